package redisqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

func TestRedisDownAtStart(t *testing.T) {
	t.Parallel()
	addr := "127.0.0.1:" + itoa(freePort(t)) // nobody listens
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			b, err := redisqueue.New(newClient(t, addr), redisqueue.Options{Name: newName(t), OnRedisDown: policy, TickInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 2, MaxQueue: 2, Backend: b})
			if err != nil {
				t.Fatalf("NewQueue with Redis down: %v, want it to start", err)
			}
			defer q.Close()
			tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
			switch policy {
			case redisqueue.FailOpen:
				if err != nil {
					t.Fatalf("FailOpen: got %v, want a local slot", err)
				}
				b.Release(tk)
			case redisqueue.FailClosed:
				if !errors.Is(err, redisqueue.ErrUnavailable) || !errors.Is(err, ginqueue.ErrQueueFull) {
					t.Fatalf("FailClosed: got %v, want ErrUnavailable wrapping ErrQueueFull", err)
				}
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
	o := redisqueue.Options{Name: newName(t), CallTimeout: callTimeout, LeaseTTL: 10 * time.Second,
		TickInterval: 2 * time.Second, OnRedisDown: redisqueue.FailClosed}
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 2}, o)
	ctl := newClient(t, srv.addr())
	ctx := context.Background()
	acquire := func() (time.Duration, error) {
		start := time.Now()
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
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
		t.Fatalf("after a one-call blip: got %v after %v, want a slot (TickInterval is %v: marked down by one failure?)", err, d, o.TickInterval)
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
	eventually(t, 2*o.TickInterval+time.Second, "Redis not marked up again", func() bool {
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
	o := redisqueue.Options{Name: newName(t), CallTimeout: callTimeout, LeaseTTL: 10 * time.Second,
		TickInterval: 2 * time.Second, OnRedisDown: redisqueue.FailClosed,
		OnStateChange: func(down bool, err error) {
			if down {
				downs <- err
			}
		}}
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: n, MaxQueue: n}, o)
	ctl := newClient(t, srv.addr())
	ctx := context.Background()
	// Warm n connections, so that the pause, not a dial, is what fails.
	tks := make([]ginqueue.Ticket, n)
	for i := range tks {
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
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
			tk, err := b.Acquire(ctx, ginqueue.Arrival{})
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
	tk, err := b.Acquire(ctx, ginqueue.Arrival{})
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
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4}, o)
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
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4}, o)
	tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
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
