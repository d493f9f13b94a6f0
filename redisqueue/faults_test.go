package redisqueue_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// loadResult is what a load run saw.
type loadResult struct {
	maxWait time.Duration // longest time a request spent before it ran or was answered
	codes   map[int]int
}

// load serves requests on reps from workers goroutines until stop is
// closed. The wait of a request is measured from before the Queue to the
// start of the handler, or to the answer when it got no slot.
func load(reps []*replica, workers int, stop <-chan struct{}) loadResult {
	type one struct {
		wait time.Duration
		code int
	}
	out := make(chan one, 1024)
	var wg sync.WaitGroup
	for i := range workers {
		r := reps[i%len(reps)]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				code, ran := r.getTimed()
				wait := time.Since(start)
				if !ran.IsZero() {
					wait = ran.Sub(start)
				}
				out <- one{wait, code}
				time.Sleep(time.Millisecond) // a 503 is instant: do not spin
			}
		})
	}
	go func() { wg.Wait(); close(out) }()
	res := loadResult{codes: map[int]int{}}
	for o := range out {
		res.maxWait = max(res.maxWait, o.wait)
		res.codes[o.code]++
	}
	return res
}

// getTimed serves one request and returns its status and when its handler
// started (zero if it did not run).
func (r *replica) getTimed() (int, time.Time) {
	var ran time.Time
	w := &statusRecorder{}
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req = req.WithContext(context.WithValue(req.Context(), ranKey{}, &ran))
	r.e.ServeHTTP(w, req)
	return w.status(), ran
}

type ranKey struct{}

// timedHandler records when it starts, then works for d.
func timedHandler(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		if p, ok := c.Request.Context().Value(ranKey{}).(*time.Time); ok {
			*p = time.Now()
		}
		time.Sleep(d)
	}
}

// statusRecorder is a minimal http.ResponseWriter.
type statusRecorder struct {
	code int
	h    http.Header
}

func (s *statusRecorder) Header() http.Header {
	if s.h == nil {
		s.h = http.Header{}
	}
	return s.h
}
func (s *statusRecorder) Write(p []byte) (int, error) { s.WriteHeader(200); return len(p), nil }
func (s *statusRecorder) WriteHeader(c int) {
	if s.code == 0 {
		s.code = c
	}
}
func (s *statusRecorder) status() int {
	if s.code == 0 {
		return 200
	}
	return s.code
}

func TestRedisPaused(t *testing.T) {
	needRedis(t)
	t.Parallel()
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
			o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: 2 * time.Second,
				TickInterval: 100 * time.Millisecond, OnRedisDown: policy}
			cfg := ginqueue.Config{MaxConcurrent: 2, MaxQueue: 20, QueueTimeout: 300 * time.Millisecond}
			var reps []*replica
			for range 2 {
				reps = append(reps, newReplica(t, srv.addr(), cfg, o, timedHandler(2*time.Millisecond)))
			}
			stop := make(chan struct{})
			done := make(chan loadResult, 1)
			go func() { done <- load(reps, 6, stop) }()

			ctl := newClient(t, srv.addr())
			time.Sleep(200 * time.Millisecond) // some load before the pause
			if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", 1000, "ALL").Err(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond) // the pause, and a while after
			close(stop)
			res := <-done

			t.Logf("%v: outcomes %v, longest wait %v", policy, res.codes, res.maxWait)
			// Scheduling slack for the race detector on a small machine
			// that runs the other tests at the same time.
			if bound := cfg.QueueTimeout + o.CallTimeout + 150*time.Millisecond; res.maxWait > bound {
				t.Fatalf("a request waited %v, want at most QueueTimeout + CallTimeout (%v)", res.maxWait, bound)
			}
			if res.codes[http.StatusOK] == 0 {
				t.Fatal("nothing was served")
			}
			if policy == redisqueue.FailClosed && res.codes[http.StatusServiceUnavailable] == 0 {
				t.Fatal("FailClosed answered no 503 while Redis was paused")
			}
			// A call that timed out while Redis was paused is Redis being
			// unreachable (FailClosed: 503), not a queue timeout: the
			// requests have no deadline of their own, so every 408 must be
			// an ErrQueueTimeout from the Backend.
			var timeouts int64
			for _, r := range reps {
				timeouts += r.timeouts.Load()
			}
			if n := res.codes[http.StatusRequestTimeout]; int64(n) != timeouts {
				t.Fatalf("%d requests answered 408, but the Backends timed out %d", n, timeouts)
			}
			for _, r := range reps {
				eventually(t, 3*time.Second, "requests left in a replica", func() bool {
					s := r.q.Stats()
					return s.Running == 0 && s.Queued == 0
				})
			}
			eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(reps[0].b) })
		})
	}
}

