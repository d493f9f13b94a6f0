package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// fleetCounter counts the requests running across a fleet, outside the
// library, and keeps the peak and a running sum for the mean.
type fleetCounter struct {
	now, peak atomic.Int64
	peakAt    atomic.Int64 // when the peak was first reached, in Unix nanoseconds
}

// raise records v as the peak if it is above it.
func (f *fleetCounter) raise(v int64) {
	for p := f.peak.Load(); v > p; p = f.peak.Load() {
		if f.peak.CompareAndSwap(p, v) {
			f.peakAt.Store(time.Now().UnixNano())
			return
		}
	}
}

func (f *fleetCounter) handler(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		f.raise(f.now.Add(1))
		time.Sleep(d)
		f.now.Add(-1)
	}
}

// sharesFleet builds n replicas of one Name in Shares mode, on one Redis.
func sharesFleet(t *testing.T, n int, cfg ginqueue.Config, o redisqueue.Options, h gin.HandlerFunc) []*replica {
	t.Helper()
	if o.Name == "" {
		o.Name = newName(t)
	}
	o.Mode = redisqueue.Shares
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = newReplica(t, redisAddr, cfg, o, h)
	}
	return rs
}

// drive runs clients closed-loop clients on each replica (clients[i] on
// rs[i]) for d and returns the statuses each replica answered.
func drive(rs []*replica, clients []int, d time.Duration) []map[int]int {
	out := make([]map[int]int, len(rs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i, r := range rs {
		out[i] = map[int]int{}
		for range clients[i] {
			wg.Go(func() {
				for time.Now().Before(end) {
					code := r.get()
					mu.Lock()
					out[i][code]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return out
}

func TestSharesKeepTheLimitUnderUnevenLoad(t *testing.T) {
	needRedis(t)
	var f fleetCounter
	cfg := ginqueue.Config{MaxConcurrent: 16, MaxQueue: 64, QueueTimeout: 2 * time.Second}
	rs := sharesFleet(t, 4, cfg, redisqueue.Options{Mode: redisqueue.GlobalQueue}, f.handler(5*time.Millisecond))
	out := drive(rs, []int{2, 2, 2, 26}, 2*time.Second)
	for i, o := range out {
		t.Logf("replica %d: %v share %d", i, o, rs[i].b.Stats().Limit)
	}
	if p := f.peak.Load(); p > 16 {
		t.Fatalf("peak %d running across the fleet, limit 16", p)
	}
}

// sampler reads a fleet counter every millisecond and keeps the mean.
type sampler struct {
	stop chan struct{}
	done chan float64
}

func sample(f *fleetCounter) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan float64, 1)}
	go func() {
		var sum, n float64
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-s.stop:
				s.done <- sum / max(n, 1)
				return
			case <-tk.C:
				sum += float64(f.now.Load())
				n++
			}
		}
	}()
	return s
}

func (s *sampler) mean() float64 { close(s.stop); return <-s.done }

// Under uneven saturation (8, 8, 8 and 104 clients on four replicas, 20 ms
// handlers) the shares follow the demand: the fleet runs at its limit, and
// never above it.
func TestSharesUseTheLimitUnderUnevenLoad(t *testing.T) {
	needRedis(t)
	var f fleetCounter
	cfg := ginqueue.Config{MaxConcurrent: 64, MaxQueue: 128, QueueTimeout: 5 * time.Second}
	rs := sharesFleet(t, 4, cfg, redisqueue.Options{Mode: redisqueue.GlobalQueue}, f.handler(20*time.Millisecond))
	var s *sampler
	time.AfterFunc(500*time.Millisecond, func() { s = sample(&f) })
	out := drive(rs, []int{8, 8, 8, 104}, 3*time.Second)
	mean := s.mean()
	for i, o := range out {
		t.Logf("replica %d: %v, share at the end %d", i, o, rs[i].b.Stats().Limit)
	}
	t.Logf("mean running %.1f of 64, peak %d", mean, f.peak.Load())
	if p := f.peak.Load(); p > 64 {
		t.Errorf("peak %d running across the fleet, limit 64", p)
	}
	if mean < 0.95*64 {
		t.Errorf("mean running %.1f, want at least %.1f (0.95 × the limit)", mean, 0.95*64)
	}
	for i, o := range out {
		if o[200] == 0 {
			t.Errorf("replica %d served nothing", i)
		}
	}
}

// shape is a load whose clients per replica change while it runs: worker j
// of replica i sends requests while j < want[i]. Latencies of 200s are kept
// per replica, from when keep is set.
type shape struct {
	want    []atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
	keep    atomic.Bool
	mu      sync.Mutex
	lat     [][]time.Duration
	answers []map[int]int
}

func startShape(rs []*replica, most int) *shape {
	s := &shape{want: make([]atomic.Int64, len(rs)), stop: make(chan struct{}),
		lat: make([][]time.Duration, len(rs)), answers: make([]map[int]int, len(rs))}
	for i, r := range rs {
		s.answers[i] = map[int]int{}
		for j := range most {
			s.wg.Go(func() {
				for {
					select {
					case <-s.stop:
						return
					default:
					}
					if int64(j) >= s.want[i].Load() {
						time.Sleep(time.Millisecond)
						continue
					}
					start := time.Now()
					code := r.get()
					d := time.Since(start)
					s.mu.Lock()
					s.answers[i][code]++
					if code == 200 && s.keep.Load() {
						s.lat[i] = append(s.lat[i], d)
					}
					s.mu.Unlock()
				}
			})
		}
	}
	return s
}

func (s *shape) set(clients ...int) {
	for i, n := range clients {
		s.want[i].Store(int64(n))
	}
}

func (s *shape) end() { close(s.stop); s.wg.Wait() }

// steadyMedians returns the median latency of each replica over a second,
// from half a second on, once the shares have settled.
func (s *shape) steadyMedians() []time.Duration {
	time.Sleep(500 * time.Millisecond)
	s.mu.Lock()
	s.lat = make([][]time.Duration, len(s.lat))
	s.mu.Unlock()
	s.keep.Store(true)
	time.Sleep(time.Second)
	s.keep.Store(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make([]time.Duration, len(s.lat))
	for i, l := range s.lat {
		if len(l) == 0 {
			continue
		}
		c := slices.Clone(l)
		slices.Sort(c)
		m[i] = c[len(c)/2]
	}
	return m
}

// shareReaches returns how long after from replica r's share first reached
// at least n, polling every millisecond for up to d; d+1 if never.
func shareReaches(r *replica, n int, from time.Time, d time.Duration) time.Duration {
	for time.Since(from) <= d {
		if r.b.Stats().Limit >= n {
			return time.Since(from)
		}
		time.Sleep(500 * time.Microsecond)
	}
	return d + 1
}

// Shares follow the demand: an idle replica hands its slots to one whose
// requests wait within 100 ms; a replica that gets 4× the clients of the
// others has its share grown within 100 ms, and again when the load moves
// to another; at steady state the median waits are within 2× of each other.
func TestSharesFollowTheDemand(t *testing.T) {
	needRedis(t)
	const limit, handler = 32, 10 * time.Millisecond
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 256, QueueTimeout: 5 * time.Second}
	var f fleetCounter
	rs := sharesFleet(t, 4, cfg, redisqueue.Options{Mode: redisqueue.GlobalQueue}, f.handler(handler))
	ld := startShape(rs, 32)
	defer ld.end()
	// Idle: the limit is split evenly, as room for arrivals.
	eventually(t, 2*time.Second, "idle shares not split evenly", func() bool {
		for _, r := range rs {
			if r.b.Stats().Limit != limit/4 {
				return false
			}
		}
		return true
	})

	t0 := time.Now()
	ld.set(0, 32, 0, 0)
	if d := shareReaches(rs[1], limit, t0, time.Second); d > 100*time.Millisecond {
		t.Errorf("the idle replicas handed their slots on after %v, want within 100ms", d)
	} else {
		t.Logf("idle replicas handed every slot on within %v", d)
	}

	// 4× the clients on replica 0: its target is 32 × 32/56, 18. Busy
	// slots move only for a shortfall of a quarter of the target or more,
	// so it gets at least 14 of them.
	const grown = 14
	t1 := time.Now()
	ld.set(32, 8, 8, 8)
	if d := shareReaches(rs[0], grown, t1, time.Second); d > 100*time.Millisecond {
		t.Errorf("the busy replica's share grew to %d after %v, want within 100ms", grown, d)
	} else {
		t.Logf("replica 0's share grew to %d within %v", grown, d)
	}
	checkWaits(t, ld.steadyMedians(), handler)

	// The load moves to replica 2.
	t2 := time.Now()
	ld.set(8, 8, 32, 8)
	if d := shareReaches(rs[2], grown, t2, time.Second); d > 100*time.Millisecond {
		t.Errorf("after the load moved, replica 2's share grew to %d after %v, want within 100ms", grown, d)
	} else {
		t.Logf("after the load moved, replica 2's share grew to %d within %v", grown, d)
	}
	checkWaits(t, ld.steadyMedians(), handler)
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d running across the fleet, limit %d", p, limit)
	}
}

// checkWaits fails unless the median waits (latency less the handler) are
// within 2× of each other.
func checkWaits(t *testing.T, medians []time.Duration, handler time.Duration) {
	t.Helper()
	lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
	for _, m := range medians {
		w := max(m-handler, time.Millisecond) // a wait below 1 ms is no wait
		lo, hi = min(lo, w), max(hi, w)
	}
	t.Logf("median latencies %v (handler %v)", medians, handler)
	if hi > 2*lo {
		t.Errorf("median waits from %v to %v, want within 2× of each other", lo, hi)
	}
}

// Priority across the fleet: high-priority waiters on one replica, low on
// another: the slots go to the high-priority ones, within a move period of
// their coming.
func TestSharesGoToHigherPriorities(t *testing.T) {
	needRedis(t)
	const limit, handler = 8, 10 * time.Millisecond
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue}
	var f fleetCounter
	low := sharesFleet(t, 1, ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 300 * time.Millisecond}, o, f.handler(handler))
	high := sharesFleet(t, 1, ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 300 * time.Millisecond,
		Priority: func(*gin.Context) int { return 10 }}, o, f.handler(handler))
	rs := []*replica{low[0], high[0]}
	ld := startShape(rs, 16)
	defer ld.end()
	ld.set(16, 0)
	if d := shareReaches(rs[0], limit, time.Now(), time.Second); d > time.Second {
		t.Fatal("the low-priority replica never got the whole limit")
	}
	t0 := time.Now()
	ld.set(16, 16)
	d := shareReaches(rs[1], limit, t0, time.Second)
	t.Logf("the high-priority replica had the whole limit after %v", d)
	if d > redisqueue.DefaultSharePeriod+handler+40*time.Millisecond {
		t.Errorf("the high-priority replica had the whole limit after %v, want within a period and a handler", d)
	}
	time.Sleep(200 * time.Millisecond)
	ld.mu.Lock()
	before := ld.answers[0][200]
	ld.mu.Unlock()
	time.Sleep(500 * time.Millisecond)
	ld.mu.Lock()
	after := ld.answers[0][200]
	ld.mu.Unlock()
	if after > before {
		t.Errorf("the low-priority replica served %d while high-priority requests waited", after-before)
	}
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d running across the fleet, limit %d", p, limit)
	}
}

