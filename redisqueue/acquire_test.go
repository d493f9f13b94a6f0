package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

func TestThreeReplicasNeverExceedTheLimit(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const limit, requests = 4, 200
	name := newName(t)
	var running, peak atomic.Int64
	h := func(c *gin.Context) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(500 * time.Microsecond)
		running.Add(-1)
	}
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: requests, QueueTimeout: 20 * time.Second}
	var reps []*replica
	for range 3 {
		// A burst of 200 under the race detector on a small machine can
		// take longer than the default call timeout, which would count as
		// Redis down and fall open; this test is about a healthy Redis.
		reps = append(reps, newReplica(t, redisAddr, cfg, redisqueue.Options{Name: name, CallTimeout: 2 * time.Second, LeaseTTL: 10 * time.Second, Mode: redisqueue.GlobalQueue}, h))
	}
	codes := make(chan int, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() { codes <- reps[i%3].get() })
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("a request got %d, want 200", c)
		}
	}
	if p := peak.Load(); p > limit {
		t.Fatalf("%d requests ran at once across the replicas, limit %d", p, limit)
	}
	t.Logf("peak concurrency %d of %d", peak.Load(), limit)
	var served uint64
	for _, r := range reps {
		served += r.q.Stats().Served
	}
	if served != requests {
		t.Fatalf("served %d, want %d", served, requests)
	}
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(reps[0].b) })
}

func TestGlobalOrderAcrossReplicas(t *testing.T) {
	needRedis(t)
	t.Parallel()
	type arrival struct {
		replica, prio int
	}
	tests := []struct {
		name     string
		arrivals []arrival
		want     []int // indexes of arrivals in grant order
	}{
		{"fifo", []arrival{{0, 0}, {1, 0}, {2, 0}, {1, 0}, {0, 0}, {2, 0}}, []int{0, 1, 2, 3, 4, 5}},
		{"priority then fifo", []arrival{{0, 0}, {1, 1}, {2, 0}, {0, 5}, {1, 1}, {2, -3}}, []int{3, 1, 4, 0, 2, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bs := startBackends(t, 3, backend.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second}, redisqueue.Options{Mode: redisqueue.GlobalQueue})
			release := holdAll(t, bs[0], 1)
			order := make(chan int, len(tt.arrivals))
			errs := make(chan error, len(tt.arrivals))
			for i, a := range tt.arrivals {
				b := bs[a.replica]
				go func() {
					tk, err := b.Acquire(context.Background(), backend.Arrival{Priority: a.prio})
					if err != nil {
						errs <- err
						return
					}
					order <- i
					b.Release(tk)
				}()
				// Staggered: each arrival is queued before the next comes.
				waitQueued(t, bs[0], i+1)
			}
			release()
			for k, want := range tt.want {
				select {
				case got := <-order:
					if got != want {
						t.Fatalf("grant %d went to arrival %d, want %d", k, got, want)
					}
				case err := <-errs:
					t.Fatal(err)
				case <-time.After(5 * time.Second):
					t.Fatalf("grant %d never came", k)
				}
			}
			eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(bs[0]) })
		})
	}
}

func TestGlobalQueueBoundGivesExact503s(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const limit, queue, extra = 2, 3, 7
	name := newName(t)
	gate := make(chan struct{})
	h := func(c *gin.Context) { <-gate }
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: queue, QueueTimeout: 10 * time.Second}
	var reps []*replica
	for range 3 {
		reps = append(reps, newReplica(t, redisAddr, cfg, redisqueue.Options{Name: name, Mode: redisqueue.GlobalQueue}, h))
	}
	codes := make(chan int, limit+queue+extra)
	for i := range limit + queue {
		go func() { codes <- reps[i%3].get() }()
	}
	eventually(t, 2*time.Second, "slots and queue not filled", func() bool {
		s, err := reps[0].b.GlobalStats(context.Background())
		return err == nil && s.Running == limit && s.Queued == queue
	})
	for i := range extra {
		if c := reps[i%3].get(); c != http.StatusServiceUnavailable {
			t.Fatalf("request beyond the global bound got %d, want 503", c)
		}
	}
	close(gate)
	for range limit + queue {
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("a request within the bound got %d, want 200", c)
		}
	}
	var full uint64
	for _, r := range reps {
		full += r.q.Stats().QueueFull
	}
	if full != extra {
		t.Fatalf("queue full counted %d times, want %d", full, extra)
	}
	eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(reps[0].b) })
}

