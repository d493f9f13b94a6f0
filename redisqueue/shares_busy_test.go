package redisqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// callSpans records when each script call that Redis answered started and
// ended: the calls whose answers the Backend counts (other commands, such
// as the notice reader's, do not tell it that Redis answers).
type callSpans struct {
	mu         sync.Mutex
	start, end []time.Time
}

func (c *callSpans) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *callSpans) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (c *callSpans) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		st := time.Now()
		err := next(ctx, cmd)
		if name := cmd.Name(); err == nil && (name == "evalsha" || name == "eval") {
			c.mu.Lock()
			c.start, c.end = append(c.start, st), append(c.end, time.Now())
			c.mu.Unlock()
		}
		return err
	}
}

// silentBefore reports whether, by t, no answer had been read for at least
// d, in a silence that ended at t-w or later: a 503 at t that the promise
// allows (a replica halted in that silence answers 503 until a sync gives
// it a share again).
func (c *callSpans) silentBefore(t time.Time, d, w time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ends := slices.Clone(c.end)
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	prev := time.Time{}
	for _, e := range append(ends, t.Add(w)) {
		if !prev.IsZero() && e.Sub(prev) >= d && !prev.Add(d).After(t) && !e.Before(t.Add(-w)) {
			return true
		}
		prev = e
	}
	return false
}

// downSpans records when a Backend had Redis marked down.
type downSpans struct {
	mu       sync.Mutex
	from, to []time.Time // to is zero while it is still down
}

func (d *downSpans) note(down bool, _ error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if down {
		d.from, d.to = append(d.from, time.Now()), append(d.to, time.Time{})
	} else if n := len(d.to); n > 0 {
		d.to[n-1] = time.Now()
	}
}

func (d *downSpans) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.from)
}

// downBefore reports whether Redis was marked down at t, or up to w before.
func (d *downSpans) downBefore(t time.Time, w time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, from := range d.from {
		if !from.After(t) && (d.to[i].IsZero() || !d.to[i].Before(t.Add(-w))) {
			return true
		}
	}
	return false
}

// longest is the longest time from a call's start to the next one's end,
// and the longest call.
func (c *callSpans) longest() (gap, call time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.start {
		call = max(call, c.end[i].Sub(c.start[i]))
		if i > 0 {
			gap = max(gap, c.end[i].Sub(c.start[i-1]))
		}
	}
	return gap, call
}

// Under FailOpen a replica stops admitting when its lease runs out only
// if Redis looks unreachable. A process whose cores are busy with its
// handlers reads Redis's answers late: the lease (timed from when the call
// left) can run out while the answer waits to be read, and a call can
// time out meanwhile. The replica must not answer 503 for it while Redis
// answers, as long as it reads an answer within 9/10 of a lease (past
// that it cannot tell its own stall from Redis's silence). Here a short
// lease and handlers that spin on the CPU, alone and beside two other
// busy processes (a noisy neighbour per core), which hold a call's
// answer unread up to about 160 ms: then a lease of 200 ms. Redis runs on
// the same cores, and on a busy machine it can go past that promise: a 503
// that follows a silence of 9/10 of a lease (less a twentieth for the
// test's own timing), or comes while Redis is marked down, is allowed; any
// other fails the test. A run whose 503s were all allowed proves little:
// the case runs again, up to four times.
func TestSharesFailOpenABusyProcessAnswersNo503WhileRedisAnswers(t *testing.T) {
	needRedis(t)
	for _, tt := range []struct {
		hogs  int
		lease time.Duration
	}{{0, 100 * time.Millisecond}, {2, 200 * time.Millisecond}} {
		t.Run(fmt.Sprintf("%d busy processes beside", tt.hogs), func(t *testing.T) {
			for range tt.hogs {
				hog := exec.Command("sh", "-c", "while :; do :; done")
				if err := hog.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = hog.Process.Kill(); _ = hog.Wait() })
			}
			for range 4 {
				if busyReplica(t, tt.lease) {
					break
				}
			}
		})
	}
}

