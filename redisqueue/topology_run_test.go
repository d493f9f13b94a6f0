package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// One topology run: 3 replicas under a closed-loop load, each request
// traced, and the analysis of what they saw against the targets of
// topology_test.go.

// trace is what one request saw, filled in its own goroutine: by the
// traced Backend's Acquire and by the handler.
type trace struct {
	answered time.Time // when Acquire returned
	local    bool      // granted by the FailOpen fallback
	policy   bool      // FailClosed's ErrUnavailable
	conc     int       // handlers running across the replicas when it started, itself included
	ran      time.Time
	hold     <-chan struct{} // for /hold: run until closed
}

type traceKey struct{}

// traced is a Backend that notes each Acquire's outcome in the request's
// trace.
type traced struct{ *redisqueue.Backend }

func (b traced) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	t, err := b.Backend.Acquire(ctx, a)
	if tr, ok := ctx.Value(traceKey{}).(*trace); ok {
		tr.answered = time.Now()
		tr.local = err == nil && redisqueue.GrantedLocally(t)
		tr.policy = errors.Is(err, redisqueue.ErrUnavailable)
	}
	return t, err
}

// topoEvent is one request of the load.
type topoEvent struct {
	start, answered time.Time
	ran             time.Time // when its handler started; zero if it did not run
	code            int
	local, policy   bool
	conc            int
}

func (e topoEvent) normal() bool { return e.code == http.StatusOK && !e.local }

// topoRun is 3 replicas of one fresh Name and the load on them.
type topoRun struct {
	t    *testing.T
	name string
	reps []*topoReplica
	conc atomic.Int64 // handlers running now, across the replicas

	mu     sync.Mutex
	events []topoEvent

	// In Shares mode: the replicas' Mode, their LeaseTTL in force, and the
	// commands their clients sent Redis (all, and while the load ran).
	mode      redisqueue.Mode
	lease     time.Duration
	calls     callCount
	loadCalls atomic.Int64
	lost      lostShare
}

type topoReplica struct {
	b *redisqueue.Backend
	q *ginqueue.Queue
	e *gin.Engine
}

func newTopoRun(t *testing.T, top topology, policy redisqueue.Policy, universal bool, lease time.Duration) *topoRun {
	t.Helper()
	r := &topoRun{t: t, name: newName(t), mode: top.mode, lease: lease}
	if r.lease == 0 {
		r.lease = redisqueue.DefaultLeaseTTL
	}
	for range 3 {
		rdb := top.client(universal)
		t.Cleanup(func() { _ = rdb.Close() })
		b, err := redisqueue.New(rdb, redisqueue.Options{Name: r.name, CallTimeout: topoCallTimeout, OnRedisDown: policy, LeaseTTL: lease, Mode: top.mode})
		if err != nil {
			t.Fatal(err)
		}
		var be backend.Backend = traced{b}
		if top.mode == redisqueue.Shares {
			rdb.AddHook(&r.calls)
			be = tracedShares{traced{b}}
		}
		q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: topoLimit, MaxQueue: 16,
			QueueTimeout: topoQueueTimeout, Backend: be})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = q.Close() }) // before its client: cleanups run last-in first-out
		e := gin.New()
		h := func(c *gin.Context) {
			tr := c.Request.Context().Value(traceKey{}).(*trace)
			tr.conc = int(r.conc.Add(1))
			tr.ran = time.Now()
			if tr.hold != nil {
				<-tr.hold
			} else {
				time.Sleep(topoHandler)
			}
			r.conc.Add(-1)
		}
		e.GET("/", q.Handler(), h)
		r.reps = append(r.reps, &topoReplica{b: b, q: q, e: e})
	}
	return r
}

// key is a key of the Name: its slot is the queue's.
func (r *topoRun) key() string { return "ginqueue:{" + r.name + "}:h" }

// serve runs one request on rep; hold, if not nil, keeps its handler
// running until closed.
func (r *topoRun) serve(rep *topoReplica, hold <-chan struct{}) (topoEvent, *trace) {
	tr := &trace{hold: hold}
	w := &statusRecorder{}
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req = req.WithContext(context.WithValue(context.Background(), traceKey{}, tr))
	ev := topoEvent{start: time.Now()}
	rep.e.ServeHTTP(w, req)
	ev.code = w.status()
	ev.answered = tr.answered
	if ev.answered.IsZero() {
		ev.answered = tr.ran // granted on a fast path, which the trace does not see
	}
	if ev.answered.IsZero() {
		ev.answered = time.Now()
	}
	ev.local, ev.policy, ev.conc, ev.ran = tr.local, tr.policy, tr.conc, tr.ran
	return ev, tr
}