func TestWaiterOutcomes(t *testing.T) {
	needRedis(t)
	t.Parallel()
	l := backend.Limits{MaxConcurrent: 1, MaxQueue: 5, QueueTimeout: 200 * time.Millisecond}

	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		bs := startBackends(t, 2, l, redisqueue.Options{Mode: redisqueue.GlobalQueue})
		defer holdAll(t, bs[0], 1)()
		start := time.Now()
		_, err := bs[1].Acquire(context.Background(), backend.Arrival{})
		if d := time.Since(start); !errors.Is(err, backend.ErrQueueTimeout) || d < l.QueueTimeout || d > l.QueueTimeout+redisqueue.DefaultCallTimeout {
			t.Fatalf("got %v after %v, want ErrQueueTimeout after %v", err, d, l.QueueTimeout)
		}
		waitQueued(t, bs[0], 0)
	})
	t.Run("hang-up", func(t *testing.T) {
		t.Parallel()
		bs := startBackends(t, 2, l, redisqueue.Options{Mode: redisqueue.GlobalQueue})
		defer holdAll(t, bs[0], 1)()
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { _, err := bs[1].Acquire(ctx, backend.Arrival{}); errc <- err }()
		waitQueued(t, bs[0], 1)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		waitQueued(t, bs[0], 0)
	})
	t.Run("close", func(t *testing.T) {
		t.Parallel()
		bs := startBackends(t, 2, backend.Limits{MaxConcurrent: 1, MaxQueue: 5}, redisqueue.Options{Mode: redisqueue.GlobalQueue})
		defer holdAll(t, bs[0], 1)()
		errc := make(chan error, 1)
		go func() { _, err := bs[1].Acquire(context.Background(), backend.Arrival{}); errc <- err }()
		waitQueued(t, bs[0], 1)
		_ = bs[1].Close()
		if err := <-errc; !errors.Is(err, backend.ErrClosed) {
			t.Fatalf("got %v, want ErrClosed", err)
		}
		if _, err := bs[1].Acquire(context.Background(), backend.Arrival{}); !errors.Is(err, backend.ErrClosed) {
			t.Fatalf("after Close: got %v, want ErrClosed", err)
		}
		waitQueued(t, bs[0], 0)
	})
}

// outcome is what one Acquire of a test ended with.
type outcome struct {
	i   int // index of the arrival
	err error
}

func TestFullQueueEvictsLowestNewestAcrossReplicas(t *testing.T) {
	needRedis(t)
	t.Parallel()
	tests := []struct {
		name     string
		queue    [][2]int // {replica, priority}, queued in this order, filling the queue
		arrival  [2]int
		evicted  int   // index into queue of the waiter that gets queue full; -1: the arrival does
		grants   []int // indexes (len(queue) is the arrival) in grant order
		maxQueue int
	}{
		{"higher evicts the newest of the lowest", [][2]int{{1, 0}, {1, 0}, {0, 3}}, [2]int{0, 5}, 1, []int{3, 2, 0}, 3},
		{"the lowest priority, not a nearer lower one", [][2]int{{1, 1}, {1, 0}, {0, 1}}, [2]int{0, 2}, 1, []int{3, 0, 2}, 3},
		{"same as the lowest: refused", [][2]int{{1, 0}, {0, 2}}, [2]int{0, 0}, -1, []int{1, 0}, 2},
		{"lower than all: refused", [][2]int{{1, 0}, {0, 2}}, [2]int{1, -4}, -1, []int{1, 0}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bs := startBackends(t, 2, backend.Limits{MaxConcurrent: 1, MaxQueue: tt.maxQueue, QueueTimeout: 10 * time.Second}, redisqueue.Options{Mode: redisqueue.GlobalQueue})
			release := holdAll(t, bs[0], 1)
			n := len(tt.queue)
			out := make(chan outcome, n+1) // refusals
			order := make(chan int, n+1)   // grants, sent before the release
			acquire := func(b *redisqueue.Backend, i, prio int) {
				tk, err := b.Acquire(context.Background(), backend.Arrival{Priority: prio})
				if err != nil {
					out <- outcome{i, err}
					return
				}
				order <- i
				b.Release(tk)
			}
			for i, a := range tt.queue {
				go acquire(bs[a[0]], i, a[1])
				waitQueued(t, bs[0], i+1)
			}
			go acquire(bs[tt.arrival[0]], n, tt.arrival[1])
			want := tt.evicted
			if want < 0 {
				want = n
			}
			select {
			case o := <-out:
				if o.i != want || !errors.Is(o.err, backend.ErrQueueFull) {
					t.Fatalf("arrival %d got %v; want arrival %d to get queue full", o.i, o.err, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("nobody got queue full")
			}
			waitQueued(t, bs[0], n)
			release()
			for k, w := range tt.grants {
				select {
				case got := <-order:
					if got != w {
						t.Fatalf("grant %d went to arrival %d, want %d", k, got, w)
					}
				case o := <-out:
					t.Fatalf("arrival %d got %v", o.i, o.err)
				case <-time.After(5 * time.Second):
					t.Fatalf("grant %d never came", k)
				}
			}
			eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(bs[0]) })
		})
	}
}

