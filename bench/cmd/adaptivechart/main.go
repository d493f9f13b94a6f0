// Command adaptivechart draws the adaptive-limit simulation of the root
// test TestAdaptiveLimitFollowsCapacity as an SVG: one column per run
// (algorithm and starting limit), and in each the limit against the
// capacity K, the handler latency and the throughput over simulated time.
// make adaptive-chart runs, at the repository root:
//
//	ADAPTIVE_CSV=/tmp/adaptive.csv go test -run TestAdaptiveLimitFollowsCapacity -count=1 .
//	cd bench && go run ./cmd/adaptivechart -csv /tmp/adaptive.csv -out ../docs/adaptive.svg
//
// The CSV has a header and the columns algorithm, start, time_s, limit,
// latency_s and k, found by name, one row per served request of the
// simulation in the order they finished.
package main

import (
	"bytes"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
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

// window is the simulated time per point of the latency and throughput
// panels, in seconds.
const window = 2.0

func main() {
	fs := flag.NewFlagSet("adaptivechart", flag.ExitOnError)
	in := fs.String("csv", "", "the CSV the root test writes to $ADAPTIVE_CSV (required)")
	out := fs.String("out", "", "the SVG to write (required), e.g. ../docs/adaptive.svg")
	_ = fs.Parse(os.Args[1:])
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "adaptivechart:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	if in == "" || out == "" {
		return errors.New("both -csv and -out are required")
	}
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	runs, err := readRuns(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if runs = selectRuns(runs, "gradient", "aimd"); len(runs) == 0 {
		return fmt.Errorf("%s: no run of gradient or aimd", in)
	}
	var b bytes.Buffer
	if err := writeChart(&b, runs); err != nil {
		return err
	}
	return os.WriteFile(out, b.Bytes(), 0o644)
}

// sample is one served request of the simulation.
type sample struct {
	t       float64 // when it finished, simulated seconds since the start
	limit   float64 // the Queue's limit then
	latency float64 // its handler time, seconds
	k       float64 // the simulated capacity then
}

// simRun is the samples of one algorithm from one starting limit.
type simRun struct {
	algorithm string
	start     int
	samples   []sample // in the order they finished
}

func (r simRun) title() string { return fmt.Sprintf("%s from %d", r.algorithm, r.start) }

// readRuns parses the CSV into runs, in the order they first appear.
func readRuns(rd io.Reader) ([]simRun, error) {
	recs, err := csv.NewReader(rd).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, errors.New("no header")
	}
	names := []string{"algorithm", "start", "time_s", "limit", "latency_s", "k"}
	col := make([]int, len(names))
	for i, name := range names {
		if col[i] = slices.Index(recs[0], name); col[i] < 0 {
			return nil, fmt.Errorf("no column %q in the header %q", name, strings.Join(recs[0], ","))
		}
	}
	var runs []simRun
	index := map[string]int{}
	for n, rec := range recs[1:] {
		var x [5]float64 // start, time_s, limit, latency_s, k
		for i := range x {
			if x[i], err = strconv.ParseFloat(rec[col[i+1]], 64); err != nil {
				return nil, fmt.Errorf("line %d, column %s: %w", n+2, names[i+1], err)
			}
		}
		key := rec[col[0]] + "/" + rec[col[1]]
		i, ok := index[key]
		if !ok {
			i, index[key] = len(runs), len(runs)
			runs = append(runs, simRun{algorithm: rec[col[0]], start: int(x[0])})
		}
		runs[i].samples = append(runs[i].samples, sample{t: x[1], limit: x[2], latency: x[3], k: x[4]})
	}
	if len(runs) == 0 {
		return nil, errors.New("no samples")
	}
	return runs, nil
}

// selectRuns keeps the runs of algs, in that order, the higher start first.
func selectRuns(runs []simRun, algs ...string) []simRun {
	var out []simRun
	for _, a := range algs {
		i := len(out)
		for _, r := range runs {
			if r.algorithm == a {
				out = append(out, r)
			}
		}
		slices.SortStableFunc(out[i:], func(x, y simRun) int { return y.start - x.start })
	}
	return out
}

