package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
)

// TestRun draws three synthetic runs, K halving half-way with one straggler
// that still carries the old K, and checks what the chart is drawn from.
func TestRun(t *testing.T) {
	csv := header + "\n"
	for _, run := range []string{"gradient,1", "aimd,1", "gradient,200"} {
		for i := range 200 {
			k, limit, lat := 20, 1+i/5, 0.1
			if i >= 100 {
				k, limit, lat = 10, 12, 0.12
			}
			if i == 101 {
				k = 20 // a straggler with the old K
			}
			csv += fmt.Sprintf("%s,%d,%.4f,%d,%.4f,%d\n", run, i, 0.1*float64(i), limit, lat, k)
		}
	}
	runs, err := readRuns(csv)
	if err != nil || len(runs) != 3 || runs[0].title != "gradient from 200" || runs[2].title != "aimd from 1" {
		t.Fatalf("runs %v, %v", runs, err)
	}
	lat, tput := windowed(runs[0].samples)
	if len(lat) != 10 || math.Abs(lat[0].Y-100) > 1e-9 || tput[0].Y != 10 {
		t.Errorf("windows: %v, %v", lat, tput)
	}
	in, svg := filepath.Join(t.TempDir(), "x.csv"), filepath.Join(t.TempDir(), "adaptive.svg")
	if err := os.WriteFile(in, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, svg); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(svg)
	for _, s := range []string{"<svg", "gradient from 200", "aimd from 1", "capacity K 20 → 10, handler", "simulated time (s)"} {
		if err != nil || !strings.Contains(string(out), s) {
			t.Errorf("SVG lacks %q (%v)", s, err) // 20 → 10: the straggler is folded
		}
	}
	for csv, want := range map[string]string{
		"":                                      "the header is not",
		"algorithm,start,time_s,limit,k\n":      "the header is not",
		header + "\n":                           "no samples",
		header + "\ngradient,1,0,1\n":           "wrong number of fields",
		header + "\ngradient,1,0,x,1,0.1,20\n":  "line 2, column time_s",
		header + "\ngradient,1,0,1,1,NaN,20\n":  "line 2, column latency_s",
		header + "\nvegas,1,0,1,1,0.1,20\n":     `algorithm "vegas"`,
		header + "\ngradient,1,0,0.1,1,0,20\n":  "line 2, column latency_s", // a 0 handler time drew forever
		header + "\naimd,1,0,0.1,1,-1,20\n":     "line 2, column latency_s",
		header + "\naimd,1,0,0.1,0,0.1,20\n":    "line 2, column limit", // a log scale would panic
		header + "\naimd,1,0,0.1,1,0.1,0\n":     "line 2, column k",
		header + "\naimd,1,0,0.1,1e308,0.1,1\n": "line 2, column limit", // its range would overflow
		header + "\naimd,1,0,1e300,1,0.1,1\n":   "line 2, column time_s",
		header + "\naimd,1,0,-1,1,0.1,1\n":      "line 2, column time_s",
	} {
		if _, err := readRuns(csv); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("readRuns(%q) = %v, want an error with %q", csv, err, want)
		}
	}
	for _, tk := range append(plainTicks(0, 250), plainTicks(0, 1.35)...) {
		if strings.HasSuffix(tk.Label, "0") && strings.Contains(tk.Label, ".") || len(tk.Label) > 4 {
			t.Errorf("tick label %q: want no trailing zeros and no float noise", tk.Label)
		}
	}
	ps := []*plot.Plot{plot.New()}
	setAxes(2, ps) // the throughput row
	if tk := ps[0].Y.Tick.Marker.Ticks(0, 1.35); tk[0].Label != "0" {
		t.Errorf("throughput axis labels 0 as %q", tk[0].Label)
	}
	// Values far out of range end, rather than loop or panic.
	done := make(chan error, 1)
	go func() {
		logTicks(0, 100)
		logTicks(1, math.Inf(1))
		_, err := chart(mustRuns(t, header+"\ngradient,1,0,1e6,1e6,1e6,1e6\ngradient,1,1,1e6,1,1e-300,1\n")).WriteTo(io.Discard)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("huge values: the chart did not end within 10 s")
	}
	if err := run("", svg); err == nil {
		t.Error("no -csv: no error")
	}
}

func mustRuns(t *testing.T, csv string) []*simRun {
	runs, err := readRuns(csv)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}
