package redisqueue_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

func TestRedisDownAtStart(t *testing.T) {
	t.Parallel()
	addr := "127.0.0.1:" + itoa(freePort(t)) // nobody listens
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			b, err := redisqueue.New(newClient(t, addr), redisqueue.Options{Name: newName(t), OnRedisDown: policy, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 50 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 2, MaxQueue: 2, Backend: b})
			if err != nil {
				t.Fatalf("NewQueue with Redis down: %v, want it to start", err)
			}
			defer q.Close()
			// Under either policy: a replica that never heard from Redis
			// cannot know what the others run, so FailOpen has no
			// allowance either (it used to take the whole limit, and ran
			// it beside a fleet that still did).
			_, err = b.Acquire(context.Background(), backend.Arrival{})
			if !errors.Is(err, redisqueue.ErrUnavailable) || !errors.Is(err, backend.ErrQueueFull) {
				t.Fatalf("%v: got %v, want ErrUnavailable wrapping ErrQueueFull", policy, err)
			}
		})
	}
}

// TestOneFailedCallDoesNotMarkRedisDown: a call that times out gives its
// own request OnRedisDown within one call timeout, but the replica turns to
// OnRedisDown only after FailureThreshold failures in a row (the maintainer
// probes at once after a failure, so that happens within that many call
// timeouts even without traffic).
func TestOneFailedCallDoesNotMarkRedisDown(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
	const callTimeout = 100 * time.Millisecond
	o := redisqueue.Options{Name: newName(t), CallTimeout: callTimeout, LeaseTTL: 10 * time.Second, OnRedisDown: redisqueue.FailClosed, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 2 * time.Second}}
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 2, MaxQueue: 2}, o)
	ctl := newClient(t, srv.addr())
	ctx := context.Background()
	acquire := func() (time.Duration, error) {
		start := time.Now()
		tk, err := b.Acquire(ctx, backend.Arrival{})
		if err == nil {
			b.Release(tk)
		}
		return time.Since(start), err
	}
	// Warm the connections, so that the pause, not a dial, is what fails.
	if _, err := acquire(); err != nil {
		t.Fatal(err)
	}

	// A blip: Redis answers nothing for 1.5 call timeouts.
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", (3 * callTimeout / 2).Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	d, err := acquire()
	if !errors.Is(err, redisqueue.ErrUnavailable) || d > callTimeout+50*time.Millisecond {
		t.Fatalf("during the pause: got %v after %v, want ErrUnavailable within one call timeout", err, d)
	}
	time.Sleep(callTimeout) // the pause ends
	if d, err := acquire(); err != nil {
		t.Fatalf("after a one-call blip: got %v after %v, want a slot (TickInterval is %v: marked down by one failure?)", err, d, o.GlobalQueue.TickInterval)
	}

	// Gone for good (a long pause): marked down within FailureThreshold
	// call timeouts of the first failure, without further requests.
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", 1500, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(); !errors.Is(err, redisqueue.ErrUnavailable) {
		t.Fatalf("during the long pause: got %v, want ErrUnavailable", err)
	}
	time.Sleep(time.Duration(redisqueue.DefaultFailureThreshold)*callTimeout + 100*time.Millisecond)
	if d, err := acquire(); !errors.Is(err, redisqueue.ErrUnavailable) || d > callTimeout/2 {
		t.Fatalf("once marked down: got %v after %v, want ErrUnavailable at once", err, d)
	}
	// Back: the probe (every TickInterval while down) marks it up.
	eventually(t, 2*o.GlobalQueue.TickInterval+time.Second, "Redis not marked up again", func() bool {
		_, err := acquire()
		return err == nil
	})
}

