// Package render turns a run of the suite into BENCHMARKS.md and its charts:
// the seed burst and goodput under overload. Every figure it prints comes from the suite's Results; the
// prose around them is report.md.tmpl.
package render

import (
	_ "embed"
	"fmt"
	"io"
	"math"
	"strings"
	"text/template"
	"time"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

// ChartPath is where the timeline chart goes, relative to the repository
// root and to BENCHMARKS.md.
const ChartPath = "docs/bench-burst.svg"

// BenchstatVersion is the benchstat the report suggests; it is not needed to
// build the report.
const BenchstatVersion = "v0.0.0-20260908200009-22c9c6c9d4da"

//go:embed report.md.tmpl
var reportTemplate string

// Markdown renders r as BENCHMARKS.md.
func Markdown(w io.Writer, r *suite.Results) error {
	return execute(w, "report", r)
}

// GoodputMarkdown renders section 12 of r alone, its targets first, as
// BENCHMARKS.md would show them: what `make bench-goodput` prints.
func GoodputMarkdown(w io.Writer, r *suite.Results) error {
	return execute(w, "goodput-alone", r)
}

// WeightedMarkdown renders section 13 of r alone, its targets first, as
// BENCHMARKS.md would show them: what `make bench-weighted` prints.
func WeightedMarkdown(w io.Writer, r *suite.Results) error {
	return execute(w, "weighted-alone", r)
}

// execute runs the template name of report.md.tmpl on r.
func execute(w io.Writer, name string, r *suite.Results) error {
	tmpl, err := template.New("report").Option("missingkey=error").
		Funcs(template.FuncMap{"digits": suite.GroupDigits}).Parse(reportTemplate)
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	if err := tmpl.ExecuteTemplate(w, name, data(r)); err != nil {
		return fmt.Errorf("render: %w", err)
	}
	return nil
}

// data is what the templates of report.md.tmpl read.
func data(r *suite.Results) map[string]any {
	var peers, depths, bursts []string
	for _, v := range r.Variants {
		if v.Peer {
			peers = append(peers, v.Name)
		}
	}
	for _, d := range r.Plan.GrowthDepths {
		depths = append(depths, suite.GroupDigits(d))
	}
	for _, t := range r.Timelines {
		bursts = append(bursts, fmt.Sprintf("%s | %d | %d | %d | %s", t.Variant, t.Count(suite.OutcomeServed),
			t.Count(suite.OutcomeFull), t.Count(suite.OutcomeTimeout), formatValue(suite.FormatDuration, float64(t.Last()))))
	}
	plain := func(row suite.Row) (float64, bool) {
		x, ok := row.Values[suite.Plain]
		return x, ok && row.Format != suite.FormatCount
	}
	ts := targets(r)
	var goodputTargets, weightedTargets []target
	for _, t := range ts {
		switch t.Area {
		case goodputArea:
			goodputTargets = append(goodputTargets, t)
		case weightedArea:
			weightedTargets = append(weightedTargets, t)
		}
	}
	return map[string]any{
		"R":       r,
		"Took":    r.Took.Round(time.Second),
		"Targets": ts, "GoodputTargets": goodputTargets, "WeightedTargets": weightedTargets,
		"Peers": strings.Join(peers, ", "),
		"Table": table(names(r.Variants), names(r.Variants), r.Rows, func(row suite.Row) (float64, bool) {
			_, x, ok := bestPeer(row, r.Variants)
			return x, ok
		}),
		"Features": table(names(r.FeatureVariants), names(r.FeatureVariants), r.FeatureRows, plain),
		"Redis":    table([]string{"figure"}, []string{suite.RedisColumn}, r.Redis.Rows, noBase),
		"Goodput":  table(names(r.Goodput.Variants), names(r.Goodput.Variants), r.Goodput.Rows, noBase),
		"Weighted": table(suite.WeightedColumns, suite.WeightedColumns, r.Weighted.Rows, noBase),
		"Bursts":   bursts,
		"Depths":   strings.Join(depths, ", "),

		"ChartPath": ChartPath, "BenchstatVersion": BenchstatVersion, "DefaultRedisAddr": suite.DefaultRedisAddr,
		"Seed": suite.Seed, "SeedAsWritten": suite.SeedAsWritten,
		"Uncontended": suite.UncontendedLimits, "Handoff": suite.HandoffLimits,
		"AdaptiveMin": max(1, suite.UncontendedLimits.MaxConcurrent/2), "AdaptiveMax": 2 * suite.UncontendedLimits.MaxConcurrent,
		"HandoffGoroutines": suite.HandoffGoroutines, "HandoffWork": suite.HandoffWork,
		"ScheduleSlots": suite.ScheduleSlots, "ScheduleWork": suite.ScheduleWork, "GrantWork": suite.GrantWork,
		"TimeoutSlots": suite.TimeoutSlots, "TimeoutPrecision": suite.TimeoutPrecisionTimeout,
		"MemorySlots": suite.MemorySlots, "GrowthSlots": suite.GrowthSlots, "ScrapeInterval": suite.ScrapeInterval,
		"BurstRequests": suite.BurstRequests, "BurstSlots": suite.BurstSlots, "BurstQueue": suite.BurstQueue,
		"RedisClients":     suite.RedisClients,
		"GoodputChartPath": GoodputChartPath, "GoodputWarmUps": goodputWarmUps(r.Plan),
		"GoodputSlots": suite.GoodputSlots, "GoodputWork": suite.GoodputWork, "GoodputCapacity": suite.GoodputCapacity,
		"GoodputPatience": suite.GoodputPatience, "GoodputLimits": suite.GoodputLimits, "GoodputLoads": suite.GoodputLoads, "GoodputIdleConns": suite.GoodputIdleConns,
		"WeightedSlots": suite.WeightedSlots, "WeightedWork": suite.WeightedWork, "WeightedHeavy": suite.WeightedHeavy,
		"WeightedHeavyPercent": fmt.Sprintf("%.0f%%", 100*suite.WeightedHeavyShare), "WeightedLightPercent": fmt.Sprintf("%.0f%%", 100*(1-suite.WeightedHeavyShare)),
		"WeightedLoad": fmt.Sprintf("%.0f%%", 100*suite.WeightedLoad), "WeightedSlotCapacity": suite.WeightedSlotCapacity, "WeightedLimits": suite.WeightedLimits,
	}
}

// noBase gives a table no ratios in brackets.
func noBase(suite.Row) (float64, bool) { return 0, false }

func names(vs []suite.Variant) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.Name
	}
	return out
}