// startLoad starts the closed-loop clients; the function it returns stops
// them and waits until they are done.
func (r *topoRun) startLoad() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	calls := r.calls.n.Load()
	for i := range topoClients {
		rep := r.reps[i%len(r.reps)]
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				ev, _ := r.serve(rep, nil)
				r.mu.Lock()
				r.events = append(r.events, ev)
				r.mu.Unlock()
				if ev.code != http.StatusOK {
					time.Sleep(time.Millisecond) // a 503 is instant: do not spin
				}
			}
		})
	}
	return func() { close(done); wg.Wait(); r.loadCalls.Add(r.calls.n.Load() - calls) }
}

// waitPromoted polls the topology every 10 ms until replica is the master.
func waitPromoted(t *testing.T, top topology, replica string, within time.Duration) time.Time {
	t.Helper()
	end := time.Now().Add(within)
	for !top.promoted(replica) {
		if time.Now().After(end) {
			t.Fatalf("no new master within %v", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}

// waitIdle waits until GlobalStats is idle and every replica's Queue is
// empty, up to topoIdleBound, and returns how long that took and what was
// left in Redis at the end.
func (r *topoRun) waitIdle() (time.Duration, string, bool) {
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		s, err := r.reps[0].b.GlobalStats(ctx)
		cancel()
		idle := err == nil && s.Running == 0 && s.Queued == 0
		if r.mode == redisqueue.Shares {
			// Idle shares stay held, split evenly as room for arrivals:
			// idle is nobody waiting, the shares within the limit, and only
			// the live replicas holding any.
			idle = err == nil && s.Queued == 0 && s.Running <= topoLimit && s.Replicas == len(r.reps)
		}
		left := fmt.Sprintf("GlobalStats %+v, error %v; replicas' running/queued:", s, err)
		for _, rep := range r.reps {
			st := rep.q.Stats()
			idle = idle && st.Running == 0 && st.Queued == 0
			left += fmt.Sprintf(" %d/%d", st.Running, st.Queued)
		}
		if idle {
			return time.Since(start), left, true
		}
		if time.Since(start) > topoIdleBound {
			return time.Since(start), left, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// capacity is the highest handler concurrency seen in each topoBucket from
// from to to: under a saturating load, the capacity the fleet was given.
func (r *topoRun) capacity(from, to time.Time) []int {
	n := int(to.Sub(from)/topoBucket) + 1
	out := make([]int, n)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.ran.IsZero() || e.ran.Before(from) || !e.ran.Before(to) {
			continue
		}
		i := int(e.ran.Sub(from) / topoBucket)
		out[i] = max(out[i], e.conc)
	}
	return out
}

// timeline writes buckets as runs: "+0.0–0.3 s: 0, +0.3–2.1 s: 4".
func timeline(b []int) string {
	var parts []string
	for i := 0; i < len(b); {
		j := i
		for j < len(b) && b[j] == b[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("+%.1f–%.1fs: %d", float64(i)*topoBucket.Seconds(), float64(j)*topoBucket.Seconds(), b[i]))
		i = j
	}
	return strings.Join(parts, ", ")
}

// underUntil is the end, from the start of b, of the last run of 3 or more
// buckets below the limit (zero if none): how long the fleet ran short of
// its limit.
func underUntil(b []int) time.Duration {
	var end time.Duration
	for i := 0; i < len(b); {
		if b[i] >= topoLimit {
			i++
			continue
		}
		j := i
		for j < len(b) && b[j] < topoLimit {
			j++
		}
		if j-i >= 3 {
			end = time.Duration(j) * topoBucket
		}
		i = j
	}
	return end
}

// topoResult is what a run measured after the trigger t0, the new master
// at tm, until the end of the load.
type topoResult struct {
	newMaster, resume time.Duration // from t0
	resumed           bool
	timeouts, policy  int // 408s; OnRedisDown answers (FailClosed's 503s, FailOpen's local grants)
	full, other       int // 503s of a full queue; any other status
	late              int // abnormal answers to requests that came 2 s after the new master or later
	maxWait           time.Duration
	peakSteady, peak  int
	over              int           // requests that ran above the limit in steady state
	under             time.Duration // from tm: how long the fleet ran short of its limit
	capacity          string
}

func (r *topoRun) analyse(t0, tm, end time.Time) topoResult {
	r.mu.Lock()
	ev := slices.Clone(r.events)
	r.mu.Unlock()
	slices.SortFunc(ev, func(a, b topoEvent) int { return a.answered.Compare(b.answered) })
	res := topoResult{newMaster: tm.Sub(t0)}
	steadyFrom := tm.Add(topoResumeBound)
	first := -1
	for i, e := range ev {
		res.maxWait = max(res.maxWait, e.answered.Sub(e.start))
		res.peak = max(res.peak, e.conc)
		// Steady state: handlers that started before the trigger or 2 s
		// after the new master.
		if !e.ran.IsZero() && (e.ran.Before(t0) || !e.ran.Before(steadyFrom)) {
			res.peakSteady = max(res.peakSteady, e.conc)
			if e.conc > topoLimit {
				res.over++
			}
		}
		if e.answered.Before(t0) {
			continue
		}
		switch {
		case e.code == http.StatusRequestTimeout:
			res.timeouts++
		case e.policy || e.local:
			res.policy++
		case e.code == http.StatusServiceUnavailable:
			res.full++
		case e.code != http.StatusOK:
			res.other++
		}
		if !e.normal() {
			if first < 0 {
				first = i
			}
			if !e.start.Before(steadyFrom) {
				res.late++
			}
		}
	}
	if first < 0 {
		res.resumed = true // no interruption at all
	} else {
		for i := first + 1; i+topoResumeRun <= len(ev); i++ {
			ok := true
			for _, e := range ev[i : i+topoResumeRun] {
				if !e.normal() {
					ok = false
					break
				}
			}
			if ok {
				res.resume, res.resumed = ev[i].answered.Sub(t0), true
				break
			}
		}
	}
	capa := r.capacity(tm, end)
	res.under = underUntil(capa)
	res.capacity = timeline(capa)
	return res
}

// check logs res and reports every target it misses.
func (r *topoRun) check(t *testing.T, what string, policy redisqueue.Policy, res topoResult) {
	t.Helper()
	if r.mode == redisqueue.Shares {
		r.checkShares(t, what, policy, res)
		return
	}
	resume := "no interruption"
	if !res.resumed {
		resume = "never, in the run"
	} else if res.resume > 0 {
		resume = fmt.Sprintf("%.2fs after the trigger, %+.2fs from the new master", res.resume.Seconds(), (res.resume - res.newMaster).Seconds())
	}
	t.Logf("%s: new master %.2fs after the trigger; normal service: %s; after the trigger 408=%d policy=%d full=%d other=%d, "+
		"abnormal answers to requests from new master+2s on: %d; longest wait %v; peak concurrency %d steady, %d in all; "+
		"short of the limit until new master+%.1fs; capacity from the new master: %s",
		what, res.newMaster.Seconds(), resume, res.timeouts, res.policy, res.full, res.other, res.late,
		res.maxWait.Round(time.Millisecond), res.peakSteady, res.peak, res.under.Seconds(), res.capacity)
	if !res.resumed {
		t.Errorf("%s: normal service (%d requests in a row) never resumed", what, topoResumeRun)
	} else if res.resume > res.newMaster+topoResumeBound {
		t.Errorf("%s: normal service resumed %v after the new master, want within %v", what,
			(res.resume - res.newMaster).Round(time.Millisecond), topoResumeBound)
	}
	if res.late > 0 {
		t.Errorf("%s: %d requests that came %v or more after the new master were not served normally", what, res.late, topoResumeBound)
	}
	if res.under > topoResumeBound {
		t.Errorf("%s: the fleet ran short of its limit of %d until %v after the new master, want within %v (capacity: %s)",
			what, topoLimit, res.under, topoResumeBound, res.capacity)
	}
	if bound := topoQueueTimeout + topoCallTimeout + topoSlack; res.maxWait > bound {
		t.Errorf("%s: a request waited %v, want at most QueueTimeout + CallTimeout (%v)", what, res.maxWait, bound)
	}
	if policy == redisqueue.FailClosed && res.timeouts > 0 {
		t.Errorf("%s: FailClosed answered %d requests 408, want 503", what, res.timeouts)
	}
	if res.over > 0 {
		t.Errorf("%s: %d requests ran above the limit of %d in steady state (peak %d)", what, res.over, topoLimit, res.peakSteady)
	}
}

// checkIdle waits for the fleet to be idle once the load stopped.
func (r *topoRun) checkIdle(t *testing.T, what string) {
	t.Helper()
	d, left, ok := r.waitIdle()
	if !ok {
		t.Errorf("%s: not idle %v after the load stopped: %s", what, d.Round(time.Millisecond), left)
		return
	}
	t.Logf("%s: idle %v after the load stopped, nothing leaked", what, d.Round(time.Millisecond))
}
