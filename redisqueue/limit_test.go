package redisqueue_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// TestSetLimitMovesTheFleet: two replicas, limit 1, waiters on both.
// Raising the limit on A grants the next waiters in the global order at
// once, though they wait on B; lowering it on B admits nobody until the
// holders fit under it; both replicas report the limit.
func TestSetLimitMovesTheFleet(t *testing.T) {
	needRedis(t)
	t.Parallel()
	// A slow safety net, so that the grants below can only come from the
	// notices pushed by SetLimit's and Release's scripts.
	o := redisqueue.Options{LeaseTTL: 3 * time.Second, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: time.Second}}
	bs := startBackends(t, 2, backend.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 20 * time.Second}, o)
	a, b := bs[0], bs[1]
	first := make(chan int, 1)
	errs := make(chan error, 8)
	granted := make(chan int, 8)
	h0 := hold(a, backend.Arrival{}, -1, first, errs)
	select {
	case <-first:
	case err := <-errs:
		t.Fatal(err)
	}
	arrivals := []struct {
		b    *redisqueue.Backend
		prio int
	}{{b, 0}, {a, 0}, {b, 5}, {b, 0}}
	var hs []*holder
	for i, ar := range arrivals {
		hs = append(hs, hold(ar.b, backend.Arrival{Priority: ar.prio}, i, granted, errs))
		waitQueued(t, a, i+1) // staggered: arrival order is index order
	}
	defer func() {
		for _, h := range append(hs, h0) {
			select {
			case <-h.release:
			default:
				close(h.release)
			}
		}
	}()

	// Raise on A: the next two by priority, then arrival, are both on B.
	start := time.Now()
	if err := a.SetLimit(3); err != nil {
		t.Fatal(err)
	}
	expectGrants(t, granted, errs, 500*time.Millisecond, 2, 0)
	t.Logf("raised: two waiters on the other replica granted within %v", time.Since(start))
	fleetIs(t, a, 3, 2)
	limitsAre(t, 3, a, b)
	if s, err := b.GlobalStats(context.Background()); err != nil || s.Limit != 3 {
		t.Fatalf("GlobalStats: %+v, %v; want Limit 3", s, err)
	}

	// Lower on B with 3 running: two releases admit nobody.
	if err := b.SetLimit(1); err != nil {
		t.Fatal(err)
	}
	if got := b.Stats().Limit; got != 1 {
		t.Fatalf("B after its SetLimit(1): Stats().Limit %d, want 1", got)
	}
	close(h0.release)
	fleetIs(t, a, 2, 2)
	close(hs[2].release)
	fleetIs(t, a, 1, 2)
	select {
	case i := <-granted:
		t.Fatalf("arrival %d was granted with the limit lowered to 1 and 1 running", i)
	default:
	}
	limitsAre(t, 1, a, b)
	// The last of the three: the head waiter (arrival 1, on A) runs.
	close(hs[0].release)
	expectGrants(t, granted, errs, 500*time.Millisecond, 1)
	fleetIs(t, a, 1, 1)
	close(hs[1].release)
	expectGrants(t, granted, errs, 500*time.Millisecond, 3)
	close(hs[3].release)
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(a) })
}

// expectGrants receives len(want) grants, in any order, within d, and fails
// on an error or a grant not in want.
func expectGrants(t *testing.T, granted <-chan int, errs <-chan error, d time.Duration, want ...int) {
	t.Helper()
	left := map[int]bool{}
	for _, i := range want {
		left[i] = true
	}
	timeout := time.After(d)
	for len(left) > 0 {
		select {
		case i := <-granted:
			if !left[i] {
				t.Fatalf("arrival %d was granted; want %v first", i, want)
			}
			delete(left, i)
		case err := <-errs:
			t.Fatal(err)
		case <-timeout:
			t.Fatalf("after %v, arrivals %v still not granted", d, left)
		}
	}
}

// limitsAre waits until every backend's Stats().Limit is n.
func limitsAre(t *testing.T, n int, bs ...*redisqueue.Backend) {
	t.Helper()
	for i, b := range bs {
		eventually(t, 3*time.Second, "replica "+strconv.Itoa(i)+" does not report limit "+strconv.Itoa(n), func() bool {
			return b.Stats().Limit == n
		})
	}
}