// Waiters of a higher priority on one replica take the busy slots of a
// replica whose requests are of a lower priority, however small the
// shortfall: moving busy slots only for a large one (a quarter of the
// target) would leave a high-priority request waiting for good while
// priority-0 requests run elsewhere. Here the limit is 16, the replica of
// priority 10 has 8 clients and then 9, the one of priority 0 has 32: the
// first gets 9 slots, and its requests wait only in passing.
func TestSharesHigherPriorityTakesBusySlotsForASmallShortfall(t *testing.T) {
	needRedis(t)
	const limit, handler = 16, 10 * time.Millisecond
	var f fleetCounter
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares}
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 256, QueueTimeout: 5 * time.Second}
	high := cfg
	high.Priority = func(*gin.Context) int { return 10 }
	h := f.handler(handler)
	rs := []*replica{newReplica(t, redisAddr, high, o, h), newReplica(t, redisAddr, cfg, o, h)}
	ld := startShape(rs, 2*limit)
	defer ld.end()
	ld.set(0, 2*limit)
	eventually(t, 2*time.Second, "the priority-0 replica never held the whole limit", func() bool {
		return rs[1].b.Stats().Limit == limit
	})
	ld.set(8, 2*limit)
	eventually(t, 2*time.Second, "the priority-10 replica never held 8", func() bool { return rs[0].b.Stats().Limit >= 8 })
	ld.set(9, 2*limit) // one more: a shortfall of one slot, a ninth of its target
	time.Sleep(300 * time.Millisecond)
	samples, waiting, share := 0, 0, 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		st := rs[0].b.Stats()
		samples++
		share += st.Limit
		if st.Queued > 0 {
			waiting++
		}
	}
	frac := float64(waiting) / float64(samples)
	t.Logf("priority 10 (9 clients): requests waiting in %.0f%% of %d samples, mean share %.1f; priority 0 (%d clients): share %d at the end; peak %d running, limit %d",
		100*frac, samples, float64(share)/float64(samples), 2*limit, rs[1].b.Stats().Limit, f.peak.Load(), limit)
	if frac > 0.25 {
		t.Errorf("priority-10 requests waited in %.0f%% of the samples while priority-0 requests ran on the other replica, want at most 25%%",
			100*frac)
	}
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d running across the fleet, limit %d", p, limit)
	}
}

