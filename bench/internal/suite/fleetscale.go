package suite

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// Section 15: many replicas of one Name in Shares mode, on a redis-server
// of its own; it runs only when named (BENCHMARKS.md says how).

// ScalePlan is what section 15 does: fleets of growing sizes, one after
// another, each under a Name of its own.
type ScalePlan struct {
	Replicas     []int         // the fleet sizes N
	Clients      int           // closed-loop clients on each loaded replica
	Work         time.Duration // what a handler sleeps
	MaxQueue     int           // each replica's waiting places: more than the clients it gets
	QueueTimeout time.Duration // each replica's: far above the wait that a fair share gives
	StartBatch   int           // replicas started at once
	Parts        int           // above 1: each Name split into this many parts, on a Redis Cluster of as many shards
	WarmUp       time.Duration // before the window of the idle and loaded phases
	Window       time.Duration // the window of each phase
	Settle       time.Duration // the load on the first half before it moves
}

// Limit is the fleet's limit for n replicas: n/2 slots, so that a fair
// share is half a slot and the shares must move between the replicas.
func (s ScalePlan) Limit(n int) int { return max(1, n/2) }

// Capacity is what n replicas serve per second with every slot busy.
func (s ScalePlan) Capacity(n int) float64 { return float64(s.Limit(n)) / s.work(n).Seconds() }

// work is what a handler sleeps: Work up to 1,024 replicas, Work × n/256
// above, so that one process can offer the load of the larger fleets.
func (s ScalePlan) work(n int) time.Duration {
	if n <= 1024 {
		return s.Work
	}
	return s.Work * time.Duration(n) / 256
}

// The phases of each fleet size, in the order they run.
const (
	ScaleIdle   = "idle"
	ScaleLoaded = "loaded"
	ScaleMoves  = "load moves"
)

// scaleConverged is the share of the limit the loaded replicas must hold
// for the load to have moved.
const scaleConverged = 0.9

// ScaleResults is what section 15 measured.
type ScaleResults struct {
	RedisVersion string
	Sizes        []ScaleSize
	Why          string // why the section was not measured
}

// ScaleSize is one fleet size.
type ScaleSize struct {
	N, Limit    int           // the replicas and the fleet's limit
	StartUp     time.Duration // from the first replica's start to the last's
	Connections int           // clients connected to Redis once every replica had started
	Live        int           // replicas Redis counted live then (GlobalStats.Replicas); -1 if it did not answer
	Outages     uint64        // times the replicas marked Redis down while they started
	Down        int           // replicas that had Redis marked down once all had started
	Phases      []ScalePhase
}

// ScalePhase is what one phase of one fleet size gave: the calls, CPU and
// served within the window; the refusals, outages and peak over the phase.
type ScalePhase struct {
	Name     string
	Window   time.Duration
	Calls    float64  // script calls Redis ran (EVALSHA, EVAL and the like); NaN if INFO failed
	RedisCPU float64  // Redis's used_cpu_sys + used_cpu_user, seconds, summed over the servers; NaN if INFO failed
	ShardCPU float64  // the same, of the busiest server; NaN if INFO failed
	BenchCPU float64  // this process's CPU, seconds; NaN where unknown
	Served   int64    // 2xx answers: the handlers that ended in the window
	Refused  [3]int64 // the other answers, by kind: refused503, refused408, refusedOther
	Outages  uint64   // times a replica marked Redis down (Stats().Outages), summed
	Down     int      // replicas that had Redis marked down (Stats().Unavailable) at the window's end
	Peak     int64    // the most handlers running at once in the fleet
	// Load moves only: from the move until the second half held
	// scaleConverged of the limit, as shares and as running; -1 if never.
	SharesAt, RunningAt time.Duration
}

// scaleSpec is how a phase loads the fleet.
type scaleSpec struct {
	name    string
	clients []int         // closed-loop clients on each replica from the first; none on the rest
	moveBy  int           // at the window's start the clients move this many replicas on
	before  time.Duration // the load before the window
}

