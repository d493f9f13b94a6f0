package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// syntheticCSV is three runs, K halving half-way, with one straggler that
// still carries the old K.
func syntheticCSV() string {
	var b strings.Builder
	b.WriteString("algorithm,start,sample,time_s,limit,latency_s,k\n")
	for _, run := range []string{"gradient,1", "aimd,1", "gradient,200"} {
		for i := range 200 {
			k, limit, lat := 20, 1+i/5, 0.1
			if i >= 100 {
				k, limit, lat = 10, 12, 0.12
			}
			if i == 101 {
				k = 20
			}
			fmt.Fprintf(&b, "%s,%d,%.4f,%d,%.4f,%d\n", run, i, 0.1*float64(i), limit, lat, k)
		}
	}
	return b.String()
}

func TestReadRuns(t *testing.T) {
	runs, err := readRuns(strings.NewReader(syntheticCSV()))
	if err != nil {
		t.Fatal(err)
	}
	var titles []string
	for _, r := range runs {
		titles = append(titles, r.title)
	}
	if got := strings.Join(titles, ", "); got != "gradient from 200, gradient from 1, aimd from 1" || len(runs[0].samples) != 200 {
		t.Fatalf("runs %s, %d samples", got, len(runs[0].samples))
	}
	if p := phases(steps(runs[0].samples, func(x sample) float64 { return x.k }, 2)); p != "20 → 10" {
		t.Errorf("phases %q, want the straggler folded: 20 → 10", p)
	}
	lat, tput := windowed(runs[0].samples)
	if len(lat) != 10 || len(tput) != 10 || math.Abs(lat[0].Y-100) > 1e-9 || tput[0].Y != 10 {
		t.Errorf("windows: %v, %v", lat, tput)
	}
	for _, tt := range []struct{ csv, want string }{
		{"", "no header"},
		{"algorithm,start,time_s,limit,k\n", `no column "latency_s"`},
		{"algorithm,start,time_s,limit,latency_s,k\n", "no samples"},
		{"algorithm,start,time_s,limit,latency_s,k\ngradient,1,x,1,0.1,20\n", "line 2, column time_s"},
		{"algorithm,start,time_s,limit,latency_s,k\nvegas,1,1,1,0.1,20\n", "no run of gradient or aimd"},
	} {
		if _, err := readRuns(strings.NewReader(tt.csv)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("readRuns(%q) = %v, want an error with %q", tt.csv, err, tt.want)
		}
	}
}

// TestRun draws the synthetic CSV as an SVG.
func TestRun(t *testing.T) {
	in, svg := filepath.Join(t.TempDir(), "x.csv"), filepath.Join(t.TempDir(), "adaptive.svg")
	if err := os.WriteFile(in, []byte(syntheticCSV()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, svg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(svg)
	for _, s := range []string{"<svg", "gradient from 200", "aimd from 1", "capacity K 20 → 10, handler", "simulated time (s)"} {
		if err != nil || !strings.Contains(string(b), s) {
			t.Errorf("SVG lacks %q (%v)", s, err)
		}
	}
	if err := run("", svg); err == nil {
		t.Error("no -csv: no error")
	}
}
