package render

import (
	"fmt"
	"math"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

// target is one figure ginqueue is held to, checked against a run.
type target struct {
	Area, Name string
	Figure     string // the figures compared, with the comparison; – when missing
	Met        string // yes, no, or not measured
}

// comparison is how a target compares subject's figure on its metric.
type comparison int

const (
	ratio    comparison = iota // subject over base at most limit
	cost                       // subject's cost over base's at most limit (see check)
	equal                      // subject rounds to base
	best                       // subject at least as good as the best peer
	atMost                     // subject at most limit
	atLeast                    // subject at least limit
	perRound                   // the median per-round ratio to bare gin over loopback at least limit
)

// spec is a target before it is checked: the figures it compares, and how.
type spec struct {
	area, name, metric, subject, base string
	kind                              comparison
	limit                             float64
}

// goodputArea is the area of section 12's targets.
const goodputArea = "goodput under overload"

// weightedArea is the area of section 13's targets.
const weightedArea = "weighted requests"

// targets checks a run against every target, in the table's order. Each
// Figure is built from the run's own numbers.
func targets(r *suite.Results) []target {
	const (
		core     = "core overhead and hand-off"
		prio     = "priorities and fair flows"
		redis    = "Redis backend"
		observed = "observability"
		adaptive = "adaptive limit"
		goodput  = goodputArea
		weighted = weightedArea
	)
	g, bare, pf, obs, ad, plain, rq := suite.GinQueue, suite.Bare, suite.PrioFlows, suite.Observed, suite.AdaptiveCol, suite.Plain, suite.RedisColumn
	specs := []spec{
		{core, "uncontended ns/op ≤ 1.2× bare gin (route only)", suite.MUncontendedRoute, g, bare, ratio, 1.2},
		{core, "uncontended allocs/op = bare gin's (route only)", suite.MUncontendedRouteA, g, bare, equal, 0},
		{core, "uncontended ns/op ≤ 1.2× bare gin (request)", suite.MUncontendedRequest, g, bare, ratio, 1.2},
		{core, "uncontended allocs/op = bare gin's (request)", suite.MUncontendedRequestA, g, bare, equal, 0},
		{core, "hand-off throughput ≥ 1.0× the best peer", suite.MHandoff, g, "", best, 0},
		{core, "schedule efficiency ≥ the best peer's", suite.MSchedule, g, "", best, 0},
		{core, "grant latency p99 ≤ 100 µs", suite.MGrantP99, g, "", atMost, 100e3},
		{core, "timeout lateness p99 ≤ 1 ms", suite.MTimeoutP99, g, "", atMost, 1e6},
		{core, "memory per queued request ≤ 1.05× x/sync", suite.MMemory, g, suite.XSync, ratio, 1.05},
		{core, "ginqueue's own structures ≤ 256 B per waiter", suite.MOwnMemory, g, "", atMost, 256},
		{core, "loopback throughput ≥ 0.97× bare", suite.MLoopback, g, bare, perRound, 0.97},
		{prio, "Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (route only)", suite.MFRoute, pf, plain, cost, 1.3},
		{prio, "Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (request)", suite.MFRequest, pf, plain, cost, 1.3},
		{prio, "Priority + FlowKey: saturated hand-off, time per request ≤ 1.3× plain", suite.MFHandoff, pf, plain, cost, 1.3},
		{prio, "Priority + FlowKey: growth over " + suite.GroupDigits(r.Plan.Flows) + " flows (deepest ÷ shallowest) ≤ 1.3× plain's", suite.MFGrowthFlat, pf, plain, cost, 1.3},
		{redis, "acquire+release round trip p50 ≤ 200 µs", suite.MRedisRoundTripP50, rq, "", atMost, 200e3},
		{redis, "acquire+release round trip p99 ≤ 500 µs", suite.MRedisRoundTripP99, rq, "", atMost, 500e3},
		{redis, "≥ 15,000 acquire+release pairs/s, 8 clients, uncontended", suite.MRedisPairs, rq, "", atLeast, 15000},
		{redis, "hand-off across backends p50 ≤ 300 µs", suite.MRedisHandoffP50, rq, "", atMost, 300e3},
		{observed, "ServerTiming + promqueue: uncontended ns/op ≤ 1.15× plain (route only)", suite.MFRoute, obs, plain, cost, 1.15},
		{observed, "ServerTiming + promqueue: uncontended ns/op ≤ 1.15× plain (request)", suite.MFRequest, obs, plain, cost, 1.15},
		{adaptive, "Adaptive: uncontended ns/op ≤ 1.2× fixed (route only)", suite.MFRoute, ad, plain, cost, 1.2},
		{adaptive, "Adaptive: uncontended ns/op ≤ 1.2× fixed (request)", suite.MFRequest, ad, plain, cost, 1.2},
		{adaptive, "Adaptive: saturated hand-off, time per request ≤ 1.2× fixed", suite.MFHandoff, ad, plain, cost, 1.2},
		{goodput, "CoDel + LIFO at 5× C: goodput ≥ 90% of C", suite.GoodputMetric(5, suite.GoodputShare), suite.GoodCoDelLIFO, "", atLeast, 0.9},
		{goodput, "CoDel + LIFO at 5× C: p99 of delivered ≤ 100 ms", suite.GoodputMetric(5, suite.GoodputP99), suite.GoodCoDelLIFO, "", atMost, 100e6},
		{weighted, fmt.Sprintf("Cost: slots running ≤ the limit (%d) at every instant", suite.WeightedSlots), suite.MWeightedMaxRunning, suite.WeightedAllCol, "", atMost, suite.WeightedSlots},
		{weighted, "Cost: p99 queue wait of cost 4 ≤ 2× that of cost 1", suite.MWeightedWaitP99, suite.WeightedHeavyCol, suite.WeightedLightCol, ratio, 2},
	}
	ts := make([]target, len(specs))
	for i, s := range specs {
		fig, pass := check(r, s)
		ts[i] = target{Area: s.area, Name: s.name, Figure: fig, Met: "no"}
		switch {
		case fig == "":
			ts[i].Figure, ts[i].Met = "–", "not measured"
		case pass:
			ts[i].Met = "yes"
		}
	}
	return ts
}

// check compares the figures s names and says whether they meet it; the
// figure is empty when those figures are missing. A cost is subject/base
// where lower is better (time per operation) and base/subject where higher
// is better (a rate), so that 1.10× reads "10% dearer" either way.
func check(r *suite.Results, s spec) (figure string, pass bool) {
	x, ok := value(r, s.metric, s.subject)
	if !ok {
		return "", false
	}
	y, okBase := value(r, s.metric, s.base)
	row := r.Row(s.metric)
	f := func(x float64) string { return formatValue(row.Format, x) }
	switch s.kind {
	case ratio:
		if q := x / y; okBase && y > 0 {
			return fmt.Sprintf("%s vs %s %s: %.2f× (≤ %.2f×)", f(x), s.base, f(y), q, s.limit), q <= s.limit
		}
	case cost:
		if q := x / y; okBase && x > 0 && y > 0 {
			if row.Higher {
				q = y / x
			}
			return fmt.Sprintf("%s vs %s %s: %.2f× the cost (≤ %.2f×)", f(x), s.base, f(y), q, s.limit), q <= s.limit
		}
	case equal:
		if okBase {
			return fmt.Sprintf("%s vs %s %s", f(x), s.base, f(y)), math.Round(x) == math.Round(y)
		}
	case best:
		if peer, b, ok := bestPeer(*row, r.Variants); ok && b > 0 {
			q := x / b
			return fmt.Sprintf("%s vs best peer %s %s: %.2f×", f(x), peer, f(b), q), (row.Higher && q >= 1) || (!row.Higher && q <= 1)
		}
	case atMost:
		return fmt.Sprintf("%s (limit %s)", f(x), f(s.limit)), x <= s.limit
	case atLeast:
		return fmt.Sprintf("%s (at least %s)", f(x), f(s.limit)), x >= s.limit
	case perRound:
		if q, ok := value(r, suite.MLoopbackBare, s.subject); ok {
			return fmt.Sprintf("%s vs %s %s: %.3f× per round, median (≥ %.2f×)", f(x), s.base, f(y), q, s.limit), q >= s.limit
		}
	}
	return "", false
}

// value is the figure of metric for variant, if the run has one.
func value(r *suite.Results, metric, variant string) (float64, bool) {
	row := r.Row(metric)
	if row == nil {
		return 0, false
	}
	x, ok := row.Values[variant]
	return x, ok && !math.IsNaN(x)
}
