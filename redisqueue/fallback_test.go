package redisqueue_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// The FailOpen fallback is one in-memory Backend for the Backend's life:
// every slot this replica runs on while Redis is down is accounted in it,
// and Close and Drain walk it like the rest.

// A request granted by Redis that runs through two outages: once it ends,
// the Backend is idle (a second outage's fallback must not keep a slot of
// the first that is never given back).
func TestDrainAfterTwoOutages(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 2, MaxQueue: 4}, fallbackOptions(t))
	tk, err := b.Acquire(context.Background(), backend.Arrival{})
	if err != nil || redisqueue.GrantedLocally(tk) {
		t.Fatalf("before the outages: %v", err)
	}
	outage(t, srv, b, 300*time.Millisecond)
	outage(t, srv, b, 300*time.Millisecond)
	if got := b.Stats().Outages; got != 2 {
		t.Fatalf("Outages %d, want 2", got)
	}
	b.Release(tk)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	if err := b.Drain(ctx); err != nil {
		t.Fatalf("Drain after the only request ended: %v after %v", err, time.Since(start))
	}
	if s := b.Stats(); s.Running != 0 || s.Queued != 0 {
		t.Fatalf("after Drain: %+v", s)
	}
}

// Close answers the fallback's waiters at once, as closed; they never run.
func TestCloseAnswersTheFallbacksWaiters(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.GlobalQueue.LocalLimit = 2
	b, err := redisqueue.New(newClient(t, srv.addr()), o)
	if err != nil {
		t.Fatal(err)
	}
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 8, QueueTimeout: 10 * time.Second, Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	release := make(chan struct{})
	var ran sync.WaitGroup
	e := gin.New()
	e.GET("/", q.Handler(), func(c *gin.Context) {
		ran.Done()
		<-release
	})
	srv.stop()
	codes := make(chan int, 4)
	serve := func() {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		codes <- w.Code
	}
	ran.Add(2)
	for range 2 {
		go serve()
	}
	ran.Wait() // two run on the fallback's slots
	for range 2 {
		go serve()
	}
	eventually(t, 2*time.Second, "the two others did not wait in the fallback", func() bool { return q.Stats().Queued == 2 })
	closed := time.Now()
	go func() { _ = q.Close() }()
	for range 2 {
		select {
		case c := <-codes:
			if c != http.StatusServiceUnavailable {
				t.Errorf("a waiter answered %d at Close, want 503 (closed)", c)
			}
		case <-time.After(time.Second):
			t.Fatal("a waiter of the fallback was not answered within 1 s of Close")
		}
	}
	if d := time.Since(closed); d > 200*time.Millisecond {
		t.Errorf("the waiters were answered %v after Close", d)
	}
	if s := q.Stats(); s.Closed != 2 {
		t.Errorf("Stats.Closed %d, want 2", s.Closed)
	}
	close(release)
	for range 2 {
		if c := <-codes; c != http.StatusOK {
			t.Errorf("a running request answered %d", c)
		}
	}
}

// A closed replica keeps the lease of a request it admitted on its own,
// once Redis counted it, until the request ends: another replica is not
// granted its slot meanwhile.
func TestClosedReplicaKeepsALocalGrantsLease(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.LeaseTTL = time.Second
	l := backend.Limits{MaxConcurrent: 1, MaxQueue: 4}
	oa := o
	oa.GlobalQueue.LocalLimit = 1
	a := startBackends2(t, srv.addr(), l, oa)
	other := startBackends2(t, srv.addr(), l, o)
	ctx := context.Background()
	pause(t, srv, 400*time.Millisecond)
	var x backend.Ticket
	eventually(t, time.Second, "no local grant during the pause", func() bool {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		tk, err := a.Acquire(c, backend.Arrival{})
		if err == nil && !redisqueue.GrantedLocally(tk) {
			a.Release(tk)
			return false
		}
		x = tk
		return err == nil
	})
	eventually(t, 3*time.Second, "the local grant was not counted in Redis", func() bool {
		s, err := a.GlobalStats(ctx)
		return err == nil && s.Running == 1 && !a.Stats().Unavailable
	})
	closeDone := make(chan struct{})
	go func() { _ = a.Close(); close(closeDone) }()
	time.Sleep(2 * o.LeaseTTL)
	c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if tk, err := other.Acquire(c, backend.Arrival{}); err == nil {
		t.Fatalf("granted beside the closed replica's running request (locally %v): 2 over a limit of 1",
			redisqueue.GrantedLocally(tk))
	}
	a.Release(x)
	<-closeDone
	tk, err := other.Acquire(ctx, backend.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	other.Release(tk)
}

// A second outage keeps the limit on one replica: requests admitted in
// the first, counted in Redis since and still running, hold their slots
// in the second too.
func TestSecondOutageKeepsTheLimit(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 2, MaxQueue: 8}, fallbackOptions(t))
	ctx := context.Background()
	srv.stop()
	var first []backend.Ticket
	for len(first) < 2 {
		tk, err := b.Acquire(ctx, backend.Arrival{})
		if err != nil || !redisqueue.GrantedLocally(tk) {
			t.Fatalf("during the first outage: %v, locally %v", err, redisqueue.GrantedLocally(tk))
		}
		first = append(first, tk)
	}
	srv.start()
	eventually(t, 3*time.Second, "the local grants were not counted in Redis", func() bool {
		s, err := b.GlobalStats(ctx)
		return err == nil && s.Running == 2 && !b.Stats().Unavailable
	})
	srv.stop()
	got := make(chan backend.Ticket, 2)
	for range 2 {
		go func() {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if tk, err := b.Acquire(c, backend.Arrival{}); err == nil {
				got <- tk
			}
		}()
	}
	select {
	case tk := <-got:
		t.Fatalf("granted in the second outage beside the two of the first (locally %v): Stats %+v",
			redisqueue.GrantedLocally(tk), b.Stats())
	case <-time.After(400 * time.Millisecond):
	}
	if s := b.Stats(); s.Running != 2 {
		t.Errorf("Stats.Running %d in the second outage, want 2", s.Running)
	}
	b.Release(first[0])
	select {
	case tk := <-got:
		b.Release(tk)
	case <-time.After(time.Second):
		t.Fatal("a slot freed in the second outage was not handed on")
	}
	b.Release(first[1])
	select {
	case tk := <-got: // the other waiter, granted on that slot
		b.Release(tk)
	case <-time.After(time.Second):
		t.Fatal("the second slot freed was not handed on")
	}
	srv.start()
}