func TestRedisRestartedMidRun(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: time.Second,
		TickInterval: 100 * time.Millisecond}
	cfg := ginqueue.Config{MaxConcurrent: 3, MaxQueue: 20, QueueTimeout: 400 * time.Millisecond}
	var reps []*replica
	for range 2 {
		reps = append(reps, newReplica(t, srv.addr(), cfg, o, timedHandler(2*time.Millisecond)))
	}
	stop := make(chan struct{})
	done := make(chan loadResult, 1)
	go func() { done <- load(reps, 8, stop) }()

	time.Sleep(200 * time.Millisecond)
	srv.stop() // kill -9: nothing persisted
	time.Sleep(300 * time.Millisecond)
	srv.start()
	time.Sleep(800 * time.Millisecond)
	close(stop)
	res := <-done

	t.Logf("outcomes %v, longest wait %v", res.codes, res.maxWait)
	if bound := cfg.QueueTimeout + o.CallTimeout + 150*time.Millisecond; res.maxWait > bound {
		t.Fatalf("a request waited %v, want at most QueueTimeout + CallTimeout (%v)", res.maxWait, bound)
	}
	eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(reps[0].b) })
	// Served through Redis again after the restart.
	before := reps[0].q.Stats().Served
	if c := reps[0].get(); c != http.StatusOK {
		t.Fatalf("after the restart a request got %d", c)
	}
	if reps[0].q.Stats().Served != before+1 {
		t.Fatal("not counted as served")
	}
}

func TestRedisFlushedWaitersEnqueueAgain(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), LeaseTTL: time.Second, TickInterval: 50 * time.Millisecond}
	l := ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 5 * time.Second}
	var bs []*redisqueue.Backend
	for range 2 {
		b, err := redisqueue.New(newClient(t, srv.addr()), o)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(l); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		bs = append(bs, b)
	}
	holder, err := bs[0].Acquire(context.Background(), ginqueue.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 3
	var served atomic.Int32
	errs := make(chan error, waiters)
	for range waiters {
		go func() {
			tk, err := bs[1].Acquire(context.Background(), ginqueue.Arrival{})
			if err == nil {
				served.Add(1)
				bs[1].Release(tk)
			}
			errs <- err
		}()
	}
	waitQueued(t, bs[0], waiters)
	if err := newClient(t, srv.addr()).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// The safety net finds the waiters lost and enqueues them again; the
	// holder's lease is reclaimed at its next refresh (LeaseTTL/3).
	eventually(t, 3*time.Second, "waiters did not enqueue again", func() bool {
		s, err := bs[0].GlobalStats(context.Background())
		return err == nil && s.Running+s.Queued+int(served.Load()) >= waiters
	})
	bs[0].Release(holder)
	for range waiters {
		if err := <-errs; err != nil {
			t.Fatalf("a waiter got %v after the flush, want a slot", err)
		}
	}
	eventually(t, 2*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(bs[0]) })
}

func TestRedisDownAtStart(t *testing.T) {
	t.Parallel()
	addr := "127.0.0.1:" + itoa(freePort(t)) // nobody listens
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			b, err := redisqueue.New(newClient(t, addr), redisqueue.Options{Name: newName(t), OnRedisDown: policy, TickInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 2, MaxQueue: 2, Backend: b})
			if err != nil {
				t.Fatalf("NewQueue with Redis down: %v, want it to start", err)
			}
			defer q.Close()
			tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
			switch policy {
			case redisqueue.FailOpen:
				if err != nil {
					t.Fatalf("FailOpen: got %v, want a local slot", err)
				}
				b.Release(tk)
			case redisqueue.FailClosed:
				if !errors.Is(err, redisqueue.ErrUnavailable) || !errors.Is(err, ginqueue.ErrQueueFull) {
					t.Fatalf("FailClosed: got %v, want ErrUnavailable wrapping ErrQueueFull", err)
				}
			}
		})
	}
}

