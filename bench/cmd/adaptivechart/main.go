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

func run(in, out string) error {
	if in == "" || out == "" {
		return errors.New("both -csv and -out are required")
	}
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	runs, err := readRuns(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	var svg bytes.Buffer
	if err := chart(&svg, runs); err != nil {
		return err
	}
	return os.WriteFile(out, svg.Bytes(), 0o644)
}

// sample is one served request: when it finished (simulated seconds), the
// limit then, its handler time (seconds) and the simulated capacity then.
type sample struct{ t, limit, latency, k float64 }

// simRun is the samples of one algorithm (gradient 0, aimd 1, other -1)
// from one starting limit.
type simRun struct {
	title      string
	alg, start int
	samples    []sample
}

// readRuns parses the CSV into the runs of gradient, then of aimd, the
// higher start first.
func readRuns(rd io.Reader) ([]simRun, error) {
	recs, err := csv.NewReader(rd).ReadAll()
	if err == nil && len(recs) == 0 {
		err = errors.New("no header")
	}
	if err != nil {
		return nil, err
	}
	names := []string{"algorithm", "start", "time_s", "limit", "latency_s", "k"}
	col := make([]int, len(names))
	for i, name := range names {
		if col[i] = slices.Index(recs[0], name); col[i] < 0 {
			return nil, fmt.Errorf("no column %q in the header %q", name, strings.Join(recs[0], ","))
		}
	}
	index := map[string]*simRun{}
	var runs []simRun
	for n, rec := range recs[1:] {
		var x [5]float64 // start, time_s, limit, latency_s, k
		for i := range x {
			if x[i], err = strconv.ParseFloat(rec[col[i+1]], 64); err != nil {
				return nil, fmt.Errorf("line %d, column %s: %w", n+2, names[i+1], err)
			}
		}
		key := rec[col[0]] + " from " + rec[col[1]]
		if index[key] == nil {
			index[key] = &simRun{title: key, alg: slices.Index([]string{"gradient", "aimd"}, rec[col[0]]), start: int(x[0])}
		}
		index[key].samples = append(index[key].samples, sample{x[1], x[2], x[3], x[4]})
	}
	for _, r := range index {
		if r.alg >= 0 {
			runs = append(runs, *r)
		}
	}
	slices.SortFunc(runs, func(a, b simRun) int { return cmp.Or(a.alg-b.alg, b.start-a.start) })
	switch {
	case len(index) == 0:
		return nil, errors.New("no samples")
	case len(runs) == 0:
		return nil, errors.New("no run of gradient or aimd")
	}
	return runs, nil
}

// windowed is a point per window: the mean latency in ms and the requests
// finished per second; empty windows are left out.
func windowed(s []sample) (latency, throughput plotter.XYs) {
	end := s[len(s)-1].t
	for lo := 0.0; lo < end; lo += window {
		var n int
		var sum float64
		for _, x := range s {
			if x.t >= lo && x.t < lo+window {
				n, sum = n+1, sum+x.latency
			}
		}
		if n > 0 {
			latency = append(latency, plotter.XY{X: lo + window/2, Y: 1e3 * sum / float64(n)})
			throughput = append(throughput, plotter.XY{X: lo + window/2, Y: float64(n) / (min(lo+window, end) - lo)})
		}
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
	for i, p := range xy {
		if i == 0 || p.Y != xy[i-1].Y {
			out = append(out, strconv.FormatFloat(p.Y, 'f', -1, 64))
		}
	}
	return strings.Join(out, " → ")
}

// series is one line of a panel.
type series struct {
	label  string
	xy     plotter.XYs
	color  uint32 // 0xRRGGBB
	dashed bool
}

// chart draws the runs side by side, three panels each: limit and K,
// latency, throughput. The panels of a row share their ranges.
func chart(w io.Writer, runs []simRun) error {
	grid := make([][]*plot.Plot, 3)
	legends := make([]plot.Legend, 3) // of the first column, drawn inside its data area
	var title string
	for c, r := range runs {
		s := r.samples
		// The service time s is the fastest handler time.
		sMin := math.Inf(1)
		for _, x := range s {
			sMin = min(sMin, x.latency)
		}
		lat, tput := windowed(s)
		k := steps(s, func(x sample) float64 { return x.k }, max(1, len(s)/100))
		ideal := make(plotter.XYs, len(k))
		for i, p := range k {
			ideal[i] = plotter.XY{X: p.X, Y: p.Y / sMin}
		}
		bound := plotter.XYs{{X: 0, Y: 2e3 * sMin}, {X: s[len(s)-1].t, Y: 2e3 * sMin}}
		if c == 0 {
			title = "Adaptive limit under steady overload: capacity K " + phases(k) + ", handler time s while at most K requests run"
		}
		for i, pn := range []struct {
			ylabel string
			ss     []series
		}{
			{"slots (log scale)", []series{
				{"limit", steps(s, func(x sample) float64 { return x.limit }, 1), 0x1f77b4, false},
				{"capacity K", k, 0x2ca02c, true}}},
			{"handler latency (ms, log scale)", []series{
				{fmt.Sprintf("mean over %gs", window), lat, 0xd62728, false},
				{"2 × s, the p99 bound", bound, 0x555555, true}}},
			{"throughput (requests/s)", []series{
				{fmt.Sprintf("served per s, over %gs", window), tput, 0x9467bd, false},
				{"K / s, the capacity", ideal, 0x555555, true}}},
		} {
			p := plot.New()
			if i == 0 {
				p.Title.Text = r.title
			}
			p.X.Label.Text, p.Y.Label.Text = "simulated time (s)", pn.ylabel
			p.Add(plotter.NewGrid())
			if c == 0 {
				legends[i] = plot.NewLegend()
				legends[i].Top, legends[i].TextStyle.Font.Size = true, vg.Points(8)
				legends[i].XOffs, legends[i].YOffs = -vg.Points(4), -vg.Points(4)
			}
			for _, s := range pn.ss {
				l, err := plotter.NewLine(s.xy)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", r.title, s.label, err)
				}
				l.Color, l.Width = color.RGBA{R: uint8(s.color >> 16), G: uint8(s.color >> 8), B: uint8(s.color), A: 0xff}, vg.Points(1.2)
				if s.dashed {
					l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
				}
				p.Add(l)
				if c == 0 {
					legends[i].Add(s.label, l)
				}
			}
			grid[i] = append(grid[i], p)
		}
	}
	for row, ps := range grid {
		lo, hi, xMax := math.Inf(1), math.Inf(-1), 0.0
		for _, p := range ps {
			lo, hi, xMax = min(lo, p.Y.Min), max(hi, p.Y.Max), max(xMax, p.X.Max)
		}
		for _, p := range ps { // room for the legend above the lines
			p.X.Min, p.X.Max = 0, xMax
			switch row {
			case 0:
				p.Y.Scale, p.Y.Min, p.Y.Max, p.Y.Tick.Marker = plot.LogScale{}, 0.8, hi*2.5, ticks(true)
			case 1:
				p.Y.Scale, p.Y.Min, p.Y.Max, p.Y.Tick.Marker = plot.LogScale{}, lo*0.8, hi*3, ticks(true)
			case 2:
				p.Y.Min, p.Y.Max, p.Y.Tick.Marker = 0, hi*1.35, ticks(false)
			}
		}
	}
	width, height, titleH := vg.Length(len(runs))*3.6*vg.Inch+0.4*vg.Inch, 8.5*vg.Inch, 0.45*vg.Inch
	cv := vgsvg.New(width, height)
	dc := draw.New(cv)
	sty := plot.New().Title.TextStyle
	sty.Font.Size, sty.XAlign, sty.YAlign = vg.Points(13), draw.XCenter, draw.YCenter
	dc.FillText(sty, vg.Point{X: width / 2, Y: height - titleH/2}, title)
	tiles := draw.Tiles{Rows: 3, Cols: len(runs), PadX: vg.Points(10), PadY: vg.Points(10),
		PadTop: vg.Points(4), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	canvases := plot.Align(grid, tiles, draw.Crop(dc, 0, 0, 0, -titleH))
	for r := range grid {
		for c := range grid[r] {
			grid[r][c].Draw(canvases[r][c])
		}
		legends[r].Draw(grid[r][0].DataCanvas(canvases[r][0]))
	}
	_, err := cv.WriteTo(w)
	return err
}

// ticks labels 1, 2, 5, 10, 20, 50… on a log scale, and otherwise gonum's
// default ticks without trailing zeros.
func ticks(log bool) plot.TickerFunc {
	return func(lo, hi float64) []plot.Tick {
		ts := plot.DefaultTicks{}.Ticks(lo, hi)
		if log {
			ts = nil
			for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
				for _, m := range []float64{d, 2 * d, 5 * d} {
					if m >= lo && m <= hi {
						ts = append(ts, plot.Tick{Value: m, Label: "labelled below"})
					}
				}
			}
		}
		for i := range ts {
			if ts[i].Label != "" {
				ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
			}
		}
		return ts
	}
}
