package redisqueue_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// weighted are the limits of the tests below: costs on, a roomy queue.
func weighted(limit int) backend.Limits {
	return backend.Limits{MaxConcurrent: limit, MaxQueue: 20, QueueTimeout: 20 * time.Second, Weighted: true}
}

// slow is the Options of the tests whose grants must come from the
// scripts of acquires and releases: a safety net so slow that a grant
// within 300 ms seldom comes from it.
var slow = redisqueue.Options{LeaseTTL: 9 * time.Second, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 3 * time.Second}}

// grant is the outcome of one acquire of acquireAsync.
type grant struct {
	i   int
	t   backend.Ticket
	err error
}

// acquireAsync acquires on b in a goroutine and sends the outcome, tagged
// i, on out.
func acquireAsync(ctx context.Context, b *redisqueue.Backend, a backend.Arrival, i int, out chan<- grant) {
	go func() {
		t, err := b.Acquire(ctx, a)
		out <- grant{i, t, err}
	}()
}

// next receives the next grant within d and checks that it is arrival i,
// granted slots slots.
func next(t *testing.T, out <-chan grant, d time.Duration, i, slots int) backend.Ticket {
	t.Helper()
	select {
	case g := <-out:
		if g.err != nil || g.i != i || g.t.Cost != slots {
			t.Fatalf("got arrival %d (Ticket %+v, %v); want arrival %d granted %d slots", g.i, g.t, g.err, i, slots)
		}
		return g.t
	case <-time.After(d):
		t.Fatalf("after %v, arrival %d is still not granted", d, i)
	}
	return backend.Ticket{}
}

// none checks that no grant comes within d.
func none(t *testing.T, out <-chan grant, d time.Duration) {
	t.Helper()
	select {
	case g := <-out:
		t.Fatalf("arrival %d got Ticket %+v, %v; want it still waiting", g.i, g.t, g.err)
	case <-time.After(d):
	}
}

// Three replicas serve a mix of cost-1 and cost-4 requests under one limit
// of 6: the slots held by running requests, and those held in Redis, never
// exceed it, and everyone is served.
func TestWeightedNeverExceedsTheLimit(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const limit, n = 6, 60
	bs := startBackends(t, 3, backend.Limits{MaxConcurrent: limit, MaxQueue: n, QueueTimeout: 30 * time.Second, Weighted: true},
		redisqueue.Options{Mode: redisqueue.GlobalQueue})
	var inUse, most, redisMost atomic.Int64
	stop := make(chan struct{})
	watched := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				watched <- nil
				return
			default:
			}
			s, err := bs[0].GlobalStats(context.Background())
			if err != nil {
				watched <- err
				return
			}
			if r := int64(s.Running); r > redisMost.Load() {
				redisMost.Store(r)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	errs := make(chan error, n)
	for i := range n {
		cost := 1
		if i%3 == 0 {
			cost = 4
		}
		go func() {
			b := bs[i%len(bs)]
			tk, err := b.Acquire(context.Background(), backend.Arrival{Cost: cost})
			if err == nil && tk.Cost != cost {
				err = errors.New("arrival of cost " + strconv.Itoa(cost) + " granted " + strconv.Itoa(tk.Cost) + " slots")
			}
			if err != nil {
				errs <- err
				return
			}
			u := inUse.Add(int64(tk.Cost))
			for m := most.Load(); u > m && !most.CompareAndSwap(m, u); m = most.Load() {
			}
			time.Sleep(3 * time.Millisecond)
			inUse.Add(-int64(tk.Cost))
			b.Release(tk)
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	if most.Load() > limit || redisMost.Load() > limit {
		t.Fatalf("slots in use peaked at %d, in Redis at %d; limit %d", most.Load(), redisMost.Load(), limit)
	}
	t.Logf("slots in use peaked at %d, in Redis at %d (limit %d)", most.Load(), redisMost.Load(), limit)
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(bs[0]) })
}

// A cost-3 waiter at the head, on replica A, holds the line: a cost-1
// waiter behind it on replica B is not granted though a slot is free, while
// an arrival of higher priority runs at once on the free slots. Once 3
// slots are free the head runs, then the one behind it.
func TestWeightedHeadOfLineAcrossReplicas(t *testing.T) {
	needRedis(t)
	t.Parallel()
	bs := startBackends(t, 2, weighted(4), slow)
	a, b := bs[0], bs[1]
	h1, h2 := held(t, a, 1, 1), held(t, a, 1, 1)
	out := make(chan grant, 4)
	acquireAsync(context.Background(), a, backend.Arrival{Cost: 3}, 3, out)
	waitQueued(t, a, 1)
	acquireAsync(context.Background(), b, backend.Arrival{Cost: 1}, 4, out)
	waitQueued(t, a, 2)
	none(t, out, 200*time.Millisecond)
	fleetIs(t, a, 2, 2)

	acquireAsync(context.Background(), b, backend.Arrival{Cost: 1, Priority: 5}, 5, out)
	h5 := next(t, out, 300*time.Millisecond, 5, 1)
	fleetIs(t, a, 3, 2)

	b.Release(h5) // 2 free: not enough for the head
	fleetIs(t, a, 2, 2)
	none(t, out, 100*time.Millisecond)
	a.Release(h1) // 3 free
	h3 := next(t, out, 300*time.Millisecond, 3, 3)
	fleetIs(t, a, 4, 1)
	a.Release(h2)
	h4 := next(t, out, 300*time.Millisecond, 4, 1)
	fleetIs(t, a, 4, 0)
	a.Release(h3)
	b.Release(h4)
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(a) })
}