// windowed is one point per window of simulated time: the mean handler
// latency in ms and the requests finished per second. Windows without a
// sample are left out.
func windowed(s []sample) (latency, throughput plotter.XYs) {
	end := s[len(s)-1].t
	for lo := 0.0; lo < end; lo += window {
		hi := lo + window
		var n int
		var sum float64
		for _, x := range s {
			if x.t >= lo && x.t < hi {
				n++
				sum += x.latency
			}
		}
		if n == 0 {
			continue
		}
		mid := lo + window/2
		latency = append(latency, plotter.XY{X: mid, Y: 1e3 * sum / float64(n)})
		// The last window may be cut short by the end of the run.
		throughput = append(throughput, plotter.XY{X: mid, Y: float64(n) / (min(hi, end) - lo)})
	}
	return latency, throughput
}

// steps is a step line of the limit over the samples: a point where it
// changes, so that thousands of samples draw as a few hundred points.
func steps(s []sample) plotter.XYs {
	var xy plotter.XYs
	for i, x := range s {
		if i == 0 || x.limit != xy[len(xy)-1].Y {
			if i > 0 {
				xy = append(xy, plotter.XY{X: x.t, Y: xy[len(xy)-1].Y})
			}
			xy = append(xy, plotter.XY{X: x.t, Y: x.limit})
		}
	}
	if last := s[len(s)-1].t; xy[len(xy)-1].X != last {
		xy = append(xy, plotter.XY{X: last, Y: xy[len(xy)-1].Y})
	}
	return xy
}

// capacity is the capacity K of a run as steps, and its phases as
// "20 → 10 → 20". A sample's k is the capacity when its handler started, so
// around a change a few late samples still carry the old value: runs of
// fewer than one sample in a hundred are folded into their neighbours.
func capacity(s []sample) (plotter.XYs, string) {
	type seg struct {
		k     float64
		from  float64 // time of its first sample
		count int
	}
	var segs, kept []seg
	for i, x := range s {
		if i == 0 || x.k != s[i-1].k {
			segs = append(segs, seg{k: x.k, from: x.t})
		}
		segs[len(segs)-1].count++
	}
	for _, g := range segs {
		if g.count*100 >= len(s) && (len(kept) == 0 || kept[len(kept)-1].k != g.k) {
			kept = append(kept, g)
		}
	}
	if len(kept) == 0 {
		kept = segs[:1]
	}
	xy := plotter.XYs{{X: 0, Y: kept[0].k}}
	names := []string{strconv.FormatFloat(kept[0].k, 'f', -1, 64)}
	for i, g := range kept[1:] {
		xy = append(xy, plotter.XY{X: g.from, Y: kept[i].k}, plotter.XY{X: g.from, Y: g.k})
		names = append(names, strconv.FormatFloat(g.k, 'f', -1, 64))
	}
	xy = append(xy, plotter.XY{X: s[len(s)-1].t, Y: kept[len(kept)-1].k})
	return xy, strings.Join(names, " → ")
}

// series is one line of a panel.
type series struct {
	label  string
	xy     plotter.XYs
	color  uint32 // 0xRRGGBB
	dashed bool
}

// panel builds one plot of series and, if legend is set, their legend. The
// legend is drawn apart, inside the data area: plot.Align gives untitled
// panels extra room at the top, where the plot's own legend would float.
func panel(title, ylabel string, ss []series, legend bool) (*plot.Plot, *plot.Legend, error) {
	p := plot.New()
	var lg *plot.Legend
	if legend {
		l := plot.NewLegend()
		lg = &l
		lg.Top = true
		lg.TextStyle.Font.Size = vg.Points(8)
		lg.XOffs, lg.YOffs = -vg.Points(4), -vg.Points(4)
	}
	p.Title.Text = title
	p.X.Label.Text = "simulated time (s)"
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	for _, s := range ss {
		l, err := plotter.NewLine(s.xy)
		if err != nil {
			return nil, nil, fmt.Errorf("%s, %s: %w", title, s.label, err)
		}
		l.Color = color.RGBA{R: uint8(s.color >> 16), G: uint8(s.color >> 8), B: uint8(s.color), A: 0xff}
		l.Width = vg.Points(1.2)
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		if lg != nil {
			lg.Add(s.label, l)
		}
	}
	return p, lg, nil
}

