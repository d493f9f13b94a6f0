package redisqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
)

// internalBackend starts a Backend of a fresh Name on the test Redis, or
// skips when none answers.
func internalBackend(t *testing.T, l ginqueue.Limits) (*Backend, *redis.Client) {
	t.Helper()
	addr := "127.0.0.1:6379"
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		addr = a
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no Redis at %s: %v", addr, err)
		}
		t.Skipf("no Redis at %s", addr)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	b, err := New(rdb, Options{Name: "internal-" + hex.EncodeToString(rnd[:])})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, rdb
}

// A grant that lands in the same instant as its waiter's hang-up is given
// back: the Backend must not go on counting a slot nobody holds (Shutdown
// would wait for it, and the lease would be refreshed for ever).
func TestGrantRacingHangUpIsGivenBack(t *testing.T) {
	b, _ := internalBackend(t, ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	leaked := 0
	for range 200 {
		b.mu.Lock()
		w := &waiter{id: b.nextID.Add(1), ready: make(chan struct{})}
		b.waiters[w.id] = w
		b.grantLocked(w) // the grant notice, as the client hangs up
		b.mu.Unlock()
		_, err, _ := b.wait(ctx, w, time.Time{}, nil)
		if err == nil {
			b.Release(ginqueue.Ticket{ID: w.id}) // it saw its grant: it ran
			continue
		}
		b.mu.Lock()
		if _, ok := b.held[w.id]; ok {
			leaked++
		}
		b.mu.Unlock()
	}
	if leaked > 0 {
		t.Fatalf("%d hung-up waiters left a slot counted as held", leaked)
	}
	drain, cancelDrain := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelDrain()
	if err := b.Drain(drain); err != nil {
		t.Fatalf("Drain: %v; held %d", err, len(b.held))
	}
}

// A replica knows which slots it holds: a lease of its own in Redis that it
// neither holds nor waits for (a release acknowledged by a master that then
// lost it in a failover) is dropped at its next sync, and the slot goes to
// the next waiter; a lease whose acquire is still in flight is kept.
func TestSyncReconcilesPhantomLeases(t *testing.T) {
	b, rdb := internalBackend(t, ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4})
	ctx := context.Background()
	h := b.keys[0]
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

// New names the options type the user built when a setting is missing.
func TestNewNamesTheOptionsTypeUsed(t *testing.T) {
	for _, tt := range []struct {
		name string
		rdb  redis.UniversalClient
		want string
	}{
		{"plain", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "redis.Options (or redis.UniversalOptions)"},
		{"universal single", redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}}), "redis.UniversalOptions"},
		{"sentinel", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}}), "redis.FailoverOptions"},
		{"universal sentinel", redis.NewUniversalClient(&redis.UniversalOptions{MasterName: "m", Addrs: []string{"127.0.0.1:1"}}), "redis.FailoverOptions (or redis.UniversalOptions"},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), "redis.ClusterOptions"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer tt.rdb.Close()
			_, err := New(tt.rdb, Options{Name: "x"})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
				t.Fatalf("got %v, want an error naming %q and ContextTimeoutEnabled", err, tt.want)
			}
		})
	}
}

// The reconcile races the acquires: an Acquire that registers its waiter
// after a sync has listed this replica's leases, and whose script reaches
// Redis first, holds a lease the list does not name. It must not be taken
// for a phantom, or one more than the limit runs. Syncs in a tight loop
// against a closed loop of acquires; the peak must stay at the limit.
func TestReconcileKeepsAcquiresAfterTheList(t *testing.T) {
	const limit = 2
	b, _ := internalBackend(t, ginqueue.Limits{MaxConcurrent: limit, MaxQueue: 16, QueueTimeout: 5 * time.Second})
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
				tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
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
	b, rdb := internalBackend(t, ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 10})
	ctx := context.Background()
	for i := range 500 {
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { _ = b.sync(false) })
		wg.Go(func() { b.Release(tk) })
		wg.Wait()
		deadline := time.Now().Add(200 * time.Millisecond)
		for rdb.ZScore(ctx, b.keys[0], b.leaseID(tk.ID)).Err() == nil {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: a released slot is still held in Redis 200 ms after its release", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