func TestSetLimitRefusesBadValues(t *testing.T) {
	needRedis(t)
	t.Parallel()
	r := newReplica(t, redisAddr, ginqueue.Config{MaxConcurrent: 2}, redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue}, nil)
	for _, n := range []int{0, -1, 1<<30 + 1} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			err := r.b.SetLimit(n)
			if err == nil || !strings.HasPrefix(err.Error(), "redisqueue: ") || !strings.Contains(err.Error(), strconv.Itoa(n)) {
				t.Fatalf("SetLimit(%d): got %v, want an error naming %d", n, err, n)
			}
		})
	}
	if got := r.q.Stats().Limit; got != 2 {
		t.Fatalf("after refused values: limit %d, want 2", got)
	}
	// Through the Queue, which finds the Backend's LimitSetter.
	if err := r.q.SetLimit(1 << 30); err != nil {
		t.Fatal(err)
	}
	if got := r.q.Stats().Limit; got != 1<<30 {
		t.Fatalf("Queue.SetLimit(2^30): limit %d", got)
	}
}

// TestSetLimitOutlivesARestartedReplica: a replica that starts while the
// fleet runs goes by the fleet's limit; a fleet started again with other
// limits, once the old replicas are gone, goes by its own.
func TestSetLimitOutlivesARestartedReplica(t *testing.T) {
	needRedis(t)
	t.Parallel()
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue}
	cfg := ginqueue.Config{MaxConcurrent: 2, MaxQueue: 4}
	a := newReplica(t, redisAddr, cfg, o, nil)
	if err := a.b.SetLimit(5); err != nil {
		t.Fatal(err)
	}
	b := newReplica(t, redisAddr, cfg, o, nil)
	if got := b.q.Stats().Limit; got != 5 {
		t.Fatalf("replica started after SetLimit(5): limit %d, want 5", got)
	}
	_ = a.q.Close()
	_ = b.q.Close()
	c := newReplica(t, redisAddr, ginqueue.Config{MaxConcurrent: 3, MaxQueue: 4}, o, nil)
	if got := c.q.Stats().Limit; got != 3 {
		t.Fatalf("fleet started again with MaxConcurrent 3: limit %d, want 3", got)
	}
	if s, err := c.b.GlobalStats(context.Background()); err != nil || s.Limit != 3 {
		t.Fatalf("GlobalStats: %+v, %v; want Limit 3", s, err)
	}
}

// TestSetLimitWithRedisDown: SetLimit returns an error wrapping
// ErrUnavailable and changes nothing; the FailOpen local limit follows the
// fleet's limit as last seen.
func TestSetLimitWithRedisDown(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: 2 * time.Second, FailureThreshold: 2, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 2}, o)
	if err := b.SetLimit(4); err != nil {
		t.Fatal(err)
	}
	srv.stop()

	// Not yet marked down: the call fails; then marked down: refused at once.
	for i := range 2 {
		err := b.SetLimit(7)
		if !errors.Is(err, redisqueue.ErrUnavailable) || !strings.Contains(err.Error(), "7") {
			t.Fatalf("SetLimit(7) with Redis gone, try %d: got %v, want ErrUnavailable naming 7", i, err)
		}
		if got := b.Stats().Limit; got != 4 {
			t.Fatalf("after a failed SetLimit(7): limit %d, want 4", got)
		}
	}
	eventually(t, 2*time.Second, "Redis not marked down", func() bool {
		err := b.SetLimit(7)
		return err != nil && strings.Contains(err.Error(), "marked down")
	})

	// FailOpen: the local limit is the fleet's 4 (one live replica), not
	// the declared 2; no local queue, so the fifth is refused.
	var ts []backend.Ticket
	for i := range 4 {
		tk, err := b.Acquire(context.Background(), backend.Arrival{})
		if err != nil {
			t.Fatalf("local acquire %d: %v", i, err)
		}
		ts = append(ts, tk)
	}
	if _, err := b.Acquire(context.Background(), backend.Arrival{}); !errors.Is(err, backend.ErrQueueFull) {
		t.Fatalf("fifth local acquire: got %v, want queue full", err)
	}
	for _, tk := range ts {
		b.Release(tk)
	}
}

// SetLimit reaches every replica at once, not at its next tick.
func TestSetLimitReachesTheFleetAtOnce(t *testing.T) {
	needRedis(t)
	t.Parallel()
	o := redisqueue.Options{Name: newName(t), LeaseTTL: 10 * time.Second, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: time.Second}}
	bs := startBackends(t, 2, backend.Limits{MaxConcurrent: 4, MaxQueue: 4}, o)
	time.Sleep(50 * time.Millisecond) // both readers listen
	if err := bs[0].SetLimit(1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually(t, 2*time.Second, "the other replica did not learn the limit", func() bool { return bs[1].Stats().Limit == 1 })
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("the other replica learnt the limit %v after SetLimit, want at once (its tick is %v)", d, o.GlobalQueue.TickInterval)
	}
}
