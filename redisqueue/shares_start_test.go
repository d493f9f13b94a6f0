package redisqueue_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
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

// A replica of a fleet of a thousand that holds no share answers 503 once
// Redis stops answering (paused: calls wait for their CallTimeout), after
// a probe that waited a second found it still down. Here 1,024 idle
// replicas, then Redis paused for 10 s and one request sent to each:
// every replica answers it 503 within 6 s, none 408 (QueueTimeout 10 s),
// and the test prints when they did.
func TestFleetScaleAnswersUnavailableWhenRedisStops(t *testing.T) {
	if testing.Short() {
		t.Skip("a thousand replicas")
	}
	if raceEnabled {
		t.Skip("a thousand replicas: run without -race")
	}
	const n, limit, hold = 1024, 512, 10 * time.Second
	srv := startRedis(t)
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: hold}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares}
	rs := make([]*replica, n)
	var starts sync.WaitGroup
	for i := range rs {
		starts.Go(func() {
			rdb := redis.NewClient(&redis.Options{Addr: srv.addr(), ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 2})
			rs[i] = newReplicaOn(t, rdb, cfg, o, func(*gin.Context) {})
		})
	}
	starts.Wait()
	eventually(t, 10*time.Second, "the fleet did not settle", func() bool {
		for _, r := range rs {
			if r.b.Stats().Unavailable {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second)
	out := time.Now()
	pause(t, srv, hold)
	answered := make([]time.Duration, n)
	codes := make([]int, n)
	var clients sync.WaitGroup
	for i, r := range rs {
		clients.Go(func() {
			codes[i] = r.get()
			answered[i] = time.Since(out)
		})
	}
	clients.Wait()
	var refused []time.Duration
	count := map[int]int{}
	for i, c := range codes {
		count[c]++
		if c == http.StatusServiceUnavailable {
			refused = append(refused, answered[i])
		}
	}
	slices.Sort(refused)
	if len(refused) == 0 {
		t.Fatalf("no replica answered 503 while Redis was paused for %v: %v", hold, count)
	}
	q := func(f float64) time.Duration {
		return refused[int(f*float64(len(refused)-1))].Round(10 * time.Millisecond)
	}
	t.Logf("answers %v; 503 after Redis paused: first %v, median %v, 90th percentile %v, last %v",
		count, q(0), q(0.5), q(0.9), q(1))
	if count[http.StatusRequestTimeout] > 0 {
		t.Errorf("%d replicas answered 408: they waited their QueueTimeout (%v) for a share nobody could move",
			count[http.StatusRequestTimeout], hold)
	}
	if last := refused[len(refused)-1]; last > 6*time.Second {
		t.Errorf("the last 503 came %v after Redis was paused", last)
	}
}