// writeChart draws the runs side by side as an SVG, three panels each: limit
// and K, latency, throughput. Panels of one row share their y range.
func writeChart(w io.Writer, runs []simRun) error {
	const rows = 3
	grid := make([][]*plot.Plot, rows)
	legends := make([]*plot.Legend, rows) // of the first column
	for c, r := range runs {
		s := r.samples
		// The service time s of the simulation is its fastest handler time:
		// every request that runs within capacity takes exactly s.
		sMin := math.Inf(1)
		for _, x := range s {
			sMin = min(sMin, x.latency)
		}
		lat, tput := windowed(s)
		k, _ := capacity(s)
		ideal := make(plotter.XYs, len(k))
		for i, p := range k {
			ideal[i] = plotter.XY{X: p.X, Y: p.Y / sMin}
		}
		bound := plotter.XYs{{X: 0, Y: 2e3 * sMin}, {X: s[len(s)-1].t, Y: 2e3 * sMin}}
		for i, pn := range []struct {
			title, ylabel string
			ss            []series
		}{
			{r.title(), "slots (log scale)", []series{
				{"limit", steps(s), 0x1f77b4, false},
				{"capacity K", k, 0x2ca02c, true},
			}},
			{"", "handler latency (ms, log scale)", []series{
				{fmt.Sprintf("mean over %gs", window), lat, 0xd62728, false},
				{"2 × s, the p99 bound", bound, 0x555555, true},
			}},
			{"", "throughput (requests/s)", []series{
				{fmt.Sprintf("served per s, over %gs", window), tput, 0x9467bd, false},
				{"K / s, the capacity", ideal, 0x555555, true},
			}},
		} {
			p, lg, err := panel(pn.title, pn.ylabel, pn.ss, c == 0)
			if err != nil {
				return err
			}
			grid[i] = append(grid[i], p)
			if c == 0 {
				legends[i] = lg
			}
		}
	}
	// The panels of a row share the ranges that Add found in their data,
	// with room for the legend above the lines.
	for r, ps := range grid {
		lo, hi, xMax := math.Inf(1), math.Inf(-1), 0.0
		for _, p := range ps {
			lo, hi, xMax = min(lo, p.Y.Min), max(hi, p.Y.Max), max(xMax, p.X.Max)
		}
		for _, p := range ps {
			p.X.Min, p.X.Max = 0, xMax
			switch r {
			case 0:
				p.Y.Scale, p.Y.Min, p.Y.Max = plot.LogScale{}, 0.8, hi*2.5
				p.Y.Tick.Marker = logTicks(1, p.Y.Max)
			case 1:
				p.Y.Scale, p.Y.Min, p.Y.Max = plot.LogScale{}, lo*0.8, hi*3
				p.Y.Tick.Marker = logTicks(p.Y.Min, p.Y.Max)
			case 2:
				p.Y.Min, p.Y.Max = 0, hi*1.35
				p.Y.Tick.Marker = plainTicks{}
			}
		}
	}
	_, phases := capacity(runs[0].samples)
	width := vg.Length(len(runs))*3.6*vg.Inch + 0.4*vg.Inch
	const height = 8.5 * vg.Inch
	cv := vgsvg.New(width, height)
	dc := draw.New(cv)
	const titleH = 0.45 * vg.Inch
	sty := plot.New().Title.TextStyle
	sty.Font.Size = vg.Points(13)
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YCenter
	dc.FillText(sty, vg.Point{X: width / 2, Y: height - titleH/2},
		"Adaptive limit under steady overload: capacity K "+phases+", handler time s while at most K requests run")
	tiles := draw.Tiles{Rows: rows, Cols: len(runs), PadX: vg.Points(10), PadY: vg.Points(10),
		PadTop: vg.Points(4), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	canvases := plot.Align(grid, tiles, draw.Crop(dc, 0, 0, 0, -titleH))
	for r := range rows {
		for c := range runs {
			grid[r][c].Draw(canvases[r][c])
		}
		legends[r].Draw(grid[r][0].DataCanvas(canvases[r][0]))
	}
	_, err := cv.WriteTo(w)
	return err
}

// logTicks labels 1, 2, 5, 10, 20, 50… from bottom up to top.
func logTicks(bottom, top float64) plot.ConstantTicks {
	var ts plot.ConstantTicks
	for d := math.Pow(10, math.Floor(math.Log10(bottom))); d <= top; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := d * m; v >= bottom && v <= top {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
			}
		}
	}
	return ts
}

// plainTicks are gonum's default ticks, labelled without trailing zeros.
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
		}
	}
	return ts
}
