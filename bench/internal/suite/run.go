// Package suite measures ginqueue beside its peers on the same work, in
// one run, and renders the figures as BENCHMARKS.md.
package suite

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Plan is what a run does: the sizes that SmokePlan shrinks, then the
// settings of the harnesses, the same in every plan.
type Plan struct {
	Smoke      bool
	BenchTime  string // -test.benchtime of each Go benchmark
	Rounds     int    // rounds of each measurement; the variants alternate within a round
	SlowRounds int    // the rounds a Slow variant joins: its figures are orders of magnitude apart anyway

	ScheduleRequests, GrantWaiters, GrantWaitersSlow, TimeoutWaiters, MemoryWaiters int
	GrowthDepths                                                                    []int
	GrowthWindow, LoopbackWindow, BurstWork, BurstTimeout                           time.Duration
	LoopbackClients, LoopbackRounds, Flows                                          int
	RedisPairs, RedisWindows, RedisHandoffs                                         int
	RedisWindow, GoodputWarmUp, GoodputWindow, WeightedWarmUp, WeightedWindow       time.Duration
	GoodputRounds                                                                   int
	GoodputFill                                                                     bool // a warm-up lasts until a FIFO queue has filled
	FleetWarmUp, FleetWindow                                                        time.Duration

	Uncontended, Handoff                                  Limits // metric 1 (never reached), metric 2
	HandoffGoroutines, ScheduleSlots, TimeoutSlots        int
	MemorySlots, GrowthSlots, RedisClients                int
	BurstRequests, BurstSlots, BurstQueue                 int
	HandoffWork, ScheduleWork, GrantWork, TimeoutDeadline time.Duration
	GoodputLimits                                         Limits // section 12: a generous queue, a 10 s timeout
	GoodputWork, GoodputPatience                          time.Duration
	GoodputLoads                                          []int // offered loads, in multiples of capacity
	GoodputIdleConns                                      int   // above the most requests in flight at once (5 × 800/s for 1 s)
	WeightedLimits                                        Limits
	WeightedWork                                          time.Duration
	WeightedHeavy                                         int     // the cost of a heavy request; a light one costs 1
	WeightedHeavyShare, WeightedLoad                      float64 // the heavy requests' share; the offered share of slot capacity
	FleetLimits                                           Limits  // section 14: the fleet's slots; each replica's waiting places and timeout
	FleetReplicas, FleetClients                           int     // replicas; closed-loop clients per replica at saturation
	FleetUneven                                           []int   // closed-loop clients of each replica under uneven saturation
	FleetWork, FleetUnevenWork, FleetShortWork            time.Duration
	Scale                                                 ScalePlan // section 15, which runs only when named
}

// FullPlan is the plan of `make bench`: a few minutes on a 2-core machine.
func FullPlan() Plan {
	return Plan{
		BenchTime: "200ms", Rounds: 5, SlowRounds: 1,
		ScheduleRequests: 400, GrantWaiters: 200, GrantWaitersSlow: 10, TimeoutWaiters: 100, MemoryWaiters: 20_000,
		GrowthDepths: []int{10, 1_000, 100_000}, GrowthWindow: 300 * time.Millisecond,
		LoopbackClients: 8, LoopbackRounds: 10, LoopbackWindow: 600 * time.Millisecond,
		BurstWork: 200 * time.Millisecond, BurstTimeout: 5 * time.Second, Flows: 10_000,
		RedisPairs: 5_000, RedisWindow: time.Second, RedisWindows: 3, RedisHandoffs: 500,
		GoodputRounds: 2, GoodputWarmUp: time.Second, GoodputFill: true, GoodputWindow: 1500 * time.Millisecond,
		WeightedWarmUp: 500 * time.Millisecond, WeightedWindow: 5 * time.Second,
		FleetWarmUp: 500 * time.Millisecond, FleetWindow: 5 * time.Second,

		Uncontended:       Limits{MaxConcurrent: 64, MaxQueue: 64, QueueTimeout: time.Second},
		Handoff:           Limits{MaxConcurrent: 4, MaxQueue: 64, QueueTimeout: 10 * time.Second},
		HandoffGoroutines: 32, HandoffWork: 2 * time.Microsecond,
		ScheduleSlots: 8, ScheduleWork: 2 * time.Millisecond, GrantWork: 5 * time.Microsecond,
		TimeoutSlots: 2, TimeoutDeadline: 20 * time.Millisecond, MemorySlots: 4, GrowthSlots: 4,
		BurstRequests: 15, BurstSlots: 3, BurstQueue: 10, RedisClients: 8,
		GoodputLimits: Limits{MaxConcurrent: 8, MaxQueue: 10_000, QueueTimeout: 10 * time.Second},
		GoodputWork:   10 * time.Millisecond, GoodputPatience: time.Second, GoodputLoads: []int{1, 2, 5}, GoodputIdleConns: 1 << 14,
		WeightedLimits: Limits{MaxConcurrent: 8, MaxQueue: 10_000, QueueTimeout: 10 * time.Second},
		WeightedWork:   10 * time.Millisecond, WeightedHeavy: 4, WeightedHeavyShare: 0.25, WeightedLoad: 0.8,
		FleetLimits:   Limits{MaxConcurrent: 64, MaxQueue: 1024, QueueTimeout: 10 * time.Second},
		FleetReplicas: 4, FleetClients: 64, FleetUneven: []int{8, 8, 8, 104},
		FleetWork: 2 * time.Millisecond, FleetUnevenWork: 20 * time.Millisecond, FleetShortWork: 200 * time.Microsecond,
		Scale: ScalePlan{Replicas: []int{16, 64, 256, 1024}, Clients: 2, Work: 20 * time.Millisecond,
			MaxQueue: 64, QueueTimeout: 2 * time.Second, StartBatch: 64,
			WarmUp: time.Second, Window: 5 * time.Second, Settle: 2 * time.Second},
	}
}

