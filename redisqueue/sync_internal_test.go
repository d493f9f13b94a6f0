package redisqueue

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/redis/go-redis/v9"
)

// A replica knows which slots it holds: a lease of its own in Redis that it
// neither holds nor waits for (a release acknowledged by a master that then
// lost it in a failover) is dropped at its next sync, and the slot goes to
// the next waiter; a lease whose acquire is still in flight is kept.
func TestSyncReconcilesPhantomLeases(t *testing.T) {
	b, rdb := internalBackend(t, backend.Limits{MaxConcurrent: 2, MaxQueue: 4})
	ctx := context.Background()
	h := b.keys[keyH]
	phantom := b.leaseID(b.nextID.Add(1))      // given out, released, and the release lost
	later := b.leaseID(b.nextID.Load() + 1000) // an acquire that begins after the sync's list
	b.mu.Lock()
	inflight := &waiter{id: b.nextID.Add(1), ready: make(chan struct{})} // its acquire reply has not come back
	b.waiters[inflight.id] = inflight
	b.mu.Unlock()
	far := float64(time.Now().Add(time.Hour).UnixMilli())
	if err := rdb.ZAdd(ctx, h, redis.Z{Score: far, Member: phantom}, redis.Z{Score: far, Member: b.leaseID(inflight.id)},
		redis.Z{Score: far, Member: later}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.sync(false); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZScore(ctx, h, phantom).Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the phantom lease is still held in Redis (%v)", err)
	}
	if err := rdb.ZScore(ctx, h, b.leaseID(inflight.id)).Err(); err != nil {
		t.Fatalf("the lease of an acquire in flight was dropped: %v", err)
	}
	if err := rdb.ZScore(ctx, h, later).Err(); err != nil {
		t.Fatalf("the lease of an acquire that began after the list was dropped: %v", err)
	}
	_ = rdb.ZRem(ctx, h, later)
	b.mu.Lock()
	delete(b.waiters, inflight.id)
	b.mu.Unlock()
	_ = rdb.ZRem(ctx, h, b.leaseID(inflight.id))
}

// The reconcile races the acquires: an Acquire that registers its waiter
// after a sync has listed this replica's leases, and whose script reaches
// Redis first, holds a lease the list does not name. It must not be taken
// for a phantom, or one more than the limit runs. Syncs in a tight loop
// against a closed loop of acquires; the peak must stay at the limit.
func TestReconcileKeepsAcquiresAfterTheList(t *testing.T) {
	const limit = 2
	b, _ := internalBackend(t, backend.Limits{MaxConcurrent: limit, MaxQueue: 16, QueueTimeout: 5 * time.Second})
	stop := make(chan struct{})
	var running, peak atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				_ = b.sync(false)
			}
		}
	})
	for range limit + 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				tk, err := b.Acquire(context.Background(), backend.Arrival{})
				if err != nil {
					continue
				}
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(200 * time.Microsecond)
				running.Add(-1)
				b.Release(tk)
			}
		})
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Fatalf("%d ran at once with a limit of %d", p, limit)
	}
}

