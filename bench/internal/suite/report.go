package suite

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// format prints x as f says.
func format(f Format, x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "–"
	}
	switch a := math.Abs(x); f {
	case FormatDuration: // each unit up to the figure that would round to 1,000 of it
		switch {
		case a < 999.5:
			return fmt.Sprintf("%.0f ns", x)
		case a < 999.95e3:
			return fmt.Sprintf("%.1f µs", x/1e3)
		case a < 999.95e6:
			return fmt.Sprintf("%.1f ms", x/1e6)
		}
		return fmt.Sprintf("%.2f s", x/1e9)
	case FormatCount:
		return strconv.FormatFloat(math.Round(x*10)/10, 'f', -1, 64)
	case FormatRate:
		return digits(int(math.Round(x))) + "/s"
	case FormatBytes:
		return digits(int(math.Round(x))) + " B"
	case FormatShare:
		return fmt.Sprintf("%.1f%%", 100*x)
	case FormatSmall:
		if a == 0 || a >= 100 {
			return fmt.Sprintf("%.0f", x)
		}
		return strconv.FormatFloat(x, 'f', 2-int(math.Floor(math.Log10(a))), 64)
	}
	return fmt.Sprintf("%.2f", x)
}

// bestPeer is the peer column of row with the best figure, and the figure.
func bestPeer(row Row) (name string, best float64) {
	for _, p := range []string{Chi, XSync, Seed} {
		if x, ok := row.Values[p]; ok && (name == "" || (row.Higher && x > best) || (!row.Higher && x < best)) {
			name, best = p, x
		}
	}
	return name, best
}

// mdTable renders a Markdown table: the header, then a line of cells per row.
func mdTable(header []string, rows [][]string) string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(header, " | ") + " |\n|" + strings.Repeat("---|", len(header)) + "\n")
	for _, cells := range rows {
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	return b.String()
}

// cell prints row's figure in column col, or "–" where it has none.
func cell(row Row, col string) string {
	if x, ok := row.Values[col]; ok {
		return format(row.Format, x)
	}
	return "–"
}

// markdown renders t; where base gives a row a positive figure, each cell
// shows its ratio to it in brackets.
func markdown(t Table, base func(Row) float64) string {
	var rows [][]string
	for _, row := range t.Rows {
		better := map[bool]string{false: "lower", true: "higher"}[row.Higher]
		if row.Given {
			better = "–"
		}
		cells := []string{label(row), better}
		for _, c := range t.Cols {
			x, ok := row.Values[c]
			if d := base(row); ok && d > 0 {
				cells = append(cells, cell(row, c)+fmt.Sprintf(" (%.2f×)", x/d))
			} else {
				cells = append(cells, cell(row, c))
			}
		}
		rows = append(rows, cells)
	}
	return mdTable(append([]string{"metric", "better"}, t.Cols...), rows)
}

// label is a row's metric and, in brackets, its unit.
func label(row Row) string {
	if row.Unit == "" {
		return row.Metric
	}
	return row.Metric + " (" + row.Unit + ")"
}

// byColumn renders t turned over: a row per column of t, headed corner.
func byColumn(t Table, corner string) string {
	header, rows := []string{corner}, make([][]string, len(t.Cols))
	for _, row := range t.Rows {
		header = append(header, label(row))
	}
	for i, c := range t.Cols {
		rows[i] = []string{c}
		for _, row := range t.Rows {
			rows[i] = append(rows[i], cell(row, c))
		}
	}
	return mdTable(header, rows)
}

