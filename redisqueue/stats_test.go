package redisqueue_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// Stats keeps the Queue's promises with this backend too: the split by
// priority adds up to Queued, OldestWait is the oldest local waiter's, and
// Served is never below Running.
func TestStatsSplitAndOldestWait(t *testing.T) {
	needRedis(t)
	t.Parallel()
	release := make(chan struct{})
	prio := func(c *gin.Context) int { p, _ := strconv.Atoi(c.Query("p")); return p }
	r := newReplica(t, redisAddr, ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 10 * time.Second, Priority: prio},
		redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue}, func(c *gin.Context) { <-release })
	done := make(chan int, 3)
	for _, p := range []string{"0", "0", "7"} {
		go func() {
			w := httptest.NewRecorder()
			r.e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/?p="+p, nil))
			done <- w.Code
		}()
		time.Sleep(50 * time.Millisecond)
	}
	eventually(t, 2*time.Second, "two waiters", func() bool { return r.q.Stats().Queued == 2 })
	st := r.q.Stats()
	sum := 0
	for _, p := range st.QueuedByPriority {
		sum += p.Queued
	}
	if sum != st.Queued || len(st.QueuedByPriority) == 0 || st.QueuedByPriority[0].Priority < st.QueuedByPriority[len(st.QueuedByPriority)-1].Priority {
		t.Fatalf("Queued %d, split %v", st.Queued, st.QueuedByPriority)
	}
	if st.OldestWait <= 0 {
		t.Fatalf("OldestWait %v with two waiters", st.OldestWait)
	}
	if uint64(st.Running) > st.Served {
		t.Fatalf("Running %d above Served %d", st.Running, st.Served)
	}
	close(release)
	for range 3 {
		if code := <-done; code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
	}
	if st := r.q.Stats(); st.QueuedByPriority != nil || st.Queued != 0 {
		t.Fatalf("after: %+v", st)
	}
}