// A waiter whose QueueTimeout passes while Redis does not answer, before
// the replica has marked it down, was not refused by the queue: under
// FailClosed it gets the policy's 503 (an error wrapping ErrUnavailable),
// not a 408. Under FailOpen it is a queue timeout.
func TestWaiterTimedOutWhileRedisPausedIsUnavailable(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 3 * time.Second, OnRedisDown: policy, FailureThreshold: 59, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}} // the most LeaseTTL allows: never marked down in this test, the pause is short of it
		l := backend.Limits{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 300 * time.Millisecond}
		b := startBackends2(t, srv.addr(), l, o)
		ctx := context.Background()
		holder, err := b.Acquire(ctx, backend.Arrival{})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := b.Acquire(ctx, backend.Arrival{})
			errc <- err
		}()
		waitQueued(t, b, 1)
		ctl := newClient(t, srv.addr())
		if err := ctl.Do(ctx, "CLIENT", "PAUSE", 600, "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		err = <-errc
		switch policy {
		case redisqueue.FailClosed:
			if !errors.Is(err, redisqueue.ErrUnavailable) || !errors.Is(err, backend.ErrQueueFull) || errors.Is(err, backend.ErrQueueTimeout) {
				t.Errorf("FailClosed: the waiter got %v, want an error wrapping ErrUnavailable and ErrQueueFull", err)
			}
		case redisqueue.FailOpen:
			if !errors.Is(err, backend.ErrQueueTimeout) {
				t.Errorf("FailOpen: the waiter got %v, want ErrQueueTimeout", err)
			}
		}
		b.Release(holder)
		eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(b) })
	}
}

// TestWaiterExpiresJustAfterFreeze: FailClosed, one waiter queued in
// Redis; the server freezes (SIGSTOP: a hung master, a partition) 100 ms
// before the waiter's QueueTimeout. No grant can come because Redis does
// not answer; the promise is 503 (ErrUnavailable), never 408. The default
// TickInterval (500 ms) is used, as in the topology runs.
func TestWaiterExpiresJustAfterFreeze(t *testing.T) {
	needRedis(t)
	srv := startRedis(t)
	const runs = 5
	timeouts := 0
	for i := range runs {
		o := redisqueue.Options{Name: newName(t), OnRedisDown: redisqueue.FailClosed, Mode: redisqueue.GlobalQueue}
		l := backend.Limits{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Second}
		b := startBackends2(t, srv.addr(), l, o)
		ctx := context.Background()
		holder, err := b.Acquire(ctx, backend.Arrival{})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := b.Acquire(ctx, backend.Arrival{})
			errc <- err
		}()
		waitQueued(t, b, 1)
		time.Sleep(time.Until(start.Add(900 * time.Millisecond)))
		_ = srv.cmd.Process.Signal(syscall.SIGSTOP)
		err = <-errc
		if errors.Is(err, backend.ErrQueueTimeout) {
			timeouts++
		}
		t.Logf("run %d: the waiter got %v after %v", i, err, time.Since(start).Round(time.Millisecond))
		_ = srv.cmd.Process.Signal(syscall.SIGCONT)
		b.Release(holder)
		eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(b) })
	}
	if timeouts > 0 {
		t.Errorf("FailClosed: %d of %d waiters whose QueueTimeout passed while Redis was frozen got 408 (ErrQueueTimeout), want 503",
			timeouts, runs)
	}
}