// SmokePlan runs every measurement once on tiny sizes, to prove the suite
// still compiles and runs.
func SmokePlan() Plan {
	p := FullPlan()
	p.Smoke, p.BenchTime, p.Rounds = true, "1x", 1
	p.ScheduleRequests, p.GrantWaiters, p.GrantWaitersSlow, p.TimeoutWaiters, p.MemoryWaiters = 16, 5, 2, 5, 100
	p.GrowthDepths, p.GrowthWindow = []int{10, 100, 1_000}, 120*time.Millisecond
	p.LoopbackClients, p.LoopbackRounds, p.LoopbackWindow = 2, 1, 50*time.Millisecond
	p.BurstWork, p.BurstTimeout, p.Flows = 10*time.Millisecond, 250*time.Millisecond, 100
	p.RedisPairs, p.RedisWindow, p.RedisWindows, p.RedisHandoffs = 20, 50*time.Millisecond, 1, 5
	p.GoodputRounds, p.GoodputWarmUp, p.GoodputFill, p.GoodputWindow = 1, 100*time.Millisecond, false, 200*time.Millisecond
	p.WeightedWarmUp, p.WeightedWindow = 50*time.Millisecond, 200*time.Millisecond
	p.FleetWarmUp, p.FleetWindow = 500*time.Millisecond, time.Second
	p.Scale.Replicas, p.Scale.WarmUp, p.Scale.Window, p.Scale.Settle = []int{4}, 200*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
	return p
}

// Format says how a Row's figures print.
type Format uint8

// The formats.
const (
	FormatDuration Format = iota // nanoseconds, printed as ns, µs, ms or s
	FormatCount                  // a number, to a tenth
	FormatRate                   // per second
	FormatBytes                  // bytes
	FormatRatio                  // a plain number, two decimals
	FormatShare                  // a fraction, printed as a percentage
	FormatSmall                  // a plain number to three significant digits, for figures far below 1
)

// Row is one metric of a table: a figure per column.
type Row struct {
	Metric, Unit string
	Higher       bool // higher figures are better
	Given        bool // a condition of the run, not a result: neither way is better
	Format       Format
	Values       map[string]float64 // by column; absent means not applicable
	Note         string             // how a figure was measured, printed under the table
}

// Table is rows under named columns.
type Table struct {
	Cols []string
	Rows []Row
}

// Results is everything one run measured.
type Results struct {
	Plan
	Date                                  time.Time
	Took                                  time.Duration
	CPU, GoVersion, LoadBefore, LoadAfter string // the load averages are empty where the system does not tell
	Cores, GOMAXPROCS                     int
	Main, Features, Redis, Goodput        Table
	Weighted, Fleet                       Table
	Timelines                             []Timeline
	RedisVersion, RedisWhy                string // RedisWhy says why section 11 was not measured
	FleetWhy                              string // why section 14 measured the static split alone
	FleetScale                            ScaleResults
	Errors                                []string
}

