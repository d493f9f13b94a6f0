package redisqueue_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// loadResult is what a load run saw.
type loadResult struct {
	maxWait time.Duration // longest time a request spent before it ran or was answered
	codes   map[int]int
}

// load serves requests on reps from workers goroutines until stop is
// closed. The wait of a request is measured from before the Queue to the
// start of the handler, or to the answer when it got no slot.
func load(reps []*replica, workers int, stop <-chan struct{}) loadResult {
	type one struct {
		wait time.Duration
		code int
	}
	out := make(chan one, 1024)
	var wg sync.WaitGroup
	for i := range workers {
		r := reps[i%len(reps)]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				code, ran := r.getTimed()
				wait := time.Since(start)
				if !ran.IsZero() {
					wait = ran.Sub(start)
				}
				out <- one{wait, code}
				time.Sleep(time.Millisecond) // a 503 is instant: do not spin
			}
		})
	}
	go func() { wg.Wait(); close(out) }()
	res := loadResult{codes: map[int]int{}}
	for o := range out {
		res.maxWait = max(res.maxWait, o.wait)
		res.codes[o.code]++
	}
	return res
}

// getTimed serves one request and returns its status and when its handler
// started (zero if it did not run).
func (r *replica) getTimed() (int, time.Time) {
	var ran time.Time
	w := &statusRecorder{}
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req = req.WithContext(context.WithValue(req.Context(), ranKey{}, &ran))
	r.e.ServeHTTP(w, req)
	return w.status(), ran
}

type ranKey struct{}

// timedHandler records when it starts, then works for d.
func timedHandler(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		if p, ok := c.Request.Context().Value(ranKey{}).(*time.Time); ok {
			*p = time.Now()
		}
		time.Sleep(d)
	}
}

func TestRedisPaused(t *testing.T) {
	needRedis(t)
	t.Parallel()
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
			o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: 2 * time.Second, OnRedisDown: policy, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
			cfg := ginqueue.Config{MaxConcurrent: 2, MaxQueue: 20, QueueTimeout: 300 * time.Millisecond}
			var reps []*replica
			for range 2 {
				reps = append(reps, newReplica(t, srv.addr(), cfg, o, timedHandler(2*time.Millisecond)))
			}
			stop := make(chan struct{})
			done := make(chan loadResult, 1)
			go func() { done <- load(reps, 6, stop) }()

			ctl := newClient(t, srv.addr())
			time.Sleep(200 * time.Millisecond) // some load before the pause
			if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", 1000, "ALL").Err(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond) // the pause, and a while after
			close(stop)
			res := <-done

			t.Logf("%v: outcomes %v, longest wait %v", policy, res.codes, res.maxWait)
			// Scheduling slack for the race detector on a small machine
			// that runs the other tests at the same time.
			if bound := cfg.QueueTimeout + o.CallTimeout + 150*time.Millisecond; res.maxWait > bound {
				t.Fatalf("a request waited %v, want at most QueueTimeout + CallTimeout (%v)", res.maxWait, bound)
			}
			if res.codes[http.StatusOK] == 0 {
				t.Fatal("nothing was served")
			}
			if policy == redisqueue.FailClosed && res.codes[http.StatusServiceUnavailable] == 0 {
				t.Fatal("FailClosed answered no 503 while Redis was paused")
			}
			// A call that timed out while Redis was paused is Redis being
			// unreachable (FailClosed: 503), not a queue timeout: the
			// requests have no deadline of their own, so every 408 must be
			// an ErrQueueTimeout from the Backend.
			var timeouts int64
			for _, r := range reps {
				timeouts += r.timeouts.Load()
			}
			if n := res.codes[http.StatusRequestTimeout]; int64(n) != timeouts {
				t.Fatalf("%d requests answered 408, but the Backends timed out %d", n, timeouts)
			}
			for _, r := range reps {
				eventually(t, 3*time.Second, "requests left in a replica", func() bool {
					s := r.q.Stats()
					return s.Running == 0 && s.Queued == 0
				})
			}
			eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(reps[0].b) })
		})
	}
}

func TestRedisRestartedMidRun(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: time.Second, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 100 * time.Millisecond}}
	cfg := ginqueue.Config{MaxConcurrent: 3, MaxQueue: 20, QueueTimeout: 400 * time.Millisecond}
	var reps []*replica
	for range 2 {
		reps = append(reps, newReplica(t, srv.addr(), cfg, o, timedHandler(2*time.Millisecond)))
	}
	stop := make(chan struct{})
	done := make(chan loadResult, 1)
	go func() { done <- load(reps, 8, stop) }()

	time.Sleep(200 * time.Millisecond)
	srv.stop() // kill -9: nothing persisted
	time.Sleep(300 * time.Millisecond)
	srv.start()
	time.Sleep(800 * time.Millisecond)
	close(stop)
	res := <-done

	t.Logf("outcomes %v, longest wait %v", res.codes, res.maxWait)
	if bound := cfg.QueueTimeout + o.CallTimeout + 150*time.Millisecond; res.maxWait > bound {
		t.Fatalf("a request waited %v, want at most QueueTimeout + CallTimeout (%v)", res.maxWait, bound)
	}
	eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(reps[0].b) })
	// Served through Redis again after the restart.
	before := reps[0].q.Stats().Served
	if c := reps[0].get(); c != http.StatusOK {
		t.Fatalf("after the restart a request got %d", c)
	}
	if reps[0].q.Stats().Served != before+1 {
		t.Fatal("not counted as served")
	}
}

func TestRedisFlushedWaitersEnqueueAgain(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), LeaseTTL: time.Second, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: 50 * time.Millisecond}}
	l := backend.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 5 * time.Second}
	var bs []*redisqueue.Backend
	for range 2 {
		b, err := redisqueue.New(newClient(t, srv.addr()), o)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(l); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		bs = append(bs, b)
	}
	holder, err := bs[0].Acquire(context.Background(), backend.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 3
	var served atomic.Int32
	errs := make(chan error, waiters)
	for range waiters {
		go func() {
			tk, err := bs[1].Acquire(context.Background(), backend.Arrival{})
			if err == nil {
				served.Add(1)
				bs[1].Release(tk)
			}
			errs <- err
		}()
	}
	waitQueued(t, bs[0], waiters)
	if err := newClient(t, srv.addr()).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// The safety net finds the waiters lost and enqueues them again; the
	// holder's lease is reclaimed at its next refresh (LeaseTTL/3).
	eventually(t, 3*time.Second, "waiters did not enqueue again", func() bool {
		s, err := bs[0].GlobalStats(context.Background())
		return err == nil && s.Running+s.Queued+int(served.Load()) >= waiters
	})
	bs[0].Release(holder)
	for range waiters {
		if err := <-errs; err != nil {
			t.Fatalf("a waiter got %v after the flush, want a slot", err)
		}
	}
	eventually(t, 2*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(bs[0]) })
}
