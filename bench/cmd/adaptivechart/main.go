// Command adaptivechart draws the adaptive-limit simulation of the root
// test TestAdaptiveLimitFollowsCapacity as an SVG: one column per run
// (algorithm and starting limit), and in each the limit against the
// capacity K, the handler latency and the throughput over simulated time.
//
//	ADAPTIVE_CSV=/tmp/adaptive.csv go test -run TestAdaptiveLimitFollowsCapacity -count=1 .   # at the repository root
//	cd bench && go run ./cmd/adaptivechart -csv /tmp/adaptive.csv -out ../docs/adaptive.svg
//
// The CSV has a header and the columns algorithm, start, sample, time_s,
// limit, latency_s and k, one row per served request of the simulation in
// the order they finished; columns are found by name.
package main

import (
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
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

func main() {
	fs := flag.NewFlagSet("adaptivechart", flag.ExitOnError)
	in := fs.String("csv", "", "the CSV the root test writes to $ADAPTIVE_CSV (required)")
	out := fs.String("out", "", "the chart to write (required), e.g. ../docs/adaptive.svg; a name ending in .png writes a PNG")
	window := fs.Float64("window", 2, "seconds of simulated time per point of the latency and throughput panels")
	algs := fs.String("algorithms", "gradient,aimd", "the algorithms to draw, in column order")
	_ = fs.Parse(os.Args[1:])
	if err := run(*in, *out, *window, strings.Split(*algs, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "adaptivechart:", err)
		os.Exit(1)
	}
}

func run(in, out string, window float64, algs []string) error {
	if in == "" || out == "" {
		return errors.New("both -csv and -out are required")
	}
	if !(window > 0) {
		return fmt.Errorf("-window must be positive, got %v", window)
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
	runs = selectRuns(runs, algs)
	if len(runs) == 0 {
		return fmt.Errorf("%s: no run of the algorithms %s", in, strings.Join(algs, ", "))
	}
	o, err := os.Create(out)
	if err != nil {
		return err
	}
	format := "svg"
	if strings.HasSuffix(strings.ToLower(out), ".png") {
		format = "png"
	}
	if err := writeChart(o, runs, window, format); err != nil {
		o.Close()
		return err
	}
	return o.Close()
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
	cr := csv.NewReader(rd)
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(h)] = i
	}
	for _, name := range []string{"algorithm", "start", "time_s", "limit", "latency_s", "k"} {
		if _, ok := col[name]; !ok {
			return nil, fmt.Errorf("no column %q in the header %q", name, strings.Join(head, ","))
		}
	}
	var runs []simRun
	index := map[string]int{}
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		var nums [5]float64
		for i, name := range []string{"start", "time_s", "limit", "latency_s", "k"} {
			if nums[i], err = strconv.ParseFloat(rec[col[name]], 64); err != nil {
				return nil, fmt.Errorf("line %d, column %s: %w", line, name, err)
			}
		}
		key := rec[col["algorithm"]] + "/" + rec[col["start"]]
		i, ok := index[key]
		if !ok {
			i = len(runs)
			index[key] = i
			runs = append(runs, simRun{algorithm: rec[col["algorithm"]], start: int(nums[0])})
		}
		runs[i].samples = append(runs[i].samples, sample{t: nums[1], limit: nums[2], latency: nums[3], k: nums[4]})
	}
	if len(runs) == 0 {
		return nil, errors.New("no samples")
	}
	return runs, nil
}

// selectRuns keeps the runs of algs, in that order, the higher start first.
func selectRuns(runs []simRun, algs []string) []simRun {
	var out []simRun
	for _, a := range algs {
		var some []simRun
		for _, r := range runs {
			if r.algorithm == strings.TrimSpace(a) {
				some = append(some, r)
			}
		}
		slices.SortStableFunc(some, func(x, y simRun) int { return y.start - x.start })
		out = append(out, some...)
	}
	return out
}

