package redisqueue_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// A fleet of 1,024 replicas that all start at once, each with two clients
// sending requests from its start, on one Redis: the first calls come back
// after their CallTimeout and mark Redis down, but no request is answered
// 503 or 408, every replica has Redis marked up again within seconds, and
// the fleet never runs more than its limit. The replicas used to answer
// 503 from their first probe that ran out of time, and stayed marked down
// for tens of seconds: every probe was given up before its late answer and
// sent again, and those probes alone kept Redis and the replicas that busy.
func TestFleetScaleStartsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("a thousand replicas")
	}
	if raceEnabled {
		t.Skip("a thousand replicas: run without -race")
	}
	const n, limit = 1024, 512
	srv := startRedis(t)
	var f fleetCounter
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 5 * time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares}
	var codes [6]atomic.Int64
	stop := make(chan struct{})
	var clients, starts sync.WaitGroup
	rs := make([]*replica, n)
	for i := range rs {
		starts.Go(func() {
			rdb := redis.NewClient(&redis.Options{Addr: srv.addr(), ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 2})
			rs[i] = newReplicaOn(t, rdb, cfg, o, f.handler(20*time.Millisecond))
			for range 2 {
				clients.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						w := httptest.NewRecorder()
						rs[i].e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
						codes[min(w.Code/100, 5)].Add(1)
						if w.Code != http.StatusOK {
							time.Sleep(20 * time.Millisecond) // no spinning on refusals
						}
					}
				})
			}
		})
	}
	starts.Wait()
	time.Sleep(8 * time.Second)
	close(stop)
	clients.Wait()
	var outages uint64
	down := 0
	for _, r := range rs {
		s := r.b.Stats()
		outages += s.Outages
		if s.Unavailable {
			down++
		}
	}
	t.Logf("2xx %d, 4xx %d, 5xx %d; Redis marked down %d times, by %d replicas at the end; peak %d of %d",
		codes[2].Load(), codes[4].Load(), codes[5].Load(), outages, down, f.peak.Load(), limit)
	if codes[4].Load() > 0 || codes[5].Load() > 0 {
		t.Errorf("%d × 4xx and %d × 5xx to a fleet that started at once", codes[4].Load(), codes[5].Load())
	}
	if down > 0 {
		t.Errorf("%d replicas had Redis marked down 8 s after the fleet started", down)
	}
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d running across the fleet, limit %d", p, limit)
	}
}