// A cost above the limit is granted as the whole limit: the request runs
// alone, and its Release gives every slot back.
func TestWeightedCostAboveTheLimitRunsAlone(t *testing.T) {
	needRedis(t)
	t.Parallel()
	bs := startBackends(t, 2, weighted(3), slow)
	a, b := bs[0], bs[1]
	big := held(t, a, 10, 3)
	if s := a.Stats(); s.Running != 3 {
		t.Fatalf("Stats().Running %d with a cost-10 request on limit 3; want 3 slots", s.Running)
	}
	out := make(chan grant, 1)
	acquireAsync(context.Background(), b, backend.Arrival{}, 1, out)
	waitQueued(t, a, 1)
	fleetIs(t, a, 3, 1)
	a.Release(big)
	b.Release(next(t, out, 300*time.Millisecond, 1, 1))
}

// A replica that dies holding a cost-3 request loses all three slots
// within LeaseTTL: a survivor's cost-4 request then gets the whole limit.
func TestWeightedLeaseExpiryFreesTheWholeCost(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const ttl = time.Second
	o := redisqueue.Options{Name: newName(t), LeaseTTL: ttl, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
	doomedClient := newClient(t, redisAddr)
	doomed, err := redisqueue.New(doomedClient, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := doomed.Start(weighted(4)); err != nil {
		t.Fatal(err)
	}
	heavy := held(t, doomed, 3, 3)
	_ = doomedClient.Close() // it dies holding its slots
	killed := time.Now()

	survivor := startBackends(t, 1, weighted(4), o)[0]
	fleetIs(t, survivor, 3, 0)
	ctx, cancel := context.WithTimeout(context.Background(), ttl+time.Second)
	defer cancel()
	tk, err := survivor.Acquire(ctx, backend.Arrival{Cost: 4})
	if err != nil || tk.Cost != 4 {
		t.Fatalf("cost 4 after the holder of 3 died: Ticket %+v, %v; want 4 slots within LeaseTTL", tk, err)
	}
	t.Logf("the whole limit back %v after the kill (LeaseTTL %v)", time.Since(killed), ttl)
	fleetIs(t, survivor, 4, 0)
	survivor.Release(tk)
	fleetIs(t, survivor, 0, 0)
	doomed.Release(heavy) // fails (client closed), given up LeaseTTL after Close
	_ = doomed.Close()
	drain, cancelDrain := context.WithTimeout(context.Background(), 2*ttl)
	defer cancelDrain()
	_ = doomed.Drain(drain) // so that its maintainer is gone when the test ends
}

// SetLimit lowered below the slots held admits nobody until the slots still
// held fit under it; a Release after it gives back the slots it was
// granted, not the new limit.
func TestWeightedSetLimitLoweredAdmitsNobodyUntilTheyFit(t *testing.T) {
	needRedis(t)
	t.Parallel()
	bs := startBackends(t, 2, weighted(6), slow)
	a, b := bs[0], bs[1]
	four, two := held(t, a, 4, 4), held(t, b, 2, 2)
	if err := b.SetLimit(3); err != nil {
		t.Fatal(err)
	}
	out := make(chan grant, 1)
	acquireAsync(context.Background(), b, backend.Arrival{}, 1, out)
	waitQueued(t, a, 1)
	b.Release(two)
	fleetIs(t, a, 4, 1) // 4 held, limit 3
	none(t, out, 100*time.Millisecond)
	a.Release(four)
	tk := next(t, out, 300*time.Millisecond, 1, 1)
	fleetIs(t, a, 1, 0) // the cost-4 Release gave back 4 slots
	b.Release(tk)
}

// After a flush, a running cost-3 request is reclaimed as 3 slots at its
// replica's next sync: a cost-2 arrival then waits until it ends.
func TestWeightedReclaimAfterFlushCountsTheCost(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), LeaseTTL: time.Second, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 50 * time.Millisecond}}
	a := startBackends2(t, srv.addr(), weighted(4), o)
	b := startBackends2(t, srv.addr(), weighted(4), o)
	heavy := held(t, a, 3, 3)
	if err := newClient(t, srv.addr()).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the cost-3 holder was not reclaimed as 3 slots", func() bool {
		s, err := a.GlobalStats(context.Background())
		return err == nil && s.Running == 3
	})
	out := make(chan grant, 1)
	acquireAsync(context.Background(), b, backend.Arrival{Cost: 2}, 1, out)
	waitQueued(t, a, 1)
	none(t, out, 200*time.Millisecond)
	a.Release(heavy)
	tk := next(t, out, 300*time.Millisecond, 1, 2)
	fleetIs(t, a, 2, 0)
	b.Release(tk)
}

