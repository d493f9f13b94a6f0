package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// replica is one service instance: its own client, Backend, Queue and
// gin engine.
type replica struct {
	rdb redis.UniversalClient
	b   *redisqueue.Backend
	q   *ginqueue.Queue
	e   *gin.Engine
	// timeouts counts the Acquire errors of b that wrap
	// backend.ErrQueueTimeout.
	timeouts atomic.Int64
}

// countTimeouts is a Backend that counts its Acquire's queue timeouts.
type countTimeouts struct {
	*redisqueue.Backend
	n *atomic.Int64
}

func (b countTimeouts) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	t, err := b.Backend.Acquire(ctx, a)
	if errors.Is(err, backend.ErrQueueTimeout) {
		b.n.Add(1)
	}
	return t, err
}

// newReplica builds a replica whose route "/" runs h behind the Queue. The
// test closes the Queue at its end.
func newReplica(t testing.TB, addr string, cfg ginqueue.Config, o redisqueue.Options, h gin.HandlerFunc) *replica {
	t.Helper()
	return newReplicaOn(t, newClient(t, addr), cfg, o, h)
}

// newReplicaOn is newReplica on the client rdb, which the test closes at
// its end.
func newReplicaOn(t testing.TB, rdb redis.UniversalClient, cfg ginqueue.Config, o redisqueue.Options, h gin.HandlerFunc) *replica {
	t.Helper()
	r := &replica{rdb: rdb}
	t.Cleanup(func() { _ = rdb.Close() })
	var err error
	r.b, err = redisqueue.New(r.rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Backend = countTimeouts{Backend: r.b, n: &r.timeouts}
	r.q, err = ginqueue.NewQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the Queue closes before its client.
	t.Cleanup(func() { _ = r.q.Close() })
	r.e = gin.New()
	r.e.GET("/", r.q.Handler(), h)
	return r
}

// get serves one request on r and returns its status.
func (r *replica) get() int {
	w := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	r.e.ServeHTTP(w, req)
	return w.Code
}

// eventually polls cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// globalIdle reports whether nothing is held or queued under b's Name.
func globalIdle(b *redisqueue.Backend) bool {
	s, err := b.GlobalStats(context.Background())
	return err == nil && s.Running == 0 && s.Queued == 0
}

// startBackends builds n Backends of one Name, each with its own client,
// started with l, and closes them at the end of the test.
func startBackends(t *testing.T, n int, l backend.Limits, o redisqueue.Options) []*redisqueue.Backend {
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

// startBackends2 is startBackends on the Redis at addr.
func startBackends2(t *testing.T, addr string, l backend.Limits, o redisqueue.Options) *redisqueue.Backend {
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

// holdAll takes every slot of b's Name with direct Acquire calls and
// returns their release.
func holdAll(t *testing.T, b *redisqueue.Backend, n int) func() {
	t.Helper()
	var ts []backend.Ticket
	for range n {
		tk, err := b.Acquire(context.Background(), backend.Arrival{})
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

// waitQueued waits until n requests wait under b's Name.
func waitQueued(t *testing.T, b *redisqueue.Backend, n int) {
	t.Helper()
	eventually(t, 2*time.Second, "waiters did not queue", func() bool {
		s, err := b.GlobalStats(context.Background())
		return err == nil && s.Queued == n
	})
}

// holder is a request that acquires on b, reports its index on granted
// (or its error on errs) and holds its slot until release is closed.
type holder struct {
	release chan struct{}
}

func hold(b *redisqueue.Backend, a backend.Arrival, i int, granted chan<- int, errs chan<- error) *holder {
	h := &holder{release: make(chan struct{})}
	go func() {
		tk, err := b.Acquire(context.Background(), a)
		if err != nil {
			errs <- err
			return
		}
		granted <- i
		<-h.release
		b.Release(tk)
	}()
	return h
}

// fleetIs waits until Redis shows running holders and queued waiters under
// b's Name. A release script either grants or does not, atomically, so
// running and queued seen together say whether it admitted anyone.
func fleetIs(t *testing.T, b *redisqueue.Backend, running, queued int) {
	t.Helper()
	var s redisqueue.GlobalStats
	eventually(t, 2*time.Second, "", func() bool {
		var err error
		s, err = b.GlobalStats(context.Background())
		return err == nil && s.Running <= running
	})
	if s.Running != running || s.Queued != queued {
		t.Fatalf("fleet: %d running, %d queued; want %d and %d", s.Running, s.Queued, running, queued)
	}
}

// held acquires cost slots on b at once (they are free) and checks the
// Ticket.
func held(t *testing.T, b *redisqueue.Backend, cost, slots int) backend.Ticket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	tk, err := b.Acquire(ctx, backend.Arrival{Cost: cost})
	if err != nil || tk.Cost != slots {
		t.Fatalf("Acquire of cost %d: Ticket %+v, %v; want %d slots", cost, tk, err, slots)
	}
	return tk
}

func fallbackOptions(t *testing.T) redisqueue.Options {
	return redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 2 * time.Second, FailureThreshold: 1, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
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

// keysWithoutTTL lists the keys of name that would never expire.
func keysWithoutTTL(ctx context.Context, rdb redis.UniversalClient, name string) ([]string, error) {
	var keys []string
	var mu sync.Mutex // ForEachMaster runs in parallel
	pattern := "ginqueue:{" + name + "}:*"
	scan := func(c *redis.Client) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			if d, err := c.PTTL(ctx, it.Val()).Result(); err == nil && d == -1 {
				mu.Lock()
				keys = append(keys, it.Val())
				mu.Unlock()
			}
		}
		return it.Err()
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(m) })
		return keys, err
	case *redis.Client:
		return keys, scan(c)
	}
	return nil, fmt.Errorf("client %T", rdb)
}

func itoa(n int) string { return strconv.Itoa(n) }
