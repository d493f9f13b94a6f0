package render

import (
	"fmt"
	"image/color"
	"io"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

// Timeline draws the seed burst of every timeline as an SVG: one band per
// variant, one line per request in arrival order, grey while it waits, blue
// while its handler runs, a red cross where it is refused at once and an
// orange ring where it times out.
func Timeline(w io.Writer, ts []suite.Timeline, title string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "milliseconds since the burst"
	p.X.Min = 0
	band := float64(suite.BurstRequests + 3)
	var ticks []plot.Tick
	var full, timedOut plotter.XYs
	var wait, run *plotter.Line // the last of each, for the legend
	for i, t := range ts {
		top := -float64(i) * band
		ticks = append(ticks, plot.Tick{Value: top - float64(len(t.Events)-1)/2, Label: t.Variant})
		for j, e := range t.Events {
			y := top - float64(j)
			waitEnd := e.End
			if e.Start >= 0 {
				waitEnd = e.Start
			}
			wait = segment(e.Arrive, waitEnd, y, color.RGBA{R: 0xb0, G: 0xb0, B: 0xb0, A: 0xff}, 1.5)
			p.Add(wait)
			if e.Start >= 0 {
				run = segment(e.Start, e.End, y, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, 4)
				p.Add(run)
			}
			switch e.Outcome {
			case suite.OutcomeFull:
				full = append(full, plotter.XY{X: ms(e.End), Y: y})
			case suite.OutcomeTimeout:
				timedOut = append(timedOut, plotter.XY{X: ms(e.End), Y: y})
			}
		}
	}
	if wait != nil {
		p.Legend.Add("waiting", wait)
	}
	if run != nil {
		p.Legend.Add("handler running", run)
	}
	for _, m := range []struct {
		pts   plotter.XYs
		label string
		c     color.Color
		shape draw.GlyphDrawer
	}{
		{full, "refused at once (503, chi 429)", color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, draw.CrossGlyph{}},
		{timedOut, "timed out (408, chi 429)", color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, draw.RingGlyph{}},
	} {
		if len(m.pts) == 0 {
			continue
		}
		s, err := plotter.NewScatter(m.pts)
		if err != nil {
			return fmt.Errorf("render: chart: %w", err)
		}
		s.GlyphStyle = draw.GlyphStyle{Color: m.c, Radius: vg.Points(3), Shape: m.shape}
		p.Add(s)
		p.Legend.Add(m.label, s)
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Min = -float64(len(ts))*band + 2
	p.Y.Max = 1
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	wt, err := p.WriterTo(9*vg.Inch, 7*vg.Inch, "svg")
	if err != nil {
		return fmt.Errorf("render: chart: %w", err)
	}
	_, err = wt.WriteTo(w)
	return err
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }

// segment is a horizontal line from t0 to t1 at y, width points wide.
func segment(t0, t1 time.Duration, y float64, c color.Color, width float64) *plotter.Line {
	l := &plotter.Line{XYs: plotter.XYs{{X: ms(t0), Y: y}, {X: ms(t1), Y: y}}, LineStyle: plotter.DefaultLineStyle}
	l.Color, l.Width = c, vg.Points(width)
	return l
}
