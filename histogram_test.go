// The wait histogram, WaitBuckets and the wait percentiles.

package ginqueue_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// The wait histogram counts every served request, those that ran at once in
// the first bucket.
func TestWaitHistogram(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: time.Minute})
		r := newEngine(q.Handler(), sleeper(2*time.Millisecond))
		out := make(chan result, 3)
		burst(r, 3, 0, out) // waits: 0, 2 ms, 4 ms
		for range 3 {
			<-out
		}
		h := q.WaitHistogram()
		assert.EqualValues(t, 3, h.Count)
		assert.InDelta(t, 0.006, h.Sum, 1e-9)
		// Bounds: .0001 .00025 .0005 .001 .0025 .005 ...
		assert.Equal(t, []uint64{1, 1, 1, 1, 2, 3, 3}, h.Counts[:7])
		assert.EqualValues(t, 3, h.Counts[len(h.Counts)-1])
	})
}

// Requests that ran at once count as zero waits: with most requests on the
// fast path, the median wait is zero.
func TestPercentilesCountFastPathAsZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Minute})
		r := newEngine(q.Handler(), sleeper(10*time.Millisecond))
		out := make(chan result, 2)
		burst(r, 2, 0, out) // one waits 10 ms
		<-out
		<-out
		for range 8 { // eight run at once
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		}
		st := q.Stats()
		assert.Zero(t, st.WaitP50)
		assert.Zero(t, st.WaitP90)
		assert.InEpsilon(t, 10*time.Millisecond, st.WaitP99, 0.1)
	})
}

// WaitBuckets hands out a copy: changing it changes nothing in the Queue.
func TestWaitBucketsIsACopy(t *testing.T) {
	b := ginqueue.WaitBuckets()
	require.Len(t, b, len(ginqueue.WaitHistogram{}.Counts))
	assert.InDelta(t, 0.0001, b[0], 1e-12)
	assert.InDelta(t, 60, b[len(b)-1], 1e-12)
	b[0] = 1e9
	assert.InDelta(t, 0.0001, ginqueue.WaitBuckets()[0], 1e-12)
}

// refusingFast is a FastBackend whose TryAcquire always refuses, as when a
// slot frees between the Queue's fast path and its Acquire.
type refusingFast struct{ backend.FastBackend }

func (refusingFast) TryAcquire() uint64 { return 0 }

// A request the in-memory Backend's Acquire serves at once, after the
// Queue's own fast path failed, is counted once in the wait histogram: its
// wait as the Queue records it, not also as a fast grant.
func TestAcquireAtOnceCountsOnceInTheHistogram(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 2, MaxQueue: 4, QueueTimeout: time.Minute,
			Backend: refusingFast{inmem.New().(backend.FastBackend)}})
		r := newEngine(q.Handler(), sleeper(time.Millisecond))
		for range 3 {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			require.Equal(t, http.StatusOK, w.Code)
		}
		h := q.WaitHistogram()
		assert.EqualValues(t, 3, h.Count, "three requests served, each counted once")
		assert.EqualValues(t, 3, q.Stats().Served)
	})
}

// Between half a second and 2.5 s, where queue timeouts and clients'
// patience usually sit, the buckets are a tenth of a second apart up to 1 s
// and a quarter of a second up to 2 s.
func TestWaitBucketsAreFineWhereTimeoutsSit(t *testing.T) {
	b := ginqueue.WaitBuckets()
	at := func(le float64) int {
		for i, x := range b {
			if x == le {
				return i
			}
		}
		t.Fatalf("no bucket %v in %v", le, b)
		return -1
	}
	for _, le := range []float64{.5, .6, .7, .8, .9, 1, 1.25, 1.5, 1.75, 2, 2.5} {
		at(le)
	}
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: time.Minute})
		r := newEngine(q.Handler(), sleeper(750*time.Millisecond))
		out := make(chan result, 3)
		burst(r, 3, 0, out) // waits: 0, 750 ms, 1.5 s
		for range 3 {
			<-out
		}
		h := q.WaitHistogram()
		assert.EqualValues(t, 1, h.Counts[at(.7)])
		assert.EqualValues(t, 2, h.Counts[at(.8)])
		assert.EqualValues(t, 2, h.Counts[at(1.25)])
		assert.EqualValues(t, 3, h.Counts[at(1.5)])
	})
}