// During an outage (Redis paused for 3 s, or killed and started again
// empty) every replica goes on admitting within the share it holds: the
// fleet never runs over its limit, nobody waits past QueueTimeout, and
// after Redis is back the shares move again within a period.
func TestSharesRideThroughAnOutage(t *testing.T) {
	needRedis(t)
	for _, fault := range []string{"paused", "killed"} {
		for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
			t.Run(fault+"/"+policy.String(), func(t *testing.T) {
				srv := startRedis(t)
				const limit, handler, timeout = 12, 10 * time.Millisecond, 500 * time.Millisecond
				var f fleetCounter
				cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: timeout}
				o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, OnRedisDown: policy, CallTimeout: 50 * time.Millisecond, LeaseTTL: 10 * time.Second}
				var rs []*replica
				for range 3 {
					rs = append(rs, newReplica(t, srv.addr(), cfg, o, f.handler(handler)))
				}
				ld := startShape(rs, 12)
				defer ld.end()
				ld.set(6, 6, 6)
				time.Sleep(500 * time.Millisecond)
				ld.mu.Lock()
				before := make([]int, 3)
				for i := range before {
					before[i] = ld.answers[i][200]
				}
				ld.mu.Unlock()
				var back time.Time
				switch fault {
				case "paused":
					pause(t, srv, 3*time.Second)
					back = time.Now().Add(3 * time.Second)
					time.Sleep(3 * time.Second)
				case "killed":
					srv.stop()
					time.Sleep(2 * time.Second)
					srv.start()
					back = time.Now()
				}
				ld.mu.Lock()
				for i := range before {
					if n := ld.answers[i][200] - before[i]; n == 0 {
						t.Errorf("replica %d served nothing during the outage", i)
					}
				}
				ld.mu.Unlock()
				// Demand moves after Redis is back: replica 0 alone.
				ld.set(12, 0, 0)
				d := shareReaches(rs[0], limit, back, 2*time.Second)
				t.Logf("replica 0 had the whole limit %v after Redis was back", d)
				if d > redisqueue.DefaultSharePeriod+handler+100*time.Millisecond {
					t.Errorf("shares moved %v after Redis was back", d)
				}
				ld.end()
				ld.stop = make(chan struct{}) // the deferred end has nothing left to stop
				for i := range rs {
					t.Logf("replica %d: %v, outages %d", i, ld.answers[i], rs[i].b.Stats().Outages)
					if ld.answers[i][408] > 0 {
						t.Errorf("replica %d answered %d × 408", i, ld.answers[i][408])
					}
				}
				ld.mu.Lock()
				for i, l := range ld.lat {
					for _, x := range l {
						if x > timeout+handler+100*time.Millisecond {
							t.Errorf("replica %d: a request took %v, QueueTimeout %v", i, x, timeout)
							break
						}
					}
				}
				ld.mu.Unlock()
				if p := f.peak.Load(); p > limit {
					t.Errorf("peak %d running across the fleet, limit %d", p, limit)
				}
			})
		}
	}
}