// windowed is one point per window of simulated time: the mean handler
// latency in ms and the requests finished per second. Windows without a
// sample are left out.
func windowed(s []sample, window float64) (latency, throughput plotter.XYs) {
	if len(s) == 0 {
		return nil, nil
	}
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

// steps is a step line of f over the samples: a point where the value
// changes, so that thousands of samples draw as a few hundred points.
func steps(s []sample, f func(sample) float64) plotter.XYs {
	var xy plotter.XYs
	for i, x := range s {
		v := f(x)
		if i == 0 || v != xy[len(xy)-1].Y {
			if i > 0 {
				xy = append(xy, plotter.XY{X: x.t, Y: xy[len(xy)-1].Y})
			}
			xy = append(xy, plotter.XY{X: x.t, Y: v})
		}
	}
	if n := len(s); n > 0 && xy[len(xy)-1].X != s[n-1].t {
		xy = append(xy, plotter.XY{X: s[n-1].t, Y: xy[len(xy)-1].Y})
	}
	return xy
}

// Colours of the chart.
var (
	colorLimit   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colorK       = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	colorLatency = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colorTput    = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	colorBound   = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
)

func line(xy plotter.XYs, c color.Color, width vg.Length, dashed bool) (*plotter.Line, error) {
	l, err := plotter.NewLine(xy)
	if err != nil {
		return nil, err
	}
	l.Color, l.Width = c, width
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	return l, nil
}

// series is one line of a panel.
type series struct {
	label  string
	xy     plotter.XYs
	c      color.Color
	dashed bool
}

// panel builds one plot of series. Its legend is drawn apart, inside the
// data area: plot.Align gives untitled panels extra room at the top, where
// the plot's own legend would float.
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
		l, err := line(s.xy, s.c, vg.Points(1.2), s.dashed)
		if err != nil {
			return nil, nil, fmt.Errorf("%s, %s: %w", title, s.label, err)
		}
		p.Add(l)
		if lg != nil {
			lg.Add(s.label, l)
		}
	}
	return p, lg, nil
}

