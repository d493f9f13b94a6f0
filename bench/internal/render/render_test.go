package render

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

// fakeResults is a run with figures chosen to meet some targets and miss
// others.
func fakeResults() *suite.Results {
	r := &suite.Results{Variants: suite.Variants(), Plan: suite.FullPlan(), Date: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	row := func(metric string, higher bool, f suite.Format, vals map[string]float64) suite.Row {
		return suite.Row{Metric: metric, Higher: higher, Format: f, Values: vals}
	}
	g, bare, chi, xs, seed := suite.GinQueue, suite.Bare, suite.Chi, suite.XSync, suite.Seed
	r.Rows = []suite.Row{
		row(suite.MUncontendedRoute, false, suite.FormatDuration, map[string]float64{bare: 40, g: 46, chi: 90, xs: 60, seed: 5e7}),
		row(suite.MUncontendedRouteA, false, suite.FormatCount, map[string]float64{bare: 0, g: 0, chi: 0, xs: 0, seed: 3}),
		row(suite.MHandoff, true, suite.FormatRate, map[string]float64{g: 900, chi: 1000, xs: 800, seed: 40}),
		row(suite.MGrantP99, false, suite.FormatDuration, map[string]float64{g: 150e3, chi: 20e3}),
		row(suite.MOwnMemory, false, suite.FormatBytes, map[string]float64{g: 192}),
	}
	r.Rows[len(r.Rows)-1].Note = "ginqueue's Backend alone, without gin"
	r.FeatureVariants = suite.FeatureVariants(100, true)
	plain, pf, obs, ad := suite.Plain, suite.PrioFlows, suite.Observed, suite.AdaptiveCol
	r.FeatureRows = []suite.Row{
		row(suite.MFRoute, false, suite.FormatDuration, map[string]float64{plain: 100, pf: 120, obs: 120, ad: 110}),
		row(suite.MFRouteA, false, suite.FormatCount, map[string]float64{plain: 0, pf: 0, obs: 1, ad: 0}),
		row(suite.MFHandoff, true, suite.FormatRate, map[string]float64{plain: 1000, pf: 700, obs: 990, ad: 900}),
	}
	cl, fifo := suite.GoodCoDelLIFO, suite.GoodFIFO
	r.Goodput = suite.GoodputReport{Variants: suite.GoodputVariants(), Loads: suite.GoodputLoads, Rows: []suite.Row{
		row(suite.GoodputMetric(1, suite.GoodputShare), true, suite.FormatShare, map[string]float64{cl: 0.97, fifo: 0.96}),
		row(suite.GoodputMetric(5, suite.GoodputShare), true, suite.FormatShare, map[string]float64{cl: 0.934, fifo: 0.012}),
		row(suite.GoodputMetric(5, suite.GoodputP99), false, suite.FormatDuration, map[string]float64{cl: 120e6, fifo: 999e6}),
	}}
	light, heavy, all := suite.WeightedLightCol, suite.WeightedHeavyCol, suite.WeightedAllCol
	r.Weighted = suite.WeightedReport{Rows: []suite.Row{
		{Metric: suite.MWeightedOffered, Given: true, Format: suite.FormatShare, Values: map[string]float64{light: 0.35, heavy: 0.45, all: 0.8}},
		row(suite.MWeightedWaitP99, false, suite.FormatDuration, map[string]float64{light: 2e6, heavy: 5e6, all: 4e6}),
		row(suite.MWeightedMaxRunning, false, suite.FormatCount, map[string]float64{all: 8}),
	}}
	r.Weighted.Rows[2].Note = "counted by the handlers"
	r.Redis = suite.RedisReport{Measured: true, Version: "7.0.0", Rows: []suite.Row{
		row(suite.MRedisRoundTripP50, false, suite.FormatDuration, map[string]float64{suite.RedisColumn: 150e3}),
		row(suite.MRedisPairs, true, suite.FormatRate, map[string]float64{suite.RedisColumn: 12000}),
	}}
	return r
}

func TestTargets(t *testing.T) {
	want := map[string]string{
		"uncontended ns/op ≤ 1.2× bare gin (route only)":  "yes", // 1.15×
		"uncontended allocs/op = bare gin's (route only)": "yes", // 0 = 0
		"hand-off throughput ≥ 1.0× the best peer":        "no",  // 0.9× chi
		"grant latency p99 ≤ 100 µs":                      "no",
		"ginqueue's own structures ≤ 256 B per waiter":    "yes",
		"schedule efficiency ≥ the best peer's":           "not measured",
		// 1.2× and 1000/700 = 1.43× the cost of plain.
		"Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (route only)":        "yes",
		"Priority + FlowKey: saturated hand-off, time per request ≤ 1.3× plain":  "no",
		"Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (request)":           "not measured",
		"ServerTiming + promqueue: uncontended ns/op ≤ 1.15× plain (route only)": "no",
		"Adaptive: uncontended ns/op ≤ 1.2× fixed (route only)":                  "yes",
		"Adaptive: saturated hand-off, time per request ≤ 1.2× fixed":            "yes", // 1.11×
		"acquire+release round trip p50 ≤ 200 µs":                                "yes",
		"≥ 15,000 acquire+release pairs/s, 8 clients, uncontended":               "no",
		"hand-off across backends p50 ≤ 300 µs":                                  "not measured",
		"CoDel + LIFO at 5× C: goodput ≥ 90% of C":                               "yes",
		"CoDel + LIFO at 5× C: p99 of delivered ≤ 100 ms":                        "no",
		"Cost: slots running ≤ the limit (8) at every instant":                   "yes",
		"Cost: p99 queue wait of cost 4 ≤ 2× that of cost 1":                     "no", // 2.5×
	}
	seen := 0
	for _, tg := range targets(fakeResults()) {
		w, ok := want[tg.Name]
		if !ok {
			continue
		}
		seen++
		if tg.Met != w {
			t.Errorf("%s: %s, want %s (%s)", tg.Name, tg.Met, w, tg.Figure)
		}
	}
	if seen != len(want) {
		t.Errorf("found %d of %d targets", seen, len(want))
	}
}

func TestMarkdown(t *testing.T) {
	r := fakeResults()
	r.Errors = []string{"3. schedule efficiency, chi Throttle: boom"}
	var b bytes.Buffer
	if err := Markdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, s := range []string{
		"| run | 0s, 5 rounds (1 for the interval-polled queue), Go benchmarks at -benchtime 200ms |\n\n## Targets",
		"| 1a. uncontended, route only | lower | 40 ns (0.67×) | 46 ns (0.77×) | 90 ns (1.50×) | 60 ns (1.00×) |",
		"| core overhead and hand-off | hand-off throughput ≥ 1.0× the best peer | 900/s vs best peer chi Throttle 1,000/s: 0.90× | no |",
		"| priorities and fair flows | Priority + FlowKey: saturated hand-off, time per request ≤ 1.3× plain | 700/s vs plain ginqueue 1,000/s: 1.43× the cost (≤ 1.30×) | no |",
		"| Redis backend | ≥ 15,000 acquire+release pairs/s, 8 clients, uncontended | 12,000/s (at least 15,000/s) | no |",
		"| adaptive limit | Adaptive: saturated hand-off, time per request ≤ 1.2× fixed | 900/s vs plain ginqueue 1,000/s: 1.11× the cost (≤ 1.20×) | yes |",
		"|\n\n- 6. throttle's own heap per waiter: ginqueue's Backend alone, without gin.\n\nMeasurements that failed in this run:\n\n- 3. schedule efficiency, chi Throttle: boom\n\n## 10. Features",
		"| 10a. uncontended, route only | lower | 100 ns (1.00×) | 120 ns (1.20×) | 120 ns (1.20×) | 110 ns (1.10×) |",
		"| 10a. uncontended, route only: allocs | lower | 0 | 0 | 1 | 0 |",
		"| metric | better | figure |\n|---|---|---|\n| 11a. acquire+release round trip p50 | lower | 150.0 µs |",
		"(version 7.0.0)",
		"](" + ChartPath + ")",
		"waiters parked behind 4 held slots",
		"so that 10, 1,000, 100,000 requests are always queued",
		"benchstat@" + BenchstatVersion,
		"| goodput under overload | CoDel + LIFO at 5× C: goodput ≥ 90% of C | 93.4% (at least 90.0%) | yes |",
		"| 12. 5× C: goodput | higher | 1.2% | – | – | 93.4% | – | – |",
		"](" + GoodputChartPath + ")",
		"1.5s at 5×",
		"| weighted requests | Cost: p99 queue wait of cost 4 ≤ 2× that of cost 1 | 5.0 ms vs cost 1 2.0 ms: 2.50× (≤ 2.00×) | no |",
		"## 13. Weighted requests\n",
		"| 13. offered load | – | 35.0% | 45.0% | 80.0% |",
		"| 13. most slots running at once | lower | – | – | 8 |\n\n- 13. most slots running at once: counted by the handlers.\n\n## A burst",
		"make bench-weighted",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	for _, s := range []string{"<no value>", "\n\n\n"} {
		if strings.Contains(md, s) {
			t.Errorf("report has %q", s)
		}
	}
}

// TestMarkdownNoRedis: without a Redis the section says so and the Redis
// targets read "not measured".
func TestMarkdownNoRedis(t *testing.T) {
	r := fakeResults()
	r.Redis = suite.RedisReport{Why: "No Redis answered at REDIS_ADDR."}
	var b bytes.Buffer
	if err := Markdown(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"## 11. redisqueue: one limit for a fleet, on Redis\n\nNo Redis answered at REDIS_ADDR.\n\n## 12. Goodput under overload",
		"| Redis backend | acquire+release round trip p50 ≤ 200 µs | – | not measured |",
	} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

func TestTimeline(t *testing.T) {
	tl := suite.Timeline{Variant: suite.GinQueue, Events: []suite.Event{
		{Arrive: 0, Start: 0, End: 200 * time.Millisecond, Status: 204, Outcome: suite.OutcomeServed},
		{Arrive: 0, Start: -1, End: time.Millisecond, Status: 503, Outcome: suite.OutcomeFull},
		{Arrive: 0, Start: -1, End: 5 * time.Second, Status: 408, Outcome: suite.OutcomeTimeout},
	}}
	var b bytes.Buffer
	if err := Timeline(&b, []suite.Timeline{tl, tl}, "test"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "<?xml") || !strings.Contains(b.String(), "<svg") {
		t.Errorf("not an SVG: %.100q", b.String())
	}
}

// TestGoodputAlone: section 12 alone, its targets first, and the chart.
func TestGoodputAlone(t *testing.T) {
	r := fakeResults()
	var b bytes.Buffer
	if err := GoodputMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if !strings.HasPrefix(md, "| area | target | figure | met |\n|---|---|---|---|\n| goodput under overload | CoDel + LIFO at 5× C: goodput") ||
		!strings.Contains(md, "| 12. 5× C: delivered p99 | lower | 999.0 ms | – | – | 120.0 ms | – | – |") ||
		strings.Contains(md, "## Targets") || strings.Contains(md, "\n\n\n") {
		t.Errorf("section 12 alone:\n%s", md)
	}
	b.Reset()
	if err := GoodputChart(&b, r.Goodput, "test"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "<svg") || !strings.Contains(b.String(), suite.GoodCoDelLIFO) {
		t.Errorf("not a chart of CoDel + LIFO: %.100q", b.String())
	}
}

// TestWeightedAlone: section 13 alone, its targets first; a run without
// it says so.
func TestWeightedAlone(t *testing.T) {
	r := fakeResults()
	var b bytes.Buffer
	if err := WeightedMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if !strings.HasPrefix(md, "| area | target | figure | met |\n|---|---|---|---|\n| weighted requests | Cost: slots running ≤ the limit (8) at every instant | 8 (limit 8) | yes |\n") ||
		!strings.Contains(md, "| 13. queue wait p99 | lower | 2.0 ms | 5.0 ms | 4.0 ms |") ||
		strings.Contains(md, "goodput") || strings.Contains(md, "\n\n\n") {
		t.Errorf("section 13 alone:\n%s", md)
	}
	r.Weighted = suite.WeightedReport{}
	b.Reset()
	if err := Markdown(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"## 13. Weighted requests\n\n", "Not measured in this run.\n\n## A burst",
		"| weighted requests | Cost: slots running ≤ the limit (8) at every instant | – | not measured |",
	} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("report without section 13 lacks %q", s)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tt := range []struct {
		f    suite.Format
		x    float64
		want string
	}{
		{suite.FormatDuration, 41.6, "42 ns"},
		{suite.FormatDuration, 12345, "12.3 µs"},
		{suite.FormatDuration, 2.5e6, "2.5 ms"},
		{suite.FormatDuration, 5.1e9, "5.10 s"},
		{suite.FormatDuration, 999.97e6, "1.00 s"},
		{suite.FormatDuration, 999.96e3, "1.0 ms"},
		{suite.FormatRate, 1234567, "1,234,567/s"},
		{suite.FormatBytes, -820, "-820 B"},
		{suite.FormatBytes, 2576, "2,576 B"},
		{suite.FormatCount, 0.04, "0"},
		{suite.FormatRatio, 0.891, "0.89"},
		{suite.FormatRatio, math.NaN(), "–"},
		{suite.FormatShare, 0.9346, "93.5%"},
	} {
		if got := formatValue(tt.f, tt.x); got != tt.want {
			t.Errorf("formatValue(%v, %v) = %q, want %q", tt.f, tt.x, got, tt.want)
		}
	}
}