// specs are the phases of a fleet of n replicas, in order.
func (s ScalePlan) specs(n int) []scaleSpec {
	return []scaleSpec{
		{name: ScaleIdle, before: s.WarmUp},
		{name: ScaleLoaded, clients: slices.Repeat([]int{s.Clients}, n), before: s.WarmUp},
		{name: ScaleMoves, clients: slices.Repeat([]int{s.Clients}, n/2), moveBy: n / 2, before: s.Settle},
	}
}

// fleet is n replicas, not started, under a Name of their own: Backends in
// Shares mode with default Options otherwise, each on a client with a
// small pool.
func (s ScalePlan) fleet(addrs []string, nodes []*redis.Client, n int) *fleet {
	return &fleet{replicas: make([]replica, n), batch: s.StartBatch, work: s.work(n), nodes: nodes,
		cfg: ginqueue.Config{MaxConcurrent: s.Limit(n), MaxQueue: s.MaxQueue, QueueTimeout: s.QueueTimeout},
		dial: func() redis.UniversalClient {
			return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs, IsClusterMode: s.Parts > 1,
				ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 2})
		},
		opts: redisqueue.Options{Name: fmt.Sprintf("scale%d-%s", n, rand.Text()[:8]), Mode: redisqueue.Shares,
			Shares: redisqueue.SharesOptions{Parts: s.Parts}}}
}

// phase runs sp on f; what it measured comes back even with an error.
func (s ScalePlan) phase(ctx context.Context, f *fleet, sp scaleSpec) (ScalePhase, error) {
	shares, running := time.Duration(-1), time.Duration(-1)
	var during func(start, end time.Time)
	if sp.name == ScaleMoves {
		during = func(start, end time.Time) { shares, running = f.converge(ctx, start, end) }
	}
	pt, err := f.measure(ctx, sp.clients, sp.moveBy, sp.before, s.Window, during)
	pt.Name, pt.SharesAt, pt.RunningAt = sp.name, shares, running
	return pt.ScalePhase, err
}

// converge samples every 5 ms the second half's shares and running
// handlers: how long after start each reached scaleConverged of the limit
// (-1: not before end).
func (f *fleet) converge(ctx context.Context, start, end time.Time) (shares, running time.Duration) {
	need := int(math.Ceil(scaleConverged * float64(f.cfg.MaxConcurrent)))
	shares, running = -1, -1
	for now := time.Now(); now.Before(end) && (shares < 0 || running < 0); now = time.Now() {
		if running < 0 && int(f.second.Load()) >= need {
			running = now.Sub(start)
		}
		if shares < 0 && int(f.stats(len(f.replicas)/2, func(s backend.Stats) uint64 { return uint64(s.Limit) })) >= need {
			shares = now.Sub(start)
		}
		if !sleepCtx(ctx, 5*time.Millisecond) {
			break
		}
	}
	return shares, running
}

// census counts Redis's clients and live replicas; -1 where it did not answer.
func (f *fleet) census(ctx context.Context) (conns, live int) {
	conns, live = 0, -1
	for _, c := range f.nodes {
		info, err := c.Info(ctx, "clients").Result()
		if err != nil {
			conns = -1
			break
		}
		conns += infoInt(info, "connected_clients")
	}
	if gs, err := f.replicas[0].b.GlobalStats(ctx); err == nil {
		live = gs.Replicas
	}
	return conns, live
}

