package redisqueue_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	good := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer good.Close()
	plain := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer plain.Close()
	tests := []struct {
		name string
		rdb  redis.UniversalClient
		o    redisqueue.Options
		want string
	}{
		{"empty name", good, redisqueue.Options{}, "Options.Name"},
		{"name with a brace", good, redisqueue.Options{Name: "a}b"}, "Options.Name"},
		{"prefix with a brace", good, redisqueue.Options{Name: "a", KeyPrefix: "{x"}, "Options.KeyPrefix"},
		{"negative lease", good, redisqueue.Options{Name: "a", LeaseTTL: -1}, "Options.LeaseTTL"},
		{"lease shorter than call timeouts", good, redisqueue.Options{Name: "a", LeaseTTL: 300 * time.Millisecond, CallTimeout: 100 * time.Millisecond}, "Options.LeaseTTL"},
		{"negative call timeout", good, redisqueue.Options{Name: "a", CallTimeout: -1}, "Options.CallTimeout"},
		{"tick above lease/3", good, redisqueue.Options{Name: "a", LeaseTTL: time.Second, TickInterval: time.Second}, "Options.TickInterval"},
		{"tick below 10 ms", good, redisqueue.Options{Name: "a", TickInterval: time.Millisecond}, "Options.TickInterval"},
		{"unknown policy", good, redisqueue.Options{Name: "a", OnRedisDown: 7}, "Options.OnRedisDown"},
		{"negative local limit", good, redisqueue.Options{Name: "a", LocalLimit: -1}, "Options.LocalLimit"},
		{"negative local queue", good, redisqueue.Options{Name: "a", LocalQueue: -1}, "Options.LocalQueue"},
		{"negative failure threshold", good, redisqueue.Options{Name: "a", FailureThreshold: -1}, "Options.FailureThreshold"},
		{"nil client", nil, redisqueue.Options{Name: "a"}, "nil"},
		{"client without context timeouts", plain, redisqueue.Options{Name: "a"}, "ContextTimeoutEnabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := redisqueue.New(tt.rdb, tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: got %v, want an error naming %s", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "redisqueue: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
}

// Config.CoDel cannot be honoured across the fleet: NewQueue says so, and
// nothing is left running (Redis is never asked).
func TestCoDelIsRefused(t *testing.T) {
	b, err := redisqueue.New(newClient(t, redisAddr), redisqueue.Options{Name: newName(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Backend: b, CoDel: &ginqueue.CoDel{}})
	if err == nil || !strings.HasPrefix(err.Error(), "redisqueue: Config.CoDel is not supported: ") {
		t.Fatalf("NewQueue with CoDel: got %v, want redisqueue's refusal", err)
	}
}

// A Queue whose Redis never answered closes at once: with nothing to give
// back, the goodbye is tried once, not until LeaseTTL has passed.
func TestCloseWithRedisNeverReachedReturnsAtOnce(t *testing.T) {
	b, err := redisqueue.New(newClient(t, "127.0.0.1:1"), redisqueue.Options{Name: newName(t), LeaseTTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close took %v with nothing to give back (LeaseTTL 10s)", took)
	}
}

// Config.MaxQueuePerFlow cannot be honoured by the fleet's queue, which
// counts no places per flow: NewQueue says so rather than ignore the cap.
func TestMaxQueuePerFlowIsRefused(t *testing.T) {
	b, err := redisqueue.New(newClient(t, redisAddr), redisqueue.Options{Name: newName(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, MaxQueuePerFlow: 1,
		FlowKey: ginqueue.ByClientIP(), Backend: b})
	if err == nil || !strings.HasPrefix(err.Error(), "redisqueue: Config.MaxQueuePerFlow is not supported: ") {
		t.Fatalf("NewQueue with MaxQueuePerFlow: got %v, want redisqueue's refusal", err)
	}
}

func TestConflictingLimitsAreRefused(t *testing.T) {
	needRedis(t)
	t.Parallel()
	name := newName(t)
	o := redisqueue.Options{Name: name}
	a := newReplica(t, redisAddr, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 10}, o, nil)

	b, err := redisqueue.New(newClient(t, redisAddr), o)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 5, MaxQueue: 10, Backend: b})
	if !errors.Is(err, redisqueue.ErrConflict) || !strings.Contains(err.Error(), "MaxConcurrent=4") {
		t.Fatalf("NewQueue with another limit: got %v, want ErrConflict naming MaxConcurrent=4", err)
	}
	// Same limits: fine.
	newReplica(t, redisAddr, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 10}, o, nil)
	// Once every replica of the old limits is gone, a new limit is accepted.
	_ = a.q.Close()
	_ = newReplicaErr(t, ginqueue.Config{MaxConcurrent: 5, MaxQueue: 10}, o)
}

// newReplicaErr builds a Queue on a new Backend and expects the conflict
// until the replica of the other limits is closed too.
func newReplicaErr(t *testing.T, cfg ginqueue.Config, o redisqueue.Options) error {
	t.Helper()
	b, err := redisqueue.New(newClient(t, redisAddr), o)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Backend = b
	q, err := ginqueue.NewQueue(cfg)
	if err == nil {
		t.Fatal("a live replica still declares MaxConcurrent=4; want a conflict")
	}
	_ = q
	return err
}