// event is one answer and when it came.
type event struct {
	at   time.Time
	code int
}

// recordEvents starts clients closed-loop clients on each of rs, which
// wait 2 ms after an answer other than 200; the func it returns stops
// them and hands back every answer.
func recordEvents(rs []*replica, clients int) func() []event {
	var mu sync.Mutex
	var evs []event
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range rs {
		for range clients {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					code := r.get()
					mu.Lock()
					evs = append(evs, event{time.Now(), code})
					mu.Unlock()
					if code != http.StatusOK {
						time.Sleep(2 * time.Millisecond)
					}
				}
			})
		}
	}
	return func() []event {
		close(stop)
		wg.Wait()
		return evs
	}
}

// Once the lease of its share runs out with Redis still unreachable, a
// replica admits nothing, under either policy: it answers 503 (never 408)
// until Redis answers, and then serves its first request within 50 ms.
// FailOpen used to go on admitting within the share past the lease, which
// a replica cut off from Redis alone cannot do without breaking the limit
// once the others are granted its share.
func TestSharesApplyOnRedisDownOnceTheLeaseRunsOut(t *testing.T) {
	needRedis(t)
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			srv := startRedis(t)
			const lease = time.Second
			var f fleetCounter
			cfg := ginqueue.Config{MaxConcurrent: 4, MaxQueue: 16, QueueTimeout: 300 * time.Millisecond}
			o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, OnRedisDown: policy, CallTimeout: 50 * time.Millisecond, LeaseTTL: lease}
			rs := []*replica{newReplica(t, srv.addr(), cfg, o, f.handler(5*time.Millisecond)),
				newReplica(t, srv.addr(), cfg, o, f.handler(5*time.Millisecond))}
			record := recordEvents(rs, 2)
			time.Sleep(300 * time.Millisecond)
			paused := time.Now()
			pause(t, srv, 2500*time.Millisecond)
			back := answersAgain(t, srv, paused.Add(2500*time.Millisecond))
			time.Sleep(time.Until(back.Add(500 * time.Millisecond)))
			evs := record()
			inLease, afterLease, firstAfter := 0, map[int]int{}, time.Duration(-1)
			for _, e := range evs {
				switch {
				case e.at.After(paused) && e.at.Before(paused.Add(lease*8/10)):
					if e.code == 200 {
						inLease++
					}
				case e.at.After(paused.Add(lease+100*time.Millisecond)) && e.at.Before(back):
					afterLease[e.code]++
				case !e.at.Before(back) && e.code == 200 && firstAfter < 0:
					firstAfter = e.at.Sub(back)
				}
			}
			t.Logf("%v: %d served in the lease, after it %v, first 200 %v after Redis answered", policy, inLease, afterLease, firstAfter)
			if inLease == 0 {
				t.Error("nothing served within the lease")
			}
			if afterLease[408] > 0 {
				t.Errorf("%d × 408 after the lease ran out", afterLease[408])
			}
			if afterLease[200] > 0 || afterLease[503] == 0 {
				t.Errorf("%v after the lease: %v, want 503s only", policy, afterLease)
			}
			if firstAfter < 0 || firstAfter > 50*time.Millisecond {
				t.Errorf("first 200 %v after Redis answered again, want within 50ms", firstAfter)
			}
			if p := f.peak.Load(); p > 4 {
				t.Errorf("peak %d running across the fleet, limit 4", p)
			}
		})
	}
}

