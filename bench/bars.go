package bench

import (
	"fmt"
	"math"
)

// value is the figure of metric for variant, if the run has one.
func (r *Results) value(metric, variant string) (float64, bool) {
	row := r.Row(metric)
	if row == nil {
		return 0, false
	}
	x, ok := row.Values[variant]
	return x, ok && !math.IsNaN(x)
}

// computeBars checks ginqueue's figures against the bars of issues 3 to 7.
// Each Figure is built from the run's own numbers.
func computeBars(r *Results) []Bar {
	bars := issue3Bars(r)
	for i := range bars {
		bars[i].Issue = 3
	}
	return append(bars, featureBars(r)...)
}

// issue3Bars compares ginqueue with bare gin and its peers.
func issue3Bars(r *Results) []Bar {
	var bars []Bar
	ratio := func(name, metric, other string, limit float64, atMost bool) {
		g, ok1 := r.value(metric, GinQueue)
		o, ok2 := r.value(metric, other)
		b := Bar{Name: name}
		if ok1 && ok2 && o > 0 {
			q := g / o
			b.Measured = true
			b.Pass = q <= limit
			op := "≤"
			if !atMost {
				b.Pass = q >= limit
				op = "≥"
			}
			b.Figure = fmt.Sprintf("%s vs %s %s: %.2f× (%s %.2f×)",
				r.format(metric, g), other, r.format(metric, o), q, op, limit)
		}
		bars = append(bars, b)
	}
	vsBest := func(name, metric string) {
		row := r.Row(metric)
		b := Bar{Name: name}
		if row != nil {
			g, ok1 := r.value(metric, GinQueue)
			peer, best, ok2 := row.Best(r.Variants)
			if ok1 && ok2 && best > 0 {
				b.Measured = true
				q := g / best
				b.Pass = q >= 1
				if !row.Higher {
					b.Pass = q <= 1
				}
				b.Figure = fmt.Sprintf("%s vs best peer %s %s: %.2f×", r.format(metric, g), peer, r.format(metric, best), q)
			}
		}
		bars = append(bars, b)
	}
	equal := func(name, metric string) {
		g, ok1 := r.value(metric, GinQueue)
		o, ok2 := r.value(metric, Bare)
		b := Bar{Name: name}
		if ok1 && ok2 {
			b.Measured = true
			b.Pass = math.Round(g) == math.Round(o)
			b.Figure = fmt.Sprintf("%s vs %s %s", r.format(metric, g), Bare, r.format(metric, o))
		}
		bars = append(bars, b)
	}
	absolute := func(name, metric string, limit float64) {
		g, ok := r.value(metric, GinQueue)
		b := Bar{Name: name}
		if ok {
			b.Measured = true
			b.Pass = g <= limit
			b.Figure = fmt.Sprintf("%s (limit %s)", r.format(metric, g), r.format(metric, limit))
		}
		bars = append(bars, b)
	}

	ratio("uncontended ns/op ≤ 1.2× bare gin (route only)", MUncontendedRoute, Bare, 1.2, true)
	equal("uncontended allocs/op = bare gin's (route only)", MUncontendedRouteA)
	ratio("uncontended ns/op ≤ 1.2× bare gin (request)", MUncontendedRequest, Bare, 1.2, true)
	equal("uncontended allocs/op = bare gin's (request)", MUncontendedRequestA)
	vsBest("hand-off throughput ≥ 1.0× the best peer", MHandoff)
	vsBest("schedule efficiency ≥ the best peer's", MSchedule)
	absolute("grant latency p99 ≤ 100 µs", MGrantP99, 100e3)
	absolute("timeout lateness p99 ≤ 1 ms", MTimeoutP99, 1e6)
	ratio("memory per queued request ≤ 1.05× x/sync", MMemory, XSync, 1.05, true)
	absolute("ginqueue's own structures ≤ 256 B per waiter", MOwnMemory, 256)
	b := Bar{Name: "loopback throughput ≥ 0.97× bare"}
	if q, ok := r.value(MLoopbackBare, GinQueue); ok {
		g, _ := r.value(MLoopback, GinQueue)
		o, _ := r.value(MLoopback, Bare)
		b.Measured, b.Pass = true, q >= 0.97
		b.Figure = fmt.Sprintf("%s vs %s %s: %.3f× per round, median (≥ 0.97×)", r.format(MLoopback, g), Bare, r.format(MLoopback, o), q)
	}
	bars = append(bars, b)
	return bars
}

