package redisqueue_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Config.CoDel cannot be honoured across the fleet: NewQueue says so, and
// nothing is left running (Redis is never asked).
func TestCoDelIsRefused(t *testing.T) {
	b, err := redisqueue.New(newClient(t, redisAddr), redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Backend: b, CoDel: &ginqueue.CoDel{}})
	if err == nil || !strings.HasPrefix(err.Error(), "redisqueue: Config.CoDel is not supported: ") {
		t.Fatalf("NewQueue with CoDel: got %v, want redisqueue's refusal", err)
	}
}

// Config.MaxQueuePerFlow cannot be honoured by the fleet's queue, which
// counts no places per flow: NewQueue says so rather than ignore the cap.
func TestMaxQueuePerFlowIsRefused(t *testing.T) {
	b, err := redisqueue.New(newClient(t, redisAddr), redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue})
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
	o := redisqueue.Options{Name: name, Mode: redisqueue.GlobalQueue}
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

// A Queue whose Redis never answered closes at once: with nothing to give
// back, the goodbye is tried once, not until LeaseTTL has passed.
func TestCloseWithRedisNeverReachedReturnsAtOnce(t *testing.T) {
	b, err := redisqueue.New(newClient(t, "127.0.0.1:1"), redisqueue.Options{Name: newName(t), LeaseTTL: 10 * time.Second, Mode: redisqueue.GlobalQueue})
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

// TestCloseStopsEveryGoroutine is not parallel, so no other test's
// goroutines run while it checks.
func TestCloseStopsEveryGoroutine(t *testing.T) {
	needRedis(t)
	defer goleak.VerifyNone(t, goRedisProbe)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(backend.Limits{MaxConcurrent: 1, MaxQueue: 2}); err != nil {
		t.Fatal(err)
	}
	tk, err := b.Acquire(context.Background(), backend.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := b.Acquire(context.Background(), backend.Arrival{}); errc <- err }()
	waitQueued(t, b, 1)
	_ = b.Close()
	if err := <-errc; !errors.Is(err, backend.ErrClosed) {
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

// Under FailClosed, Close while an acquire call is in flight answers the
// request as closed when the call returns (within CallTimeout), not as
// unavailable.
func TestCloseDuringAnAcquireCallIsClosed(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.CallTimeout, o.OnRedisDown = 500*time.Millisecond, redisqueue.FailClosed
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 2, MaxQueue: 4}, o)
	if tk, err := b.Acquire(context.Background(), backend.Arrival{}); err != nil { // warm the connection
		t.Fatal(err)
	} else {
		b.Release(tk)
	}
	pause(t, srv, time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(context.Background(), backend.Arrival{})
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // the call is on its way
	closed := time.Now()
	go func() { _ = b.Close() }()
	select {
	case err := <-errc:
		if !errors.Is(err, backend.ErrClosed) || errors.Is(err, backend.ErrQueueFull) {
			t.Errorf("Acquire answered %v at Close, want ErrClosed", err)
		}
		if d := time.Since(closed); d > o.CallTimeout {
			t.Errorf("answered %v after Close, want within CallTimeout %v", d, o.CallTimeout)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Acquire not answered")
	}
}

// Shutdown keeps to its context when Redis stops answering while a request
// waits: Close gives the goodbye 2 × CallTimeout, the maintainer goes on
// trying in the background, and Drain waits for it only as long as ctx
// allows. Close used to wait for the goodbye until LeaseTTL had passed.
func TestShutdownWithRedisFrozenKeepsToItsContext(t *testing.T) {
	needRedis(t)
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue, LeaseTTL: 10 * time.Second}
	cfg := ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 30 * time.Second}
	release := make(chan struct{})
	holder := newReplica(t, redisAddr, cfg, o, func(c *gin.Context) { <-release })
	go holder.get()
	eventually(t, 2*time.Second, "the slot is held", func() bool {
		s, err := holder.b.GlobalStats(context.Background())
		return err == nil && s.Running == 1
	})
	px := newFreezeProxy(t, redisAddr)
	waiter := newReplica(t, px.addr(), cfg, o, func(c *gin.Context) {})
	codes := make(chan int, 1)
	go func() { codes <- waiter.get() }()
	eventually(t, 2*time.Second, "the request waits", func() bool { return waiter.q.Stats().Queued == 1 })
	px.setFrozen(true)
	defer px.setFrozen(false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := waiter.q.Shutdown(ctx)
	took := time.Since(start)
	if took > 1500*time.Millisecond {
		t.Fatalf("Shutdown with a 1 s context took %v (LeaseTTL 10 s)", took)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want nil or the context's error", err)
	}
	if code := <-codes; code != http.StatusServiceUnavailable {
		t.Fatalf("the waiter got %d, want 503 (closed)", code)
	}
	close(release)
}