// answersAgain returns when srv, paused until about end, answers again: a
// PING sent just before end returns then (Redis ends a pause on its own
// clock, up to a tenth of a second late).
func answersAgain(t *testing.T, srv *redisServer, end time.Time) time.Time {
	t.Helper()
	c := newClient(t, srv.addr())
	time.Sleep(time.Until(end.Add(-100 * time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// Every replica of a Name runs one mode and declares one MaxConcurrent: a
// replica refuses to start beside live replicas of the other mode or of
// another limit, naming what disagrees.
func TestSharesRefuseToMix(t *testing.T) {
	needRedis(t)
	l := backend.Limits{MaxConcurrent: 4, MaxQueue: 8}
	start := func(o redisqueue.Options, l backend.Limits) error {
		b, err := redisqueue.New(newClient(t, redisAddr), o)
		if err != nil {
			t.Fatal(err)
		}
		err = b.Start(l)
		t.Cleanup(func() { _ = b.Close() })
		return err
	}
	t.Run("global beside shares", func(t *testing.T) {
		name := newName(t)
		if err := start(redisqueue.Options{Name: name, Mode: redisqueue.Shares}, l); err != nil {
			t.Fatal(err)
		}
		err := start(redisqueue.Options{Name: name, Mode: redisqueue.GlobalQueue}, l)
		if !errors.Is(err, redisqueue.ErrConflict) || !strings.Contains(err.Error(), "Shares") {
			t.Fatalf("a GlobalQueue replica beside a Shares one: %v", err)
		}
	})
	t.Run("shares beside global", func(t *testing.T) {
		name := newName(t)
		if err := start(redisqueue.Options{Name: name, Mode: redisqueue.GlobalQueue}, l); err != nil {
			t.Fatal(err)
		}
		err := start(redisqueue.Options{Name: name, Mode: redisqueue.Shares}, l)
		if !errors.Is(err, redisqueue.ErrConflict) || !strings.Contains(err.Error(), "GlobalQueue") {
			t.Fatalf("a Shares replica beside a GlobalQueue one: %v", err)
		}
	})
	t.Run("another limit", func(t *testing.T) {
		name := newName(t)
		if err := start(redisqueue.Options{Name: name, Mode: redisqueue.Shares}, l); err != nil {
			t.Fatal(err)
		}
		err := start(redisqueue.Options{Name: name, Mode: redisqueue.Shares}, backend.Limits{MaxConcurrent: 5})
		if !errors.Is(err, redisqueue.ErrConflict) || !strings.Contains(err.Error(), "MaxConcurrent=4, this one 5") {
			t.Fatalf("a Shares replica of another limit: %v", err)
		}
	})
}

// Every in-memory feature works on each replica: CoDel, MaxQueuePerFlow and
// FlowKey are accepted, and a flow over its cap is refused locally.
func TestSharesHonourEveryLocalFeature(t *testing.T) {
	needRedis(t)
	release := make(chan struct{})
	cfg := ginqueue.Config{MaxConcurrent: 2, MaxQueue: 8, MaxQueuePerFlow: 1, QueueTimeout: 5 * time.Second,
		FlowKey: func(c *gin.Context) string { return c.Query("flow") },
		CoDel:   &ginqueue.CoDel{LIFO: true}}
	rs := sharesFleet(t, 1, cfg, redisqueue.Options{Mode: redisqueue.GlobalQueue}, func(*gin.Context) { <-release })
	r := rs[0]
	eventually(t, 2*time.Second, "no share", func() bool { return r.b.Stats().Limit == 2 })
	codes := make(chan int, 8)
	get := func(flow string) {
		w := httptest.NewRecorder()
		r.e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?flow="+flow, nil))
		codes <- w.Code
	}
	go get("a")
	go get("a")
	eventually(t, time.Second, "two not running", func() bool { return r.b.Stats().Running == 2 })
	go get("a")
	eventually(t, time.Second, "one not queued", func() bool { return r.b.Stats().Queued == 1 })
	go get("a") // over the flow's cap
	if c := <-codes; c != http.StatusServiceUnavailable {
		t.Fatalf("a second waiter of one flow: %d, want 503", c)
	}
	go get("b")
	eventually(t, time.Second, "flow b not queued", func() bool { return r.b.Stats().Queued == 2 })
	close(release)
	for range 4 {
		if c := <-codes; c != http.StatusOK {
			t.Errorf("got %d, want 200", c)
		}
	}
}

// A replica that closes gives its share back at once; SetLimit moves the
// fleet's limit up and down, and the shares follow.
func TestSharesFollowCloseAndSetLimit(t *testing.T) {
	needRedis(t)
	var f fleetCounter
	cfg := ginqueue.Config{MaxConcurrent: 8, MaxQueue: 64, QueueTimeout: 5 * time.Second}
	rs := sharesFleet(t, 2, cfg, redisqueue.Options{Mode: redisqueue.GlobalQueue}, f.handler(5*time.Millisecond))
	eventually(t, 2*time.Second, "idle shares not split", func() bool {
		return rs[0].b.Stats().Limit == 4 && rs[1].b.Stats().Limit == 4
	})
	if err := rs[1].q.Close(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	eventually(t, time.Second, "the closed replica's share did not come back", func() bool { return rs[0].b.Stats().Limit == 8 })
	t.Logf("the whole limit on the survivor %v after the other closed", time.Since(t0))
	if err := rs[0].q.SetLimit(12); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "the share did not follow SetLimit up", func() bool { return rs[0].b.Stats().Limit == 12 })
	g, err := rs[0].b.GlobalStats(context.Background())
	if err != nil || g.Limit != 12 || g.Replicas != 1 || g.Running != 12 {
		t.Fatalf("GlobalStats %+v, %v; want limit 12, 1 replica, 12 held", g, err)
	}
	if err := rs[0].q.SetLimit(3); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "the share did not follow SetLimit down", func() bool { return rs[0].b.Stats().Limit == 3 })
}

// slotCounter is a Backend that counts, in f, the slots of the Tickets it
// hands out, from the grant to the Release: a count of the slots held
// across a fleet, outside the library, whatever cost each grant was clamped
// to.
type slotCounter struct {
	*redisqueue.Backend
	f *fleetCounter
}

func (c slotCounter) add(n int) {
	c.f.raise(c.f.now.Add(int64(n)))
}

func (c slotCounter) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	t, err := c.Backend.Acquire(ctx, a)
	if err == nil {
		c.add(max(t.Cost, 1))
	}
	return t, err
}

func (c slotCounter) Release(t backend.Ticket) {
	c.f.now.Add(-int64(max(t.Cost, 1)))
	c.Backend.Release(t)
}

// FastPath counts the fast path's grants too.
func (c slotCounter) FastPath() backend.FastBackend { return countedFast{c.Backend.FastPath(), c} }

type countedFast struct {
	backend.FastBackend
	c slotCounter
}

func (f countedFast) TryAcquire() uint64 {
	n := f.FastBackend.TryAcquire()
	if n > 0 {
		f.c.add(1)
	}
	return n
}

func (f countedFast) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	return f.c.Acquire(ctx, a)
}

// countedReplica is newReplica with its Backend's slots counted in f.
func countedReplica(t *testing.T, addr string, cfg ginqueue.Config, o redisqueue.Options, f *fleetCounter, h gin.HandlerFunc) *replica {
	t.Helper()
	r := &replica{rdb: newClient(t, addr)}
	var err error
	if r.b, err = redisqueue.New(r.rdb, o); err != nil {
		t.Fatal(err)
	}
	cfg.Backend = slotCounter{r.b, f}
	if r.q, err = ginqueue.NewQueue(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.q.Close() })
	r.e = gin.New()
	r.e.GET("/", r.q.Handler(), h)
	return r
}

