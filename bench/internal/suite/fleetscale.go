package suite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
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

// Sizes lists the fleet sizes: "16, 64, 256 and 1,024".
func (s ScalePlan) Sizes() string { return andList(s.Replicas) }

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
	Served   int64    // 2xx answers
	Refused  [3]int64 // the other answers, by kind: refused503, refused408, refusedOther
	Outages  uint64   // times a replica marked Redis down (Stats().Outages), summed
	Down     int      // replicas that had Redis marked down (Stats().Unavailable) at the window's end
	Peak     int64    // the most handlers running at once in the fleet
	// Load moves only: from the move until the second half held
	// scaleConverged of the limit, as shares and as running; -1 if never.
	SharesAt, RunningAt time.Duration
}

// The kinds of refusal in ScalePhase.Refused.
const (
	refused503   = iota // queue full or Redis unavailable
	refused408          // queue timeout
	refusedOther        // any other status that is not 2xx
)

// scaleCounts is what a fleet's handlers and clients count, outside the
// library; each phase resets it.
type scaleCounts struct {
	running, peak atomic.Int64 // handlers running in the fleet; the most at once
	second        atomic.Int64 // handlers running on the second half of the replicas
	window        atomic.Bool  // set while the phase's window is open
	served        atomic.Int64 // 2xx answers while window was set
	refused       [3]atomic.Int64
}

func (c *scaleCounts) reset() {
	c.peak.Store(c.running.Load())
	c.served.Store(0)
	for i := range c.refused {
		c.refused[i].Store(0)
	}
}

// enter counts a handler that starts, on the second half or not.
func (c *scaleCounts) enter(second bool) {
	raise(&c.peak, c.running.Add(1))
	if second {
		c.second.Add(1)
	}
}

func (c *scaleCounts) leave(second bool) {
	if second {
		c.second.Add(-1)
	}
	c.running.Add(-1)
}

// answer counts the status a client got and reports whether it was served.
func (c *scaleCounts) answer(code int) bool {
	switch {
	case code >= 200 && code < 300:
		if c.window.Load() {
			c.served.Add(1)
		}
		return true
	case code == http.StatusServiceUnavailable:
		c.refused[refused503].Add(1)
	case code == http.StatusRequestTimeout:
		c.refused[refused408].Add(1)
	default:
		c.refused[refusedOther].Add(1)
	}
	return false
}

// scaleReplica is a Backend in Shares mode on a client of its own, under
// a Queue on a gin engine of its own.
type scaleReplica struct {
	rdb redis.UniversalClient
	b   *redisqueue.Backend
	q   *ginqueue.Queue
	h   http.Handler
}

// scaleFleet is the replicas of one fleet size, all under one Name.
type scaleFleet struct {
	plan     ScalePlan
	addrs    []string // one Redis, or the Cluster's masters
	name     string
	limit    int
	replicas []scaleReplica // each written by the goroutine that starts it, before start returns
	counts   scaleCounts
}

// newScaleFleet is a fleet of n replicas, not started, under a fresh Name.
func newScaleFleet(plan ScalePlan, addrs []string, n int) *scaleFleet {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &scaleFleet{plan: plan, addrs: addrs, name: fmt.Sprintf("scale%d-%s", n, hex.EncodeToString(b[:])),
		limit: plan.Limit(n), replicas: make([]scaleReplica, n)}
}

// inBatches calls do for every replica, StartBatch at once, and stops
// after a batch with an error or once ctx ends.
func (f *scaleFleet) inBatches(ctx context.Context, do func(i int) error) error {
	batch := max(f.plan.StartBatch, 1)
	for lo := 0; lo < len(f.replicas); lo += batch {
		if err := ctx.Err(); err != nil {
			return err
		}
		hi := min(lo+batch, len(f.replicas))
		errs := make([]error, hi-lo)
		var wg sync.WaitGroup
		for i := lo; i < hi; i++ {
			wg.Go(func() { errs[i-lo] = do(i) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

// startReplica starts replica i: a client with a small pool, a Backend in
// Shares mode with default Options otherwise, and its Queue.
func (f *scaleFleet) startReplica(i int) error {
	rep := &f.replicas[i]
	o := redisqueue.Options{Name: f.name, Mode: redisqueue.Shares}
	if f.plan.Parts > 1 {
		o.Shares.Parts = f.plan.Parts
		rep.rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: f.addrs, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 2})
	} else {
		rep.rdb = redis.NewClient(&redis.Options{Addr: f.addrs[0], ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 2})
	}
	b, err := redisqueue.New(rep.rdb, o)
	if err != nil {
		return fmt.Errorf("replica %d: %w", i+1, err)
	}
	rep.b = b
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: f.limit, MaxQueue: f.plan.MaxQueue, QueueTimeout: f.plan.QueueTimeout, Backend: b})
	if err != nil {
		return fmt.Errorf("replica %d: %w", i+1, err)
	}
	rep.q = q
	rep.h, _ = route(f.handler(i >= len(f.replicas)/2), nil, q.Handler())
	return nil
}

// handler sleeps work and counts itself running; second: on the second half.
func (f *scaleFleet) handler(second bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		f.counts.enter(second)
		defer f.counts.leave(second)
		time.Sleep(f.plan.work(len(f.replicas)))
		c.Status(http.StatusNoContent)
	}
}