// scaleSize starts n replicas, runs the phases and closes them; what it
// measured comes back even with an error.
func (r *runner) scaleSize(ctx context.Context, addrs []string, nodes []*redis.Client, n int) (*ScaleSize, error) {
	f := r.Scale.fleet(addrs, nodes, n)
	defer f.close()
	start := time.Now()
	if err := f.start(ctx); err != nil {
		return nil, fmt.Errorf("starting %d replicas: %w", n, err)
	}
	size := &ScaleSize{N: n, Limit: f.cfg.MaxConcurrent, StartUp: time.Since(start), Outages: f.outages(), Down: f.down()}
	size.Connections, size.Live = f.census(ctx)
	r.logf("  N=%d: %d replicas started in %v, marked Redis down %d times, %d down now; Redis: %d connections, %d replicas live",
		n, n, size.StartUp.Round(time.Millisecond), size.Outages, size.Down, size.Connections, size.Live)
	for _, sp := range r.Scale.specs(n) {
		pt, err := r.Scale.phase(ctx, f, sp)
		size.Phases = append(size.Phases, pt)
		r.logf("  N=%d %s", n, r.Scale.describe(n, pt))
		if err != nil {
			return size, fmt.Errorf("%d replicas, %s: %w", n, sp.name, err)
		}
	}
	return size, nil
}

// describe is a phase's figures on one line, for the log.
func (s ScalePlan) describe(n int, pt ScalePhase) string {
	w := pt.Window.Seconds()
	line := fmt.Sprintf("%s: script calls %s, Redis CPU %s of a core (%s a call), served %s of %s, 503 %d, 408 %d, other %d, marked down %d times, %d down at the end, peak %d of %d, this process %s of a core",
		pt.Name, format(FormatRate, pt.Calls/w), format(FormatShare, pt.RedisCPU/w), format(FormatDuration, perCall(pt)),
		format(FormatRate, float64(pt.Served)/w), format(FormatRate, s.Capacity(n)), pt.Refused[refused503], pt.Refused[refused408], pt.Refused[refusedOther],
		pt.Outages, pt.Down, pt.Peak, s.Limit(n), format(FormatShare, pt.BenchCPU/w))
	if s.Parts > 1 {
		line += fmt.Sprintf("; busiest of %d shards %s of a core", s.Parts, format(FormatShare, pt.ShardCPU/w))
	}
	if pt.Name == ScaleMoves {
		line += fmt.Sprintf("; converged: shares %s, running %s", convergence(pt.SharesAt, pt.Window), convergence(pt.RunningAt, pt.Window))
	}
	return line
}

// perCall is Redis's CPU per script call, in ns; NaN without calls.
func perCall(pt ScalePhase) float64 {
	if pt.Calls <= 0 {
		return math.NaN()
	}
	return pt.RedisCPU * 1e9 / pt.Calls
}

// convergence prints a time to converge, or that it did not.
func convergence(d, window time.Duration) string {
	if d < 0 {
		return "not within " + window.Round(100*time.Millisecond).String()
	}
	return format(FormatDuration, float64(d))
}

// fleetScale is section 15, on a redis-server it starts and stops; SIGINT
// or SIGTERM ends it early with what it measured.
func (r *runner) fleetScale() {
	res := &r.res.FleetScale
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r.logf("  open files: up to %d", raiseOpenFiles())
	srvs, err := startRedis(ctx, r.Scale.Parts)
	if errors.Is(err, errNoRedisServer) {
		res.Why = "No redis-server was found on the PATH, so this section was not measured in this run."
		r.logf("  %s", res.Why)
		return
	}
	if err != nil {
		r.fail(FleetShares, "15. starting redis-server", err)
		return
	}
	var addrs []string
	var nodes []*redis.Client
	for _, s := range srvs {
		defer s.stop()
		addrs, nodes = append(addrs, s.addr), append(nodes, s.ctl)
	}
	if info, err := nodes[0].Info(ctx, "server").Result(); err == nil {
		res.RedisVersion = infoString(info, "redis_version")
	}
	r.logf("  redis-server %s on %s", res.RedisVersion, strings.Join(addrs, ", "))
	for _, n := range r.Scale.Replicas {
		size, err := r.scaleSize(ctx, addrs, nodes, n)
		if size != nil {
			res.Sizes = append(res.Sizes, *size)
		}
		if ctx.Err() != nil {
			r.fail(FleetShares, "15. fleet at scale", fmt.Errorf("interrupted: %w", err))
			return
		}
		if err != nil {
			r.fail(FleetShares, "15. fleet at scale", err)
		}
		// Each size starts on an empty Redis.
		for _, c := range nodes {
			if err := c.FlushAll(ctx).Err(); err != nil {
				r.fail(FleetShares, "15. FLUSHALL", err)
			}
		}
	}
	for _, c := range nodes {
		if info, err := c.Info(ctx, "stats").Result(); err == nil {
			r.logf("  Redis at %s refused %d connections in the run (rejected_connections)", c.Options().Addr, infoInt(info, "rejected_connections"))
		}
	}
}

