// Package suite measures ginqueue side by side with its peers on the same
// work, in one run. Every variant guards the same gin route with the same
// MaxConcurrent, queue bound, queue timeout and handler:
//
//   - bare: the route with no throttle, the floor;
//   - ginqueue: this repository's middleware;
//   - chi: go-chi/chi v5 middleware.ThrottleWithOpts wrapping the gin engine;
//   - x/sync: a gin middleware on golang.org/x/sync/semaphore with an atomic
//     count of waiters and a per-request context timeout (semaphore.go);
//   - seed: a Go port of an interval-polled queue from a published tutorial (intervalpolled.go).
//
// The metrics are described on their harnesses in metrics.go. Four more
// sections measure ginqueue against itself, its Redis backend, overload and
// weighted requests: features.go runs the harnesses of metrics 1, 2 and 7 on
// ginqueue with Priority + FlowKey, ServerTiming + a scraped promqueue
// Collector, or an adaptive limit, against plain ginqueue (section 10);
// redis.go measures the redisqueue backend against the Redis at REDIS_ADDR,
// or says plainly that none answered (section 11); goodput.go offers a real
// server over loopback up to five times its capacity, from clients that give
// up after a second, and counts what is delivered in time through four
// configurations of ginqueue, chi and x/sync (section 12); weighted.go
// serves a mix of light and heavy requests through Config.Cost below
// capacity, checks that the slots running never exceed the limit, and
// measures what each class waits (section 13).
//
// Run runs them all, alternating the variants within each round, and
// returns the figures; package render turns them into BENCHMARKS.md and its
// charts.
package suite

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// Plan is how much work each measurement does.
type Plan struct {
	Smoke bool
	// Only names the sections to run (see SectionNames); empty runs all.
	Only      []string
	BenchTime string // -test.benchtime of each Go benchmark run
	Rounds    int    // rounds of each measurement; variants alternate within a round
	// SlowRounds replaces Rounds for the variants that grant on a 100 ms
	// tick (the seed port), whose figures are orders of magnitude apart
	// anyway.
	SlowRounds       int
	ScheduleRequests int
	GrantWaiters     int
	GrantWaitersSlow int
	TimeoutWaiters   int
	MemoryWaiters    int
	GrowthDepths     []int
	GrowthWindow     time.Duration
	LoopbackClients  int
	LoopbackRounds   int
	LoopbackWindow   time.Duration
	BurstWork        time.Duration
	BurstTimeout     time.Duration
	// Flows is how many flows the feature variants' clients spread over.
	Flows int
	// Redis measurements (section 11): pairs timed one at a time, windows
	// of 8 concurrent clients, hand-offs between two backends.
	RedisPairs    int
	RedisWindow   time.Duration
	RedisWindows  int
	RedisHandoffs int
	// Goodput under overload (section 12): rounds of every variant at every
	// load, the shortest warm-up of a point (GoodputWarmUp), whether the
	// warm-up waits for a FIFO queue to fill, and the window counted.
	GoodputRounds int
	GoodputWarmUp time.Duration
	GoodputFill   bool
	GoodputWindow time.Duration
	// Weighted requests (section 13): how long the mix is offered before
	// the requests are counted, and for how long they are.
	WeightedWarmUp time.Duration
	WeightedWindow time.Duration
}

// FullPlan is the plan of `make bench`: a few minutes on a 2-core machine.
func FullPlan() Plan {
	return Plan{
		BenchTime:        "200ms",
		Rounds:           5,
		SlowRounds:       1,
		ScheduleRequests: 400,
		GrantWaiters:     200,
		GrantWaitersSlow: 10,
		TimeoutWaiters:   100,
		MemoryWaiters:    20_000,
		GrowthDepths:     []int{10, 1_000, 100_000},
		GrowthWindow:     300 * time.Millisecond,
		LoopbackClients:  8,
		LoopbackRounds:   10,
		LoopbackWindow:   600 * time.Millisecond,
		BurstWork:        200 * time.Millisecond,
		BurstTimeout:     5 * time.Second,
		Flows:            10_000,
		RedisPairs:       5_000,
		RedisWindow:      time.Second,
		RedisWindows:     3,
		RedisHandoffs:    500,
		GoodputRounds:    2,
		GoodputWarmUp:    time.Second,
		GoodputFill:      true,
		GoodputWindow:    1500 * time.Millisecond,
		WeightedWarmUp:   500 * time.Millisecond,
		WeightedWindow:   5 * time.Second,
	}
}