// The slots running across the fleet never exceed the limit while shares
// move under a random load of weighted requests, replicas join and leave,
// SetLimit moves the limit down and up, and Redis loses its data.
func TestSharesKeepTheLimitThroughChanges(t *testing.T) {
	needRedis(t)
	srv := startRedis(t) // FLUSHALL below
	const most = 16
	cost := func(c *gin.Context) int { n, _ := strconv.Atoi(c.Query("cost")); return max(n, 1) }
	var f fleetCounter
	var limitNow atomic.Int64 // the highest limit in force since the last check
	limitNow.Store(most)
	cfg := ginqueue.Config{MaxConcurrent: most, MaxQueue: 256, QueueTimeout: 2 * time.Second, Cost: cost}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, CallTimeout: 50 * time.Millisecond}
	h := func(*gin.Context) { time.Sleep(3 * time.Millisecond) }
	var mu sync.Mutex
	reps := []*replica{}
	for range 3 {
		reps = append(reps, countedReplica(t, srv.addr(), cfg, o, &f, h))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	over := make(chan string, 1)
	client := func(r *replica, seed int) {
		defer wg.Done()
		for i := seed; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			w := httptest.NewRecorder()
			r.e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?cost="+strconv.Itoa(1+i*7%3), nil))
			if n := f.now.Load(); n > limitNow.Load() {
				select {
				case over <- fmt.Sprintf("%d slots running, limit %d", n, limitNow.Load()):
				default:
				}
			}
			if i%5 == 0 {
				time.Sleep(time.Duration(i%4) * time.Millisecond) // uneven, bursty clients
			}
		}
	}
	for i, r := range reps {
		for j := range 2 + 4*i {
			wg.Add(1)
			go client(r, j)
		}
	}
	step := func(what string, fn func()) {
		fn()
		time.Sleep(300 * time.Millisecond)
		t.Logf("%s: peak %d", what, f.peak.Load())
	}
	step("steady", func() {})
	step("a replica joins", func() {
		r := countedReplica(t, srv.addr(), cfg, o, &f, h)
		mu.Lock()
		reps = append(reps, r)
		mu.Unlock()
		for j := range 6 {
			wg.Add(1)
			go client(r, j)
		}
	})
	step("a replica leaves", func() { _ = reps[0].q.Close() })
	step("the limit goes down to 6", func() {
		if err := reps[1].q.SetLimit(6); err != nil {
			t.Error(err)
		}
		// Lowering preempts nobody: until what ran before ends, the old
		// limit bounds the count.
		time.Sleep(100 * time.Millisecond)
		limitNow.Store(6)
	})
	step("the limit goes up to 20", func() {
		limitNow.Store(20)
		if err := reps[2].q.SetLimit(20); err != nil {
			t.Error(err)
		}
	})
	step("Redis loses its data", func() {
		if err := newClient(t, srv.addr()).FlushAll(context.Background()).Err(); err != nil {
			t.Error(err)
		}
		// The fleet limit returns to MaxConcurrent with the data.
		time.Sleep(100 * time.Millisecond)
		limitNow.Store(most)
	})
	close(stop)
	wg.Wait()
	select {
	case m := <-over:
		t.Error(m)
	default:
	}
	if f.peak.Load() > 20 {
		t.Errorf("peak %d slots running, limit at most 20", f.peak.Load())
	}
}

