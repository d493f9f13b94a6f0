package redisqueue_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// fleetCounter counts the requests running across a fleet, outside the
// library, and keeps the peak and a running sum for the mean.
type fleetCounter struct {
	now, peak atomic.Int64
}

func (f *fleetCounter) handler(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		n := f.now.Add(1)
		for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
		}
		time.Sleep(d)
		f.now.Add(-1)
	}
}

// sharesFleet builds n replicas of one Name in Shares mode, on one Redis.
func sharesFleet(t *testing.T, n int, cfg ginqueue.Config, o redisqueue.Options, h gin.HandlerFunc) []*replica {
	t.Helper()
	if o.Name == "" {
		o.Name = newName(t)
	}
	o.Mode = redisqueue.Shares
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = newReplica(t, redisAddr, cfg, o, h)
	}
	return rs
}

// drive runs clients closed-loop clients on each replica (clients[i] on
// rs[i]) for d and returns the statuses each replica answered.
func drive(rs []*replica, clients []int, d time.Duration) []map[int]int {
	out := make([]map[int]int, len(rs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i, r := range rs {
		out[i] = map[int]int{}
		for range clients[i] {
			wg.Go(func() {
				for time.Now().Before(end) {
					code := r.get()
					mu.Lock()
					out[i][code]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return out
}

func TestSharesKeepTheLimitUnderUnevenLoad(t *testing.T) {
	needRedis(t)
	var f fleetCounter
	cfg := ginqueue.Config{MaxConcurrent: 16, MaxQueue: 64, QueueTimeout: 2 * time.Second}
	rs := sharesFleet(t, 4, cfg, redisqueue.Options{}, f.handler(5*time.Millisecond))
	out := drive(rs, []int{2, 2, 2, 26}, 2*time.Second)
	for i, o := range out {
		t.Logf("replica %d: %v share %d", i, o, rs[i].b.Stats().Limit)
	}
	if p := f.peak.Load(); p > 16 {
		t.Fatalf("peak %d running across the fleet, limit 16", p)
	}
}