// SmokePlan runs every measurement once on tiny sizes, to prove the suite
// still compiles and runs.
func SmokePlan() Plan {
	return Plan{
		Smoke:            true,
		BenchTime:        "1x",
		Rounds:           1,
		SlowRounds:       1,
		ScheduleRequests: 16,
		GrantWaiters:     5,
		GrantWaitersSlow: 2,
		TimeoutWaiters:   5,
		MemoryWaiters:    100,
		GrowthDepths:     []int{10, 100, 1_000},
		GrowthWindow:     120 * time.Millisecond,
		LoopbackClients:  2,
		LoopbackRounds:   1,
		LoopbackWindow:   50 * time.Millisecond,
		BurstWork:        10 * time.Millisecond,
		BurstTimeout:     250 * time.Millisecond,
		Flows:            100,
		RedisPairs:       20,
		RedisWindow:      50 * time.Millisecond,
		RedisWindows:     1,
		RedisHandoffs:    5,
		GoodputRounds:    1,
		GoodputWarmUp:    100 * time.Millisecond,
		GoodputWindow:    200 * time.Millisecond,
		WeightedWarmUp:   50 * time.Millisecond,
		WeightedWindow:   200 * time.Millisecond,
	}
}

// Format says how a Row's figures print.
type Format uint8

// The formats.
const (
	FormatDuration Format = iota // nanoseconds, printed as ns, µs, ms or s
	FormatCount                  // a whole number
	FormatRate                   // per second
	FormatBytes                  // bytes
	FormatRatio                  // a plain number, two decimals
	FormatShare                  // a fraction, printed as a percentage
)

// Row is one metric of the table: a figure per variant.
type Row struct {
	Metric string
	Unit   string
	Higher bool // higher figures are better
	// Given marks a condition of the run rather than a result (an offered
	// load, say): neither way is better, and Higher is ignored.
	Given  bool
	Format Format
	Values map[string]float64 // by variant name; absent means not applicable
	Note   string             // why a variant has no figure, or how it was measured
}

// Machine describes where the suite ran.
type Machine struct {
	CPU        string
	Cores      int
	GOMAXPROCS int
	GoVersion  string
	OSArch     string
	// LoadBefore and LoadAfter are the 1-minute load averages when the run
	// started and ended, where the system tells them: a shared machine's
	// other work shows here.
	LoadBefore, LoadAfter string
}

// Results is everything one run measured.
type Results struct {
	Machine   Machine
	Plan      Plan
	Date      time.Time
	Took      time.Duration
	Variants  []Variant
	Rows      []Row
	Timelines []Timeline
	Errors    []string // measurements that failed, by variant
	// FeatureVariants head the columns of FeatureRows: plain ginqueue and
	// ginqueue with one feature on (section 10).
	FeatureVariants []Variant
	FeatureRows     []Row
	// Redis is section 11, the redisqueue backend on a real Redis.
	Redis RedisReport
	// Goodput is section 12, goodput under overload over loopback.
	Goodput GoodputReport
	// Weighted is section 13, light and heavy requests under Config.Cost.
	Weighted WeightedReport
}

// Row returns the row named metric, in any table, or nil.
func (r *Results) Row(metric string) *Row {
	for _, rows := range [][]Row{r.Rows, r.FeatureRows, r.Redis.Rows, r.Goodput.Rows, r.Weighted.Rows} {
		for i := range rows {
			if rows[i].Metric == metric {
				return &rows[i]
			}
		}
	}
	return nil
}

