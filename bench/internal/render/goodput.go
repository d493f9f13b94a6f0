package render

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

// GoodputChartPath is where the goodput chart goes, relative to the
// repository root and to BENCHMARKS.md.
const GoodputChartPath = "docs/bench-goodput.svg"

// GoodputChart draws section 12 as an SVG: the goodput share of capacity
// over the offered load, one line per variant, and capacity itself as a
// dashed line. A variant with no figure at a load has no point there.
func GoodputChart(w io.Writer, g suite.GoodputReport, title string) error {
	p, err := goodputPlot(g, title)
	if err != nil {
		return err
	}
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "svg")
	if err != nil {
		return fmt.Errorf("render: goodput chart: %w", err)
	}
	_, err = wt.WriteTo(w)
	return err
}

// goodputPlot is the plot GoodputChart draws.
func goodputPlot(g suite.GoodputReport, title string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = fmt.Sprintf("offered load, in multiples of capacity C = %s/s", suite.GroupDigits(suite.GoodputCapacity))
	p.Y.Label.Text = "goodput: delivered in time, share of C"
	var xt []plot.Tick
	for _, l := range g.Loads {
		xt = append(xt, plot.Tick{Value: float64(l), Label: fmt.Sprintf("%d×", l)})
	}
	var yt []plot.Tick
	for y := 0; y <= 100; y += 25 {
		yt = append(yt, plot.Tick{Value: float64(y) / 100, Label: fmt.Sprintf("%d%%", y)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(xt)
	p.Y.Tick.Marker = plot.ConstantTicks(yt)
	// The lines end at the highest load; the legend goes to the right of
	// it, where no line runs.
	first, last := 1.0, 5.0
	if len(g.Loads) > 0 {
		first, last = float64(g.Loads[0]), float64(g.Loads[len(g.Loads)-1])
	}
	p.X.Min, p.X.Max = first-0.25, last+0.6*(last-first)
	p.Y.Min, p.Y.Max = 0, 1.1
	p.Add(plotter.NewGrid())
	if len(g.Loads) > 0 {
		capLine, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: 1}, {X: last + 0.25, Y: 1}})
		if err != nil {
			return nil, fmt.Errorf("render: goodput chart: %w", err)
		}
		capLine.Color, capLine.Dashes = color.Gray{Y: 0x80}, []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(capLine)
		p.Legend.Add("capacity C", capLine)
	}
	for i, v := range g.Variants {
		var pts plotter.XYs
		for _, l := range g.Loads {
			if x, ok := goodputValue(g, l, v.Name); ok {
				pts = append(pts, plotter.XY{X: float64(l), Y: x})
			}
		}
		if len(pts) == 0 {
			continue
		}
		line, dots, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, fmt.Errorf("render: goodput chart: %w", err)
		}
		line.Color, line.Width = plotutil.Color(i), vg.Points(2)
		dots.GlyphStyle = draw.GlyphStyle{Color: plotutil.Color(i), Radius: vg.Points(3.5), Shape: plotutil.Shape(i)}
		p.Add(line, dots)
		p.Legend.Add(v.Name, line, dots)
	}
	p.Legend.Top = true
	return p, nil
}

// goodputValue is variant's goodput share at load, if the run has one.
func goodputValue(g suite.GoodputReport, load int, variant string) (float64, bool) {
	metric := suite.GoodputMetric(load, suite.GoodputShare)
	for _, row := range g.Rows {
		if row.Metric == metric {
			x, ok := row.Values[variant]
			return x, ok && !math.IsNaN(x)
		}
	}
	return 0, false
}

// goodputWarmUps says how long each load of plan warms up: "1s at 1×, …".
func goodputWarmUps(plan suite.Plan) string {
	var parts []string
	for _, l := range suite.GoodputLoads {
		parts = append(parts, fmt.Sprintf("%v at %d×", suite.GoodputWarmUp(plan, l), l))
	}
	return strings.Join(parts, ", ")
}