// TestFailClosedCallTimeoutIs503: under FailClosed, requests whose Redis
// calls time out during a pause are answered 503 and counted queue full,
// with their hook and outcome, not 408: the error wraps the call's own
// context.DeadlineExceeded (the requests behind the paused one time out
// waiting for the pool's only connection), and the backend's timeout is not
// the request's.
func TestFailClosedCallTimeoutIs503(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr(), ContextTimeoutEnabled: true,
		DialTimeout: 200 * time.Millisecond, MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond,
		LeaseTTL: 10 * time.Second, TickInterval: 2 * time.Second, OnRedisDown: redisqueue.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	outcomes := map[ginqueue.Outcome]int{}
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 8, MaxQueue: 8, QueueTimeout: time.Minute, Backend: b,
		OnOutcome: func(_ *gin.Context, o ginqueue.Outcome, _ time.Duration) {
			mu.Lock()
			outcomes[o]++
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() }) // before the client: cleanups run last-in first-out
	e := gin.New()
	e.GET("/", q.Handler(), func(c *gin.Context) { c.Status(http.StatusOK) })
	get := func() int {
		w := &statusRecorder{}
		req, _ := http.NewRequest(http.MethodGet, "/", nil)
		e.ServeHTTP(w, req)
		return w.status()
	}
	if code := get(); code != http.StatusOK { // warms the pool's connection
		t.Fatalf("before the pause: %d, want 200", code)
	}

	ctl := newClient(t, srv.addr())
	if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", 500, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	const n = 6
	codes := make(chan int, n)
	for range n {
		go func() { codes <- get() }()
	}
	got := map[int]int{}
	for range n {
		got[<-codes]++
	}
	if want := map[int]int{http.StatusServiceUnavailable: n}; !maps.Equal(got, want) {
		t.Errorf("during the pause: statuses %v, want %v", got, want)
	}
	if st := q.Stats(); st.QueueFull != n || st.QueueTimeout != 0 {
		t.Errorf("counted %d queue full and %d queue timeout, want %d and 0", st.QueueFull, st.QueueTimeout, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := map[ginqueue.Outcome]int{ginqueue.OutcomeServed: 1, ginqueue.OutcomeQueueFull: n}; !maps.Equal(outcomes, want) {
		t.Errorf("OnOutcome saw %v, want %v", outcomes, want)
	}
}

// TestOneFailedCallDoesNotMarkRedisDown: a call that times out gives its
// own request OnRedisDown within one call timeout, but the replica turns to
// OnRedisDown only after FailureThreshold failures in a row (the maintainer
// probes at once after a failure, so that happens within that many call
// timeouts even without traffic).
func TestOneFailedCallDoesNotMarkRedisDown(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
	const callTimeout = 100 * time.Millisecond
	o := redisqueue.Options{Name: newName(t), CallTimeout: callTimeout, LeaseTTL: 10 * time.Second,
		TickInterval: 2 * time.Second, OnRedisDown: redisqueue.FailClosed}
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 2}, o)
	ctl := newClient(t, srv.addr())
	ctx := context.Background()
	acquire := func() (time.Duration, error) {
		start := time.Now()
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err == nil {
			b.Release(tk)
		}
		return time.Since(start), err
	}
	// Warm the connections, so that the pause, not a dial, is what fails.
	if _, err := acquire(); err != nil {
		t.Fatal(err)
	}

	// A blip: Redis answers nothing for 1.5 call timeouts.
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", (3 * callTimeout / 2).Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	d, err := acquire()
	if !errors.Is(err, redisqueue.ErrUnavailable) || d > callTimeout+50*time.Millisecond {
		t.Fatalf("during the pause: got %v after %v, want ErrUnavailable within one call timeout", err, d)
	}
	time.Sleep(callTimeout) // the pause ends
	if d, err := acquire(); err != nil {
		t.Fatalf("after a one-call blip: got %v after %v, want a slot (TickInterval is %v: marked down by one failure?)", err, d, o.TickInterval)
	}

	// Gone for good (a long pause): marked down within FailureThreshold
	// call timeouts of the first failure, without further requests.
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", 1500, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(); !errors.Is(err, redisqueue.ErrUnavailable) {
		t.Fatalf("during the long pause: got %v, want ErrUnavailable", err)
	}
	time.Sleep(time.Duration(redisqueue.DefaultFailureThreshold)*callTimeout + 100*time.Millisecond)
	if d, err := acquire(); !errors.Is(err, redisqueue.ErrUnavailable) || d > callTimeout/2 {
		t.Fatalf("once marked down: got %v after %v, want ErrUnavailable at once", err, d)
	}
	// Back: the probe (every TickInterval while down) marks it up.
	eventually(t, 2*o.TickInterval+time.Second, "Redis not marked up again", func() bool {
		_, err := acquire()
		return err == nil
	})
}