// writeChart draws the runs side by side, three panels each: limit and K,
// latency, throughput, as an SVG (format "svg") or a PNG ("png"). Panels of
// one row share their y range.
func writeChart(w io.Writer, runs []simRun, window float64, format string) error {
	const rows = 3
	grid := make([][]*plot.Plot, rows)
	legends := make([]*plot.Legend, rows) // of the first column
	for i := range grid {
		grid[i] = make([]*plot.Plot, len(runs))
	}
	var xMax, limMax, latMax, tputMax float64
	latMin := math.Inf(1)
	for c, r := range runs {
		s := r.samples
		// The service time s of the simulation is its fastest handler time:
		// every request that runs within capacity takes exactly s.
		sMin := math.Inf(1)
		for _, x := range s {
			sMin = min(sMin, x.latency)
		}
		lat, tput := windowed(s, window)
		limit := steps(s, func(x sample) float64 { return x.limit })
		k, _ := capacity(s)
		ideal := make(plotter.XYs, len(k))
		for i, p := range k {
			ideal[i] = plotter.XY{X: p.X, Y: p.Y / sMin}
		}
		bound := plotter.XYs{{X: 0, Y: 2e3 * sMin}, {X: s[len(s)-1].t, Y: 2e3 * sMin}}
		legend := c == 0
		var err error
		lg := make([]*plot.Legend, rows)
		if grid[0][c], lg[0], err = panel(r.title(), "slots (log scale)", []series{
			{"limit", limit, colorLimit, false},
			{"capacity K", k, colorK, true},
		}, legend); err != nil {
			return err
		}
		if grid[1][c], lg[1], err = panel("", "handler latency (ms, log scale)", []series{
			{fmt.Sprintf("mean over %gs", window), lat, colorLatency, false},
			{"2 × s, the p99 bound", bound, colorBound, true},
		}, legend); err != nil {
			return err
		}
		if grid[2][c], lg[2], err = panel("", "throughput (requests/s)", []series{
			{fmt.Sprintf("served per s, over %gs", window), tput, colorTput, false},
			{"K / s, the capacity", ideal, colorBound, true},
		}, legend); err != nil {
			return err
		}
		if legend {
			copy(legends, lg)
		}
		xMax = max(xMax, s[len(s)-1].t)
		for _, p := range limit {
			limMax = max(limMax, p.Y)
		}
		for _, p := range lat {
			latMax, latMin = max(latMax, p.Y), min(latMin, p.Y)
		}
		for _, p := range append(slices.Clone(tput), ideal...) {
			tputMax = max(tputMax, p.Y)
		}
		latMax = max(latMax, bound[0].Y)
	}
	for c := range runs {
		for r := range rows {
			grid[r][c].X.Min, grid[r][c].X.Max = 0, xMax
		}
		lp := grid[0][c]
		lp.Y.Scale = plot.LogScale{}
		lp.Y.Min, lp.Y.Max = 0.8, limMax*2.5 // room for the legend above the lines
		lp.Y.Tick.Marker = logTicks(1, lp.Y.Max)
		lt := grid[1][c]
		lt.Y.Scale = plot.LogScale{}
		lt.Y.Min, lt.Y.Max = latMin*0.8, latMax*3
		lt.Y.Tick.Marker = logTicks(lt.Y.Min, lt.Y.Max)
		grid[2][c].Y.Min, grid[2][c].Y.Max = 0, tputMax*1.35
		grid[2][c].Y.Tick.Marker = plainTicks{}
	}
	_, phases := capacity(runs[0].samples)
	width := vg.Length(len(runs))*3.6*vg.Inch + 0.4*vg.Inch
	const height = 8.5 * vg.Inch
	var cv interface {
		vg.CanvasSizer
		io.WriterTo
	}
	switch format {
	case "svg":
		cv = vgsvg.New(width, height)
	case "png":
		cv = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96))}
	default:
		return fmt.Errorf("unknown format %q", format)
	}
	dc := draw.New(cv)
	const titleH = 0.45 * vg.Inch
	sty := plot.New().Title.TextStyle
	sty.Font.Size = vg.Points(13)
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YCenter
	dc.FillText(sty, vg.Point{X: width / 2, Y: height - titleH/2},
		"Adaptive limit under steady overload: capacity K "+phases+", handler time s while at most K requests run")
	body := draw.Crop(dc, 0, 0, 0, -titleH)
	tiles := draw.Tiles{Rows: rows, Cols: len(runs), PadX: vg.Points(10), PadY: vg.Points(10),
		PadTop: vg.Points(4), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	canvases := plot.Align(grid, tiles, body)
	for r := range rows {
		for c := range runs {
			grid[r][c].Draw(canvases[r][c])
		}
		legends[r].Draw(grid[r][0].DataCanvas(canvases[r][0]))
	}
	_, err := cv.WriteTo(w)
	return err
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
	var segs []seg
	for i, x := range s {
		if i == 0 || x.k != s[i-1].k {
			segs = append(segs, seg{k: x.k, from: x.t})
		}
		segs[len(segs)-1].count++
	}
	var kept []seg
	for _, g := range segs {
		if g.count*100 < len(s) {
			continue
		}
		if n := len(kept); n > 0 && kept[n-1].k == g.k {
			continue
		}
		kept = append(kept, g)
	}
	if len(kept) == 0 {
		kept = segs[:1]
	}
	var xy plotter.XYs
	var names []string
	for i, g := range kept {
		from := g.from
		if i == 0 {
			from = 0
		} else {
			xy = append(xy, plotter.XY{X: from, Y: kept[i-1].k})
		}
		xy = append(xy, plotter.XY{X: from, Y: g.k})
		names = append(names, strconv.FormatFloat(g.k, 'f', -1, 64))
	}
	xy = append(xy, plotter.XY{X: s[len(s)-1].t, Y: kept[len(kept)-1].k})
	return xy, strings.Join(names, " → ")
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