// Row is the row named metric, in any table, or nil.
func (r *Results) Row(metric string) *Row {
	for _, t := range []*Table{&r.Main, &r.Features, &r.Redis, &r.Goodput, &r.Weighted, &r.Fleet} {
		for i := range t.Rows {
			if t.Rows[i].Metric == metric {
				return &t.Rows[i]
			}
		}
	}
	return nil
}

// value is the figure of metric in column col, if the run has one.
func (r *Results) value(metric, col string) (float64, bool) {
	if row := r.Row(metric); row != nil {
		x, ok := row.Values[col]
		return x, ok && !math.IsNaN(x)
	}
	return 0, false
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg") // the 1-minute one, or "" where the system does not tell
	return append(strings.Fields(string(b)), "")[0]
}

// Sections are the parts of a run, in order; Run's only names one.
var Sections = []string{"uncontended", "handoff", "schedule", "grant", "timeout", "memory", "growth",
	"loopback", "burst", "features", "redis", "goodput", "weighted", "fleet", "fleet-scale"}

// Alone are the sections that a full run leaves out, for they take minutes:
// they run when only names them, and in a smoke run on its tiny sizes.
var Alone = []string{"fleet-scale"}

type runner struct {
	Plan
	log io.Writer
	res *Results
}

// Run measures every section (Alone ones in a smoke run only), or only the
// one named. Call testing.Init first: it sets -test.benchtime.
func Run(plan Plan, only string, log io.Writer) (*Results, error) {
	if only != "" && !slices.Contains(Sections, only) {
		return nil, fmt.Errorf("bench: no section %q (sections: %s)", only, strings.Join(Sections, ", "))
	}
	if err := flag.Set("test.benchtime", plan.BenchTime); err != nil {
		return nil, fmt.Errorf("bench: -test.benchtime (call testing.Init first): %w", err)
	}
	start := time.Now()
	r := &runner{Plan: plan, log: log, res: &Results{Plan: plan, Date: start.UTC(), CPU: runtime.GOARCH,
		GoVersion: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		Cores:     runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), LoadBefore: loadAverage()}}
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.Lines(string(cpuinfo)) {
		if k, v, _ := strings.Cut(line, ":"); strings.TrimSpace(k) == "model name" {
			r.res.CPU = strings.TrimSpace(v)
			break
		}
	}
	main, res := Variants(), r.res
	res.Main.Cols = names(main)
	thr := main[1:] // the bare route has no queue
	spread, pinned := FeatureVariants(plan.Flows, true), FeatureVariants(plan.Flows, false)
	res.Features.Cols = names(spread)
	d := plan.GrowthDepths
	runs := map[string]func(){
		"uncontended": func() {
			r.gobench(&res.Main, "1a. uncontended, route only", false, main, plan.BenchRoute)
			r.gobench(&res.Main, "1b. uncontended, request", false, main, plan.BenchRequest)
		},
		"handoff": func() { r.gobench(&res.Main, "2. saturated hand-off", true, thr, plan.BenchHandoff) },
		"schedule": func() {
			r.measure(&res.Main, "3. schedule efficiency", thr, r.Rounds, []stat{
				{"3. schedule efficiency", "ideal/measured", FormatRatio, true, med(0)},
			}, func(_ int, v Variant) ([][]float64, error) { return kind(r.scheduleEfficiency(v)) })
		},
		"grant": func() {
			r.measure(&res.Main, "4. grant latency", thr, r.Rounds, []stat{
				{"4. grant latency p50", "", FormatDuration, false, pct(0, 0.5)},
				{"4. grant latency p99", "", FormatDuration, false, pct(0, 0.99)},
			}, func(_ int, v Variant) ([][]float64, error) {
				return kind(r.grantLatency(v, map[bool]int{false: r.GrantWaiters, true: r.GrantWaitersSlow}[v.Slow]))
			})
		},
		"timeout": func() {
			r.measure(&res.Main, "5. timeout lateness", main, r.Rounds, []stat{
				{"5. timeout lateness p50", "", FormatDuration, false, pct(0, 0.5)},
				{"5. timeout lateness p99", "", FormatDuration, false, pct(0, 0.99)},
				{"5. timeout lateness max", "", FormatDuration, false, pct(0, 1)},
			}, func(_ int, v Variant) ([][]float64, error) { return kind(r.timeoutLateness(v)) })
			res.Main.Rows[len(res.Main.Rows)-3].Note = "the bare gin column is the floor: a plain time.Timer under the same arrivals, without any throttle"
		},
		"memory": func() {
			r.measure(&res.Main, "6. memory per queued request", thr, min(r.Rounds, 3), []stat{
				{"6. memory per queued request", "heap+stack", FormatBytes, false, med(0)},
				{"6. memory per queued request: heap only", "heap", FormatBytes, false, med(1)},
			}, func(_ int, v Variant) ([][]float64, error) {
				heap, stack, err := r.memoryPerWaiter(v)
				return [][]float64{{heap + stack}, {heap}}, err
			})
			// Last, as it always ran: what runs before a variant moves its
			// stack figure.
			r.measure(&res.Main, "6. throttle's own heap per waiter", thr[:1], min(r.Rounds, 3), []stat{
				{"6. throttle's own heap per waiter", "heap", FormatBytes, false, med(0)},
			}, func(int, Variant) ([][]float64, error) { return kind(r.backendHeapPerWaiter()) })
			res.Main.Rows[len(res.Main.Rows)-1].Note = "ginqueue's Backend alone, without gin"
		},
		"growth": func() { r.growth(&res.Main, "7. ", "", thr, d) },
		"loopback": func() {
			bare := map[int]float64{}
			ratio := func(s [][]float64) float64 {
				var q []float64
				for j, x := range s[0] {
					if b := bare[int(s[1][j])]; b > 0 {
						q = append(q, x/b)
					}
				}
				return med(0)([][]float64{q})
			}
			r.measure(&res.Main, "8. loopback HTTP", main, r.LoopbackRounds, []stat{
				{"8. loopback HTTP", "req/s", FormatRate, true, med(0)},
				{"8. loopback HTTP, ratio to bare", "median of per-round ratios", FormatRatio, true, ratio},
			}, func(round int, v Variant) ([][]float64, error) {
				x, err := r.loopbackRate(v)
				if v.ID == "bare" {
					bare[round] = x
				}
				return [][]float64{{x}, {float64(round)}}, err
			})
		},
		"burst": func() {
			for _, v := range burstVariants() {
				res.Timelines = append(res.Timelines, r.seedBurst(v))
			}
		},
		"features": func() {
			r.gobench(&res.Features, "10a. uncontended, route only", false, spread, plan.BenchRoute)
			r.gobench(&res.Features, "10b. uncontended, request", false, spread, plan.BenchRequest)
			r.gobench(&res.Features, "10c. saturated hand-off", true, pinned, plan.BenchHandoff)
			r.growth(&res.Features, "10d. ", " over flows", spread[:2], []int{d[0], d[len(d)-1]})
		},
		"redis": r.redis, "goodput": r.goodput, "weighted": r.weighted, "fleet": r.fleet, "fleet-scale": r.fleetScale,
	}
	for i, name := range Sections {
		if only == name || (only == "" && (plan.Smoke || !slices.Contains(Alone, name))) {
			t := time.Now()
			r.logf("%d. %s", i+1, name)
			runs[name]()
			r.logf("  (%v)", time.Since(t).Round(100*time.Millisecond))
		}
	}
	res.Took, res.LoadAfter = time.Since(start), loadAverage()
	return res, nil
}

