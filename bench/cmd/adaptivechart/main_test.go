package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// syntheticCSV is two runs of a few samples each, K halving half-way, with
// one straggler that still carries the old K.
func syntheticCSV() string {
	var b strings.Builder
	b.WriteString("algorithm,start,sample,time_s,limit,latency_s,k\n")
	for _, run := range []struct {
		alg   string
		start int
	}{{"gradient", 1}, {"gradient", 200}, {"aimd", 1}} {
		for i := range 200 {
			k, limit, lat := 20, 1+i/5, 0.1
			if i >= 100 {
				k, limit, lat = 10, 12, 0.12
			}
			if i == 101 {
				k = 20
			}
			fmt.Fprintf(&b, "%s,%d,%d,%.4f,%d,%.4f,%d\n", run.alg, run.start, i, 0.1*float64(i), limit, lat, k)
		}
	}
	return b.String()
}

func TestReadRuns(t *testing.T) {
	runs, err := readRuns(strings.NewReader(syntheticCSV()))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 || len(runs[0].samples) != 200 || runs[1].start != 200 {
		t.Fatalf("runs: %d, samples %d, second start %d", len(runs), len(runs[0].samples), runs[1].start)
	}
	got := selectRuns(runs, "gradient")
	if len(got) != 2 || got[0].title() != "gradient from 200" || got[1].title() != "gradient from 1" {
		t.Errorf("selectRuns = %v, %v", got[0].title(), got[len(got)-1].title())
	}
	if _, phases := capacity(runs[0].samples); phases != "20 → 10" {
		t.Errorf("phases %q, want the straggler folded: 20 → 10", phases)
	}
	lat, tput := windowed(runs[0].samples)
	if len(lat) != 10 || len(tput) != 10 {
		t.Fatalf("%d latency and %d throughput points, want 10 each", len(lat), len(tput))
	}
	if math.Abs(lat[0].Y-100) > 1e-9 || tput[0].Y != 10 {
		t.Errorf("first window: latency %v ms, throughput %v/s, want 100 and 10", lat[0].Y, tput[0].Y)
	}
}

func TestReadRunsErrors(t *testing.T) {
	for _, tt := range []struct{ csv, want string }{
		{"", "no header"},
		{"algorithm,start,sample,time_s,limit,k\n", `no column "latency_s"`},
		{"algorithm,start,sample,time_s,limit,latency_s,k\n", "no samples"},
		{"algorithm,start,sample,time_s,limit,latency_s,k\ngradient,1,0,x,1,0.1,20\n", "line 2, column time_s"},
	} {
		if _, err := readRuns(strings.NewReader(tt.csv)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("readRuns(%q) = %v, want an error with %q", tt.csv, err, tt.want)
		}
	}
}

// TestRun draws the synthetic CSV as an SVG.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "x.csv")
	if err := os.WriteFile(in, []byte(syntheticCSV()), 0o644); err != nil {
		t.Fatal(err)
	}
	svg := filepath.Join(dir, "adaptive.svg")
	if err := run(in, svg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"<svg", "gradient from 200", "aimd from 1", "capacity K", "simulated time (s)", "20 → 10"} {
		if !strings.Contains(string(b), s) {
			t.Errorf("SVG lacks %q", s)
		}
	}
	if err := os.WriteFile(in, []byte("algorithm,start,sample,time_s,limit,latency_s,k\nvegas,1,0,1,1,0.1,20\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, svg); err == nil || !strings.Contains(err.Error(), "no run of gradient or aimd") {
		t.Errorf("unknown algorithm: %v", err)
	}
	if err := run("", svg); err == nil {
		t.Error("no -csv: no error")
	}
}
