// Stats must not count as queued a request that has already returned:
// random scenarios through the middleware in fake time, each checked the
// instant its last request returns, and the smallest schedule that fails.

package ginqueue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
)

// leftoverTick is the step of every scheduled event: arrivals, handler ends,
// client deadlines, hang-ups and limit changes all fall on its multiples, so
// that many of them come in the same instant as an expiry.
const leftoverTick = 50 * time.Millisecond

// leftoverHeader carries a request's client deadline, as a wait from arrival.
const leftoverHeader = "X-Leftover-Wait"

// leftoverReq is one request of a scenario. Times are from the start of the
// scenario; a zero hangUp or wait means none.
type leftoverReq struct {
	at, hold, hangUp, wait time.Duration
	cost, prio             int
	flow                   string
}

// leftoverScenario is one run: the Config fields that vary and the schedule.
type leftoverScenario struct {
	seed        uint64
	minTimeLeft time.Duration
	rejectEarly bool
	codel       *CoDel
	limitAt     time.Duration // when SetLimit(limitTo) is called; 0 means never
	limitTo     int
	// together starts every request on its own goroutine that sleeps until
	// its arrival, and SetLimit on a timer; otherwise one driver makes the
	// arrivals and SetLimit in order, each settled before the next.
	together bool
	reqs     []leftoverReq
}

// newLeftoverScenario draws a scenario from seed: 2 slots, 6 places, a
// 200 ms QueueTimeout, and everything else at random.
func newLeftoverScenario(seed uint64) leftoverScenario {
	r := rand.New(rand.NewPCG(seed, 0x1ef7))
	ticks := func(lo, hi int) time.Duration { return time.Duration(lo+r.IntN(hi-lo+1)) * leftoverTick }
	s := leftoverScenario{
		seed:        seed,
		minTimeLeft: []time.Duration{0, -1, 10 * time.Millisecond, 50 * time.Millisecond}[r.IntN(4)],
		rejectEarly: r.IntN(2) == 0,
		together:    r.IntN(2) == 0,
	}
	if r.IntN(2) == 0 {
		s.codel = &CoDel{Target: ticks(0, 1), Interval: ticks(1, 3), LIFO: true}
		if s.codel.Target == 0 {
			s.codel.Target = 5 * time.Millisecond
		}
	}
	if r.IntN(3) == 0 {
		s.limitAt, s.limitTo = ticks(1, 6), 1+r.IntN(3)
	}
	for range 4 + r.IntN(17) {
		q := leftoverReq{
			at:   ticks(0, 10),
			hold: ticks(0, 4),
			cost: 1 + r.IntN(2),
			prio: r.IntN(2),
			flow: []string{"a", "b"}[r.IntN(2)],
		}
		if r.IntN(3) != 0 {
			q.wait = ticks(1, 5)
		}
		if r.IntN(4) == 0 {
			q.hangUp = q.at + ticks(0, 5)
		}
		s.reqs = append(s.reqs, q)
	}
	slices.SortStableFunc(s.reqs, func(a, b leftoverReq) int { return int(a.at - b.at) })
	return s
}

func (s leftoverScenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: MaxConcurrent 2, MaxQueue 6, QueueTimeout 200ms, MinTimeLeft %v, RejectEarly %v, together %v",
		s.seed, s.minTimeLeft, s.rejectEarly, s.together)
	if s.codel != nil {
		fmt.Fprintf(&b, ", CoDel %+v", *s.codel)
	}
	if s.limitAt > 0 {
		fmt.Fprintf(&b, ", SetLimit(%d) at %v", s.limitTo, s.limitAt)
	}
	for i, q := range s.reqs {
		fmt.Fprintf(&b, "\n  #%d at %v: cost %d, priority %d, flow %s, handler %v", i, q.at, q.cost, q.prio, q.flow, q.hold)
		if q.wait > 0 {
			fmt.Fprintf(&b, ", deadline %v after arrival", q.wait)
		}
		if q.hangUp > 0 {
			fmt.Fprintf(&b, ", hangs up at %v", q.hangUp)
		}
	}
	return b.String()
}

