package suite

import (
	"fmt"
	"image/color"
	"io"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Where the charts go, relative to the repository root and BENCHMARKS.md.
const (
	BurstChart   = "docs/bench-burst.svg"
	GoodputChart = "docs/bench-goodput.svg"
)

func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }

// svg draws p with a grid and its legend at the top, w × h inches.
func svg(out io.Writer, p *plot.Plot, w, h vg.Length) error {
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	wt, err := p.WriterTo(w*vg.Inch, h*vg.Inch, "svg")
	if err == nil {
		_, err = wt.WriteTo(out)
	}
	return err
}

// DrawBurst draws the burst, a band per variant and a line per request in
// arrival order: grey while it waits, blue while its handler runs, a red
// cross where it is refused at once and an orange ring where it times out.
func DrawBurst(out io.Writer, r *Results) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("A burst of %d requests, %d slots, %d places (%s)", r.BurstRequests, r.BurstSlots, r.BurstQueue, r.Date.Format(time.DateOnly))
	p.X.Label.Text, p.X.Min = "milliseconds since the burst", 0
	band, marks, legend := float64(r.BurstRequests+3), map[string]plotter.XYs{}, map[string]bool{}
	var ticks []plot.Tick
	line := func(label string, t0, t1 time.Duration, y float64, c color.RGBA, width float64) {
		l := &plotter.Line{XYs: plotter.XYs{{X: ms(t0), Y: y}, {X: ms(t1), Y: y}}, LineStyle: plotter.DefaultLineStyle}
		l.Color, l.Width = c, vg.Points(width)
		if p.Add(l); !legend[label] {
			legend[label] = true
			p.Legend.Add(label, l)
		}
	}
	for i, t := range r.Timelines {
		top := -float64(i) * band
		ticks = append(ticks, plot.Tick{Value: top - float64(len(t.Events)-1)/2, Label: t.Variant})
		for j, e := range t.Events {
			y, waitEnd := top-float64(j), e.End
			if e.Start >= 0 {
				waitEnd = e.Start
			}
			line("waiting", e.Arrive, waitEnd, y, color.RGBA{R: 0xb0, G: 0xb0, B: 0xb0, A: 0xff}, 1.5)
			if e.Start >= 0 {
				line("handler running", e.Start, e.End, y, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, 4)
			}
			marks[e.Outcome] = append(marks[e.Outcome], plotter.XY{X: ms(e.End), Y: y})
		}
	}
	for _, m := range []struct {
		outcome, label string
		glyph          draw.GlyphStyle
	}{
		{OutcomeFull, "refused at once (503, chi 429)", draw.GlyphStyle{Color: color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, Radius: vg.Points(3), Shape: draw.CrossGlyph{}}},
		{OutcomeTimeout, "timed out (408, chi 429)", draw.GlyphStyle{Color: color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, Radius: vg.Points(3), Shape: draw.RingGlyph{}}},
	} {
		if s, err := plotter.NewScatter(marks[m.outcome]); err == nil && len(marks[m.outcome]) > 0 {
			s.GlyphStyle = m.glyph
			p.Add(s)
			p.Legend.Add(m.label, s)
		}
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Min, p.Y.Max = -float64(len(r.Timelines))*band+2, 1
	return svg(out, p, 9, 7)
}

// DrawGoodput draws section 12: goodput over the offered load, a line per
// variant, and capacity as a dashed line; the legend goes right of the
// lines.
func DrawGoodput(out io.Writer, r *Results) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Goodput under overload: %d slots of %v, clients that give up after %v (%s)",
		r.GoodputLimits.MaxConcurrent, r.GoodputWork, r.GoodputPatience, r.Date.Format(time.DateOnly))
	p.X.Label.Text = fmt.Sprintf("offered load, in multiples of capacity C = %s/s", digits(r.GoodputCapacity()))
	p.Y.Label.Text = "goodput: delivered in time, share of C"
	var xt, yt plot.ConstantTicks
	for _, l := range r.GoodputLoads {
		xt = append(xt, plot.Tick{Value: float64(l), Label: fmt.Sprintf("%d×", l)})
	}
	for y := 0; y <= 100; y += 25 {
		yt = append(yt, plot.Tick{Value: float64(y) / 100, Label: fmt.Sprintf("%d%%", y)})
	}
	first, last := xt[0].Value, xt[len(xt)-1].Value
	p.X.Tick.Marker, p.Y.Tick.Marker = xt, yt
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = first-0.25, last+0.6*(last-first), 0, 1.1
	capLine := &plotter.Line{XYs: plotter.XYs{{X: p.X.Min, Y: 1}, {X: last + 0.25, Y: 1}}, LineStyle: plotter.DefaultLineStyle}
	capLine.Color, capLine.Dashes = color.Gray{Y: 0x80}, []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(capLine)
	p.Legend.Add("capacity C", capLine)
	for i, c := range r.Goodput.Cols {
		var pts plotter.XYs
		for _, l := range r.GoodputLoads {
			if x, ok := r.value(goodputMetric(l, "goodput"), c); ok {
				pts = append(pts, plotter.XY{X: float64(l), Y: x})
			}
		}
		if line, dots, err := plotter.NewLinePoints(pts); err == nil && len(pts) > 0 {
			line.Color, line.Width = plotutil.Color(i), vg.Points(2)
			dots.GlyphStyle = draw.GlyphStyle{Color: plotutil.Color(i), Radius: vg.Points(3.5), Shape: plotutil.Shape(i)}
			p.Add(line, dots)
			p.Legend.Add(c, line, dots)
		}
	}
	return svg(out, p, 8, 5)
}