// busyReplica is one run of TestSharesFailOpenABusyProcessAnswersNo503WhileRedisAnswers.
// It reports false if the run proved little: it had 503s, each allowed.
func busyReplica(t *testing.T, lease time.Duration) bool {
	srv := startRedis(t)
	downs := &downSpans{}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, OnRedisDown: redisqueue.FailOpen,
		LeaseTTL: lease, CallTimeout: 25 * time.Millisecond, OnStateChange: downs.note}
	rdb := newClient(t, srv.addr())
	calls := &callSpans{}
	rdb.AddHook(calls)
	cfg := ginqueue.Config{MaxConcurrent: 8, MaxQueue: 64, QueueTimeout: 5 * time.Second}
	r := newReplicaOn(t, rdb, cfg, o, func(*gin.Context) {
		for end := time.Now().Add(5 * time.Millisecond); time.Now().Before(end); {
		}
	})
	var mu sync.Mutex
	codes := map[int]int{}
	var refused []time.Time
	var wg sync.WaitGroup
	end := time.Now().Add(4 * time.Second)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(end) {
				c := r.get()
				mu.Lock()
				codes[c]++
				if c == http.StatusServiceUnavailable {
					refused = append(refused, time.Now())
				}
				mu.Unlock()
				if c != http.StatusOK {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	gap, call := calls.longest()
	t.Logf("answers %v; Redis marked down %d times; longest from a call's start to the next one's end %v, longest call %v (LeaseTTL %v, CallTimeout %v)",
		codes, downs.count(), gap.Round(time.Millisecond), call.Round(time.Millisecond), o.LeaseTTL, o.CallTimeout)
	if len(refused) == 0 {
		return true
	}
	wrong := 0
	for _, at := range refused {
		if !calls.silentBefore(at, lease*9/10-lease/20, lease) && !downs.downBefore(at, lease) {
			wrong++
		}
	}
	if wrong > 0 {
		t.Errorf("%d × 503 from a replica that had read an answer from Redis within 9/10 of a lease and did not have it marked down", wrong)
		return true
	}
	t.Logf("each 503 followed a silence of 9/10 of the lease, or came while Redis was marked down: run again")
	return false
}

// A 503 is allowed only after a silence that had lasted by then, and
// that ended no longer than w before it.
func TestSilentBeforeNeedsTheSilenceToHaveLasted(t *testing.T) {
	t0 := time.Now()
	at := func(ms ...int) *callSpans {
		c := &callSpans{}
		for _, m := range ms {
			c.end = append(c.end, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return c
	}
	ms := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Millisecond) }
	d, w := 85*time.Millisecond, 100*time.Millisecond
	for _, tt := range []struct {
		name    string
		answers *callSpans
		refused time.Time
		allowed bool
	}{
		{"an answer 5 ms before", at(0, 10, 20, 30, 116, 120), ms(35), false},
		{"in the millisecond of an answer", at(0, 10, 100), ms(10), false},
		{"just after the last answer", at(0, 10, 20, 30), ms(31), false},
		{"before any answer", at(50, 60), ms(40), false},
		{"within a silence that has lasted", at(0, 10, 200), ms(96), true},
		{"after the last answer, a silence that has lasted", at(0, 10), ms(96), true},
		{"soon after a silence ended", at(0, 10, 100, 110, 120), ms(150), true},
		{"long after a silence ended", at(0, 10, 100, 110, 120, 200, 210, 220), ms(230), false},
	} {
		if got := tt.answers.silentBefore(tt.refused, d, w); got != tt.allowed {
			t.Errorf("%s: allowed %v, want %v", tt.name, got, tt.allowed)
		}
	}
}

// Start and Close may run at once on a Shares Backend (a Queue closed as
// it starts): no data race, and Close stops what Start made.
func TestSharesCloseDuringStart(t *testing.T) {
	needRedis(t)
	rdb := newClient(t, redisAddr)
	for range 50 {
		b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { _ = b.Start(backend.Limits{MaxConcurrent: 2, MaxQueue: 4, QueueTimeout: time.Second}) })
		wg.Go(func() { _ = b.Close() })
		wg.Wait()
		_ = b.Close()
	}
}