// One stall of Redis that catches many calls in flight is one failure, not
// one per call: eight requests that time out together in a blip of 1.5 call
// timeouts do not mark Redis down.
func TestOneStallOfManyCallsDoesNotMarkRedisDown(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
	const callTimeout, n = 100 * time.Millisecond, 8
	downs := make(chan error, 16)
	o := redisqueue.Options{Name: newName(t), CallTimeout: callTimeout, LeaseTTL: 10 * time.Second, OnRedisDown: redisqueue.FailClosed, OnStateChange: func(down bool, err error) {
		if down {
			downs <- err
		}
	}, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 2 * time.Second}}
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: n, MaxQueue: n}, o)
	ctl := newClient(t, srv.addr())
	ctx := context.Background()
	// Warm n connections, so that the pause, not a dial, is what fails.
	tks := make([]backend.Ticket, n)
	for i := range tks {
		tk, err := b.Acquire(ctx, backend.Arrival{})
		if err != nil {
			t.Fatal(err)
		}
		tks[i] = tk
	}
	for _, tk := range tks {
		b.Release(tk)
	}
	eventually(t, time.Second, "slots not back", func() bool { return b.Stats().Running == 0 })

	if err := ctl.Do(ctx, "CLIENT", "PAUSE", (3 * callTimeout / 2).Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n)
	for range n {
		go func() {
			tk, err := b.Acquire(ctx, backend.Arrival{})
			if err == nil {
				b.Release(tk)
			}
			errs <- err
		}()
	}
	failed := 0
	for range n {
		if err := <-errs; err != nil {
			failed++
		}
	}
	time.Sleep(2 * callTimeout) // the pause ends, the probe answers
	select {
	case err := <-downs:
		t.Fatalf("marked down by one stall (%d of %d calls failed in it): %v", failed, n, err)
	default:
	}
	if failed < 2 {
		t.Fatalf("only %d of %d calls were caught in the stall, want them all", failed, n)
	}
	tk, err := b.Acquire(ctx, backend.Arrival{})
	if err != nil {
		t.Fatalf("after the stall: %v", err)
	}
	b.Release(tk)
}

// OnStateChange tells each change, in order, and Stats shows it.
func TestOnStateChange(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	type change struct {
		down bool
		err  error
	}
	changes := make(chan change, 8)
	o.OnStateChange = func(down bool, err error) { changes <- change{down, err} }
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 2, MaxQueue: 4}, o)
	outage(t, srv, b, 300*time.Millisecond)
	if c := <-changes; !c.down || c.err == nil {
		t.Errorf("first change %+v, want down with the error that tipped it", c)
	}
	if c := <-changes; c.down || c.err != nil {
		t.Errorf("second change %+v, want up", c)
	}
	select {
	case c := <-changes:
		t.Errorf("a third change %+v", c)
	default:
	}
	if s := b.Stats(); s.Unavailable || s.Outages != 1 {
		t.Errorf("Stats after the outage: Unavailable %v, Outages %d; want false, 1", s.Unavailable, s.Outages)
	}
}

// A Backend closed while Redis is down says so when Redis answers its
// goodbye.
func TestClosedWhileDownReportsRedisBack(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	ups := make(chan bool, 4)
	o.OnStateChange = func(down bool, _ error) { ups <- down }
	b := startBackends2(t, srv.addr(), backend.Limits{MaxConcurrent: 2, MaxQueue: 4}, o)
	tk, err := b.Acquire(context.Background(), backend.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	srv.stop()
	eventually(t, 2*time.Second, "Redis not marked down", func() bool { return b.Stats().Unavailable })
	b.Release(tk) // retried in the background: the goodbye waits for it
	closed := make(chan struct{})
	go func() { _ = b.Close(); close(closed) }()
	srv.start()
	<-closed
	if b.Stats().Unavailable {
		t.Error("Unavailable still set after the goodbye got its answer")
	}
	if d := <-ups; !d {
		t.Fatal("the first change was not down")
	}
	select {
	case d := <-ups:
		if d {
			t.Error("a second down, want up")
		}
	case <-time.After(time.Second):
		t.Error("OnStateChange never said Redis was back")
	}
}

// TestFirstGrantAfterAnOutage: with the default timings (TickInterval
// 500 ms, CallTimeout 150 ms, FailureThreshold 3), once a Redis that the
// replica had marked down answers again, a client that keeps sending
// requests (one every 2 ms) gets one granted by Redis, not by the FailOpen
// fallback, within 50 ms. Redis is unreachable in two ways: paused (CLIENT
// PAUSE: what is sent meanwhile is answered when it ends) and cut off by a
// partition that swallows what is sent during it (nothing sent then is ever
// answered). Each round lasts a different time, so that Redis answers again
// at another point of the replica's probing; and each case's rounds a little
// longer than the last case's, so that the cases, which run at once, do not
// all find Redis back in the same instant.
func TestFirstGrantAfterAnOutage(t *testing.T) {
	needRedis(t)
	const bound = 50 * time.Millisecond
	outages := []time.Duration{800 * time.Millisecond, 910 * time.Millisecond, 1030 * time.Millisecond}
	n := 0
	for _, how := range []string{"paused", "partitioned"} {
		for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
			stagger := time.Duration(n) * 27 * time.Millisecond
			n++
			t.Run(how+"/"+policy.String(), func(t *testing.T) {
				t.Parallel()
				// cut makes Redis unreachable for d from now on, and returns a
				// func that waits for the end and says when Redis answered
				// again.
				var cut func(d time.Duration) func() time.Time
				var addr string
				if how == "paused" {
					srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
					addr = srv.addr()
					cut = pauseFor(t, srv)
				} else {
					p := newHoleProxy(t, redisAddr)
					addr = p.addr()
					cut = func(d time.Duration) func() time.Time {
						p.setCut(true)
						return func() time.Time {
							time.Sleep(d)
							back := time.Now() // the proxy forwards again just after
							p.setCut(false)
							return back
						}
					}
				}
				var downAt atomic.Int64
				o := redisqueue.Options{Name: newName(t), OnRedisDown: policy, OnStateChange: func(down bool, _ error) {
					if down {
						downAt.Store(time.Now().UnixNano())
					}
				}, Mode: redisqueue.GlobalQueue}
				b := startBackends2(t, addr, backend.Limits{MaxConcurrent: 4, MaxQueue: 100, QueueTimeout: time.Second}, o)
				for i, d := range outages {
					d += stagger
					// Connections warm, and Redis marked up.
					eventually(t, 2*time.Second, "no grant by Redis before the outage", func() bool {
						tk, err := b.Acquire(context.Background(), backend.Arrival{})
						if err == nil {
							b.Release(tk)
						}
						return err == nil && !redisqueue.GrantedLocally(tk)
					})
					downAt.Store(0)
					end := cut(d)
					backs := make(chan time.Time, 1)
					go func() { backs <- end() }()
					first, err := firstRedisGrant(b, time.Now().Add(d+2*time.Second))
					back := <-backs
					if err != nil {
						t.Fatalf("round %d (%v): %v", i, d, err)
					}
					if back.IsZero() {
						t.Fatalf("round %d (%v): no way to tell when Redis answered again (a call to it failed)", i, d)
					}
					down := time.Unix(0, downAt.Load())
					if downAt.Load() == 0 || !down.Before(back) {
						t.Fatalf("round %d (%v): Redis was not marked down before it answered again", i, d)
					}
					lag := first.Sub(back)
					t.Logf("round %d: unreachable %v, marked down %v before it answered again; first grant by Redis %v after",
						i, d, back.Sub(down).Round(time.Millisecond), lag.Round(100*time.Microsecond))
					if lag > bound {
						t.Errorf("round %d (%v): the first grant by Redis came %v after Redis answered again, want at most %v",
							i, d, lag.Round(100*time.Microsecond), bound)
					}
				}
				eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(b) })
			})
		}
	}
}

