// Command adaptivechart draws the CSV of the root test
// TestAdaptiveLimitFollowsCapacity as an SVG (make adaptive-chart): a
// column per run, with the limit, latency and throughput over time.
package main

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// header is the first line of the CSV the root test writes.
const header = "algorithm,start,sample,time_s,limit,latency_s,k"

// window is the simulated seconds per point of the latency and throughput.
const window = 2.0

func main() {
	in := flag.String("csv", "", "the CSV the root test writes to $ADAPTIVE_CSV (required)")
	out := flag.String("out", "", "the SVG to write (required), e.g. ../docs/adaptive.svg")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "adaptivechart:", err)
		os.Exit(1)
	}
}

// run draws the runs in the CSV file in as the SVG file out.
func run(in, out string) error {
	if in == "" || out == "" {
		return errors.New("both -csv and -out are required")
	}
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	runs, err := readRuns(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	var svg bytes.Buffer
	if _, err := chart(runs).WriteTo(&svg); err != nil {
		return err
	}
	return os.WriteFile(out, svg.Bytes(), 0o644)
}

// sample is one served request: when it finished (simulated seconds), the
// limit then, its handler time (seconds) and the simulated capacity then.
type sample struct{ t, limit, latency, k float64 }

// simRun is the samples of one algorithm (gradient 0, aimd 1) from one
// starting limit.
type simRun struct {
	title      string
	alg, start int
	samples    []sample
}

// readRuns parses the CSV into the runs of gradient, then of aimd, the
// higher start first.
func readRuns(data string) ([]*simRun, error) {
	recs, err := csv.NewReader(strings.NewReader(data)).ReadAll()
	switch {
	case err != nil:
		return nil, err
	case len(recs) == 0 || strings.Join(recs[0], ",") != header:
		return nil, fmt.Errorf("the header is not %q", header)
	case len(recs) == 1:
		return nil, errors.New("no samples")
	}
	index := map[string]*simRun{}
	var runs []*simRun
	for n, rec := range recs[1:] {
		var x [6]float64 // start, sample, time_s, limit, latency_s, k
		for i := range x {
			x[i], err = strconv.ParseFloat(rec[i+1], 64)
			if err != nil || math.IsNaN(x[i]) || math.IsInf(x[i], 0) {
				return nil, fmt.Errorf("line %d, column %s: %q is not a finite number", n+2, recs[0][i+1], rec[i+1])
			}
		}
		if err := inRange(x); err != nil {
			return nil, fmt.Errorf("line %d, %w", n+2, err)
		}
		title := rec[0] + " from " + rec[1]
		r := index[title]
		if r == nil {
			r = &simRun{title: title, alg: slices.Index([]string{"gradient", "aimd"}, rec[0]), start: int(x[0])}
			if r.alg < 0 {
				return nil, fmt.Errorf("line %d: algorithm %q is neither gradient nor aimd", n+2, rec[0])
			}
			index[title], runs = r, append(runs, r)
		}
		r.samples = append(r.samples, sample{x[2], x[3], x[4], x[5]})
	}
	slices.SortFunc(runs, func(a, b *simRun) int { return cmp.Or(a.alg-b.alg, b.start-a.start) })
	return runs, nil
}

// maxValue bounds time_s, limit, latency_s and k, far above what the
// simulation writes, so that the chart's ranges stay finite.
const maxValue = 1e6

// inRange checks a row's numbers: start, sample, time_s, limit, latency_s
// and k. Limit, latency and K go on log scales, so they must be above 0.
func inRange(x [6]float64) error {
	for i, name := range []string{"time_s", "limit", "latency_s", "k"} {
		if v := x[i+2]; v > maxValue || v < 0 || v == 0 && name != "time_s" {
			return fmt.Errorf("column %s: %g is not within (0, %g]", name, v, maxValue)
		}
	}
	return nil
}

// windowed is a point per window: the mean latency in ms and the requests
// finished per second; empty windows are left out.
func windowed(s []sample) (latency, throughput plotter.XYs) {
	end := s[len(s)-1].t
	type total struct{ n, sum float64 }
	windows := map[float64]*total{} // by the window's start
	for _, x := range s {
		lo := math.Floor(x.t/window) * window
		if x.t < 0 || lo >= end {
			continue
		}
		if windows[lo] == nil {
			windows[lo] = &total{}
		}
		windows[lo].n, windows[lo].sum = windows[lo].n+1, windows[lo].sum+x.latency
	}
	for _, lo := range slices.Sorted(maps.Keys(windows)) {
		w := windows[lo]
		latency = append(latency, plotter.XY{X: lo + window/2, Y: 1e3 * w.sum / w.n})
		throughput = append(throughput, plotter.XY{X: lo + window/2, Y: w.n / (min(lo+window, end) - lo)})
	}
	return latency, throughput
}

// steps is value as a step line, a point where it changes; a run of fewer
// than minRun samples, late ones with the old value, is folded away.
func steps(s []sample, value func(sample) float64, minRun int) plotter.XYs {
	xy := plotter.XYs{{X: s[0].t, Y: value(s[0])}}
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && value(s[j]) == value(s[i]) {
			j++
		}
		if v := value(s[i]); j-i >= minRun && v != xy[len(xy)-1].Y {
			xy = append(xy, plotter.XY{X: s[i].t, Y: xy[len(xy)-1].Y}, plotter.XY{X: s[i].t, Y: v})
		}
		i = j
	}
	return append(xy, plotter.XY{X: s[len(s)-1].t, Y: xy[len(xy)-1].Y})
}