// roundTrips is the number of commands clients sent srv, from INFO
// commandstats, by name: the commands that scripts run inside are left
// out (every script is one call of EVALSHA or EVAL).
func roundTrips(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		switch name {
		case "evalsha", "eval", "blpop", "ping", "hello", "info", "role", "client|setinfo", "client|setname", "select", "readonly":
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			out[name] = n
		}
	}
	return out
}

// tripsSince is the round trips since before, by name and in all, less the
// INFO that read now.
func tripsSince(before, now map[string]int64) (map[string]int64, int64) {
	d := map[string]int64{}
	var all int64
	for k, v := range now {
		if k == "info" {
			v--
		}
		if v -= before[k]; v > 0 {
			d[k] = v
			all += v
		}
	}
	return d, all
}

// At saturation a replica calls Redis only to move shares: at most one
// round trip per hundred admitted requests. Two replicas of 64 clients,
// handlers of 5 ms, so that the slots saturate before the two cores do,
// even under -race: with the cores saturated the demand of each replica
// comes in bursts, and the shares rightly follow them. make bench-fleet
// measures the four replicas of 64 clients and 200 µs handlers, without
// -race.
func TestSharesCallRedisRarelyAtSaturation(t *testing.T) {
	needRedis(t)
	srv := startRedis(t) // its own, so that only this fleet's calls count
	ctl := newClient(t, srv.addr())
	var f fleetCounter
	cfg := ginqueue.Config{MaxConcurrent: 64, MaxQueue: 256, QueueTimeout: 5 * time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares}
	var rs []*replica
	for range 2 {
		rs = append(rs, newReplica(t, srv.addr(), cfg, o, f.handler(5*time.Millisecond)))
	}
	drive(rs, []int{64, 64}, 300*time.Millisecond) // the shares settle
	before := roundTrips(t, ctl)
	out := drive(rs, []int{64, 64}, 2*time.Second)
	byName, calls := tripsSince(before, roundTrips(t, ctl))
	served := 0
	for _, o := range out {
		served += o[200]
	}
	ratio := float64(calls) / float64(max(served, 1))
	t.Logf("%d requests served, %d round trips to Redis %v: %.4f per request; peak %d", served, calls, byName, ratio, f.peak.Load())
	if ratio > 0.01 {
		t.Errorf("%.4f round trips per request, want at most 0.01", ratio)
	}
	if p := f.peak.Load(); p > 64 {
		t.Errorf("peak %d running across the fleet, limit 64", p)
	}
}

// A replica that holds no share when Redis becomes unreachable cannot be
// given one: its waiters and arrivals are answered 503 (unavailable), not
// left to time out, under either policy; it serves again once Redis is back.
func TestSharesWithoutAShareAnswerUnavailableDuringAnOutage(t *testing.T) {
	needRedis(t)
	for _, tt := range []struct {
		policy      redisqueue.Policy
		callTimeout time.Duration // zero: the default
	}{{redisqueue.FailOpen, 50 * time.Millisecond}, {redisqueue.FailClosed, 50 * time.Millisecond}, {redisqueue.FailClosed, 0}} {
		policy := tt.policy
		t.Run(fmt.Sprintf("%v/%v", policy, tt.callTimeout), func(t *testing.T) {
			srv := startRedis(t)
			var f fleetCounter
			// With the default CallTimeout, a QueueTimeout of a second:
			// Redis must be found down, and the waiter answered 503, first.
			cfg := ginqueue.Config{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: 2 * time.Second}
			if tt.callTimeout == 0 {
				cfg.QueueTimeout = time.Second
			}
			o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, OnRedisDown: policy, CallTimeout: tt.callTimeout}
			busy := newReplica(t, srv.addr(), cfg, o, f.handler(5*time.Millisecond))
			idle := newReplica(t, srv.addr(), cfg, o, f.handler(5*time.Millisecond))
			ld := startShape([]*replica{busy, idle}, 8)
			defer ld.end()
			ld.set(8, 0)
			eventually(t, 2*time.Second, "the busy replica never held the whole limit", func() bool {
				return busy.b.Stats().Limit == 2 && idle.b.Stats().Limit == 0
			})
			pause(t, srv, 1500*time.Millisecond)
			if n := idle.b.Stats().Limit; n != 0 {
				t.Fatalf("the idle replica held %d slots when Redis paused", n)
			}
			start := time.Now()
			code := idle.get()
			took := time.Since(start)
			t.Logf("%v: the replica without a share answered %d after %v", policy, code, took)
			if code != http.StatusServiceUnavailable || took >= cfg.QueueTimeout || took > time.Second {
				t.Errorf("got %d after %v, want 503 within a second (QueueTimeout is %v)", code, took, cfg.QueueTimeout)
			}
			eventually(t, 3*time.Second, "no 200 after the pause", func() bool { return idle.get() == http.StatusOK })
			if p := f.peak.Load(); p > 2 {
				t.Errorf("peak %d running across the fleet, limit 2", p)
			}
		})
	}
}