// An eviction that empties the queue deletes its keys; the arrival that
// took the place writes them again, and they get their TTL there too, not
// only at the next sync.
func TestEvictionThatEmptiesTheQueueKeepsTheTTLs(t *testing.T) {
	needRedis(t)
	t.Parallel()
	o := redisqueue.Options{Name: newName(t), LeaseTTL: 3 * time.Minute, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: time.Minute}}
	b := startBackends(t, 1, backend.Limits{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute}, o)[0]
	defer holdAll(t, b, 1)()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)
	acquire := func(prio int) {
		tk, err := b.Acquire(ctx, backend.Arrival{Priority: prio})
		if err == nil {
			b.Release(tk)
		}
		errs <- err
	}
	go acquire(0)
	waitQueued(t, b, 1)
	go acquire(1) // evicts the first: the queue is empty for an instant
	if err := <-errs; !errors.Is(err, backend.ErrQueueFull) {
		t.Fatalf("the waiter of lower priority got %v, want evicted (queue full)", err)
	}
	waitQueued(t, b, 1)
	if keys, err := keysWithoutTTL(context.Background(), newClient(t, redisAddr), o.Name); err != nil || len(keys) > 0 {
		t.Fatalf("keys without a TTL after the eviction: %v (%v)", keys, err)
	}
	cancel()
	<-errs
}

// Arrival.MinTimeLeft in both modes: a waiter granted with less time left
// before its context's deadline than it needs is answered queue timeout,
// is not counted as served, and its slot goes to the next waiter; one that
// finds its slot free runs whatever its time left.
func TestMinTimeLeftInBothModes(t *testing.T) {
	needRedis(t)
	for _, mode := range []redisqueue.Mode{redisqueue.GlobalQueue, redisqueue.Shares} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			b := startBackends(t, 1, backend.Limits{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 10 * time.Second},
				redisqueue.Options{Mode: mode})[0]
			eventually(t, 2*time.Second, "no slot", func() bool { return b.Stats().Limit == 1 })
			short, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			defer cancel()
			first, err := b.Acquire(short, backend.Arrival{MinTimeLeft: time.Second})
			if err != nil {
				t.Fatalf("a free slot: its time left is not looked at, but: %v", err)
			}
			served := b.Stats().Served

			late, cancelLate := context.WithTimeout(context.Background(), 600*time.Millisecond)
			defer cancelLate()
			lateErr := make(chan error, 1)
			go func() {
				_, err := b.Acquire(late, backend.Arrival{MinTimeLeft: 400 * time.Millisecond})
				lateErr <- err
			}()
			waitFor := func(n int) {
				eventually(t, 2*time.Second, "waiters did not queue", func() bool { return b.Stats().Queued == n })
			}
			waitFor(1)
			next := make(chan backend.Ticket, 1)
			go func() {
				tk, err := b.Acquire(context.Background(), backend.Arrival{})
				if err == nil {
					next <- tk
				}
			}()
			waitFor(2)
			time.Sleep(300 * time.Millisecond) // the first waiter now has under 300 ms left of 600
			b.Release(first)
			select {
			case err := <-lateErr:
				if !errors.Is(err, backend.ErrQueueTimeout) {
					t.Errorf("the late waiter: %v, want a queue timeout", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("the late waiter was not answered")
			}
			select {
			case tk := <-next:
				b.Release(tk)
			case <-time.After(2 * time.Second):
				t.Fatal("the slot did not go to the next waiter")
			}
			if got := b.Stats().Served; got != served+1 {
				t.Errorf("served %d, want %d: the refused grant is not served", got, served+1)
			}
		})
	}
}