// phases is the levels of a step line: "20 → 10 → 20".
func phases(xy plotter.XYs) string {
	var out []string
	for _, p := range xy {
		out = append(out, strconv.FormatFloat(p.Y, 'f', -1, 64))
	}
	return strings.Join(slices.Compact(out), " → ")
}

// series is one labelled line of a panel.
type series struct {
	label string
	*plotter.Line
}

// line is xy drawn 1.2 points wide in the colour 0xRRGGBB, maybe dashed.
func line(xy plotter.XYs, rgb uint32, dashed bool) *plotter.Line {
	c := color.RGBA{R: uint8(rgb >> 16), G: uint8(rgb >> 8), B: uint8(rgb), A: 0xff}
	l := &plotter.Line{XYs: xy, LineStyle: draw.LineStyle{Color: c, Width: vg.Points(1.2)}}
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	return l
}

// panels is the lines of a run's three panels, top to bottom: the limit
// and K, the latency, the throughput.
func panels(s []sample) [3][]series {
	// The service time s is the fastest handler time.
	sMin := slices.MinFunc(s, func(a, b sample) int { return cmp.Compare(a.latency, b.latency) }).latency
	lat, tput := windowed(s)
	k := steps(s, func(x sample) float64 { return x.k }, max(1, len(s)/100))
	ideal := make(plotter.XYs, len(k))
	for i, p := range k {
		ideal[i] = plotter.XY{X: p.X, Y: p.Y / sMin}
	}
	bound := plotter.XYs{{X: 0, Y: 2e3 * sMin}, {X: s[len(s)-1].t, Y: 2e3 * sMin}}
	return [3][]series{
		{{"limit", line(steps(s, func(x sample) float64 { return x.limit }, 1), 0x1f77b4, false)},
			{"capacity K", line(k, 0x2ca02c, true)}},
		{{fmt.Sprintf("mean over %gs", window), line(lat, 0xd62728, false)},
			{"2 × s, the p99 bound", line(bound, 0x555555, true)}},
		{{fmt.Sprintf("served per s, over %gs", window), line(tput, 0x9467bd, false)},
			{"K / s, the capacity", line(ideal, 0x555555, true)}},
	}
}

