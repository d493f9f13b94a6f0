package bench

import (
	"fmt"
	"image/color"
	"io"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Colours of the timeline.
var (
	colorWait    = color.RGBA{R: 0xb0, G: 0xb0, B: 0xb0, A: 0xff}
	colorRun     = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colorFull    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colorTimeout = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
)

// WriteTimelineSVG draws the seed burst of every timeline as an SVG: one
// band per variant, one line per request in arrival order, grey while it
// waits, blue while its handler runs, a red cross where it is refused at
// once and an orange ring where it times out.
func WriteTimelineSVG(w io.Writer, ts []Timeline, title string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "milliseconds since the burst"
	p.X.Min = 0
	band := float64(burstRequests + 3)
	var ticks []plot.Tick
	var fullPts, timeoutPts plotter.XYs
	var waitLine, runLine *plotter.Line
	for i, t := range ts {
		top := -float64(i) * band
		ticks = append(ticks, plot.Tick{Value: top - float64(len(t.Events)-1)/2, Label: t.Variant})
		for j, e := range t.Events {
			y := top - float64(j)
			waitEnd := e.End
			if e.Start >= 0 {
				waitEnd = e.Start
			}
			l, err := segment(ms(e.Arrive), ms(waitEnd), y, colorWait, vg.Points(1.5))
			if err != nil {
				return err
			}
			p.Add(l)
			waitLine = l
			if e.Start >= 0 {
				l, err = segment(ms(e.Start), ms(e.End), y, colorRun, vg.Points(4))
				if err != nil {
					return err
				}
				p.Add(l)
				runLine = l
			}
			switch e.Outcome {
			case OutcomeFull:
				fullPts = append(fullPts, plotter.XY{X: ms(e.End), Y: y})
			case OutcomeTimeout:
				timeoutPts = append(timeoutPts, plotter.XY{X: ms(e.End), Y: y})
			}
		}
	}
	if waitLine != nil {
		p.Legend.Add("waiting", waitLine)
	}
	if runLine != nil {
		p.Legend.Add("handler running", runLine)
	}
	for _, m := range []struct {
		pts   plotter.XYs
		label string
		c     color.Color
		shape draw.GlyphDrawer
	}{
		{fullPts, "refused at once (503, chi 429)", colorFull, draw.CrossGlyph{}},
		{timeoutPts, "timed out (408, chi 429)", colorTimeout, draw.RingGlyph{}},
	} {
		if len(m.pts) == 0 {
			continue
		}
		s, err := plotter.NewScatter(m.pts)
		if err != nil {
			return err
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
		return fmt.Errorf("bench: chart: %w", err)
	}
	_, err = wt.WriteTo(w)
	return err
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }

// segment is a horizontal line from x0 to x1 at y.
func segment(x0, x1, y float64, c color.Color, width vg.Length) (*plotter.Line, error) {
	l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return nil, err
	}
	l.Color = c
	l.Width = width
	return l, nil
}