// format prints x as metric's row prints its figures.
func (r *Results) format(metric string, x float64) string {
	row := r.Row(metric)
	if row == nil {
		return fmt.Sprint(x)
	}
	return formatValue(row.Format, x)
}

// costBar compares subject with base on metric: the cost ratio is
// subject/base where lower is better (time per operation) and base/subject
// where higher is better (a rate), so that 1.10× reads "10% dearer" either
// way. It passes at most limit.
func (r *Results) costBar(issue int, name, metric, subject, base string, limit float64) Bar {
	b := Bar{Issue: issue, Name: name}
	s, ok1 := r.value(metric, subject)
	o, ok2 := r.value(metric, base)
	row := r.Row(metric)
	if !ok1 || !ok2 || s <= 0 || o <= 0 || row == nil {
		return b
	}
	q := s / o
	if row.Higher {
		q = o / s
	}
	b.Measured, b.Pass = true, q <= limit
	b.Figure = fmt.Sprintf("%s vs %s %s: %.2f× the cost (≤ %.2f×)", r.format(metric, s), base, r.format(metric, o), q, limit)
	return b
}

// absoluteBar checks the figure of metric for variant against limit: at
// most limit, or at least where atLeast is set.
func (r *Results) absoluteBar(issue int, name, metric, variant string, limit float64, atLeast bool) Bar {
	b := Bar{Issue: issue, Name: name}
	x, ok := r.value(metric, variant)
	if !ok {
		return b
	}
	b.Measured, b.Pass = true, x <= limit
	word := "limit"
	if atLeast {
		b.Pass, word = x >= limit, "at least"
	}
	b.Figure = fmt.Sprintf("%s (%s %s)", r.format(metric, x), word, r.format(metric, limit))
	return b
}

// featureBars are the bars of issues 4 to 7: each feature against plain
// ginqueue measured in the same rounds, and the Redis backend's figures.
func featureBars(r *Results) []Bar {
	flows := groupDigits(r.Plan.Flows)
	bars := []Bar{
		r.costBar(4, "Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (route only)", MFRoute, PrioFlows, Plain, 1.3),
		r.costBar(4, "Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (request)", MFRequest, PrioFlows, Plain, 1.3),
		r.costBar(4, "Priority + FlowKey: saturated hand-off, time per request ≤ 1.3× plain", MFHandoff, PrioFlows, Plain, 1.3),
		r.costBar(4, "Priority + FlowKey: growth over "+flows+" flows (deepest ÷ shallowest) ≤ 1.3× plain's", MFGrowthFlat, PrioFlows, Plain, 1.3),
		r.absoluteBar(5, "acquire+release round trip p50 ≤ 200 µs", MRedisRoundTripP50, RedisColumn, 200e3, false),
		r.absoluteBar(5, "acquire+release round trip p99 ≤ 500 µs", MRedisRoundTripP99, RedisColumn, 500e3, false),
		r.absoluteBar(5, "≥ 15,000 acquire+release pairs/s, 8 clients, uncontended", MRedisPairs, RedisColumn, 15000, true),
		r.absoluteBar(5, "hand-off across backends p50 ≤ 300 µs", MRedisHandoffP50, RedisColumn, 300e3, false),
		r.costBar(6, "ServerTiming + promqueue: uncontended ns/op ≤ 1.15× plain (route only)", MFRoute, Observed, Plain, 1.15),
		r.costBar(6, "ServerTiming + promqueue: uncontended ns/op ≤ 1.15× plain (request)", MFRequest, Observed, Plain, 1.15),
		r.costBar(7, "Adaptive: uncontended ns/op ≤ 1.2× fixed (route only)", MFRoute, AdaptiveCol, Plain, 1.2),
		r.costBar(7, "Adaptive: uncontended ns/op ≤ 1.2× fixed (request)", MFRequest, AdaptiveCol, Plain, 1.2),
		r.costBar(7, "Adaptive: saturated hand-off, time per request ≤ 1.2× fixed", MFHandoff, AdaptiveCol, Plain, 1.2),
	}
	return bars
}