func TestThreeReplicasNeverExceedTheLimit(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const limit, requests = 4, 200
	name := newName(t)
	var running, peak atomic.Int64
	h := func(c *gin.Context) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(500 * time.Microsecond)
		running.Add(-1)
	}
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: requests, QueueTimeout: 20 * time.Second}
	var reps []*replica
	for range 3 {
		// A burst of 200 under the race detector on a small machine can
		// take longer than the default call timeout, which would count as
		// Redis down and fall open; this test is about a healthy Redis.
		reps = append(reps, newReplica(t, redisAddr, cfg, redisqueue.Options{Name: name, CallTimeout: 2 * time.Second, LeaseTTL: 10 * time.Second}, h))
	}
	codes := make(chan int, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() { codes <- reps[i%3].get() })
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("a request got %d, want 200", c)
		}
	}
	if p := peak.Load(); p > limit {
		t.Fatalf("%d requests ran at once across the replicas, limit %d", p, limit)
	}
	t.Logf("peak concurrency %d of %d", peak.Load(), limit)
	var served uint64
	for _, r := range reps {
		served += r.q.Stats().Served
	}
	if served != requests {
		t.Fatalf("served %d, want %d", served, requests)
	}
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(reps[0].b) })
}

// holdAll takes every slot of b's Name with direct Acquire calls and
// returns their release.
func holdAll(t *testing.T, b *redisqueue.Backend, n int) func() {
	t.Helper()
	var ts []ginqueue.Ticket
	for range n {
		tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tk)
	}
	return func() {
		for _, tk := range ts {
			b.Release(tk)
		}
	}
}

// startBackends builds n Backends of one Name, each with its own client,
// started with l, and closes them at the end of the test.
func startBackends(t *testing.T, n int, l ginqueue.Limits, o redisqueue.Options) []*redisqueue.Backend {
	t.Helper()
	if o.Name == "" {
		o.Name = newName(t)
	}
	var bs []*redisqueue.Backend
	for range n {
		b, err := redisqueue.New(newClient(t, redisAddr), o)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(l); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		bs = append(bs, b)
	}
	return bs
}

// waitQueued waits until n requests wait under b's Name.
func waitQueued(t *testing.T, b *redisqueue.Backend, n int) {
	t.Helper()
	eventually(t, 2*time.Second, "waiters did not queue", func() bool {
		s, err := b.GlobalStats(context.Background())
		return err == nil && s.Queued == n
	})
}

func TestGlobalOrderAcrossReplicas(t *testing.T) {
	needRedis(t)
	t.Parallel()
	type arrival struct {
		replica, prio int
	}
	tests := []struct {
		name     string
		arrivals []arrival
		want     []int // indexes of arrivals in grant order
	}{
		{"fifo", []arrival{{0, 0}, {1, 0}, {2, 0}, {1, 0}, {0, 0}, {2, 0}}, []int{0, 1, 2, 3, 4, 5}},
		{"priority then fifo", []arrival{{0, 0}, {1, 1}, {2, 0}, {0, 5}, {1, 1}, {2, -3}}, []int{3, 1, 4, 0, 2, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bs := startBackends(t, 3, ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second}, redisqueue.Options{})
			release := holdAll(t, bs[0], 1)
			order := make(chan int, len(tt.arrivals))
			errs := make(chan error, len(tt.arrivals))
			for i, a := range tt.arrivals {
				b := bs[a.replica]
				go func() {
					tk, err := b.Acquire(context.Background(), ginqueue.Arrival{Priority: a.prio})
					if err != nil {
						errs <- err
						return
					}
					order <- i
					b.Release(tk)
				}()
				// Staggered: each arrival is queued before the next comes.
				waitQueued(t, bs[0], i+1)
			}
			release()
			for k, want := range tt.want {
				select {
				case got := <-order:
					if got != want {
						t.Fatalf("grant %d went to arrival %d, want %d", k, got, want)
					}
				case err := <-errs:
					t.Fatal(err)
				case <-time.After(5 * time.Second):
					t.Fatalf("grant %d never came", k)
				}
			}
			eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(bs[0]) })
		})
	}
}

func TestGlobalQueueBoundGivesExact503s(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const limit, queue, extra = 2, 3, 7
	name := newName(t)
	gate := make(chan struct{})
	h := func(c *gin.Context) { <-gate }
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: queue, QueueTimeout: 10 * time.Second}
	var reps []*replica
	for range 3 {
		reps = append(reps, newReplica(t, redisAddr, cfg, redisqueue.Options{Name: name}, h))
	}
	codes := make(chan int, limit+queue+extra)
	for i := range limit + queue {
		go func() { codes <- reps[i%3].get() }()
	}
	eventually(t, 2*time.Second, "slots and queue not filled", func() bool {
		s, err := reps[0].b.GlobalStats(context.Background())
		return err == nil && s.Running == limit && s.Queued == queue
	})
	for i := range extra {
		if c := reps[i%3].get(); c != http.StatusServiceUnavailable {
			t.Fatalf("request beyond the global bound got %d, want 503", c)
		}
	}
	close(gate)
	for range limit + queue {
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("a request within the bound got %d, want 200", c)
		}
	}
	var full uint64
	for _, r := range reps {
		full += r.q.Stats().QueueFull
	}
	if full != extra {
		t.Fatalf("queue full counted %d times, want %d", full, extra)
	}
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(reps[0].b) })
}