// describeMachine reads the CPU model from /proc/cpuinfo where there is one.
func describeMachine() Machine {
	m := Machine{
		CPU:        runtime.GOARCH,
		Cores:      runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion:  runtime.Version(),
		OSArch:     runtime.GOOS + "/" + runtime.GOARCH,
		LoadBefore: loadAverage(),
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// loadAverage is the 1-minute load average, or "" where the system does not
// tell.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// setBenchTime sets -test.benchtime for testing.Benchmark. A command must
// call testing.Init first; a test binary has the flag already.
func setBenchTime(d string) error {
	if flag.Lookup("test.benchtime") == nil {
		return fmt.Errorf("bench: -test.benchtime is not registered; call testing.Init first")
	}
	return flag.Set("test.benchtime", d)
}

// runner carries one run's state.
type runner struct {
	plan Plan
	vs   []Variant
	log  io.Writer
	res  *Results
}

// Run measures every metric for every variant as plan says, logging
// progress to log. It sets -test.benchtime (see setBenchTime).
func Run(plan Plan, log io.Writer) (*Results, error) {
	if err := setBenchTime(plan.BenchTime); err != nil {
		return nil, err
	}
	start := time.Now()
	r := &runner{plan: plan, vs: Variants(), log: log, res: &Results{
		Machine: describeMachine(), Plan: plan, Date: start.UTC(), Variants: Variants(),
	}}
	sections := r.sections()
	for _, name := range plan.Only {
		if !slices.ContainsFunc(sections, func(s section) bool { return s.name == name }) {
			return nil, fmt.Errorf("bench: no section %q (sections: %s)", name, strings.Join(SectionNames(), ", "))
		}
	}
	for _, s := range sections {
		if len(plan.Only) > 0 && !slices.Contains(plan.Only, s.name) {
			continue
		}
		t := time.Now()
		s.run()
		r.logf("  (%v)", time.Since(t).Round(100*time.Millisecond))
	}
	r.res.Took = time.Since(start)
	r.res.Machine.LoadAfter = loadAverage()
	return r.res, nil
}

// section is one part of a run, named for Plan.Only.
type section struct {
	name string
	run  func()
}

// sections are the parts of a run, in the order they run.
func (r *runner) sections() []section {
	return []section{
		{"uncontended", r.uncontended}, {"handoff", r.handoff}, {"schedule", r.schedule}, {"grant", r.grant},
		{"timeout", r.timeout}, {"memory", r.memory}, {"growth", r.growth}, {"loopback", r.loopback},
		{"burst", r.burst}, {"features", r.features}, {"redis", r.redis}, {"goodput", r.goodput},
		{"weighted", r.weighted},
	}
}

// SectionNames are the names Plan.Only accepts, in the order they run.
func SectionNames() []string {
	var out []string
	for _, s := range (&runner{}).sections() {
		out = append(out, s.name)
	}
	return out
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.log, format+"\n", args...)
}

func (r *runner) fail(v Variant, metric string, err error) {
	r.res.Errors = append(r.res.Errors, fmt.Sprintf("%s, %s: %v", metric, v.Name, err))
	r.logf("  FAILED %s %s: %v", metric, v.Name, err)
}

// rounds calls f for each variant in each round, rotating the order so that
// no variant always runs first or last; the seed port joins only its
// SlowRounds.
func (r *runner) rounds(vs []Variant, f func(round int, v Variant)) {
	for round := range r.plan.Rounds {
		for i := range vs {
			v := vs[(i+round)%len(vs)]
			if v.Slow && round >= r.plan.SlowRounds {
				continue
			}
			f(round, v)
		}
	}
}

func throttling(vs []Variant) []Variant {
	return slices.DeleteFunc(slices.Clone(vs), func(v Variant) bool { return !v.Throttles })
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// quantile is the q-quantile of ds by the nearest-rank method.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func newRow(metric, unit string, higher bool, f Format) Row {
	return Row{Metric: metric, Unit: unit, Higher: higher, Format: f, Values: map[string]float64{}}
}

// Metric names: the table's rows, and the keys the targets look up.
const (
	MUncontendedRoute    = "1a. uncontended, route only"
	MUncontendedRouteA   = "1a. uncontended, route only: allocs"
	MUncontendedRequest  = "1b. uncontended, request"
	MUncontendedRequestA = "1b. uncontended, request: allocs"
	MHandoff             = "2. saturated hand-off"
	MHandoffA            = "2. saturated hand-off: allocs"
	MSchedule            = "3. schedule efficiency"
	MGrantP50            = "4. grant latency p50"
	MGrantP99            = "4. grant latency p99"
	MTimeoutP50          = "5. timeout lateness p50"
	MTimeoutP99          = "5. timeout lateness p99"
	MTimeoutMax          = "5. timeout lateness max"
	MMemory              = "6. memory per queued request"
	MMemoryHeap          = "6. memory per queued request: heap only"
	MOwnMemory           = "6. throttle's own heap per waiter"
	MGrowthPrefix        = "7. per-request cost, queue depth "
	MGrowthFlat          = "7. growth, deepest / shallowest"
	MLoopback            = "8. loopback HTTP"
	MLoopbackBare        = "8. loopback HTTP, ratio to bare"
	MBurstServed         = "9. burst of 15: served"
	MBurstFull           = "9. burst of 15: refused at once"
	MBurstTimeout        = "9. burst of 15: timed out"
	MBurstLast           = "9. burst of 15: last response"
)

// gobench runs one Go benchmark per variant per round and adds the median
// ns/op and allocs/op to the table.
func (r *runner) gobench(metric, allocsMetric string, higherRate bool, vs []Variant, bench func(Variant) func(*testing.B)) {
	row, arow := r.gobenchRows(metric, allocsMetric, higherRate, vs, bench)
	r.res.Rows = append(r.res.Rows, row, arow)
}

// gobenchRows runs one Go benchmark per variant per round and returns the
// median ns/op (or its inverse, a rate) and allocs/op.
func (r *runner) gobenchRows(metric, allocsMetric string, higherRate bool, vs []Variant, bench func(Variant) func(*testing.B)) (Row, Row) {
	ns := map[string][]float64{}
	allocs := map[string][]float64{}
	r.rounds(vs, func(_ int, v Variant) {
		res := testing.Benchmark(bench(v))
		if res.N == 0 {
			r.fail(v, metric, fmt.Errorf("benchmark failed"))
			return
		}
		ns[v.Name] = append(ns[v.Name], float64(res.T.Nanoseconds())/float64(res.N))
		allocs[v.Name] = append(allocs[v.Name], float64(res.MemAllocs)/float64(res.N))
	})
	var row Row
	if higherRate {
		row = newRow(metric, "req/s", true, FormatRate)
	} else {
		row = newRow(metric, "per op", false, FormatDuration)
	}
	arow := newRow(allocsMetric, "allocs/op", false, FormatCount)
	for name, xs := range ns {
		m := median(xs)
		if higherRate {
			row.Values[name] = 1e9 / m
		} else {
			row.Values[name] = m
		}
		// Whole-run allocations divided by N leave crumbs such as 0.002 from
		// the benchmark's own machinery; a tenth is the resolution kept.
		arow.Values[name] = math.Round(median(allocs[name])*10) / 10
	}
	return row, arow
}

func (r *runner) uncontended() {
	r.logf("1. uncontended overhead")
	r.gobench(MUncontendedRoute, MUncontendedRouteA, false, r.vs, BenchUncontendedRoute)
	r.gobench(MUncontendedRequest, MUncontendedRequestA, false, r.vs, BenchUncontendedRequest)
}

func (r *runner) handoff() {
	r.logf("2. saturated hand-off")
	r.gobench(MHandoff, MHandoffA, true, throttling(r.vs), BenchHandoff)
}

func (r *runner) schedule() {
	r.logf("3. schedule efficiency")
	xs := map[string][]float64{}
	r.rounds(throttling(r.vs), func(_ int, v Variant) {
		e, err := scheduleEfficiency(v, r.plan.ScheduleRequests)
		if err != nil {
			r.fail(v, MSchedule, err)
			return
		}
		xs[v.Name] = append(xs[v.Name], e)
	})
	row := newRow(MSchedule, "ideal/measured", true, FormatRatio)
	for name, x := range xs {
		row.Values[name] = median(x)
	}
	r.res.Rows = append(r.res.Rows, row)
}

// percentiles pools samples over rounds and adds one row per quantile.
func (r *runner) percentiles(samples map[string][]time.Duration, rows []string, qs []float64) {
	for i, metric := range rows {
		row := newRow(metric, "", false, FormatDuration)
		for name, s := range samples {
			row.Values[name] = float64(quantile(s, qs[i]))
		}
		r.res.Rows = append(r.res.Rows, row)
	}
}

func (r *runner) grant() {
	r.logf("4. grant latency")
	samples := map[string][]time.Duration{}
	r.rounds(throttling(r.vs), func(_ int, v Variant) {
		n := r.plan.GrantWaiters
		if v.Slow {
			n = r.plan.GrantWaitersSlow
		}
		s, err := grantLatency(v, n)
		if err != nil {
			r.fail(v, "4. grant latency", err)
			return
		}
		samples[v.Name] = append(samples[v.Name], s...)
	})
	r.percentiles(samples, []string{MGrantP50, MGrantP99}, []float64{0.5, 0.99})
}

func (r *runner) timeout() {
	r.logf("5. queue-timeout precision")
	samples := map[string][]time.Duration{}
	r.rounds(r.vs, func(_ int, v Variant) {
		if !v.Throttles {
			samples[v.Name] = append(samples[v.Name], timerLateness(r.plan.TimeoutWaiters)...)
			return
		}
		s, err := timeoutLateness(v, r.plan.TimeoutWaiters)
		if err != nil {
			r.fail(v, "5. timeout lateness", err)
			return
		}
		samples[v.Name] = append(samples[v.Name], s...)
	})
	r.percentiles(samples, []string{MTimeoutP50, MTimeoutP99, MTimeoutMax}, []float64{0.5, 0.99, 1})
	r.res.Rows[len(r.res.Rows)-3].Note = "the bare gin column is the floor: a plain time.Timer under the same arrivals, without any throttle"

}

func (r *runner) memory() {
	r.logf("6. memory per queued request")
	xs := map[string][]float64{}
	heaps := map[string][]float64{}
	saved := r.plan.Rounds
	r.plan.Rounds = min(saved, 3)
	r.rounds(throttling(r.vs), func(_ int, v Variant) {
		heap, stack, err := memoryPerWaiter(v, r.plan.MemoryWaiters)
		if err != nil {
			r.fail(v, MMemory, err)
			return
		}
		xs[v.Name] = append(xs[v.Name], heap+stack)
		heaps[v.Name] = append(heaps[v.Name], heap)
	})
	r.plan.Rounds = saved
	row := newRow(MMemory, "heap+stack", false, FormatBytes)
	hrow := newRow(MMemoryHeap, "heap", false, FormatBytes)
	for name, x := range xs {
		row.Values[name] = median(x)
		hrow.Values[name] = median(heaps[name])
	}
	own := newRow(MOwnMemory, "heap", false, FormatBytes)
	var ownXs []float64
	for range min(r.plan.Rounds, 3) {
		b, err := backendHeapPerWaiter(r.plan.MemoryWaiters)
		if err != nil {
			r.fail(Variant{Name: GinQueue}, MOwnMemory, err)
			continue
		}
		ownXs = append(ownXs, b)
	}
	if len(ownXs) > 0 {
		own.Values[GinQueue] = median(ownXs)
	}
	own.Note = "ginqueue's Backend alone, without gin"
	r.res.Rows = append(r.res.Rows, row, hrow, own)
}

func (r *runner) growth() {
	r.logf("7. growth with queue depth")
	r.res.Rows = append(r.res.Rows, r.growthRows(MGrowthPrefix, MGrowthFlat, throttling(r.vs), r.plan.GrowthDepths)...)
}

// growthRows measures growthCost at each depth for each variant, at most 3
// rounds, and returns a row per depth (named prefix + depth) and the row
// flat, the deepest over the shallowest.
func (r *runner) growthRows(prefix, flatMetric string, vs []Variant, depths []int) []Row {
	xs := map[int]map[string][]float64{}
	for _, d := range depths {
		xs[d] = map[string][]float64{}
	}
	saved := r.plan.Rounds
	r.plan.Rounds = min(saved, 3)
	r.rounds(vs, func(_ int, v Variant) {
		for _, d := range depths {
			c, err := growthCost(v, d, r.plan.GrowthWindow)
			if err != nil {
				r.fail(v, prefix+GroupDigits(d), err)
				continue
			}
			xs[d][v.Name] = append(xs[d][v.Name], float64(c))
		}
	})
	r.plan.Rounds = saved
	var rows []Row
	flat := newRow(flatMetric, "ratio", false, FormatRatio)
	first, last := depths[0], depths[len(depths)-1]
	for _, d := range depths {
		row := newRow(prefix+GroupDigits(d), "per request", false, FormatDuration)
		for name, x := range xs[d] {
			row.Values[name] = median(x)
		}
		rows = append(rows, row)
	}
	for name := range xs[last] {
		a, b := median(xs[first][name]), median(xs[last][name])
		if a > 0 && !math.IsNaN(a) && !math.IsNaN(b) {
			flat.Values[name] = b / a
		}
	}
	return append(rows, flat)
}

func (r *runner) loopback() {
	r.logf("8. loopback HTTP")
	xs := map[string][]float64{}
	ratios := map[string][]float64{}
	saved := r.plan.Rounds
	r.plan.Rounds = r.plan.LoopbackRounds
	perRound := map[int]map[string]float64{}
	r.rounds(r.vs, func(round int, v Variant) {
		window := r.plan.LoopbackWindow
		if v.Slow {
			window = max(window, 3*seedInterval)
		}
		x, err := loopbackRate(v, r.plan.LoopbackClients, window)
		if err != nil {
			r.fail(v, MLoopback, err)
			return
		}
		xs[v.Name] = append(xs[v.Name], x)
		if perRound[round] == nil {
			perRound[round] = map[string]float64{}
		}
		perRound[round][v.Name] = x
	})
	r.plan.Rounds = saved
	for _, m := range perRound {
		bare, ok := m[Bare]
		if !ok || bare == 0 {
			continue
		}
		for name, x := range m {
			ratios[name] = append(ratios[name], x/bare)
		}
	}
	row := newRow(MLoopback, "req/s", true, FormatRate)
	rrow := newRow(MLoopbackBare, "median of per-round ratios", true, FormatRatio)
	for name, x := range xs {
		row.Values[name] = median(x)
	}
	for name, x := range ratios {
		rrow.Values[name] = median(x)
	}
	r.res.Rows = append(r.res.Rows, row, rrow)
}

func (r *runner) burst() {
	r.logf("9. seed burst timeline")
	served := newRow(MBurstServed, "of 15", true, FormatCount)
	full := newRow(MBurstFull, "of 15", false, FormatCount)
	timedOut := newRow(MBurstTimeout, "of 15", false, FormatCount)
	last := newRow(MBurstLast, "", false, FormatDuration)
	for _, v := range timelineVariants() {
		t := seedBurst(v, r.plan.BurstWork, r.plan.BurstTimeout)
		r.res.Timelines = append(r.res.Timelines, t)
		if v.Name == SeedAsWritten {
			continue // shown in the chart and its own paragraph
		}
		served.Values[v.Name] = float64(t.Count(OutcomeServed))
		full.Values[v.Name] = float64(t.Count(OutcomeFull))
		timedOut.Values[v.Name] = float64(t.Count(OutcomeTimeout))
		last.Values[v.Name] = float64(t.Last())
	}
	r.res.Rows = append(r.res.Rows, served, full, timedOut, last)
}

// GroupDigits prints n with thin groups of three digits: 100,000.
func GroupDigits(n int) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return sign + s
}
