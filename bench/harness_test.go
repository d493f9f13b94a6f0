package bench

import (
	"bytes"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func newBareWith(s *SeedQueue) (http.Handler, func()) {
	r := engine(s.Handler)
	r.GET("/", noContent)
	return r, s.Close
}

func serveOnce(h http.Handler) int {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	return w.Code
}

// TestVariantsServe: every variant serves a lone request with the handler's
// status.
func TestVariantsServe(t *testing.T) {
	for _, v := range Variants() {
		t.Run(v.ID, func(t *testing.T) {
			h, stop := v.New(UncontendedLimits, noContent)
			defer stop()
			if code := serveOnce(h); code != http.StatusNoContent {
				t.Errorf("status %d, want 204", code)
			}
		})
	}
}

// TestHarnesses runs each measurement on tiny sizes for the variants that
// do not wait for a tick, and checks that the figures are plausible.
func TestHarnesses(t *testing.T) {
	for _, v := range throttling(Variants()) {
		if v.Slow {
			continue
		}
		t.Run(v.ID, func(t *testing.T) {
			if e, err := ScheduleEfficiency(v, 16); err != nil || e <= 0 || e > 1.05 {
				t.Errorf("ScheduleEfficiency = %v, %v", e, err)
			}
			if s, err := GrantLatency(v, 3); err != nil || len(s) != 3 {
				t.Errorf("GrantLatency = %v, %v", s, err)
			}
			if s, err := TimeoutLateness(v, 3); err != nil || len(s) != 3 || slicesMin(s) < -time.Millisecond {
				t.Errorf("TimeoutLateness = %v, %v", s, err)
			}
			if heap, stack, err := MemoryPerWaiter(v, 50); err != nil || math.IsNaN(heap+stack) {
				t.Errorf("MemoryPerWaiter = %v, %v, %v", heap, stack, err)
			}
			if c, err := GrowthCost(v, 10, 20*time.Millisecond); err != nil || c <= 0 {
				t.Errorf("GrowthCost = %v, %v", c, err)
			}
			if x, err := Loopback(v, 1, 20*time.Millisecond); err != nil || x <= 0 {
				t.Errorf("Loopback = %v, %v", x, err)
			}
		})
	}
	if b, err := BackendHeapPerWaiter(50); err != nil || math.IsNaN(b) {
		t.Errorf("BackendHeapPerWaiter = %v, %v", b, err)
	}
}

func slicesMin(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = min(m, d)
	}
	return m
}

// fakeResults is a run with figures chosen to pass some bars and miss
// others.
func fakeResults() *Results {
	r := &Results{Variants: Variants(), Plan: FullPlan(), Date: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	set := func(metric string, higher bool, f Format, vals map[string]float64) {
		row := newRow(metric, "", higher, f)
		row.Values = vals
		r.Rows = append(r.Rows, row)
	}
	set(MUncontendedRoute, false, FormatDuration, map[string]float64{Bare: 40, GinQueue: 46, Chi: 90, XSync: 60, Seed: 5e7})
	set(MUncontendedRouteA, false, FormatCount, map[string]float64{Bare: 0, GinQueue: 0, Chi: 0, XSync: 0, Seed: 3})
	set(MHandoff, true, FormatRate, map[string]float64{GinQueue: 900, Chi: 1000, XSync: 800, Seed: 40})
	set(MGrantP99, false, FormatDuration, map[string]float64{GinQueue: 150e3, Chi: 20e3})
	set(MOwnMemory, false, FormatBytes, map[string]float64{GinQueue: 192})
	r.Bars = computeBars(r)
	return r
}

func TestBars(t *testing.T) {
	r := fakeResults()
	want := map[string]struct{ measured, pass bool }{
		"uncontended ns/op ≤ 1.2× bare gin (route only)":  {true, true},  // 1.15×
		"uncontended allocs/op = bare gin's (route only)": {true, true},  // 0 = 0
		"hand-off throughput ≥ 1.0× the best peer":        {true, false}, // 0.9× chi
		"grant latency p99 ≤ 100 µs":                      {true, false},
		"ginqueue's own structures ≤ 256 B per waiter":    {true, true},
		"schedule efficiency ≥ the best peer's":           {false, false},
	}
	seen := 0
	for _, b := range r.Bars {
		w, ok := want[b.Name]
		if !ok {
			continue
		}
		seen++
		if b.Measured != w.measured || b.Pass != w.pass {
			t.Errorf("%s: measured %v pass %v, want %v %v (%s)", b.Name, b.Measured, b.Pass, w.measured, w.pass, b.Figure)
		}
	}
	if seen != len(want) {
		t.Errorf("found %d of %d bars", seen, len(want))
	}
}

func TestWriteMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMarkdown(&b, fakeResults()); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, s := range []string{
		"| 1a. uncontended, route only | lower | 40 ns (0.67×) | 46 ns (0.77×) | 90 ns (1.50×) | 60 ns (1.00×) |",
		"| hand-off throughput ≥ 1.0× the best peer | 900/s vs best peer chi Throttle 1,000/s: 0.90× | no |",
		"](" + ChartPath + ")",
		"make bench",
		"benchstat@" + BenchstatVersion,
	} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

func TestWriteTimelineSVG(t *testing.T) {
	tl := Timeline{Variant: GinQueue, Events: []Event{
		{Arrive: 0, Start: 0, End: 200 * time.Millisecond, Status: 204, Outcome: OutcomeServed},
		{Arrive: 0, Start: -1, End: time.Millisecond, Status: 503, Outcome: OutcomeFull},
		{Arrive: 0, Start: -1, End: 5 * time.Second, Status: 408, Outcome: OutcomeTimeout},
	}}
	var b bytes.Buffer
	if err := WriteTimelineSVG(&b, []Timeline{tl, tl}, "test"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "<?xml") || !strings.Contains(b.String(), "<svg") {
		t.Errorf("not an SVG: %.100q", b.String())
	}
}

func TestFormat(t *testing.T) {
	for _, tt := range []struct {
		f    Format
		x    float64
		want string
	}{
		{FormatDuration, 41.6, "42 ns"},
		{FormatDuration, 12345, "12.3 µs"},
		{FormatDuration, 2.5e6, "2.5 ms"},
		{FormatDuration, 5.1e9, "5.10 s"},
		{FormatRate, 1234567, "1,234,567/s"},
		{FormatBytes, -820, "-820 B"},
		{FormatBytes, 2576, "2,576 B"},
		{FormatCount, 0.04, "0"},
		{FormatRatio, 0.891, "0.89"},
		{FormatRatio, math.NaN(), "–"},
	} {
		if got := formatValue(tt.f, tt.x); got != tt.want {
			t.Errorf("formatValue(%v, %v) = %q, want %q", tt.f, tt.x, got, tt.want)
		}
	}
}