func names(vs []Variant) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.Name
	}
	return out
}

func (r *runner) logf(format string, args ...any) { fmt.Fprintf(r.log, format+"\n", args...) }

func (r *runner) fail(col, metric string, err error) {
	r.res.Errors = append(r.res.Errors, fmt.Sprintf("%s, %s: %v", metric, col, err))
	r.logf("  FAILED %s %s: %v", metric, col, err)
}

// stat is one row of a measurement: how the figures a variant gave over the
// rounds, pooled kind by kind, reduce to one (NaN for none).
type stat struct {
	metric, unit string
	format       Format
	higher       bool
	reduce       func(pooled [][]float64) float64
}

// pct is the q-quantile of the figures of kind k by the nearest rank; med
// is their median, the mean of the middle two of an even count.
func pct(k int, q float64) func([][]float64) float64 {
	return func(s [][]float64) float64 {
		if k >= len(s) || len(s[k]) == 0 {
			return math.NaN()
		}
		x := slices.Sorted(slices.Values(s[k]))
		if q < 0 {
			return (x[(len(x)-1)/2] + x[len(x)/2]) / 2
		}
		return x[max(0, min(int(math.Ceil(q*float64(len(x))))-1, len(x)-1))]
	}
}

func med(k int) func([][]float64) float64 { return pct(k, -1) }

// kind is figures of one kind, as measure wants them.
func kind(s []float64, err error) ([][]float64, error) { return [][]float64{s}, err }

