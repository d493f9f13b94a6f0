package ginqueue_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"

	"github.com/ginqueue/ginqueue"
)

// mixEngine serves GET /?c=<cost>&ms=<handler time> behind q.
func mixEngine(q *ginqueue.Queue) *gin.Engine {
	r := gin.New()
	r.Use(q.Handler())
	r.GET("/", func(c *gin.Context) {
		ms, _ := strconv.Atoi(c.Query("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		c.Status(http.StatusOK)
	})
	return r
}

// serveMix sends rounds of 16 light requests (10 ms, one slot) and one
// other, one at a time, so that the light ones run at once (on the fast
// path, which times one in 16) and a heavy one goes through Acquire (which
// times every request).
func serveMix(t *testing.T, r http.Handler, rounds int, other string) {
	t.Helper()
	for range rounds {
		for i := range 17 {
			url := "/?c=1&ms=10"
			if i == 16 {
				url = "/?" + other
			}
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, url, nil))
			if w.Code != http.StatusOK {
				t.Fatalf("warm-up %s: status %d", url, w.Code)
			}
		}
	}
}

// RejectEarly judges a queue by the mean slot time of the requests served,
// each request counting once whichever path it took: one heavy request in
// 17 must not make the light ones look four times their slot time. After
// 16 light requests (10 ms, one slot) to one heavy (40 ms, four slots), a
// mean slot time of about 19 ms, a burst of 60 light requests on 4 slots,
// the last of which waits 140 ms, fits in a QueueTimeout of 500 ms.
func TestRejectEarlyJudgesTheMixOfCosts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other string // the 17th request of each warm-up round
	}{
		{"one heavy in 17", "c=4&ms=40"},
		{"all light", "c=1&ms=10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 100, QueueTimeout: 500 * time.Millisecond,
					RejectEarly: true, Cost: byQueryCost})
				r := mixEngine(q)
				serveMix(t, r, 30, tc.other) // 60 samples: the decay of the older ones is reached

				const burst = 60
				codes := make(chan int, burst)
				for range burst {
					go func() {
						w := httptest.NewRecorder()
						r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?c=1&ms=10", nil))
						codes <- w.Code
					}()
				}
				synctest.Wait()
				st := q.Stats()
				assert.Equal(t, 4, st.Running)
				assert.Equal(t, burst-4, st.Queued, "the burst, less the 4 that run, waits (the last 140 ms)")
				got := map[int]int{}
				for range burst {
					got[<-codes]++
				}
				assert.Equal(t, map[int]int{http.StatusOK: burst}, got, "statuses of the burst")
				st = q.Stats()
				assert.Zero(t, st.QueueFull, "refused by RejectEarly")
				assert.Zero(t, st.QueueTimeout)
			})
		})
	}
}