// pauseFor returns a func that pauses srv (CLIENT PAUSE ALL) for d and
// returns one that waits for the end and says when it was, by Redis's own
// clock: Redis ends a pause at its next cron tick, up to 100 ms after d, so
// the end is read from a TIME call sent during the pause, which Redis runs
// as the pause ends. The zero time if a call failed.
func pauseFor(t *testing.T, srv *redisServer) func(time.Duration) func() time.Time {
	ctl := newClient(t, srv.addr())
	witness := newClient(t, srv.addr())
	return func(d time.Duration) func() time.Time {
		ctx := context.Background()
		// The witness's connection is ready before the pause.
		if witness.Ping(ctx).Err() != nil || ctl.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err() != nil {
			return func() time.Time { return time.Time{} }
		}
		return func() time.Time {
			back, err := witness.Time(ctx).Result()
			if err != nil {
				return time.Time{}
			}
			return back
		}
	}
}

// firstRedisGrant sends a request to b every 2 ms, each on a goroutine of
// its own with a context of its own, and returns when the first one that
// Redis granted (not the FailOpen fallback) returned, or an error if none
// had by end. Every request it sent has been answered, and released, when
// it returns.
func firstRedisGrant(b *redisqueue.Backend, end time.Time) (time.Time, error) {
	grants := make(chan time.Time, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	timeout := time.NewTimer(time.Until(end))
	defer timeout.Stop()
	for {
		select {
		case at := <-grants:
			return at, nil
		case <-timeout.C:
			return time.Time{}, errors.New("no grant by Redis")
		case <-tick.C:
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			tk, err := b.Acquire(ctx, backend.Arrival{})
			at := time.Now()
			if err != nil {
				return
			}
			b.Release(tk)
			if !redisqueue.GrantedLocally(tk) {
				select {
				case grants <- at:
				default:
				}
			}
		})
	}
}

// holeProxy forwards TCP to a server until cut: then it swallows what
// either side sends, as a partition would (what was sent during it is never
// delivered), and forwards again once healed. Connections stay open.
type holeProxy struct {
	l   net.Listener
	cut atomic.Bool
}

func newHoleProxy(t *testing.T, to string) *holeProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{l: l}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !p.cut.Load() {
				if _, err := dst.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = dst.Close()
		_ = src.Close()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Add(2)
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return p
}

func (p *holeProxy) addr() string { return p.l.Addr().String() }

func (p *holeProxy) setCut(cut bool) { p.cut.Store(cut) }