// yieldWhilePublishing makes every publication of d's room yield the
// processor halfway, after a section changed the room and before Stats
// can see the change. It changes no decision, only how long
// that moment lasts; without it the moment is a few atomic operations long
// and the loop below fails about once in tens of thousands of scenarios.
// The returned func lists the sections that published, by the function that
// ended them, for a failure message.
func yieldWhilePublishing(d *dispatcher) func() []string {
	var mu sync.Mutex
	var seen []string
	t0 := time.Now()
	half := false
	d.step = func(s step) {
		if s != stepPublish {
			return
		}
		half = !half // stepPublish comes twice per publication, under d.mu
		if !half {
			return
		}
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%v %s -> Queued %d", time.Since(t0), sectionName(), d.room.n))
		mu.Unlock()
		for range 3 {
			runtime.Gosched()
		}
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// sectionName is the name of the function whose section under d.mu is
// being published: the caller of unlock.
func sectionName() string {
	pcs := make([]uintptr, 16)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	for after := false; ; {
		f, more := frames.Next()
		name := f.Function[strings.LastIndex(f.Function, ".")+1:]
		if after {
			return name
		}
		after = name == "unlock"
		if !more {
			return "?"
		}
	}
}

// play runs s in the calling synctest bubble and returns what is wrong the
// instant its last request returns, or "" if nothing is.
func (s leftoverScenario) play() string {
	index := func(c *gin.Context) int { i, _ := strconv.Atoi(c.Query("i")); return i }
	q, err := NewQueue(Config{
		MaxConcurrent: 2,
		MaxQueue:      6,
		QueueTimeout:  4 * leftoverTick,
		Cost:          func(c *gin.Context) int { return s.reqs[index(c)].cost },
		Priority:      func(c *gin.Context) int { return s.reqs[index(c)].prio },
		FlowKey:       func(c *gin.Context) string { return s.reqs[index(c)].flow },
		Deadline:      DeadlineHeader(leftoverHeader),
		MinTimeLeft:   s.minTimeLeft,
		RejectEarly:   s.rejectEarly,
		CoDel:         s.codel,
	})
	if err != nil {
		return fmt.Sprintf("NewQueue: %v", err)
	}
	defer q.Close()
	published := yieldWhilePublishing(q.backend.(*dispatcher))
	r := gin.New()
	r.Use(q.Handler())
	r.GET("/", func(c *gin.Context) {
		time.Sleep(s.reqs[index(c)].hold)
		c.Status(http.StatusOK)
	})

	t0 := time.Now()
	cancels := make([]context.CancelFunc, len(s.reqs))
	codes := make([]int, len(s.reqs))
	var wg sync.WaitGroup
	arrive := func(i int) {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "/?i="+strconv.Itoa(i), nil)
		if w := s.reqs[i].wait; w > 0 {
			req.Header.Set(leftoverHeader, w.String())
		}
		if h := s.reqs[i].hangUp; h > 0 {
			time.AfterFunc(h-time.Since(t0), cancel)
		}
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		codes[i] = rec.Code
	}
	if s.together {
		if s.limitAt > 0 {
			time.AfterFunc(s.limitAt, func() { _ = q.SetLimit(s.limitTo) })
		}
		for i, rq := range s.reqs {
			wg.Go(func() {
				time.Sleep(rq.at)
				arrive(i)
			})
		}
	} else {
		limitDone := s.limitAt == 0
		for i, rq := range s.reqs {
			if !limitDone && s.limitAt <= rq.at {
				time.Sleep(s.limitAt - time.Since(t0))
				_ = q.SetLimit(s.limitTo)
				limitDone = true
				synctest.Wait()
			}
			time.Sleep(rq.at - time.Since(t0))
			wg.Go(func() { arrive(i) })
			synctest.Wait()
		}
	}
	wg.Wait()
	// Every request has returned; no time passes from here on.
	now := q.Stats()
	synctest.Wait() // every other goroutine of the bubble blocked
	settled := q.Stats()
	for _, cancel := range cancels {
		if cancel != nil {
			cancel()
		}
	}

	var bad []string
	if now.Running != 0 || now.Queued != 0 {
		bad = append(bad, fmt.Sprintf("the instant the last request returned: Running %d, Queued %d (OldestWait %v, by priority %v);"+
			" once the bubble settled, in the same instant: Running %d, Queued %d",
			now.Running, now.Queued, now.OldestWait, now.QueuedByPriority, settled.Running, settled.Queued))
	}
	st := settled
	if sum := st.Served + st.QueueFull + st.QueueTimeout + st.Canceled + st.Closed + st.Panicked; sum != uint64(len(s.reqs)) || st.Closed != 0 {
		bad = append(bad, fmt.Sprintf("outcomes do not add up to %d requests: %+v", len(s.reqs), st))
	}
	if len(bad) == 0 {
		return ""
	}
	pubs := published()
	return fmt.Sprintf("%s\n  codes %v\n  outcomes: served %d, queue full %d, queue timeout %d, canceled %d\n  last publications %q",
		strings.Join(bad, "\n  "), codes, st.Served, st.QueueFull, st.QueueTimeout, st.Canceled, pubs[max(0, len(pubs)-3):])
}

// TestNoWaiterOutlivesItsRequest plays random scenarios (see
// newLeftoverScenario) and checks, the instant the last request has
// returned and before any time passes, that no slot is held and nobody is
// counted as queued. Each scenario is a subtest named by its seed, so
// "-run 'TestNoWaiterOutlivesItsRequest/seed=116$'" plays one again; how
// the goroutines of one instant interleave is up to the scheduler, so a
// replay fails often, not always.
func TestNoWaiterOutlivesItsRequest(t *testing.T) {
	n := 4000
	if testing.Short() {
		n = 1000
	}
	fails := 0
	for i := range n {
		s := newLeftoverScenario(uint64(i))
		var msg string
		t.Run(fmt.Sprintf("seed=%d", s.seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { msg = s.play() })
			if msg == "" {
				return
			}
			if fails++; fails <= 3 {
				t.Errorf("%v\n  %s", s, msg)
			} else {
				t.Errorf("%s", msg[:strings.IndexByte(msg, '\n')])
			}
		})
	}
	if fails > 0 {
		t.Errorf("%d of %d scenarios failed", fails, n)
	}
}