func sum(xs []float64) (s float64) {
	for _, x := range xs {
		s += x
	}
	return s
}

// measure calls f for each variant of vs in each of rounds rounds, pools
// what it returns kind by kind, and adds a row per stat to t.
func (r *runner) measure(t *Table, name string, vs []Variant, rounds int, stats []stat, f func(round int, v Variant) ([][]float64, error)) {
	pooled := map[string][][]float64{}
	for round := range rounds {
		r.round(pooled, name, vs, round, f)
	}
	addRows(t, stats, pooled)
}

// round calls f once per variant of vs, rotating the order each round (a
// Slow one joins only SlowRounds), and pools what f returns by variant.
func (r *runner) round(pooled map[string][][]float64, name string, vs []Variant, round int, f func(round int, v Variant) ([][]float64, error)) {
	for i := range vs {
		v := vs[(i+round)%len(vs)]
		if v.Slow && round >= r.SlowRounds {
			continue
		}
		s, err := f(round, v)
		if err != nil {
			r.fail(v.Name, name, err)
			continue
		}
		p := append(pooled[v.Name], make([][]float64, max(0, len(s)-len(pooled[v.Name])))...)
		for k := range s {
			p[k] = append(p[k], s[k]...)
		}
		pooled[v.Name] = p
	}
}

func addRows(t *Table, stats []stat, pooled map[string][][]float64) {
	for _, st := range stats {
		row := Row{Metric: st.metric, Unit: st.unit, Format: st.format, Higher: st.higher, Values: map[string]float64{}}
		for name, s := range pooled {
			if x := st.reduce(s); !math.IsNaN(x) {
				row.Values[name] = x
			}
		}
		t.Rows = append(t.Rows, row)
	}
}

// gobench runs a Go benchmark per variant per round: the median ns/op (or
// its inverse, a rate) and allocs/op.
func (r *runner) gobench(t *Table, metric string, rate bool, vs []Variant, bench func(Variant) func(*testing.B)) {
	perOp := stat{metric, "per op", FormatDuration, false, med(0)}
	if rate {
		perOp = stat{metric, "req/s", FormatRate, true, func(s [][]float64) float64 { return 1e9 / med(0)(s) }}
	}
	// Whole-run allocations over N leave crumbs such as 0.002 from the
	// benchmark's own machinery: a tenth is the resolution kept.
	allocs := stat{metric + ": allocs", "allocs/op", FormatCount, false, func(s [][]float64) float64 { return math.Round(med(1)(s)*10) / 10 }}
	r.measure(t, metric, vs, r.Rounds, []stat{perOp, allocs}, func(_ int, v Variant) ([][]float64, error) {
		res := testing.Benchmark(bench(v))
		if res.N == 0 {
			return nil, errors.New("benchmark failed")
		}
		return [][]float64{{float64(res.T.Nanoseconds()) / float64(res.N)}, {float64(res.MemAllocs) / float64(res.N)}}, nil
	})
}

// growth measures growthCost at each depth, at most 3 rounds: a row per
// depth and one of the deepest over the shallowest.
func (r *runner) growth(t *Table, prefix, flows string, vs []Variant, depths []int) {
	var stats []stat
	for k, d := range depths {
		stats = append(stats, stat{prefix + "per-request cost" + flows + ", queue depth " + digits(d), "per request", FormatDuration, false, med(k)})
	}
	stats = append(stats, stat{prefix + "growth" + flows + ", deepest / shallowest", "ratio", FormatRatio, false,
		func(s [][]float64) float64 { return med(len(depths)-1)(s) / med(0)(s) }})
	r.measure(t, prefix+"growth", vs, min(r.Rounds, 3), stats, func(_ int, v Variant) ([][]float64, error) {
		var s [][]float64
		for _, d := range depths {
			c, err := r.growthCost(v, d)
			if err != nil {
				return nil, err
			}
			s = append(s, []float64{c})
		}
		return s, nil
	})
}

// andList prints ns as "16, 64, 256 and 1,024".
func andList(ns []int) string {
	s := ""
	for i, n := range ns {
		if i > 0 {
			s += map[bool]string{true: " and ", false: ", "}[i == len(ns)-1]
		}
		s += digits(n)
	}
	return s
}

// raise lifts peak to n, if n is higher.
func raise(peak *atomic.Int64, n int64) {
	for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
	}
}

// digits prints n in groups of three digits: 100,000.
func digits(n int) string {
	s := fmt.Sprint(max(n, -n))
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if n < 0 {
		return "-" + s
	}
	return s
}
