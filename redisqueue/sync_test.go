package redisqueue_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

func TestDeadReplicaLosesItsSlotsWithinLeaseTTL(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const ttl = time.Second
	o := redisqueue.Options{Name: newName(t), LeaseTTL: ttl, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
	l := backend.Limits{MaxConcurrent: 2, MaxQueue: 5, QueueTimeout: 10 * time.Second}

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
	tk, err := survivor.Acquire(context.Background(), backend.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(killed)
	survivor.Release(tk)
	if waited > ttl+2*o.GlobalQueue.TickInterval+200*time.Millisecond {
		t.Fatalf("the dead replica's slots came back after %v, want within LeaseTTL %v", waited, ttl)
	}
	t.Logf("slot back %v after the kill (LeaseTTL %v)", waited, ttl)
	// Let the dead replica's goroutines end: its releases fail at once
	// (client closed) and are given up at Close.
	release()
	_ = doomed.Close()
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(survivor) })
}

// TestLostEvictionNoticeIsCaughtByTheSafetyNet evicts a waiter in Redis as
// the acquire script does, but pushes no notice: the safety-net tick must
// answer it queue full, not enqueue it again.
func TestLostEvictionNoticeIsCaughtByTheSafetyNet(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const tick = 100 * time.Millisecond
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: tick}}
	bs := startBackends(t, 2, backend.Limits{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: 10 * time.Second}, o)
	defer holdAll(t, bs[0], 1)()
	errc := make(chan error, 1)
	go func() {
		tk, err := bs[1].Acquire(context.Background(), backend.Arrival{})
		if err == nil {
			bs[1].Release(tk)
		}
		errc <- err
	}()
	waitQueued(t, bs[0], 1)

	ctx := context.Background()
	c := newClient(t, redisAddr)
	prefix := "ginqueue:{" + o.Name + "}:"
	w, err := c.HGetAll(ctx, prefix+"w").Result()
	if err != nil || len(w) != 1 {
		t.Fatalf("waiters in Redis: %v, %v", w, err)
	}
	for id, m := range w {
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.ZRem(ctx, prefix+"q", m)
			p.HDel(ctx, prefix+"w", id)
			p.ZRem(ctx, prefix+"we", id)
			p.ZAdd(ctx, prefix+"ev", redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: id})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	select {
	case err := <-errc:
		if !errors.Is(err, backend.ErrQueueFull) {
			t.Fatalf("evicted waiter got %v, want queue full", err)
		}
		if d := time.Since(start); d > 3*tick+redisqueue.DefaultCallTimeout {
			t.Fatalf("answered after %v, want within about one tick (%v)", d, tick)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the evicted waiter was never answered")
	}
	waitQueued(t, bs[0], 0)
}

// Requests granted by FailOpen's fallback while Redis was down are counted
// in Redis by the sync that finds it back, before Redis grants anybody
// else: the fleet does not run over its limit while they end.
func TestFailOpenLocalGrantsCountedWhenRedisReturns(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 3 * time.Second, FailureThreshold: 1, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
	l := backend.Limits{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: 10 * time.Second}
	b := startBackends2(t, srv.addr(), l, o)
	ctx := context.Background()
	srv.stop()
	var locals []backend.Ticket
	for len(locals) < 2 {
		tk, err := b.Acquire(ctx, backend.Arrival{})
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
	got := make(chan backend.Ticket, 1)
	go func() {
		tk, err := b.Acquire(ctx, backend.Arrival{})
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

// A FailClosed fleet admits nothing on its own: after a pause in which a
// replica died, the survivor's grants are not held back for it.
func TestFailClosedFleetIsNotHeldBackForADeadReplica(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 10 * time.Second, FailureThreshold: 1, OnRedisDown: redisqueue.FailClosed, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 500 * time.Millisecond}}
	l := backend.Limits{MaxConcurrent: 2, MaxQueue: 4, QueueTimeout: 5 * time.Second}
	survivor := startBackends2(t, srv.addr(), l, o)
	doomedClient := newClient(t, srv.addr())
	doomed, err := redisqueue.New(doomedClient, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := doomed.Start(l); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eventually(t, 2*time.Second, "the replicas did not see each other", func() bool {
		s, err := survivor.GlobalStats(ctx)
		return err == nil && s.Replicas == 2
	})
	pause(t, srv, 600*time.Millisecond)
	_ = doomedClient.Close() // it dies during the pause, without a goodbye
	_ = doomed.Close()
	time.Sleep(700 * time.Millisecond) // the pause ends
	start := time.Now()
	var tk backend.Ticket
	eventually(t, 3*time.Second, "no grant after the pause", func() bool {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		tk, err = survivor.Acquire(c, backend.Arrival{})
		return err == nil
	})
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Errorf("the first grant came %v after the pause ended, want well within the liveness lease (1.5 s)", d)
	}
	survivor.Release(tk)
}

// Redis restarted empty while two FailOpen replicas ran requests on their
// own: the first back is not granted beside what the other still runs
// uncounted, until the other has registered again.
func TestRestartedEmptyWaitsForTheReplicasItLost(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.LeaseTTL = 3 * time.Second
	l := backend.Limits{MaxConcurrent: 2, MaxQueue: 4}
	a := startBackends2(t, srv.addr(), l, o)
	proxy := newCutProxy(t, srv.addr())
	b := startBackends2(t, proxy.addr(), l, o)
	ctx := context.Background()
	eventually(t, 2*time.Second, "the replicas did not see each other", func() bool {
		s, err := a.GlobalStats(ctx)
		return err == nil && s.Replicas == 2
	})
	time.Sleep(3 * o.GlobalQueue.TickInterval) // each has heard there are 2
	srv.stop()
	local := func(r *redisqueue.Backend) backend.Ticket {
		t.Helper()
		var tk backend.Ticket
		eventually(t, 2*time.Second, "no grant on the replica's own", func() bool {
			c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			var err error
			tk, err = r.Acquire(c, backend.Arrival{})
			if err == nil && !redisqueue.GrantedLocally(tk) {
				t.Fatal("granted by a Redis that is stopped")
			}
			return err == nil
		})
		return tk
	}
	ta, tb := local(a), local(b) // an allowance of 1 each
	proxy.setCut(true)
	srv.start() // empty
	eventually(t, 2*time.Second, "a did not find Redis back", func() bool { return !a.Stats().Unavailable })
	c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if tk, err := a.Acquire(c, backend.Arrival{}); err == nil {
		t.Fatalf("granted (locally %v) beside a's and b's requests admitted on their own: 3 over a limit of 2",
			redisqueue.GrantedLocally(tk))
	}
	proxy.setCut(false)
	eventually(t, 3*time.Second, "b did not find Redis back", func() bool { return !b.Stats().Unavailable })
	eventually(t, 2*time.Second, "b's request admitted on its own not counted", func() bool {
		s, err := a.GlobalStats(ctx)
		return err == nil && s.Running == 2
	})
	a.Release(ta)
	b.Release(tb)
	eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(a) })
}

// cutProxy forwards TCP to a server until cut: then it closes every
// connection and refuses new ones (as a partition would), until healed.
type cutProxy struct {
	l     net.Listener
	to    string
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func newCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, to: to}
	t.Cleanup(func() { _ = l.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			cut := p.cut
			p.mu.Unlock()
			if cut {
				_ = c.Close()
				continue
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return p.l.Addr().String() }

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
	}
}