// A heavy waiter at the head that hangs up lets the line move at once: the
// cost-1 waiter behind it, on another replica, runs on the free slots
// without waiting for a safety-net tick.
func TestWeightedHeadHangUpLetsTheLineMove(t *testing.T) {
	needRedis(t)
	t.Parallel()
	bs := startBackends(t, 2, weighted(4), slow)
	a, b := bs[0], bs[1]
	two := held(t, a, 2, 2)
	ctx, hangUp := context.WithCancel(context.Background())
	out := make(chan grant, 2)
	acquireAsync(ctx, a, backend.Arrival{Cost: 4}, 1, out)
	waitQueued(t, a, 1)
	acquireAsync(context.Background(), b, backend.Arrival{}, 2, out)
	waitQueued(t, a, 2)
	none(t, out, 100*time.Millisecond)
	hangUp()
	if g := <-out; g.i != 1 || !errors.Is(g.err, context.Canceled) {
		t.Fatalf("the heavy waiter that hung up got %+v", g)
	}
	tk := next(t, out, 300*time.Millisecond, 2, 1)
	fleetIs(t, a, 3, 0)
	b.Release(tk)
	a.Release(two)
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(a) })
}

// Through a Queue: Config.Cost is accepted, and Stats and GlobalStats count
// a running request's slots.
func TestWeightedThroughTheQueue(t *testing.T) {
	needRedis(t)
	t.Parallel()
	release := make(chan struct{})
	cost := func(c *gin.Context) int { n, _ := strconv.Atoi(c.Query("cost")); return n }
	r := newReplica(t, redisAddr, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: 10 * time.Second, Cost: cost},
		redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue}, func(*gin.Context) { <-release })
	done := make(chan int, 1)
	go func() {
		w := httptest.NewRecorder()
		r.e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?cost=3", nil))
		done <- w.Code
	}()
	eventually(t, 2*time.Second, "the cost-3 request does not run", func() bool { return r.q.Stats().Running == 3 })
	fleetIs(t, r.b, 3, 0)
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	fleetIs(t, r.b, 0, 0)
}

// Under FailOpen the local fallback counts costs too: with Redis gone and
// a local limit of 4, a cost-3 request leaves room for no cost-2 one.
func TestWeightedFailOpenCountsCostsLocally(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: 2 * time.Second, FailureThreshold: 2, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 4, Weighted: true}, o)
	srv.stop()
	eventually(t, 3*time.Second, "Redis not marked down", func() bool {
		err := b.SetLimit(4)
		return err != nil && strings.Contains(err.Error(), "marked down")
	})
	tk, err := b.Acquire(context.Background(), backend.Arrival{Cost: 3})
	if err != nil || tk.Cost != 3 || !redisqueue.GrantedLocally(tk) {
		t.Fatalf("local cost-3 acquire: Ticket %+v, %v", tk, err)
	}
	if _, err := b.Acquire(context.Background(), backend.Arrival{Cost: 2}); !errors.Is(err, backend.ErrQueueFull) {
		t.Fatalf("local cost-2 acquire beside a cost-3 one, limit 4: got %v, want queue full", err)
	}
	if s := b.Stats(); s.Running != 3 {
		t.Fatalf("Stats().Running %d; want the 3 local slots", s.Running)
	}
	b.Release(tk)
	b.Release(held(t, b, 2, 2))
	// Redis back: the replica turns to it again, and Close says goodbye at once.
	srv.start()
	eventually(t, 3*time.Second, "Redis not back", func() bool { return b.SetLimit(4) == nil })
	tk = held(t, b, 4, 4)
	if redisqueue.GrantedLocally(tk) {
		t.Fatal("granted locally with Redis back")
	}
	b.Release(tk)
}

// A write to the limit's hash after Redis lost it (a flush) gives it a TTL
// again.
func TestWeightedWritesKeepTheLimitsTTL(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), LeaseTTL: 10 * time.Second, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 3 * time.Second}}
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 4, MaxQueue: 4, Weighted: true}, o)
	ctl := newClient(t, srv.addr())
	ctx := context.Background()
	if err := ctl.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	tk, err := b.Acquire(ctx, backend.Arrival{Cost: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(tk)
	if keys, err := keysWithoutTTL(ctx, ctl, o.Name); err != nil || len(keys) > 0 {
		t.Errorf("keys without a TTL after a flush and a weighted grant: %v (%v)", keys, err)
	}
}
