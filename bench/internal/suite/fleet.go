package suite

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// The harness of sections 14 and 15: replicas that share one limit, in
// this process, loaded by closed-loop clients and measured over a window.

// replica is a Queue on a gin engine of its own, on a redisqueue Backend
// with a Redis client of its own, or on the in-memory Backend.
type replica struct {
	rdb redis.UniversalClient // nil with the in-memory Backend
	b   *redisqueue.Backend   // nil with the in-memory Backend
	q   *ginqueue.Queue
	h   http.Handler
}

// close closes whatever of rep started.
func (rep *replica) close() {
	if rep.q != nil {
		_ = rep.q.Close()
	}
	if rep.b != nil {
		_ = rep.b.Close() // NewQueue leaves b open when it fails
	}
	if rep.rdb != nil {
		_ = rep.rdb.Close()
	}
}

// fleet is replicas that share one limit, and what their handlers and
// clients count outside the library.
type fleet struct {
	replicas []replica                    // each written by the goroutine that starts it, before start returns
	cfg      ginqueue.Config              // each replica's Queue, but the Backend
	dial     func() redis.UniversalClient // each replica's own client; nil: the in-memory Backend
	opts     redisqueue.Options           // each replica's Backend
	batch    int                          // replicas started and closed at once; 0 is one
	work     time.Duration                // what a handler sleeps, and a client after a refusal
	nodes    []*redis.Client              // the Redis servers read at the window's ends
	*tally                                // set anew by each measurement
}

// tally is what a fleet's handlers and clients count in one measurement.
// The window's ends are in ns after epoch, math.MaxInt64 until set.
type tally struct {
	epoch         time.Time
	from, to      atomic.Int64
	running, peak atomic.Int64    // handlers running in the fleet; the most at once
	second        atomic.Int64    // handlers running on the second half of the replicas
	served        atomic.Int64    // handlers that ended in the window
	handled, busy atomic.Int64    // their time, and the time of all handlers inside the window, ns
	refused       [3]atomic.Int64 // the answers that were not 2xx, by kind
}

// The kinds of refusal in ScalePhase.Refused.
const (
	refused503   = iota // queue full or Redis unavailable
	refused408          // queue timeout
	refusedOther        // any other status that is not 2xx
)

// newTally is a tally whose window has not opened.
func newTally() *tally {
	t := &tally{epoch: time.Now()}
	t.from.Store(math.MaxInt64)
	t.to.Store(math.MaxInt64)
	return t
}

// at is tm in ns after epoch; opened and closed say whether the window
// has.
func (t *tally) at(tm time.Time) int64 { return int64(tm.Sub(t.epoch)) }
func (t *tally) opened() bool          { return t.from.Load() < math.MaxInt64 }
func (t *tally) closed() bool          { return t.to.Load() < math.MaxInt64 }

// refusal is the kind of refusal of a status that is not 2xx.
func refusal(code int) int {
	switch code {
	case http.StatusServiceUnavailable:
		return refused503
	case http.StatusRequestTimeout:
		return refused408
	}
	return refusedOther
}

// handler sleeps work and counts itself; second: on the second half.
func (f *fleet) handler(second bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		t := f.tally
		raise(&t.peak, t.running.Add(1))
		if second {
			t.second.Add(1)
		}
		t0 := time.Now()
		time.Sleep(f.work)
		t1 := time.Now()
		if second {
			t.second.Add(-1)
		}
		t.running.Add(-1)
		from, to, end := t.from.Load(), t.to.Load(), t.at(t1)
		if end >= from && end < to {
			t.served.Add(1)
			t.handled.Add(int64(t1.Sub(t0)))
		}
		if d := min(end, to) - max(t.at(t0), from); d > 0 {
			t.busy.Add(d)
		}
		c.Status(http.StatusNoContent)
	}
}

// inBatches calls do for every replica, batch at once, and stops after a
// batch with an error or once ctx ends.
func (f *fleet) inBatches(ctx context.Context, do func(i int) error) error {
	batch := max(f.batch, 1)
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

// start starts every replica; close closes those that started.
func (f *fleet) start(ctx context.Context) error { return f.inBatches(ctx, f.startReplica) }

func (f *fleet) close() {
	_ = f.inBatches(context.Background(), func(i int) error { f.replicas[i].close(); return nil })
}

// startReplica starts replica i: its client and Backend, if any, and its
// Queue on an engine of its own.
func (f *fleet) startReplica(i int) error {
	rep, cfg := &f.replicas[i], f.cfg
	if f.dial != nil {
		rep.rdb = f.dial()
		b, err := redisqueue.New(rep.rdb, f.opts)
		if err != nil {
			return fmt.Errorf("replica %d: %w", i+1, err)
		}
		rep.b, cfg.Backend = b, b
	}
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		return fmt.Errorf("replica %d: %w", i+1, err)
	}
	rep.q = q
	rep.h, _ = route(f.handler(i >= len(f.replicas)/2), nil, q.Handler())
	return nil
}