// close closes every replica that started.
func (f *scaleFleet) close() {
	_ = f.inBatches(context.Background(), func(i int) error {
		rep := &f.replicas[i]
		if rep.q != nil {
			_ = rep.q.Close()
		}
		if rep.b != nil {
			_ = rep.b.Close() // NewQueue leaves b open when it fails
		}
		if rep.rdb != nil {
			_ = rep.rdb.Close()
		}
		return nil
	})
}

// sum adds up of over the Stats of the replicas from first on.
func (f *scaleFleet) sum(first int, of func(backend.Stats) uint64) uint64 {
	var n uint64
	for _, rep := range f.replicas[first:] {
		n += of(rep.b.Stats())
	}
	return n
}

// outages sums the times the replicas marked Redis down; down counts those
// with it marked down now; secondShares sums the second half's shares.
func (f *scaleFleet) outages() uint64 {
	return f.sum(0, func(s backend.Stats) uint64 { return s.Outages })
}
func (f *scaleFleet) down() int {
	return int(f.sum(0, func(s backend.Stats) uint64 {
		if s.Unavailable {
			return 1
		}
		return 0
	}))
}
func (f *scaleFleet) secondShares() int {
	return int(f.sum(len(f.replicas)/2, func(s backend.Stats) uint64 { return uint64(s.Limit) }))
}

// clients starts Clients closed-loop clients on replicas first to last
// (excluded); once moved is set they move moveBy on, once stop, they end.
func (f *scaleFleet) clients(wg *sync.WaitGroup, first, last, moveBy int, moved, stop *atomic.Bool) {
	for i := first; i < last; i++ {
		for range f.plan.Clients {
			wg.Go(func() { f.client(i, moveBy, moved, stop) })
		}
	}
}

func (f *scaleFleet) client(at, moveBy int, moved, stop *atomic.Bool) {
	req, w := httptest.NewRequest(http.MethodGet, "/", nil), newWriter()
	for !stop.Load() {
		i := at
		if moved.Load() {
			i += moveBy
		}
		if !f.counts.answer(serve(f.replicas[i].h, w, req)) {
			time.Sleep(f.plan.work(len(f.replicas))) // do not spin on refusals
		}
	}
}

// redisNodes are the Redis servers of a run: one, or a Cluster's masters.
type redisNodes []*redis.Client

// load reads the script calls (summed) and CPU seconds (by server).
func (ns redisNodes) load(ctx context.Context) (calls float64, cpu []float64, err error) {
	for _, c := range ns {
		l, err := readLoad(ctx, c)
		if err != nil {
			return 0, nil, err
		}
		n, _ := l.scripts()
		calls += n
		cpu = append(cpu, l.cpu)
	}
	return calls, cpu, nil
}

// sleepCtx sleeps for d or until ctx ends; false if it ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// scaleSpec is how a phase loads the fleet.
type scaleSpec struct {
	name         string
	first, last  int           // the replicas whose clients start the phase; none when equal
	moveBy       int           // at the window's start the clients move this many replicas on; 0 stays
	before       time.Duration // the load before the window
	measureMoves bool          // sample the convergence in the window
}

// specs are the phases of a fleet of n replicas, in order.
func (s ScalePlan) specs(n int) []scaleSpec {
	return []scaleSpec{
		{name: ScaleIdle, before: s.WarmUp},
		{name: ScaleLoaded, last: n, before: s.WarmUp},
		{name: ScaleMoves, last: n / 2, moveBy: n / 2, before: s.Settle, measureMoves: true},
	}
}

// phase runs sp's clients through the load before the window and the
// window; they have all returned when it does.
func (f *scaleFleet) phase(ctx context.Context, ctl redisNodes, sp scaleSpec) (ScalePhase, error) {
	runtime.GC() // the previous phase's garbage is collected on its own time
	pt := ScalePhase{Name: sp.name, Calls: math.NaN(), RedisCPU: math.NaN(), ShardCPU: math.NaN(), BenchCPU: math.NaN(), SharesAt: -1, RunningAt: -1}
	f.counts.reset()
	outages0 := f.outages()
	var moved, stop atomic.Bool
	var wg sync.WaitGroup
	f.clients(&wg, sp.first, sp.last, sp.moveBy, &moved, &stop)
	err := f.window(ctx, ctl, sp, &pt, &moved)
	stop.Store(true)
	wg.Wait()
	pt.Served, pt.Peak, pt.Outages = f.counts.served.Load(), f.counts.peak.Load(), f.outages()-outages0
	for i := range pt.Refused {
		pt.Refused[i] = f.counts.refused[i].Load()
	}
	return pt, err
}