// chart draws the runs side by side, three panels each, and the title.
func chart(runs []*simRun) *vgsvg.Canvas {
	grid := make([][]*plot.Plot, 3)
	cols := make([][3][]series, len(runs))
	for c, r := range runs {
		cols[c] = panels(r.samples)
		for i, ss := range cols[c] {
			p := plot.New()
			p.Add(plotter.NewGrid())
			for _, s := range ss {
				p.Add(s.Line)
			}
			grid[i] = append(grid[i], p)
		}
		grid[0][c].Title.Text = r.title
	}
	for i, ps := range grid {
		setAxes(i, ps)
	}
	k := cols[0][0][1].XYs // the K line of the first run
	title := "Adaptive limit under steady overload: capacity K " + phases(k) + ", handler time s while at most K requests run"
	return drawGrid(grid, cols[0], title)
}

// setAxes labels the axes of a row of panels and gives them the same
// ranges, with room for the legend above the lines.
func setAxes(row int, ps []*plot.Plot) {
	lo, hi, xMax := math.Inf(1), math.Inf(-1), 0.0
	for _, p := range ps {
		lo, hi, xMax = min(lo, p.Y.Min), max(hi, p.Y.Max), max(xMax, p.X.Max)
	}
	for _, p := range ps {
		p.X.Label.Text, p.X.Min, p.X.Max = "simulated time (s)", 0, xMax
		switch row {
		case 0:
			p.Y.Label.Text, p.Y.Min, p.Y.Max = "slots (log scale)", 0.8, hi*2.5
		case 1:
			p.Y.Label.Text, p.Y.Min, p.Y.Max = "handler latency (ms, log scale)", lo*0.8, hi*3
		case 2:
			p.Y.Label.Text, p.Y.Min, p.Y.Max = "throughput (requests/s)", 0, hi*1.35
		}
		p.Y.Tick.Marker = plot.TickerFunc(plainTicks)
		if row < 2 {
			p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.TickerFunc(logTicks)
		}
	}
}

// drawGrid draws the title above the grid, and in each row's first panel
// the legend of the lines of first.
func drawGrid(grid [][]*plot.Plot, first [3][]series, title string) *vgsvg.Canvas {
	width, height, titleH := vg.Length(len(grid[0]))*3.6*vg.Inch+0.4*vg.Inch, 8.5*vg.Inch, 0.45*vg.Inch
	cv := vgsvg.New(width, height)
	dc := draw.New(cv)
	sty := plot.New().Title.TextStyle
	sty.Font.Size, sty.XAlign, sty.YAlign = vg.Points(13), draw.XCenter, draw.YCenter
	dc.FillText(sty, vg.Point{X: width / 2, Y: height - titleH/2}, title)
	tiles := draw.Tiles{Rows: 3, Cols: len(grid[0]), PadX: vg.Points(10), PadY: vg.Points(10),
		PadTop: vg.Points(4), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	canvases := plot.Align(grid, tiles, draw.Crop(dc, 0, 0, 0, -titleH))
	for r := range grid {
		for c := range grid[r] {
			grid[r][c].Draw(canvases[r][c])
		}
		legend := plot.NewLegend()
		legend.Top, legend.TextStyle.Font.Size = true, vg.Points(8)
		legend.XOffs, legend.YOffs = -vg.Points(4), -vg.Points(4)
		for _, s := range first[r] {
			legend.Add(s.label, s.Line)
		}
		legend.Draw(grid[r][0].DataCanvas(canvases[r][0]))
	}
	return cv
}

// plainTicks is gonum's default ticks, labelled without trailing zeros.
func plainTicks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(math.Round(ts[i].Value*1e9)/1e9, 'f', -1, 64)
		}
	}
	return ts
}

// logTicks labels 1, 2, 5, 10, 20, 50… on a log scale.
func logTicks(lo, hi float64) (ts []plot.Tick) {
	if lo <= 0 || math.IsInf(hi, 0) { // no decade to start from, or none to end at
		return nil
	}
	for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
		for _, m := range []float64{d, 2 * d, 5 * d} {
			if m >= lo && m <= hi {
				ts = append(ts, plot.Tick{Value: m, Label: strconv.FormatFloat(m, 'f', -1, 64)})
			}
		}
	}
	return ts
}