// stallHook holds this client's calls, while stalled is set, until their
// context ends or lifted is closed: a Redis too busy to answer within
// CallTimeout, for one replica alone.
type stallHook struct {
	stalled atomic.Bool
	lifted  chan struct{}
}

func (h *stallHook) wait(ctx context.Context) error {
	if !h.stalled.Load() {
		return nil
	}
	select {
	case <-h.lifted:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sharelessBesideBusy starts two replicas of a limit of 2 (CallTimeout 50
// ms, QueueTimeout 3 s), counted by f: one on addr that 8 clients keep
// busy until the test ends, and one on rdb that is idle. It returns the
// idle one once the busy one holds the whole limit, and a channel closed
// when the idle one first marks Redis down.
func sharelessBesideBusy(t *testing.T, f *fleetCounter, addr string, rdb *redis.Client) (*replica, <-chan struct{}) {
	t.Helper()
	cfg := ginqueue.Config{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: 3 * time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, CallTimeout: 50 * time.Millisecond}
	busy := newReplica(t, addr, cfg, o, f.handler(5*time.Millisecond))
	marked := make(chan struct{})
	var once sync.Once
	o.OnStateChange = func(down bool, _ error) {
		if down {
			once.Do(func() { close(marked) })
		}
	}
	idle := newReplicaOn(t, rdb, cfg, o, f.handler(5*time.Millisecond))
	ld := startShape([]*replica{busy}, 8)
	t.Cleanup(ld.end)
	ld.set(8)
	eventually(t, 2*time.Second, "the busy replica never held the whole limit", func() bool {
		return busy.b.Stats().Limit == 2 && idle.b.Stats().Limit == 0
	})
	return idle, marked
}

// getThroughStall sends a request to idle and calls end once idle marked
// Redis down (marked closes); it fails t if that never came. It returns
// the request's status.
func getThroughStall(t *testing.T, idle *replica, marked <-chan struct{}, end func()) int {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-marked:
			end()
		case <-time.After(5 * time.Second):
		}
	}()
	code := idle.get()
	<-done
	select {
	case <-marked:
	default:
		t.Fatal("the replica without a share never marked Redis down")
	}
	return code
}

// Calls that a burst holds past their CallTimeout mark Redis down as an
// outage does. A replica that holds no share then waits for its first
// probe before it answers 503: Redis answers it, and the request that
// waited is served. It used to be answered 503 as Redis was marked down.
func TestSharesWithoutAShareWaitOutABriefStall(t *testing.T) {
	needRedis(t)
	var f fleetCounter
	stall := &stallHook{lifted: make(chan struct{})}
	rdb := newClient(t, redisAddr)
	rdb.AddHook(callHook{stall.wait})
	idle, marked := sharelessBesideBusy(t, &f, redisAddr, rdb)
	stall.stalled.Store(true)
	code := getThroughStall(t, idle, marked, func() { close(stall.lifted) })
	if code != http.StatusOK {
		t.Errorf("the replica without a share answered %d to a request that waited through a stall Redis recovered from, want 200", code)
	}
	if p := f.peak.Load(); p > 2 {
		t.Errorf("peak %d running across the fleet, limit 2", p)
	}
}

// A stall of the server itself (SIGSTOP) that ends 25 ms after a replica
// without a share marked Redis down: its waiter is served, not answered
// 503. The probe goes on a connection of its own, outside the client.
func TestSharesWithoutAShareWaitOutAServerStall(t *testing.T) {
	srv := startRedis(t)
	var f fleetCounter
	idle, marked := sharelessBesideBusy(t, &f, srv.addr(), newClient(t, srv.addr()))
	p := srv.cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Signal(syscall.SIGCONT) }()
	code := getThroughStall(t, idle, marked, func() {
		time.Sleep(25 * time.Millisecond) // the stall ends after the mark, as the probe waits
		_ = p.Signal(syscall.SIGCONT)
	})
	if code != http.StatusOK {
		t.Errorf("answered %d to a request that waited through a server stall that ended 25 ms after Redis was marked down, want 200", code)
	}
}

// A Shares replica that found a conflict after Start (it started while
// Redis was out of reach, beside a live replica that declared another
// MaxConcurrent) serves again, SetLimit included, once that replica has
// left. SetLimit used to keep answering ErrConflict for good.
func TestSharesConflictEndsWithTheConflictingReplica(t *testing.T) {
	needRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond}
	other, err := redisqueue.New(newClient(t, redisAddr), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(backend.Limits{MaxConcurrent: 4, MaxQueue: 8}); err != nil {
		t.Fatal(err)
	}
	px := newCutProxy(t, redisAddr)
	px.setCut(true)
	b, err := redisqueue.New(newClient(t, px.addr()), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Start(backend.Limits{MaxConcurrent: 5, MaxQueue: 8}); err != nil {
		t.Fatalf("Start while Redis is out of reach: %v", err)
	}
	px.setCut(false)
	eventually(t, 5*time.Second, "the conflict found", func() bool {
		return errors.Is(b.SetLimit(5), redisqueue.ErrConflict)
	})
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "SetLimit accepted once the other replica left", func() bool {
		return b.SetLimit(5) == nil
	})
}