// startBackends2 is startBackends on the Redis at addr.
func startBackends2(t *testing.T, addr string, l ginqueue.Limits, o redisqueue.Options) *redisqueue.Backend {
	t.Helper()
	b, err := redisqueue.New(newClient(t, addr), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// A grant made while the notice reader is away (the server was gone for
// a while, and the reader's pauses between dials grew to a tick) reaches
// the waiter well before the safety net's next tick: the reader dials again
// as soon as the maintainer's call gets an answer, and while the reader is
// away the safety net runs faster.
func TestGrantReachesWaiterSoonAfterServerReturns(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	const tick = time.Second
	o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: 3 * tick, TickInterval: tick,
		FailureThreshold: 100} // never down: this is about the reader alone
	l := ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second}
	b := startBackends2(t, srv.addr(), l, o)
	ctx := context.Background()
	holder, err := b.Acquire(ctx, ginqueue.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			t.Errorf("the waiter got %v", err)
			close(got)
			return
		}
		got <- time.Now()
		b.Release(tk)
	}()
	waitQueued(t, b, 1)
	srv.stop()
	time.Sleep(2 * tick)
	srv.start()
	// The waiter, lost with the server, enqueues again.
	eventually(t, 2*tick, "the waiter did not enqueue again", func() bool {
		s, err := b.GlobalStats(ctx)
		return err == nil && s.Queued == 1
	})
	released := time.Now()
	b.Release(holder)
	select {
	case at, ok := <-got:
		if !ok {
			return
		}
		if d := at.Sub(released); d > tick/4 {
			t.Errorf("the grant reached the waiter %v after the release, want well within the safety net's tick (%v)", d, tick)
		}
	case <-time.After(5 * tick):
		t.Fatal("the waiter was never granted")
	}
	eventually(t, 2*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(b) })
}

// A waiter whose QueueTimeout passes while Redis does not answer, before
// the replica has marked it down, was not refused by the queue: under
// FailClosed it gets the policy's 503 (an error wrapping ErrUnavailable),
// not a 408. Under FailOpen it is a queue timeout.
func TestWaiterTimedOutWhileRedisPausedIsUnavailable(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 3 * time.Second,
			TickInterval: 100 * time.Millisecond, OnRedisDown: policy,
			FailureThreshold: 1000} // never marked down in this test: the pause is short of it
		l := ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 300 * time.Millisecond}
		b := startBackends2(t, srv.addr(), l, o)
		ctx := context.Background()
		holder, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := b.Acquire(ctx, ginqueue.Arrival{})
			errc <- err
		}()
		waitQueued(t, b, 1)
		ctl := newClient(t, srv.addr())
		if err := ctl.Do(ctx, "CLIENT", "PAUSE", 600, "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		err = <-errc
		switch policy {
		case redisqueue.FailClosed:
			if !errors.Is(err, redisqueue.ErrUnavailable) || !errors.Is(err, ginqueue.ErrQueueFull) || errors.Is(err, ginqueue.ErrQueueTimeout) {
				t.Errorf("FailClosed: the waiter got %v, want an error wrapping ErrUnavailable and ErrQueueFull", err)
			}
		case redisqueue.FailOpen:
			if !errors.Is(err, ginqueue.ErrQueueTimeout) {
				t.Errorf("FailOpen: the waiter got %v, want ErrQueueTimeout", err)
			}
		}
		b.Release(holder)
		eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(b) })
	}
}