// A cost that cannot run within the replica's allowance while Redis is down is
// refused at once, as unavailable: it does not run on fewer slots than its
// cost.
func TestWeightedAboveTheAllowanceIsRefusedWhileDown(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.GlobalQueue.LocalLimit = 1
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 4, MaxQueue: 4, Weighted: true}, o)
	srv.stop()
	ctx := context.Background()
	var err error
	for range 5 { // until Redis is marked down
		var tk backend.Ticket
		if tk, err = b.Acquire(ctx, backend.Arrival{Cost: 3}); err == nil {
			b.Release(tk)
			t.Fatalf("a request of cost 3 granted %d slots while this replica may run 1 on its own", tk.Cost)
		}
		if b.Stats().Unavailable {
			break
		}
	}
	start := time.Now()
	_, err = b.Acquire(ctx, backend.Arrival{Cost: 3})
	if !errors.Is(err, redisqueue.ErrUnavailable) || !errors.Is(err, backend.ErrQueueFull) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("cost 3 above an allowance of 1: %v after %v, want ErrUnavailable and ErrQueueFull at once", err, time.Since(start))
	}
	tk, err := b.Acquire(ctx, backend.Arrival{Cost: 1})
	if err != nil || !redisqueue.GrantedLocally(tk) {
		t.Fatalf("cost 1 within the allowance: %v", err)
	}
	b.Release(tk)
	srv.start()
}

// Under FailOpen the replicas' local limits add up to the fleet's limit
// (4 on 3 replicas: 2, 1 and 1, by replica id), and a request that still
// runs on a slot granted by Redis counts against its replica's local limit
// until it ends. That request runs on the replica of the larger share: on
// a replica of share 1 it would take that replica's whole allowance, and
// the fleet would run one slot short through the outage (a skewed fleet
// keeps less than its limit; docs/fleet.md says so).
func TestFailOpenLocalLimitsAddUpToTheFleets(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 600 * time.Millisecond, FailureThreshold: 1, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
	l := backend.Limits{MaxConcurrent: 4, MaxQueue: 30, QueueTimeout: 10 * time.Second}
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
	for i, b := range bs {
		if redisqueue.Rank(b)%len(bs) == 0 {
			bs[0], bs[i] = bs[i], bs[0] // bs[0] has the share of 2
			break
		}
	}
	redisHeld, err := bs[0].Acquire(ctx, backend.Arrival{})
	if err != nil || redisqueue.GrantedLocally(redisHeld) {
		t.Fatalf("before the outage: %v, granted locally %v", err, redisqueue.GrantedLocally(redisHeld))
	}
	srv.stop()
	// grab takes local slots on b until one does not come within 50 ms.
	grab := func(b *redisqueue.Backend) []backend.Ticket {
		var ts []backend.Ticket
		for {
			c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			tk, err := b.Acquire(c, backend.Arrival{})
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
	var held [3][]backend.Ticket
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
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: 10 * time.Second, OnRedisDown: redisqueue.FailClosed, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 2 * time.Second}})
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