// A Release that races a sync which still lists its slot as held: the
// leave frees the slot first, the sync finds it free and reclaims it. The
// reclaimed slot, which nobody holds, is given back at once, not at the
// next sync.
func TestReleaseRacingSyncLeavesNoGhost(t *testing.T) {
	b, rdb := internalBackend(t, backend.Limits{MaxConcurrent: 2, MaxQueue: 10})
	ctx := context.Background()
	for i := range 500 {
		tk, err := b.Acquire(ctx, backend.Arrival{})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { _ = b.sync(false) })
		wg.Go(func() { b.Release(tk) })
		wg.Wait()
		deadline := time.Now().Add(200 * time.Millisecond)
		for rdb.ZScore(ctx, b.keys[keyH], b.leaseID(tk.ID)).Err() == nil {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: a released slot is still held in Redis 200 ms after its release", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// A request admitted on this replica's own after its probe listed what it
// runs, and before the probe's answer marks Redis up, is counted before
// Redis grants anybody: the probe does not count as this replica's full
// list, the sync right after it does.
func TestALocalGrantAfterTheProbesListIsCounted(t *testing.T) {
	addr := ownRedis(t)
	o := Options{Name: "late", CallTimeout: 50 * time.Millisecond, LeaseTTL: 3 * time.Second, FailureThreshold: 1, Mode: GlobalQueue, GlobalQueue: GlobalQueueOptions{TickInterval: 200 * time.Millisecond}} // a liveness lease of 600 ms
	l := backend.Limits{MaxConcurrent: 2, MaxQueue: 4}
	start := func(o Options, hook func(bool)) *Backend {
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		b, err := New(rdb, o)
		if err != nil {
			t.Fatal(err)
		}
		b.syncHook = hook
		if err := b.Start(l); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	var a *Backend
	var late atomic.Pointer[backend.Ticket]
	var paused, delayed atomic.Bool
	window := make(chan struct{})
	a = start(o, func(down bool) {
		switch {
		case down && paused.Load() && late.Load() == nil:
			// The probe that will find Redis back: its list is taken, and
			// a request is admitted on a's own before it is sent.
			c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if tk, err := a.Acquire(c, backend.Arrival{}); err == nil {
				late.Store(&tk)
			}
		case !down && late.Load() != nil && !delayed.Swap(true):
			// The sync with the full list comes late.
			close(window)
			time.Sleep(200 * time.Millisecond) // well within the liveness lease
		}
	})
	ob := o
	ob.FailureThreshold = 59 // the most LeaseTTL allows, never reached: it syncs with a full list at once
	other := start(ob, nil)
	ctl := redis.NewClient(&redis.Options{Addr: addr})
	defer ctl.Close()
	ctx := context.Background()
	for s, _ := a.GlobalStats(ctx); s.Replicas != 2; s, _ = a.GlobalStats(ctx) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", 500, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	paused.Store(true)
	c, cancel := context.WithTimeout(ctx, 60*time.Millisecond)
	if tk, err := a.Acquire(c, backend.Arrival{}); err == nil { // its call fails: Redis is marked down on a
		a.Release(tk) // admitted on its own
	}
	cancel()
	select {
	case <-window:
	case <-time.After(3 * time.Second):
		t.Fatalf("no late local grant, or Redis not marked up on a: %+v", a.Stats())
	}
	// While a's full list is on its way: two requests on the other replica.
	got := make(chan backend.Ticket, 2)
	for range 2 {
		go func() {
			c, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if tk, err := other.Acquire(c, backend.Arrival{}); err == nil {
				got <- tk
			}
		}()
	}
	var tks []backend.Ticket
	timeout := time.After(1200 * time.Millisecond)
	for len(tks) < 2 {
		select {
		case tk := <-got:
			tks = append(tks, tk)
			continue
		case <-timeout:
		}
		break
	}
	if len(tks) > 1 {
		t.Fatalf("both granted beside a's request admitted on its own: 3 over a limit of 2")
	}
	a.Release(*late.Load())
	for _, tk := range tks {
		other.Release(tk)
	}
	if len(tks) == 1 {
		// the other one gets the slot a's request gave back, or timed out
		select {
		case tk := <-got:
			other.Release(tk)
		case <-time.After(time.Second):
		}
	}
}

// quietBackend is a Backend registered in Redis as Start would do it, but
// with no reader and no maintainer: the test makes each sync itself, and no
// notice is ever read.
func quietBackend(t *testing.T, addr string, o Options, l backend.Limits) *Backend {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	b, err := New(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.declare(l); err != nil {
		t.Fatal(err)
	}
	if err := b.sync(true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.refuseStart)
	return b
}

// Two FailOpen replicas come back from one outage a moment apart. The
// second one's recovery asks the first to sync again, by a notice the
// first cannot read (its reader still waits on the master that froze).
// The first learns of that recovery from its next sync's reply and
// confirms it with the sync after: grants do not wait for the recovery to
// run out (a liveness lease) or for the reader to come back.
func TestARecoveryIsConfirmedWithoutItsNotice(t *testing.T) {
	addr := ownRedis(t)
	o := Options{Name: "recover", CallTimeout: 100 * time.Millisecond, OnRedisDown: FailOpen, Mode: GlobalQueue}
	l := backend.Limits{MaxConcurrent: 2, MaxQueue: 4}
	a, b := quietBackend(t, addr, o, l), quietBackend(t, addr, o, l)
	a.markDown(errors.New("test: Redis froze"))
	b.markDown(errors.New("test: Redis froze"))
	for _, r := range []*Backend{a, b} {
		// Each comes back: a sync with its list as it was while down, then
		// one with its full list and its recovery's token. Redis's clock
		// moves on in between, so b's recovery ends later than a's.
		time.Sleep(5 * time.Millisecond)
		for range 2 {
			if err := r.sync(false); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	// a's regular syncs, as its maintainer makes them; its notices are
	// never read.
	for range 2 {
		if err := a.sync(false); err != nil {
			t.Fatal(err)
		}
	}
	if u, _ := a.rdb.SMembers(ctx, a.keys[keyU]).Result(); len(u) > 0 {
		t.Errorf("the recovery still waits for %d replica(s) after each synced twice since", len(u))
	}
	c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	tk, err := b.Acquire(c, backend.Arrival{})
	if err != nil {
		t.Fatalf("a request with every slot free is not granted: %v", err)
	}
	b.Release(tk)
}