// summary is ginqueue beside its peers: rows copied from the sections, as
// naming the column that stands for ginqueue.
func summary(r *Results) Table {
	t := Table{Cols: []string{GinQueue, Chi, XSync, Seed, Bare}}
	for _, s := range []struct{ label, metric, as string }{
		{"overhead per request, the route alone (1a)", "1a. uncontended, route only", GinQueue},
		{"overhead per request, with its request and recorder (1b)", "1b. uncontended, request", GinQueue},
		{"hand-off throughput, 32 goroutines over 4 slots (2)", "2. saturated hand-off", GinQueue},
		{"memory per queued request, heap and stack (6)", "6. memory per queued request", GinQueue},
		{"loopback HTTP throughput, limits not reached (8)", "8. loopback HTTP", GinQueue},
		{"goodput at 5× capacity, share of capacity; ginqueue: CoDel + LIFO (12)", goodputMetric(5, "goodput"), GoodCoDelLIFO},
		{"p99 of what was delivered at 5× capacity; ginqueue: CoDel + LIFO (12)", goodputMetric(5, "delivered p99"), GoodCoDelLIFO},
		{"fleet: acquire+release round trip p50 on Redis; ginqueue: redisqueue (11)", "11a. acquire+release round trip p50", redisCol},
		{"fleet: acquire+release round trip p99 (11)", "11a. acquire+release round trip p99", redisCol},
		{fmt.Sprintf("fleet: acquire+release pairs, %d clients (11)", r.RedisClients), fmt.Sprintf("11b. acquire+release pairs, %d clients, uncontended", r.RedisClients), redisCol},
		{"fleet: hand-off across backends p50 (11)", "11c. hand-off across backends p50", redisCol},
	} {
		row := Row{Metric: s.label, Values: map[string]float64{}}
		if src := r.Row(s.metric); src != nil {
			row.Higher, row.Format = src.Higher, src.Format
			for _, c := range t.Cols[1:] {
				if x, ok := src.Values[c]; ok {
					row.Values[c] = x
				}
			}
			if x, ok := src.Values[s.as]; ok {
				row.Values[GinQueue] = x
			}
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// Block is one generated part of BENCHMARKS.md: the Markdown between the
// lines <!-- bench:Name --> and <!-- /bench:Name -->.
type Block struct{ Name, Text string }

// Blocks renders what r measured: every section of a full run, or the one
// named only.
func Blocks(r *Results, only string) []Block {
	all := targets(r)
	var area, fleet []target
	for _, t := range all {
		if t.Area == only {
			area = append(area, t)
		}
		if t.Area == "fleet" {
			fleet = append(fleet, t)
		}
	}
	switch only {
	case "":
	case "fleet-scale":
		return []Block{{"scale", scaleBlock(r)}}
	case "fleet":
		return []Block{{"fleet", fleetBlock(r, fleet)}}
	default:
		b := map[string]Block{"goodput": {"goodput", markdown(r.Goodput, none)}, "weighted": {"weighted", weightedBlock(r)}}[only]
		return []Block{{"targets", targetTable(area)}, b}
	}
	peer := func(row Row) float64 { _, x := bestPeer(row); return x }
	plain := func(row Row) float64 { return map[bool]float64{true: row.Values[Plain]}[row.Format != FormatCount] }
	bs := []Block{
		{"run", runTable(r)}, {"summary", markdown(summary(r), peer)}, {"targets", targetTable(all)},
		{"results", markdown(r.Main, peer) + notes(r.Main) + failures(r)}, {"features", markdown(r.Features, plain)},
		{"redis", redisBlock(r)}, {"goodput", markdown(r.Goodput, none)}, {"weighted", weightedBlock(r)},
		{"fleet", fleetBlock(r, fleet)}, {"burst", burstTable(r)},
	}
	if r.FleetScale.Sizes != nil || r.FleetScale.Why != "" { // a smoke run measures section 15 too
		bs = append(bs, Block{"scale", scaleBlock(r)})
	}
	return bs
}

func none(Row) float64 { return 0 }

// Failed says why r's blocks should not replace those of BENCHMARKS.md: a
// measurement failed or was interrupted, or section 15 could not run.
func (r *Results) Failed() error {
	switch {
	case len(r.Errors) > 0:
		return fmt.Errorf("%d measurements failed, the first: %s", len(r.Errors), r.Errors[0])
	case r.FleetScale.Why != "":
		return errors.New(r.FleetScale.Why)
	}
	return nil
}

// Fill puts each block into md between its marker lines. Each marker must
// be a whole line of its own, once in md, the end after the begin; a block
// whose text holds a marker is refused.
func Fill(md []byte, blocks []Block) ([]byte, error) {
	for _, b := range blocks {
		if holdsMarker(b.Text) {
			return nil, fmt.Errorf("block %s holds a marker line (<!-- bench: or <!-- /bench:)", b.Name)
		}
		_, i, err := markerLine(md, "<!-- bench:"+b.Name+" -->")
		if err != nil {
			return nil, err
		}
		j, _, err := markerLine(md, "<!-- /bench:"+b.Name+" -->")
		if err != nil {
			return nil, err
		}
		if j < i {
			return nil, fmt.Errorf("the line <!-- /bench:%s --> comes before <!-- bench:%s -->", b.Name, b.Name)
		}
		if holdsMarker(string(md[i:j])) {
			return nil, fmt.Errorf("block %s encloses another block's marker", b.Name)
		}
		text := b.Text
		if text != "" && !strings.HasSuffix(text, "\n") {
			text += "\n" // the end marker stays a line of its own
		}
		md = slices.Concat(md[:i], []byte(text), md[j:])
	}
	return md, nil
}

// holdsMarker reports whether s holds the start of a marker line.
func holdsMarker(s string) bool {
	return strings.Contains(s, "<!-- bench:") || strings.Contains(s, "<!-- /bench:")
}

// markerLine finds the one line of md that is marker: where it starts, and
// where the next line does.
func markerLine(md []byte, marker string) (start, next int, err error) {
	found := 0
	for off := 0; off < len(md); {
		eol := len(md)
		if k := bytes.IndexByte(md[off:], '\n'); k >= 0 {
			eol = off + k + 1
		}
		if string(bytes.TrimRight(md[off:eol], "\r\n")) == marker {
			start, next, found = off, eol, found+1
		}
		off = eol
	}
	if found != 1 {
		return 0, 0, fmt.Errorf("%d lines %q, want exactly one", found, marker)
	}
	return start, next, nil
}

// runTable says when, where and how long the run was.
func runTable(r *Results) string {
	rows := [][]string{{"date", r.Date.Format("2006-01-02 15:04 MST")}, {"CPU", r.CPU},
		{"cores", fmt.Sprintf("%d (GOMAXPROCS %d)", r.Cores, r.GOMAXPROCS)}, {"Go", r.GoVersion}}
	if r.LoadBefore != "" {
		rows = append(rows, []string{"load average", r.LoadBefore + " at the start, " + r.LoadAfter + " at the end (other work on a shared machine adds noise)"})
	}
	rows = append(rows, []string{"run", fmt.Sprintf("%v, %d rounds (%d for the interval-polled queue), Go benchmarks at -benchtime %s",
		r.Took.Round(time.Second), r.Rounds, r.SlowRounds, r.BenchTime)})
	return mdTable([]string{"", ""}, rows)
}

// notes lists the notes of t's rows.
func notes(t Table) (s string) {
	for _, row := range t.Rows {
		if row.Note != "" {
			s += "\n- " + row.Metric + ": " + row.Note + ".\n"
		}
	}
	return s
}

// failures lists the measurements that failed, if any did.
func failures(r *Results) string {
	if len(r.Errors) == 0 {
		return ""
	}
	return "\nMeasurements that failed in this run:\n\n- " + strings.Join(r.Errors, "\n- ") + "\n"
}

// targetTable renders targets as a table.
func targetTable(ts []target) string {
	rows := make([][]string, len(ts))
	for i, t := range ts {
		rows[i] = []string{t.Area, t.Name, t.Figure, t.Met}
	}
	return mdTable([]string{"area", "target", "figure", "met"}, rows)
}

// redisBlock is section 11's table, or why it was not measured.
func redisBlock(r *Results) string {
	switch {
	case r.RedisWhy != "":
		return r.RedisWhy + "\n"
	case len(r.Redis.Rows) == 0:
		return "Not measured in this run.\n"
	}
	return "Redis " + r.RedisVersion + ".\n\n" + markdown(r.Redis, none)
}

func weightedBlock(r *Results) string {
	if len(r.Weighted.Rows) == 0 {
		return "Not measured in this run.\n"
	}
	return markdown(r.Weighted, none) + notes(r.Weighted)
}

// fleetBlock is section 14's table and targets, and why a way is missing.
func fleetBlock(r *Results, ts []target) string {
	if len(r.Fleet.Rows) == 0 {
		return "Not measured in this run.\n"
	}
	s := byColumn(r.Fleet, "way") + "\n" + targetTable(ts)
	if r.FleetWhy != "" {
		s += "\n" + r.FleetWhy + "\n"
	}
	return s
}

// burstTable is how each variant answered the burst.
func burstTable(r *Results) string {
	var rows [][]string
	for _, t := range r.Timelines {
		rows = append(rows, []string{t.Variant, strconv.Itoa(t.Count(OutcomeServed)), strconv.Itoa(t.Count(OutcomeFull)),
			strconv.Itoa(t.Count(OutcomeTimeout)), format(FormatDuration, float64(t.Last()))})
	}
	return mdTable([]string{"variant", "served", "refused at once", "timed out", "last response"}, rows)
}

// target is one figure ginqueue is held to, checked against a run.
type target struct {
	Area, Name, Figure, Met string // Met: yes, no, or not measured
}

// targets checks a run against every target; each figure is the run's own.
func targets(r *Results) []target {
	const core, prio, obs, ad, rq = "core overhead and hand-off", "priorities and fair flows", "observability", "adaptive limit", "Redis backend"
	// The kinds of comparison; cost compares times, or a rate's inverse.
	const ratio, cost, equal, best, atMost, atLeast, perRound, ratioAtLeast = 0, 1, 2, 3, 4, 5, 6, 7
	g, bare, pf, plain, heavy := GinQueue, Bare, PrioFlows, Plain, fmt.Sprintf("cost %d", r.WeightedHeavy)
	specs := []struct {
		area, name, metric, subject, base string
		kind                              int
		limit                             float64
	}{
		{core, "uncontended allocs/op = bare gin's (route only)", "1a. uncontended, route only: allocs", g, bare, equal, 0},
		{core, "uncontended ns/op ≤ 1.2× bare gin (request)", "1b. uncontended, request", g, bare, ratio, 1.2},
		{core, "uncontended allocs/op = bare gin's (request)", "1b. uncontended, request: allocs", g, bare, equal, 0},
		{core, "hand-off throughput ≥ 1.0× the best peer", "2. saturated hand-off", g, "", best, 0},
		{core, "schedule efficiency ≥ the best peer's", "3. schedule efficiency", g, "", best, 0},
		{core, "grant latency p99 ≤ 100 µs", "4. grant latency p99", g, "", atMost, 100e3},
		{core, "timeout lateness p99 ≤ 1 ms", "5. timeout lateness p99", g, "", atMost, 1e6},
		{core, "memory per queued request ≤ 1.05× x/sync", "6. memory per queued request", g, XSync, ratio, 1.05},
		{core, "ginqueue's own structures ≤ 256 B per waiter", "6. throttle's own heap per waiter", g, "", atMost, 256},
		{core, "loopback throughput ≥ 0.97× bare", "8. loopback HTTP", g, bare, perRound, 0.97},
		{prio, "Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (route only)", "10a. uncontended, route only", pf, plain, cost, 1.3},
		{prio, "Priority + FlowKey: uncontended ns/op ≤ 1.3× plain (request)", "10b. uncontended, request", pf, plain, cost, 1.3},
		{prio, "Priority + FlowKey: saturated hand-off, time per request ≤ 1.3× plain", "10c. saturated hand-off", pf, plain, cost, 1.3},
		{prio, "Priority + FlowKey: growth over " + digits(r.Flows) + " flows (deepest ÷ shallowest) ≤ 1.3× plain's", "10d. growth over flows, deepest / shallowest", pf, plain, cost, 1.3},
		{obs, "ServerTiming + promqueue: uncontended ns/op ≤ 1.15× plain (route only)", "10a. uncontended, route only", Observed, plain, cost, 1.15},
		{obs, "ServerTiming + promqueue: uncontended ns/op ≤ 1.15× plain (request)", "10b. uncontended, request", Observed, plain, cost, 1.15},
		{obs, "otelqueue metrics + span events, no span: uncontended ns/op ≤ 1.05× plain (request)", "10b. uncontended, request", OTel, plain, cost, 1.05},
		{ad, "Adaptive: uncontended ns/op ≤ 1.2× fixed (route only)", "10a. uncontended, route only", AdaptiveCol, plain, cost, 1.2},
		{ad, "Adaptive: uncontended ns/op ≤ 1.2× fixed (request)", "10b. uncontended, request", AdaptiveCol, plain, cost, 1.2},
		{ad, "Adaptive: saturated hand-off, time per request ≤ 1.2× fixed", "10c. saturated hand-off", AdaptiveCol, plain, cost, 1.2},
		{rq, "acquire+release round trip p50 ≤ 200 µs", "11a. acquire+release round trip p50", redisCol, "", atMost, 200e3},
		{rq, "acquire+release round trip p99 ≤ 500 µs", "11a. acquire+release round trip p99", redisCol, "", atMost, 500e3},
		{rq, fmt.Sprintf("≥ 15,000 acquire+release pairs/s, %d clients, uncontended", r.RedisClients), fmt.Sprintf("11b. acquire+release pairs, %d clients, uncontended", r.RedisClients), redisCol, "", atLeast, 15000},
		{rq, "hand-off across backends p50 ≤ 300 µs", "11c. hand-off across backends p50", redisCol, "", atMost, 300e3},
		{"goodput", "CoDel + LIFO at 5× C: goodput ≥ 90% of C", goodputMetric(5, "goodput"), GoodCoDelLIFO, "", atLeast, 0.9},
		{"goodput", "CoDel + LIFO at 5× C: p99 of delivered ≤ 100 ms", goodputMetric(5, "delivered p99"), GoodCoDelLIFO, "", atMost, 100e6},
		{"goodput", "FIFO + Deadline (clients send their patience) at 5× C: goodput ≥ 90% of C", goodputMetric(5, "goodput"), GoodDeadline, "", atLeast, 0.9},
		{"weighted", fmt.Sprintf("Cost: slots running ≤ the limit (%d) at every instant", r.WeightedLimits.MaxConcurrent), "13. most slots running at once", "all", "", atMost, float64(r.WeightedLimits.MaxConcurrent)},
		{"weighted", "Cost: p99 queue wait of " + heavy + " ≤ 2× that of cost 1", "13. queue wait p99", heavy, "cost 1", ratio, 2},
		{"fleet", "Shares: admitted on an even load ≥ 0.8× the static split's", "14a. admitted, even load", FleetShares, FleetStatic, ratioAtLeast, 0.8},
		{"fleet", "Shares: ≤ 0.01 Redis round trips per admitted request at saturation", "14b. Redis round trips per admitted request", FleetShares, "", atMost, 0.01},
		{"fleet", fmt.Sprintf("static split: peak running across the fleet ≤ %d", r.FleetLimits.MaxConcurrent), "14c. peak running across the fleet", FleetStatic, "", atMost, float64(r.FleetLimits.MaxConcurrent)},
		{"fleet", fmt.Sprintf("GlobalQueue: peak running across the fleet ≤ %d", r.FleetLimits.MaxConcurrent), "14c. peak running across the fleet", FleetGlobal, "", atMost, float64(r.FleetLimits.MaxConcurrent)},
		{"fleet", fmt.Sprintf("Shares: peak running across the fleet ≤ %d", r.FleetLimits.MaxConcurrent), "14c. peak running across the fleet", FleetShares, "", atMost, float64(r.FleetLimits.MaxConcurrent)},
		{"fleet", "Shares: utilization under uneven saturation ≥ 95%", "14d. utilization, uneven", FleetShares, "", atLeast, 0.95},
	}
	ts := make([]target, len(specs))
	for i, s := range specs {
		ts[i] = target{Area: s.area, Name: s.name, Figure: "–", Met: "not measured"}
		x, ok := r.value(s.metric, s.subject)
		y, okBase := r.value(s.metric, s.base)
		if !ok || (s.base != "" && !okBase) || ((s.kind == ratio || s.kind == cost || s.kind == ratioAtLeast) && (y <= 0 || (s.kind == cost && x <= 0))) {
			continue
		}
		row := r.Row(s.metric)
		f, q := func(x float64) string { return format(row.Format, x) }, x/y
		fig, pass := fmt.Sprintf("%s (limit %s)", f(x), f(s.limit)), x <= s.limit
		switch s.kind {
		case ratio:
			fig, pass = fmt.Sprintf("%s vs %s %s: %.2f× (≤ %.2f×)", f(x), s.base, f(y), q, s.limit), q <= s.limit
		case cost:
			if row.Higher {
				q = y / x
			}
			fig, pass = fmt.Sprintf("%s vs %s %s: %.2f× the cost (≤ %.2f×)", f(x), s.base, f(y), q, s.limit), q <= s.limit
		case equal:
			fig, pass = fmt.Sprintf("%s vs %s %s", f(x), s.base, f(y)), math.Round(x) == math.Round(y)
		case best:
			peer, b := bestPeer(*row)
			if q = x / b; peer == "" || b <= 0 {
				continue
			}
			fig, pass = fmt.Sprintf("%s vs best peer %s %s: %.2f×", f(x), peer, f(b), q), (row.Higher && q >= 1) || (!row.Higher && q <= 1)
		case atLeast:
			fig, pass = fmt.Sprintf("%s (at least %s)", f(x), f(s.limit)), x >= s.limit
		case ratioAtLeast:
			fig, pass = fmt.Sprintf("%s vs %s %s: %.2f× (≥ %.2f×)", f(x), s.base, f(y), q, s.limit), q >= s.limit
		case perRound:
			if q, ok = r.value("8. loopback HTTP, ratio to bare", s.subject); !ok {
				continue
			}
			fig, pass = fmt.Sprintf("%s vs %s %s: %.3f× per round, median (≥ %.2f×)", f(x), s.base, f(y), q, s.limit), q >= s.limit
		}
		ts[i].Figure, ts[i].Met = fig, map[bool]string{true: "yes", false: "no"}[pass]
	}
	return ts
}