// stats sums of over the Backends' Stats from replica first on.
func (f *fleet) stats(first int, of func(backend.Stats) uint64) uint64 {
	var n uint64
	for _, rep := range f.replicas[first:] {
		if rep.b != nil {
			n += of(rep.b.Stats())
		}
	}
	return n
}

// outages sums the times the replicas marked Redis down.
func (f *fleet) outages() uint64 {
	return f.stats(0, func(s backend.Stats) uint64 { return s.Outages })
}

// down counts the replicas that have Redis marked down now.
func (f *fleet) down() int {
	n := 0
	for _, rep := range f.replicas {
		if rep.b != nil && rep.b.Stats().Unavailable {
			n++
		}
	}
	return n
}

// client sends requests to replica at, moveBy replicas on once the window
// opens, each as soon as the last is answered, until the window closes.
func (f *fleet) client(at, moveBy int) {
	req, w := httptest.NewRequest(http.MethodGet, "/", nil), newWriter()
	for !f.closed() {
		i := at
		if f.opened() {
			i += moveBy
		}
		if code := serve(f.replicas[i].h, w, req); code < 200 || code > 299 {
			f.refused[refusal(code)].Add(1)
			time.Sleep(f.work) // a refusal returns at once: do not spin on it
		}
	}
}

// fleetPoint is what a fleet gave in one measurement: section 15's
// figures, and more that section 14 reports.
type fleetPoint struct {
	ScalePhase
	handled, busy  time.Duration      // the time of the handlers that ended in the window; all handler time inside it
	redis          []redisLoad        // each Redis server's growth over the window; nil if one did not answer
	sent, inScript map[string]float64 // section 14: the commands the replicas sent; those their scripts ran
}

func (pt *fleetPoint) refusals() int64 { return pt.Refused[0] + pt.Refused[1] + pt.Refused[2] }

// measure runs clients[i] closed-loop clients on replica i through warmUp
// and a window of d; they move moveBy replicas on as it opens, and during,
// if set, runs then. What it measured comes back even with an error.
func (f *fleet) measure(ctx context.Context, clients []int, moveBy int, warmUp, d time.Duration, during func(start, end time.Time)) (*fleetPoint, error) {
	runtime.GC() // the previous measurement's garbage is collected on its own time
	f.tally = newTally()
	outages0 := f.outages()
	var wg sync.WaitGroup
	for i, n := range clients {
		for range n {
			wg.Go(func() { f.client(i, moveBy) })
		}
	}
	pt, err := f.window(ctx, warmUp, d, during)
	wg.Wait()
	pt.Served, pt.Peak, pt.Outages = f.served.Load(), f.peak.Load(), f.outages()-outages0
	pt.handled, pt.busy = time.Duration(f.handled.Load()), time.Duration(f.busy.Load())
	for i := range pt.Refused {
		pt.Refused[i] = f.refused[i].Load()
	}
	return pt, err
}

// window waits out warmUp, then opens the window for d, reading the Redis
// servers and this process's CPU at both ends. Closing it ends the
// clients.
func (f *fleet) window(ctx context.Context, warmUp, d time.Duration, during func(start, end time.Time)) (*fleetPoint, error) {
	sleepCtx(ctx, warmUp)
	l0, err0 := f.read(ctx)
	cpu0, start := processCPU(), time.Now()
	f.from.Store(f.at(start))
	if during != nil {
		during(start, start.Add(d))
	}
	sleepCtx(ctx, time.Until(start.Add(d)))
	l1, err1 := f.read(ctx)
	cpu1, end := processCPU(), time.Now()
	f.to.Store(f.at(end))
	pt := &fleetPoint{ScalePhase: ScalePhase{Window: end.Sub(start), BenchCPU: cpu1 - cpu0, Down: f.down(),
		Calls: math.NaN(), RedisCPU: math.NaN(), ShardCPU: math.NaN()}}
	if err := errors.Join(ctx.Err(), err0, err1); err != nil || l1 == nil {
		return pt, err
	}
	pt.Calls, pt.RedisCPU, pt.ShardCPU = 0, 0, 0
	for i := range l1 {
		l := l1[i].since(l0[i])
		calls, _ := l.scripts()
		pt.Calls, pt.RedisCPU, pt.ShardCPU = pt.Calls+calls, pt.RedisCPU+l.cpu, max(pt.ShardCPU, l.cpu)
		pt.redis = append(pt.redis, l)
	}
	return pt, nil
}

// read reads INFO cpu and commandstats of each of the fleet's Redis servers.
func (f *fleet) read(ctx context.Context) ([]redisLoad, error) {
	var ls []redisLoad
	for _, c := range f.nodes {
		l, err := readLoad(ctx, c)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
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