// scaleBlock is section 15's tables and targets, or why it was not run.
func scaleBlock(r *Results) string {
	if r.FleetScale.Why != "" {
		return r.FleetScale.Why + "\n"
	}
	s := fmt.Sprintf("Measured %s on %s, %d cores (GOMAXPROCS %d), %s, Redis %s", r.Date.Format("2006-01-02 15:04 MST"),
		r.CPU, r.Cores, r.GOMAXPROCS, r.GoVersion, r.FleetScale.RedisVersion)
	if r.LoadBefore != "" {
		s += ", load average " + r.LoadBefore + " at the start and " + r.LoadAfter + " at the end"
	}
	return s + fmt.Sprintf("; the run took %v.\n\n", r.Took.Round(time.Second)) +
		scaleStartTable(r) + "\n" + scaleTable(r) + "\n" + targetTable(scaleTargets(r))
}

// scaleTable renders section 15: a row per fleet size and phase.
func scaleTable(r *Results) string {
	var rows [][]string
	for _, size := range r.FleetScale.Sizes {
		for _, pt := range size.Phases {
			w := pt.Window.Seconds()
			served, moved := "–", "–"
			if pt.Name != ScaleIdle {
				rate := float64(pt.Served) / w
				served = fmt.Sprintf("%s (%s)", format(FormatRate, rate), format(FormatShare, rate/r.Scale.Capacity(size.N)))
			}
			if pt.Name == ScaleMoves {
				moved = convergence(pt.SharesAt, pt.Window) + "; " + convergence(pt.RunningAt, pt.Window)
			}
			rows = append(rows, []string{digits(size.N), pt.Name, format(FormatRate, pt.Calls/w), format(FormatDuration, perCall(pt)),
				format(FormatShare, pt.RedisCPU/w), served, digits(int(pt.Refused[refused503])), digits(int(pt.Refused[refused408])),
				digits(int(pt.Refused[refusedOther])), digits(int(pt.Outages)) + "; " + digits(pt.Down), fmt.Sprintf("%d of %d", pt.Peak, size.Limit), moved})
		}
	}
	return mdTable([]string{"N", "phase", "script calls/s", "Redis CPU per call", "Redis CPU (of one core)", "served/s (of capacity)", "503", "408",
		"other non-2xx", "marked down: times; replicas at the end", "peak running (of the limit)", "load moved: shares; running"}, rows)
}

// scaleStartTable renders how each fleet size of section 15 started.
func scaleStartTable(r *Results) string {
	known := func(n int) string { return map[bool]string{true: digits(n), false: "–"}[n >= 0] }
	var rows [][]string
	for _, s := range r.FleetScale.Sizes {
		rows = append(rows, []string{digits(s.N), digits(s.Limit), digits(s.N * r.Scale.Clients), format(FormatDuration, float64(s.StartUp)),
			digits(int(s.Outages)) + "; " + digits(s.Down), known(s.Connections), known(s.Live)})
	}
	return mdTable([]string{"N", "limit", "clients, loaded", "start-up", "marked down: times; replicas at the end", "Redis connections", "replicas live"}, rows)
}

