package ginqueue

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The waiters served before an arrival, for another Backend: its priority
// and higher, or everyone when the Backend gives no split.
func TestAheadInOtherBackends(t *testing.T) {
	split := BackendStats{Queued: 6, QueuedByPriority: []PriorityCount{{Priority: 5, Queued: 1}, {Priority: 0, Queued: 2}, {Priority: -3, Queued: 3}}}
	for _, tc := range []struct {
		b    BackendStats
		prio int
		want int
	}{
		{split, 9, 0}, {split, 5, 1}, {split, 1, 1}, {split, 0, 3}, {split, -3, 6}, {split, math.MinInt, 6},
		{BackendStats{Queued: 4}, 7, 4},
	} {
		assert.Equal(t, tc.want, aheadIn(tc.b, Arrival{Priority: tc.prio}), "priority %d of %+v", tc.prio, tc.b)
	}
}

// Flows take turns: an arrival has ahead of it its own flow's waiters and,
// from each other flow, one more than that or all that flow has.
func TestAheadInTheWaitroom(t *testing.T) {
	r := newWaitroom()
	push := func(prio int, flow string, n int) {
		for range n {
			r.push(&waiter{}, prio, flow)
		}
	}
	push(0, "A", 5) // the cursor is on A, then B
	push(0, "B", 1)
	push(2, "C", 2)
	for _, tc := range []struct {
		prio int
		flow string
		want int
	}{
		{3, "A", 0},         // above everyone
		{2, "C", 2},         // behind its own flow
		{2, "D", 1},         // a new flow at 2: one turn of C
		{1, "A", 2},         // a level of its own: only the higher one
		{0, "new", 2 + 2},   // one turn of A and of B
		{0, "B", 2 + 1 + 2}, // B's second: its own 1, two turns of A (before it)
		{0, "A", 2 + 5 + 1}, // A's sixth: its own 5, all of B
		{0, "new", 2 + 2},   // a new flow: one turn of each
	} {
		assert.Equal(t, tc.want, r.ahead(tc.prio, tc.flow, false), "priority %d flow %q", tc.prio, tc.flow)
	}
	// Newest first (CoDel's LIFO): an arrival is its flow's next, so a flow
	// between the cursor and its own gets one turn before it, one after none.
	for _, tc := range []struct {
		prio int
		flow string
		want int
	}{
		{2, "C", 0},     // its flow's next, at the highest priority
		{0, "A", 2},     // the cursor's flow: only the higher priority
		{0, "B", 2 + 1}, // one turn of A first
		{0, "new", 2 + 2},
	} {
		assert.Equal(t, tc.want, r.ahead(tc.prio, tc.flow, true), "newest first: priority %d flow %q", tc.prio, tc.flow)
	}
	// Flows after the arrival's own in the round get as many turns as it has
	// waiters, not one more: with the cursor on A (one waiter) and B, C
	// behind it with three each, A's second waits for A's first and one of
	// each of B and C.
	r = newWaitroom()
	push(0, "A", 1)
	push(0, "B", 3)
	push(0, "C", 3)
	assert.Equal(t, 1+1+1, r.ahead(0, "A", false))
	assert.Equal(t, 3+1+3, r.ahead(0, "B", false), "B's fourth: its own 3, A's only one, C's three (each of C's turns comes before it)")
	assert.Equal(t, 1, r.ahead(0, "B", true), "newest first: one turn of A, none of C")
	assert.Equal(t, 1+1, r.ahead(0, "C", true), "newest first: one turn of A and of B")
}

// The handler-time estimate is a mean per request: nothing but samples move
// it, so an idle period leaves it where it was, and a change of handler
// time shows within a few dozen samples. drainTime saturates.
func TestServiceEstimate(t *testing.T) {
	var m serviceMeter
	_, ok := m.mean()
	assert.False(t, ok, "nothing measured yet")
	for range 100 {
		m.sample(20*time.Millisecond, 1, 1)
	}
	got, ok := m.mean()
	assert.True(t, ok)
	assert.Equal(t, 20*time.Millisecond, got.Round(time.Microsecond))
	m.sample(-time.Second, 1, 1) // a clock step: counted as zero, never negative
	got, _ = m.mean()
	assert.Positive(t, got)
	for range 60 {
		m.sample(100*time.Millisecond, 1, 1)
	}
	got, _ = m.mean()
	assert.InDelta(t, 100, got.Seconds()*1000, 5, "slower handlers show within 60 samples")

	assert.Equal(t, 500*time.Millisecond, drainTime(10, 100*time.Millisecond, 2))
	assert.Equal(t, time.Duration(math.MaxInt64), drainTime(math.MaxInt, time.Duration(math.MaxInt64), 1))
	assert.Equal(t, time.Second, drainTime(1, time.Second, 0), "a limit of 0 counts as 1")
}

// The slot time estimate is a mean over requests, whichever path each took:
// the fast path times one request in serviceEvery and Acquire every one, so
// a sample of the fast path stands for serviceEvery requests. Rounds of 16
// light requests (10 ms, one slot), run at once, and one other, which goes
// through Acquire when it is heavy (40 ms, four slots).
func TestServiceEstimateOfAMixOfPaths(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other string // the 17th request of each round
		want  time.Duration
	}{
		{"one heavy in 17", "c=4&ms=40", (16*10*time.Millisecond + 4*40*time.Millisecond) / 17},
		{"all light", "c=1&ms=10", 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q, err := NewQueue(Config{MaxConcurrent: 4, MaxQueue: 100, QueueTimeout: 500 * time.Millisecond,
					RejectEarly: true, Cost: func(c *gin.Context) int { n, _ := strconv.Atoi(c.Query("c")); return n }})
				require.NoError(t, err)
				defer q.Close()
				r := gin.New()
				r.Use(q.Handler())
				r.GET("/", func(c *gin.Context) {
					ms, _ := strconv.Atoi(c.Query("ms"))
					time.Sleep(time.Duration(ms) * time.Millisecond)
					c.Status(http.StatusOK)
				})
				for round := range 30 { // past the first serviceWeight samples, so the decay is reached
					for i := range 17 {
						url := "/?c=1&ms=10"
						if i == 16 {
							url = "/?" + tc.other
						}
						w := httptest.NewRecorder()
						r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, url, nil))
						require.Equal(t, http.StatusOK, w.Code, url)
					}
					got, ok := q.service.mean()
					require.True(t, ok)
					assert.InEpsilon(t, tc.want.Seconds(), got.Seconds(), 0.25, "after round %d: %v, the mean is %v", round+1, got, tc.want)
				}
			})
		})
	}
}
