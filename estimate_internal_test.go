// RejectEarly's and Retry-After's estimates: who is ahead, slot time, drain rate.

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
	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The waiters served before an arrival, for another Backend: its priority
// and higher, or everyone when the Backend gives no split.
func TestAheadInOtherBackends(t *testing.T) {
	split := backend.Stats{Queued: 6, QueuedByPriority: []backend.PriorityCount{{Priority: 5, Queued: 1}, {Priority: 0, Queued: 2}, {Priority: -3, Queued: 3}}}
	for _, tc := range []struct {
		b    backend.Stats
		prio int
		want int
	}{
		{split, 9, 0}, {split, 5, 1}, {split, 1, 1}, {split, 0, 3}, {split, -3, 6}, {split, math.MinInt, 6},
		{backend.Stats{Queued: 4}, 7, 4},
	} {
		assert.Equal(t, tc.want, aheadIn(tc.b, backend.Arrival{Priority: tc.prio}), "priority %d of %+v", tc.prio, tc.b)
	}
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

// The drain rate covers about ten seconds however often it is asked: a burst
// of 100 finished requests 5 s ago still counts.
func TestDrainRateCoversItsWindow(t *testing.T) {
	var m drainMeter
	t0 := time.Unix(0, 0)
	m.rate(t0, 0)
	done := uint64(100) // a burst in the first second
	for at := time.Second; at <= 5*time.Second; at += 100 * time.Millisecond {
		rate, ok := m.rate(t0.Add(at), done)
		require.True(t, ok)
		if at == 5*time.Second {
			assert.InDelta(t, 140.0/5, rate, 1e-9, "the base must still be the sample at the start")
		}
		done++ // then 10 a second
	}
}
