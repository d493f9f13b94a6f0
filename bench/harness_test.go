package bench

import (
	"bytes"
	"fmt"
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

// TestFeatureVariants: every feature variant serves a lone request, the
// metrics variant with its Server-Timing header, and the feature variants
// go through the growth harness with their flows and priorities.
func TestFeatureVariants(t *testing.T) {
	for _, spread := range []bool{true, false} {
		for _, v := range FeatureVariants(10, spread) {
			t.Run(fmt.Sprintf("%s/spread=%v", v.ID, spread), func(t *testing.T) {
				h, stop := v.New(HandoffLimits, noContent)
				defer stop()
				w := httptest.NewRecorder()
				h.ServeHTTP(w, v.request(3, 4))
				if w.Code != http.StatusNoContent {
					t.Errorf("status %d, want 204", w.Code)
				}
				if st := w.Header().Get("Server-Timing"); (v.Name == Observed) != (st != "") {
					t.Errorf("Server-Timing %q", st)
				}
				if c, err := GrowthCost(v, 10, 20*time.Millisecond); err != nil || c <= 0 {
					t.Errorf("GrowthCost = %v, %v", c, err)
				}
			})
		}
	}
}

// TestFeatureRequest: client c is flow c mod flows, and its requests cycle
// through the priorities.
func TestFeatureRequest(t *testing.T) {
	v := FeatureVariants(10, true)[1]
	rs := v.requests(13)
	if len(rs) != priorityClasses {
		t.Fatalf("%d requests, want %d", len(rs), priorityClasses)
	}
	for i, r := range rs {
		if f, p := r.Header.Get(headerFlow), r.Header.Get(headerPriority); f != "3" || p != fmt.Sprint(i) {
			t.Errorf("request %d: flow %q priority %q, want 3 and %d", i, f, p, i)
		}
	}
	if n := len(Variants()[1].requests(0)); n != 1 {
		t.Errorf("a table variant cycles through %d requests, want 1", n)
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
	r.FeatureVariants = FeatureVariants(100, true)
	feature := func(metric string, higher bool, f Format, vals map[string]float64) {
		row := newRow(metric, "", higher, f)
		row.Values = vals
		r.FeatureRows = append(r.FeatureRows, row)
	}
	feature(MFRoute, false, FormatDuration, map[string]float64{Plain: 100, PrioFlows: 120, Observed: 120, AdaptiveCol: 110})
	feature(MFRouteA, false, FormatCount, map[string]float64{Plain: 0, PrioFlows: 0, Observed: 1, AdaptiveCol: 0})
	feature(MFHandoff, true, FormatRate, map[string]float64{Plain: 1000, PrioFlows: 700, Observed: 990, AdaptiveCol: 900})
	r.Redis = RedisReport{Measured: true, Version: "7.0.0", Rows: []Row{
		{Metric: MRedisRoundTripP50, Format: FormatDuration, Values: map[string]float64{RedisColumn: 150e3}},
		{Metric: MRedisPairs, Format: FormatRate, Higher: true, Values: map[string]float64{RedisColumn: 12000}},
	}}
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
		// 1.2× and 1000/700 = 1.43× the cost of plain.
		"Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (route only)":        {true, true},
		"Priority + FlowKey: saturated hand-off, time per request ≤ 1.3× plain":  {true, false},
		"Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (request)":           {false, false},
		"ServerTiming + promqueue: uncontended ns/op ≤ 1.15× plain (route only)": {true, false},
		"Adaptive: uncontended ns/op ≤ 1.2× fixed (route only)":                  {true, true},
		"Adaptive: saturated hand-off, time per request ≤ 1.2× fixed":            {true, true}, // 1.11×
		"acquire+release round trip p50 ≤ 200 µs":                                {true, true},
		"≥ 15,000 acquire+release pairs/s, 8 clients, uncontended":               {true, false},
		"hand-off across backends p50 ≤ 300 µs":                                  {false, false},
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
		"| 3 | hand-off throughput ≥ 1.0× the best peer | 900/s vs best peer chi Throttle 1,000/s: 0.90× | no |",
		"| 4 | Priority + FlowKey: saturated hand-off, time per request ≤ 1.3× plain | 700/s vs plain ginqueue 1,000/s: 1.43× the cost (≤ 1.30×) | no |",
		"| 5 | ≥ 15,000 acquire+release pairs/s, 8 clients, uncontended | 12,000/s (at least 15,000/s) | no |",
		"| 10a. uncontended, route only | lower | 100 ns (1.00×) | 120 ns (1.20×) | 120 ns (1.20×) | 110 ns (1.10×) |",
		"| 10a. uncontended, route only: allocs | lower | 0 | 0 | 1 | 0 |",
		"| 11a. acquire+release round trip p50 | lower | 150.0 µs |",
		"(version 7.0.0)",
		"](" + ChartPath + ")",
		"make bench",
		"benchstat@" + BenchstatVersion,
	} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

// TestWriteMarkdownNoRedis: without a Redis the section says so and the
// Redis bars read "not measured".
func TestWriteMarkdownNoRedis(t *testing.T) {
	r := fakeResults()
	r.Redis = RedisReport{Why: "No Redis answered at REDIS_ADDR."}
	r.Bars = computeBars(r)
	var b bytes.Buffer
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"## 11. redisqueue: one limit for a fleet, on Redis\n\nNo Redis answered at REDIS_ADDR.\n",
		"| 5 | acquire+release round trip p50 ≤ 200 µs | – | not measured |",
	} {
		if !strings.Contains(b.String(), s) {
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