func TestWaiterOutcomes(t *testing.T) {
	needRedis(t)
	t.Parallel()
	l := ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 5, QueueTimeout: 200 * time.Millisecond}

	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		bs := startBackends(t, 2, l, redisqueue.Options{})
		defer holdAll(t, bs[0], 1)()
		start := time.Now()
		_, err := bs[1].Acquire(context.Background(), ginqueue.Arrival{})
		if d := time.Since(start); !errors.Is(err, ginqueue.ErrQueueTimeout) || d < l.QueueTimeout || d > l.QueueTimeout+redisqueue.DefaultCallTimeout {
			t.Fatalf("got %v after %v, want ErrQueueTimeout after %v", err, d, l.QueueTimeout)
		}
		waitQueued(t, bs[0], 0)
	})
	t.Run("hang-up", func(t *testing.T) {
		t.Parallel()
		bs := startBackends(t, 2, l, redisqueue.Options{})
		defer holdAll(t, bs[0], 1)()
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { _, err := bs[1].Acquire(ctx, ginqueue.Arrival{}); errc <- err }()
		waitQueued(t, bs[0], 1)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		waitQueued(t, bs[0], 0)
	})
	t.Run("close", func(t *testing.T) {
		t.Parallel()
		bs := startBackends(t, 2, ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 5}, redisqueue.Options{})
		defer holdAll(t, bs[0], 1)()
		errc := make(chan error, 1)
		go func() { _, err := bs[1].Acquire(context.Background(), ginqueue.Arrival{}); errc <- err }()
		waitQueued(t, bs[0], 1)
		_ = bs[1].Close()
		if err := <-errc; !errors.Is(err, ginqueue.ErrClosed) {
			t.Fatalf("got %v, want ErrClosed", err)
		}
		if _, err := bs[1].Acquire(context.Background(), ginqueue.Arrival{}); !errors.Is(err, ginqueue.ErrClosed) {
			t.Fatalf("after Close: got %v, want ErrClosed", err)
		}
		waitQueued(t, bs[0], 0)
	})
}

func TestDeadReplicaLosesItsSlotsWithinLeaseTTL(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const ttl = time.Second
	o := redisqueue.Options{Name: newName(t), LeaseTTL: ttl, TickInterval: 100 * time.Millisecond}
	l := ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 5, QueueTimeout: 10 * time.Second}

	doomedClient := newClient(t, redisAddr)
	doomed, err := redisqueue.New(doomedClient, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := doomed.Start(l); err != nil {
		t.Fatal(err)
	}
	release := holdAll(t, doomed, 2)
	// The replica dies: its connection is gone and it never releases.
	_ = doomedClient.Close()
	killed := time.Now()

	survivor := startBackends(t, 1, l, o)[0]
	tk, err := survivor.Acquire(context.Background(), ginqueue.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(killed)
	survivor.Release(tk)
	if waited > ttl+2*o.TickInterval+200*time.Millisecond {
		t.Fatalf("the dead replica's slots came back after %v, want within LeaseTTL %v", waited, ttl)
	}
	t.Logf("slot back %v after the kill (LeaseTTL %v)", waited, ttl)
	// Let the dead replica's goroutines end: its releases fail at once
	// (client closed) and are given up at Close.
	release()
	_ = doomed.Close()
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(survivor) })
}

// TestCloseStopsEveryGoroutine is not parallel, so no other test's
// goroutines run while it checks.
func TestCloseStopsEveryGoroutine(t *testing.T) {
	needRedis(t)
	defer goleak.VerifyNone(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 2}); err != nil {
		t.Fatal(err)
	}
	tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := b.Acquire(context.Background(), ginqueue.Arrival{}); errc <- err }()
	waitQueued(t, b, 1)
	_ = b.Close()
	if err := <-errc; !errors.Is(err, ginqueue.ErrClosed) {
		t.Fatalf("waiter got %v, want ErrClosed", err)
	}
	b.Release(tk)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if !globalIdle(b) {
		t.Fatal("slots or places left in Redis after Close and Drain")
	}
}

// A client its owner closed right after Close (a common shutdown order)
// will never answer: the maintainer stops at once instead of retrying the
// goodbye until LeaseTTL.
func TestMaintainerStopsWhenTheClientIsClosed(t *testing.T) {
	needRedis(t)
	defer goleak.VerifyNone(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 2}); err != nil {
		t.Fatal(err)
	}
	tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	_ = rdb.Close()
	b.Release(tk) // its release and the goodbye find the client closed
}