// TestStatsCountsAnExpiredWaiterAfterItReturned is the smallest schedule
// the loop above failed on, made deterministic. One slot, one place, a
// 200 ms QueueTimeout. A arrives at 0 and runs for 200 ms; B arrives at 0
// and waits. At 200 ms the expiry timer and the end of A's handler come in
// the same instant. expire timed B out and woke it at once, and its
// section ended in settle, which cleared slowBit (the room was empty)
// before it published the room. In between, A's Release saw slowBit clear
// and returned without the mutex, and B wrote its 408 without it: both
// requests had returned, and Stats still showed B queued, beside its 408
// counted. No waiter was left in the room: the publication Stats reads was
// behind it. Now a section publishes first, then sends its wake-ups, then
// sets slowBit. Here the expiry's goroutine is held at its publication
// (stepPublish) until Stats has been read, or until somebody asks for the
// mutex it holds (then nobody can return before the room is published,
// and the hold would only deadlock); A's handler lets the expiry go first
// (synctest.Wait), so that its Release does not time B out itself.
func TestStatsCountsAnExpiredWaiterAfterItReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, err := NewQueue(Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		d := q.backend.(*dispatcher)
		hold, giveUp := make(chan struct{}), make(chan struct{})
		var held, holding atomic.Bool
		var gaveUp sync.Once
		d.step = func(s step) {
			switch {
			case s == stepPublish && d.room.n == 0 && !held.Load():
				// Under d.mu: the first publication of an empty room, the
				// expiry's.
				held.Store(true)
				holding.Store(true)
				select {
				case <-hold:
				case <-giveUp:
				}
				holding.Store(false)
			case s == stepLock && holding.Load():
				gaveUp.Do(func() { close(giveUp) })
			}
		}
		r := gin.New()
		r.Use(q.Handler())
		r.GET("/", func(c *gin.Context) {
			time.Sleep(200 * time.Millisecond)
			synctest.Wait() // the expiry's goroutine runs first, up to the hold
			c.Status(http.StatusOK)
		})
		codes := make(chan string, 2)
		for _, id := range []string{"A", "B"} {
			go func() {
				rec := httptest.NewRecorder()
				r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
				codes <- fmt.Sprintf("%s %d", id, rec.Code)
			}()
			synctest.Wait()
		}
		got := []string{<-codes, <-codes}
		st := q.Stats() // both requests have returned; still 200 ms
		close(hold)
		slices.Sort(got)
		if !slices.Equal(got, []string{"A 200", "B 408"}) {
			t.Fatalf("codes %v, want A 200 and B 408", got)
		}
		if !held.Load() {
			t.Fatal("the expiry never published an empty room")
		}
		if st.Queued != 0 || st.Running != 0 {
			t.Errorf("after A (200) and B (408) returned, Stats shows Queued %d (OldestWait %v, by priority %v), Running %d,"+
				" with Served %d and QueueTimeout %d: B is counted twice", st.Queued, st.OldestWait, st.QueuedByPriority,
				st.Running, st.Served, st.QueueTimeout)
		}
		synctest.Wait()
		if st := q.Stats(); st.Queued != 0 {
			t.Errorf("once the expiry's section ended: Queued %d", st.Queued)
		}
	})
}