// window waits out the load before it, then measures Redis's counters,
// this process's CPU and the replicas down into pt. It sets moved at its
// start and, if sp says so, samples the convergence.
func (f *scaleFleet) window(ctx context.Context, ctl redisNodes, sp scaleSpec, pt *ScalePhase, moved *atomic.Bool) error {
	if !sleepCtx(ctx, sp.before) {
		return ctx.Err()
	}
	calls0, cpu0, err := ctl.load(ctx)
	if err != nil {
		return err
	}
	bench0, start := processCPU(), time.Now()
	f.counts.window.Store(true)
	defer f.counts.window.Store(false)
	moved.Store(true)
	end := start.Add(f.plan.Window)
	if sp.measureMoves {
		pt.SharesAt, pt.RunningAt = f.converge(ctx, start, end)
	}
	if !sleepCtx(ctx, time.Until(end)) {
		return ctx.Err()
	}
	calls1, cpu1, err := ctl.load(ctx)
	f.counts.window.Store(false)
	pt.Window, pt.BenchCPU, pt.Down = time.Since(start), processCPU()-bench0, f.down()
	if err == nil {
		pt.Calls, pt.RedisCPU, pt.ShardCPU = calls1-calls0, 0, 0
		for i := range cpu1 {
			pt.RedisCPU += cpu1[i] - cpu0[i]
			pt.ShardCPU = max(pt.ShardCPU, cpu1[i]-cpu0[i])
		}
	}
	return err
}

// converge samples every 5 ms the second half's shares and running
// handlers: how long after start each reached scaleConverged of the limit
// (-1: not before end).
func (f *scaleFleet) converge(ctx context.Context, start, end time.Time) (shares, running time.Duration) {
	need := int(math.Ceil(scaleConverged * float64(f.limit)))
	shares, running = -1, -1
	for now := time.Now(); now.Before(end) && (shares < 0 || running < 0); now = time.Now() {
		if running < 0 && int(f.counts.second.Load()) >= need {
			running = now.Sub(start)
		}
		if shares < 0 && f.secondShares() >= need {
			shares = now.Sub(start)
		}
		if !sleepCtx(ctx, 5*time.Millisecond) {
			break
		}
	}
	return shares, running
}

// census counts Redis's clients and live replicas; -1 where it did not answer.
func (f *scaleFleet) census(ctx context.Context, ctl redisNodes) (conns, live int) {
	conns, live = 0, -1
	for _, c := range ctl {
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
func (r *runner) scaleSize(ctx context.Context, addrs []string, ctl redisNodes, n int) (*ScaleSize, error) {
	f := newScaleFleet(r.Scale, addrs, n)
	defer f.close()
	start := time.Now()
	if err := f.inBatches(ctx, f.startReplica); err != nil {
		return nil, fmt.Errorf("starting %d replicas: %w", n, err)
	}
	size := &ScaleSize{N: n, Limit: f.limit, StartUp: time.Since(start), Outages: f.outages(), Down: f.down()}
	size.Connections, size.Live = f.census(ctx, ctl)
	r.logf("  N=%d: %d replicas started in %v, marked Redis down %d times, %d down now; Redis: %d connections, %d replicas live",
		n, n, size.StartUp.Round(time.Millisecond), size.Outages, size.Down, size.Connections, size.Live)
	for _, sp := range r.Scale.specs(n) {
		pt, err := f.phase(ctx, ctl, sp)
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
	var ctl redisNodes
	for _, s := range srvs {
		defer s.stop()
		addrs, ctl = append(addrs, s.addr), append(ctl, s.ctl)
	}
	if info, err := ctl[0].Info(ctx, "server").Result(); err == nil {
		res.RedisVersion = infoString(info, "redis_version")
	}
	r.logf("  redis-server %s on %s", res.RedisVersion, strings.Join(addrs, ", "))
	for _, n := range r.Scale.Replicas {
		size, err := r.scaleSize(ctx, addrs, ctl, n)
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
		for _, c := range ctl {
			if err := c.FlushAll(ctx).Err(); err != nil {
				r.fail(FleetShares, "15. FLUSHALL", err)
			}
		}
	}
	for _, c := range ctl {
		if info, err := c.Info(ctx, "stats").Result(); err == nil {
			r.logf("  Redis at %s refused %d connections in the run (rejected_connections)", c.Options().Addr, infoInt(info, "rejected_connections"))
		}
	}
}