// Under FailOpen the replicas' local limits add up to the fleet's limit
// (4 on 3 replicas: 2, 1 and 1, by replica id), and a request that still
// runs on a slot granted by Redis counts against its replica's local limit
// until it ends.
func TestFailOpenLocalLimitsAddUpToTheFleets(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 600 * time.Millisecond,
		TickInterval: 100 * time.Millisecond, FailureThreshold: 1}
	l := ginqueue.Limits{MaxConcurrent: 4, MaxQueue: 30, QueueTimeout: 10 * time.Second}
	var bs []*redisqueue.Backend
	for range 3 {
		bs = append(bs, startBackends2(t, srv.addr(), l, o))
	}
	ctx := context.Background()
	eventually(t, 2*time.Second, "the replicas did not see each other", func() bool {
		s, err := bs[0].GlobalStats(ctx)
		return err == nil && s.Replicas == 3
	})
	time.Sleep(o.LeaseTTL) // every replica has synced since: each knows there are 3
	redisHeld, err := bs[0].Acquire(ctx, ginqueue.Arrival{})
	if err != nil || redisqueue.GrantedLocally(redisHeld) {
		t.Fatalf("before the outage: %v, granted locally %v", err, redisqueue.GrantedLocally(redisHeld))
	}
	srv.stop()
	// grab takes local slots on b until one does not come within 50 ms.
	grab := func(b *redisqueue.Backend) []ginqueue.Ticket {
		var ts []ginqueue.Ticket
		for {
			c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			tk, err := b.Acquire(c, ginqueue.Arrival{})
			cancel()
			if err != nil {
				return ts
			}
			if !redisqueue.GrantedLocally(tk) {
				t.Fatal("a grant from Redis while it is stopped")
			}
			ts = append(ts, tk)
		}
	}
	var held [3][]ginqueue.Ticket
	total := 0
	for i, b := range bs {
		held[i] = grab(b)
		total += len(held[i])
	}
	if total != l.MaxConcurrent-1 {
		t.Errorf("the local limits admitted %d (%d, %d, %d) besides the request running on a slot from Redis, want %d in all",
			total, len(held[0]), len(held[1]), len(held[2]), l.MaxConcurrent-1)
	}
	// Its end frees a local slot on its replica.
	bs[0].Release(redisHeld)
	if more := grab(bs[0]); len(more) != 1 {
		t.Errorf("after the request on a slot from Redis ended, its replica admitted %d more locally, want 1", len(more))
	} else {
		held[0] = append(held[0], more...)
	}
	for i, b := range bs {
		for _, tk := range held[i] {
			b.Release(tk)
		}
	}
	srv.start()
}

// Requests granted by FailOpen's fallback while Redis was down are counted
// in Redis by the sync that finds it back, before Redis grants anybody
// else: the fleet does not run over its limit while they end.
func TestFailOpenLocalGrantsCountedWhenRedisReturns(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 3 * time.Second,
		TickInterval: 100 * time.Millisecond, FailureThreshold: 1}
	l := ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: 10 * time.Second}
	b := startBackends2(t, srv.addr(), l, o)
	ctx := context.Background()
	srv.stop()
	var locals []ginqueue.Ticket
	for len(locals) < 2 {
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			t.Fatal(err)
		}
		if !redisqueue.GrantedLocally(tk) {
			t.Fatal("a grant from Redis while it is stopped")
		}
		locals = append(locals, tk)
	}
	srv.start() // empty: nothing persisted
	eventually(t, 3*time.Second, "the local grants were not counted in Redis", func() bool {
		s, err := b.GlobalStats(ctx)
		return err == nil && s.Running == 2
	})
	// Redis is back and full: a new request waits for a local one to end.
	got := make(chan ginqueue.Ticket, 1)
	go func() {
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			t.Errorf("after Redis returned: %v", err)
		}
		got <- tk
	}()
	select {
	case tk := <-got:
		t.Fatalf("granted beside the two local grants still running (locally: %v): 3 over a limit of 2", redisqueue.GrantedLocally(tk))
	case <-time.After(300 * time.Millisecond):
	}
	b.Release(locals[0])
	tk := <-got
	if redisqueue.GrantedLocally(tk) {
		t.Error("granted locally after Redis returned")
	}
	b.Release(locals[1])
	b.Release(tk)
	eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(b) })
}