// table renders rows as a markdown table with a column per key of cols,
// headed heads. Where base gives a positive figure, each cell shows its
// ratio to it in brackets.
func table(heads, cols []string, rows []suite.Row, base func(suite.Row) (float64, bool)) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| metric | better | %s |\n|---|---|%s\n", strings.Join(heads, " | "), strings.Repeat("---|", len(heads)))
	for _, row := range rows {
		metric, better := row.Metric, "lower"
		if row.Unit != "" {
			metric += " (" + row.Unit + ")"
		}
		switch {
		case row.Given:
			better = "–"
		case row.Higher:
			better = "higher"
		}
		fmt.Fprintf(&b, "| %s | %s |", metric, better)
		d, hasBase := base(row)
		for _, c := range cols {
			cell := "–"
			if x, ok := row.Values[c]; ok && !math.IsNaN(x) {
				cell = formatValue(row.Format, x)
				if hasBase && d > 0 {
					cell += fmt.Sprintf(" (%.2f×)", x/d)
				}
			}
			b.WriteString(" " + cell + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// bestPeer is the peer of vs with the best figure of row, and the figure;
// ok is false when no peer has one.
func bestPeer(row suite.Row, vs []suite.Variant) (name string, value float64, ok bool) {
	for _, v := range vs {
		x, has := row.Values[v.Name]
		if !v.Peer || !has || math.IsNaN(x) {
			continue
		}
		if !ok || (row.Higher && x > value) || (!row.Higher && x < value) {
			name, value, ok = v.Name, x, true
		}
	}
	return name, value, ok
}