// scaleTargets checks section 15 against the targets of its issue, at the
// largest fleet size of the plan, and the convergence at every size.
func scaleTargets(r *Results) []target {
	if len(r.Scale.Replicas) == 0 {
		return nil
	}
	big := slices.Max(r.Scale.Replicas)
	var ts []target
	for _, name := range []string{ScaleIdle, ScaleLoaded} {
		at, pt := fmt.Sprintf("N=%s %s: ", digits(big), name), r.scalePhase(big, name)
		ts = append(ts, scaleTarget(at+"Redis CPU ≤ 25% of a core", pt, func(pt *ScalePhase) (string, bool) {
			x := pt.RedisCPU / pt.Window.Seconds()
			return fmt.Sprintf("%s (limit 25.0%%)", format(FormatShare, x)), x <= 0.25
		}), scaleTarget(at+"no replica marks Redis down", pt, func(pt *ScalePhase) (string, bool) {
			return fmt.Sprintf("%s times; %s replicas down at the end", digits(int(pt.Outages)), digits(pt.Down)), pt.Outages == 0 && pt.Down == 0
		}))
	}
	ts = append(ts, scaleTarget(fmt.Sprintf("N=%s loaded: no 503 or 408 (the load calls for none)", digits(big)), r.scalePhase(big, ScaleLoaded), func(pt *ScalePhase) (string, bool) {
		return fmt.Sprintf("503: %s, 408: %s", digits(int(pt.Refused[refused503])), digits(int(pt.Refused[refused408]))), pt.Refused[refused503]+pt.Refused[refused408] == 0
	}))
	for _, n := range r.Scale.Replicas {
		name := fmt.Sprintf("N=%s load moves: the loaded half holds %.0f%% of the limit within 200 ms", digits(n), 100*scaleConverged)
		ts = append(ts, scaleTarget(name, r.scalePhase(n, ScaleMoves), func(pt *ScalePhase) (string, bool) {
			return convergence(pt.SharesAt, pt.Window), pt.SharesAt >= 0 && pt.SharesAt <= 200*time.Millisecond
		}))
	}
	return append(ts, scalePeakTarget(r))
}

// scalePhase is the phase name of fleet size n, or nil if it was not
// measured.
func (r *Results) scalePhase(n int, name string) *ScalePhase {
	for i := range r.FleetScale.Sizes {
		s := &r.FleetScale.Sizes[i]
		for j := range s.Phases {
			if s.N == n && s.Phases[j].Name == name && !math.IsNaN(s.Phases[j].Calls) {
				return &s.Phases[j]
			}
		}
	}
	return nil
}

// scaleTarget is the target name of section 15, checked on pt by figure:
// the figure and whether it was met.
func scaleTarget(name string, pt *ScalePhase, figure func(*ScalePhase) (string, bool)) target {
	t := target{Area: "fleet at scale", Name: name, Figure: "–", Met: "not measured"}
	if pt != nil {
		fig, ok := figure(pt)
		t.Figure, t.Met = fig, map[bool]string{true: "yes", false: "no"}[ok]
	}
	return t
}

// scalePeakTarget checks that the handlers running at once never exceeded
// the limit, at any size in any phase.
func scalePeakTarget(r *Results) target {
	t := target{Area: "fleet at scale", Name: "peak running ≤ the limit, every size and phase", Figure: "–", Met: "not measured"}
	worst, over := -1.0, false
	for _, s := range r.FleetScale.Sizes {
		for _, pt := range s.Phases {
			if q := float64(pt.Peak) / float64(s.Limit); q > worst {
				worst, t.Figure = q, fmt.Sprintf("%d of %d at N=%s, %s", pt.Peak, s.Limit, digits(s.N), pt.Name)
			}
			over = over || pt.Peak > int64(s.Limit)
		}
	}
	if worst >= 0 {
		t.Met = map[bool]string{true: "no", false: "yes"}[over]
	}
	return t
}
