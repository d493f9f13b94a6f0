package redisqueue_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// The tests of this file are about how Shares mode comes back: a replica
// that starts after another died, a Redis that answers again after an
// outage of the whole fleet, data lost twice in a row. Each one runs on a
// redis-server of its own (or the shared one, if it pauses nothing), and
// cuts replicas off from it with a recoveryProxy.

// recoveryProxy forwards TCP to a Redis, for the replicas that dial it. held
// makes every byte wait (a partition: what was sent arrives when it ends);
// cut closes every connection and refuses new ones (Redis unreachable,
// nothing stale arrives later).
type recoveryProxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	cond  *sync.Cond // signalled when held turns false; uses mu
	held  bool
	cut   bool
	conns map[net.Conn]struct{} // open connections, both sides; guarded by mu
}

// newRecoveryProxy starts a proxy to the Redis at to; the test stops it at
// its end (after the Backends it started later are closed).
func newRecoveryProxy(t *testing.T, to string) *recoveryProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &recoveryProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept(to)
	t.Cleanup(func() {
		_ = ln.Close()
		p.setCut(true) // also lets held bytes go, so that every pipe ends
		p.wg.Wait()
	})
	return p
}

func (p *recoveryProxy) accept(to string) {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", to, time.Second)
		p.mu.Lock()
		if err != nil || p.cut {
			p.mu.Unlock()
			_ = c.Close()
			if s != nil {
				_ = s.Close()
			}
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

// pipe copies src to dst, each read waiting while the proxy is held.
func (p *recoveryProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.held {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *recoveryProxy) addr() string { return p.ln.Addr().String() }

// setHeld holds (or lets go) every byte through the proxy.
func (p *recoveryProxy) setHeld(held bool) {
	p.mu.Lock()
	p.held = held
	p.cond.Broadcast()
	p.mu.Unlock()
}

// setCut cuts the replicas behind the proxy off (or lets them dial again).
func (p *recoveryProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		p.held = false
		p.cond.Broadcast()
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

// recoveryCount counts the slots of granted Tickets across Backends, outside
// the library, and keeps their peak.
type recoveryCount struct{ now, peak atomic.Int64 }

func (c *recoveryCount) add(n int64) {
	v := c.now.Add(n)
	for p := c.peak.Load(); v > p && !c.peak.CompareAndSwap(p, v); p = c.peak.Load() {
	}
}

// resetPeak makes the peak what runs now: what ran before does not count.
func (c *recoveryCount) resetPeak() { c.peak.Store(c.now.Load()) }

// recoveryLoad runs clients closed-loop on b, each acquiring (giving up
// after 300 ms), holding for hold and releasing, counted in c. The returned
// stop ends them and waits; the test's cleanup calls it too, before b is
// closed.
func recoveryLoad(t *testing.T, b *redisqueue.Backend, c *recoveryCount, clients int, hold time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				tk, err := b.Acquire(ctx, backend.Arrival{})
				cancel()
				if err != nil {
					time.Sleep(time.Millisecond) // refused at once when Redis is down
					continue
				}
				n := int64(max(tk.Cost, 1))
				c.add(n)
				time.Sleep(hold)
				c.now.Add(-n)
				b.Release(tk)
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// shareIsWithin polls b's share until it is n, and reports how long that
// took, or -1 if it did not happen within d.
func shareIsWithin(b *redisqueue.Backend, n int, d time.Duration) time.Duration {
	from := time.Now()
	for time.Since(from) < d {
		if b.Stats().Limit == n {
			return time.Since(from)
		}
		time.Sleep(time.Millisecond)
	}
	return -1
}

// A replica that starts after another one died finds that nobody synced
// for a while. Redis cannot tell that from an outage of the whole fleet (a
// pause, a partition) during which the other replica still runs its share,
// so it moves every lease on by the gap, the dead one's too: the new
// replica gets the dead one's share a lease later, never while the other
// might still use it, and not two leases later either.
func TestSharesADeadReplicasShareComesBackALeaseAfterTheNextStart(t *testing.T) {
	srv := startRedis(t)
	const limit = 4
	l := backend.Limits{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 5 * time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, LeaseTTL: time.Second}
	px := newRecoveryProxy(t, srv.addr())
	a := startBackends2(t, px.addr(), l, o)
	eventually(t, 3*time.Second, "the first replica did not take the limit", func() bool { return a.Stats().Limit == limit })

	px.setCut(true) // a dies: Redis never hears from it again
	died := time.Now()
	time.Sleep(o.LeaseTTL + o.LeaseTTL/2) // its lease ran out half a lease ago

	starts := time.Now()
	b := startBackends2(t, srv.addr(), l, o)
	got := shareIsWithin(b, limit, 2*o.LeaseTTL)
	t.Logf("the new replica started %v after the other died; its share was the limit %v after Start",
		starts.Sub(died).Round(time.Millisecond), got.Round(time.Millisecond))
	if got < o.LeaseTTL/2 || got > o.LeaseTTL+400*time.Millisecond {
		t.Errorf("the dead replica's share came back %v after the new one started (want about a lease, %v; -1: 2 leases)", got, o.LeaseTTL)
	}

	// a comes back so that its goodbye at Close reaches Redis.
	px.setCut(false)
	eventually(t, 3*time.Second, "the first replica did not find Redis back", func() bool { return !a.Stats().Unavailable })
}

// A replica closed while Redis is unreachable for the whole fleet, for
// longer than its lease, gives its share back when Redis answers again.
// Its goodbye used to be given up when its lease ran out; then the first
// sync after the outage moved every lease on by the gap, the closed
// replica's too, and its share stayed counted for another LeaseTTL.
func TestSharesCloseDuringALongOutageGivesTheShareBack(t *testing.T) {
	srv := startRedis(t)
	const limit = 4
	l := backend.Limits{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 5 * time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, LeaseTTL: time.Second}
	px := newRecoveryProxy(t, srv.addr())
	a := startBackends2(t, px.addr(), l, o)
	b := startBackends2(t, px.addr(), l, o)
	var c recoveryCount
	stopA := recoveryLoad(t, a, &c, 4, 20*time.Millisecond)
	recoveryLoad(t, b, &c, 8, 20*time.Millisecond)
	eventually(t, 3*time.Second, "the replicas did not split the limit", func() bool {
		return a.Stats().Limit == 2 && b.Stats().Limit == 2
	})

	px.setCut(true) // the outage, for everyone
	time.Sleep(100 * time.Millisecond)
	stopA()
	if err := a.Close(); err != nil {
		t.Fatalf("Close during the outage: %v", err)
	}
	time.Sleep(2 * o.LeaseTTL) // longer than the closed replica's lease
	px.setCut(false)
	got := shareIsWithin(b, limit, 3*o.LeaseTTL)
	t.Logf("the live replica's share was the limit %v after Redis answered again (LeaseTTL %v)", got.Round(time.Millisecond), o.LeaseTTL)
	if got < 0 || got > 400*time.Millisecond {
		t.Errorf("the closed replica's share stayed counted %v after Redis answered again (want at once; -1: 3 leases)", got)
	}
}

// After an outage of the whole fleet longer than LeaseTTL, the first call
// to reach Redis may be a GlobalStats (a replica that serves a monitor)
// rather than a sync. Every call used to sweep the leases that ran out, so
// that one took every replica for dead before any sync had moved the
// leases on by the gap: it answered an empty fleet, and the replicas then
// synced as newcomers, the first granted the whole limit while the others,
// under FailOpen, still ran their shares.
func TestSharesAStatsCallFirstAfterAnOutageTakesNobodyForDead(t *testing.T) {
	srv := startRedis(t)
	const limit = 4
	l := backend.Limits{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 5 * time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, LeaseTTL: time.Second, OnRedisDown: redisqueue.FailOpen}
	pab, pm := newRecoveryProxy(t, srv.addr()), newRecoveryProxy(t, srv.addr())
	a := startBackends2(t, pab.addr(), l, o)
	b := startBackends2(t, pab.addr(), l, o)
	m := startBackends2(t, pm.addr(), l, o) // the monitor's replica: no load
	var c recoveryCount
	recoveryLoad(t, a, &c, 6, 40*time.Millisecond)
	recoveryLoad(t, b, &c, 6, 40*time.Millisecond)
	eventually(t, 3*time.Second, "the replicas did not split the limit", func() bool {
		return a.Stats().Limit == 2 && b.Stats().Limit == 2
	})
	time.Sleep(200 * time.Millisecond)

	pab.setCut(true)
	pm.setCut(true)
	time.Sleep(o.LeaseTTL + o.LeaseTTL/2) // everyone's outage, longer than the lease
	c.resetPeak()
	pm.setCut(false)
	gs, err := m.GlobalStats(context.Background()) // the monitor's scrape comes first
	pm.setCut(true)                                // and its replica stays cut off a little longer
	time.Sleep(5 * time.Millisecond)
	pab.setCut(false)
	time.Sleep(500 * time.Millisecond) // a and b sync again, many times
	peak := c.peak.Load()
	t.Logf("GlobalStats first after the outage: %+v, %v; slots running at the peak after it %d (limit %d)", gs, err, peak, limit)
	if err != nil || gs.Replicas != 3 || gs.Running != limit {
		t.Errorf("GlobalStats first after the outage: %+v, %v; want the 3 replicas and the %d slots they held", gs, err, limit)
	}
	if peak > limit {
		t.Errorf("%d slots ran after the outage, limit %d", peak, limit)
	}

	// The monitor's replica finds Redis back, so that its goodbye at Close
	// reaches Redis.
	pm.setCut(false)
	eventually(t, 3*time.Second, "the monitor's replica did not find Redis back", func() bool { return !m.Stats().Unavailable })
}

// After Redis lost its data, no share grows until every replica that held
// slots of the old data has synced again, or for a lease. When the data is
// lost a second time before a cut-off replica synced, the freeze must still
// wait for it. It used to wait for a count of replicas, taken the second
// time from the last reply, which counted only the replica that found the
// first loss: that replica's own sync ended the freeze, and it grew into
// the slots the cut-off one still ran.
func TestSharesTwoLossesInARowKeepTheFreeze(t *testing.T) {
	srv := startRedis(t)
	const limit = 8
	l := backend.Limits{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 5 * time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, LeaseTTL: 3 * time.Second, OnRedisDown: redisqueue.FailClosed}
	pa := newRecoveryProxy(t, srv.addr())
	a := startBackends2(t, pa.addr(), l, o)
	b := startBackends2(t, srv.addr(), l, o)
	var c recoveryCount
	recoveryLoad(t, a, &c, 8, 30*time.Millisecond)
	recoveryLoad(t, b, &c, 8, 30*time.Millisecond)
	eventually(t, 3*time.Second, "the replicas did not split the limit", func() bool {
		return a.Stats().Limit == limit/2 && b.Stats().Limit == limit/2
	})
	time.Sleep(200 * time.Millisecond)
	c.resetPeak()

	pa.setHeld(true) // a is cut off, well within its lease: it runs its share
	ctl := newClient(t, srv.addr())
	if err := ctl.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // b finds the loss
	if err := ctl.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // b finds the second one, and syncs on
	pa.setHeld(false)
	time.Sleep(300 * time.Millisecond)
	peak := c.peak.Load()
	t.Logf("slots running at the peak %d (limit %d); shares after a %d, b %d", peak, limit, a.Stats().Limit, b.Stats().Limit)
	if peak > limit {
		t.Errorf("%d slots ran after two losses, limit %d", peak, limit)
	}
}

// GlobalStats works on a Shares-mode Backend that was never started, as a
// monitor's is: it used to fail with a script error, for want of the
// arguments that Start sets.
func TestSharesGlobalStatsBeforeStart(t *testing.T) {
	needRedis(t)
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares}
	r := startBackends2(t, redisAddr, backend.Limits{MaxConcurrent: 4, MaxQueue: 8, QueueTimeout: time.Second}, o)
	m, err := redisqueue.New(newClient(t, redisAddr), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	want, err := r.GlobalStats(context.Background())
	if err != nil {
		t.Fatalf("GlobalStats of the started replica: %v", err)
	}
	got, err := m.GlobalStats(context.Background())
	if err != nil {
		t.Fatalf("GlobalStats before Start: %v", err)
	}
	if got.Replicas != 1 || got.Running != want.Running || got.Queued != want.Queued {
		t.Errorf("GlobalStats before Start: %+v; want the started replica's view %+v", got, want)
	}
}

// A Backend closed while Redis cannot be reached goes on trying its
// goodbye in the background, but stops as soon as its owner closes the
// Redis client: the goodbye can never get through then. (It kept trying
// for 10 lease TTLs.)
func TestSharesClosedDuringAnOutageStopsWithItsClient(t *testing.T) {
	srv := startRedis(t)
	px := newRecoveryProxy(t, srv.addr())
	rdb := redis.NewClient(&redis.Options{Addr: px.addr(), ContextTimeoutEnabled: true, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(backend.Limits{MaxConcurrent: 2, MaxQueue: 4}); err != nil {
		t.Fatal(err)
	}
	px.setCut(true)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-redisqueue.Stopped(b):
		t.Fatal("the goodbye got through a cut connection")
	default:
	}
	_ = rdb.Close()
	select {
	case <-redisqueue.Stopped(b):
	case <-time.After(time.Second):
		t.Fatal("the Backend still tried its goodbye a second after its client was closed")
	}
}
