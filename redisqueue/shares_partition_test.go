package redisqueue_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// A partition that swallows what is sent during it (holeProxy), under
// load, in Shares mode with two replicas: the first request after it heals
// is served within 200 ms. A probe sent during the partition is never
// answered; when probes waited up to a second for their answers in any
// fleet, it held the coordinator that long after the partition healed.
func TestSharesServeSoonAfterAPartitionHeals(t *testing.T) {
	for _, ct := range []time.Duration{redisqueue.DefaultCallTimeout} {
		for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
			t.Run(policy.String()+"/"+ct.String(), func(t *testing.T) {
				srv := startRedis(t)
				px := newHoleProxy(t, srv.addr())
				var f fleetCounter
				cfg := ginqueue.Config{MaxConcurrent: 4, MaxQueue: 16, QueueTimeout: 2 * time.Second}
				o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, OnRedisDown: policy, CallTimeout: ct, LeaseTTL: time.Second}
				rs := []*replica{newReplica(t, px.addr(), cfg, o, f.handler(5*time.Millisecond)),
					newReplica(t, px.addr(), cfg, o, f.handler(5*time.Millisecond))}
				for round, d := range []time.Duration{2500 * time.Millisecond, 3100 * time.Millisecond} {
					stop := make(chan struct{})
					var wg sync.WaitGroup
					var mu sync.Mutex
					type ev struct {
						at   time.Time
						code int
					}
					var evs []ev
					for _, r := range rs {
						for range 2 {
							wg.Go(func() {
								for {
									select {
									case <-stop:
										return
									default:
									}
									w := httptest.NewRecorder()
									r.e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
									mu.Lock()
									evs = append(evs, ev{time.Now(), w.Code})
									mu.Unlock()
									if w.Code != 200 {
										time.Sleep(2 * time.Millisecond)
									}
								}
							})
						}
					}
					time.Sleep(500 * time.Millisecond)
					px.setCut(true)
					time.Sleep(d)
					back := time.Now()
					px.setCut(false)
					time.Sleep(time.Second)
					close(stop)
					wg.Wait()
					first := time.Duration(-1)
					codes := map[int]int{}
					for _, e := range evs {
						if e.at.After(back) {
							codes[e.code]++
							if e.code == 200 && first < 0 {
								first = e.at.Sub(back)
							}
						}
					}
					t.Logf("round %d (cut %v): first 200 %v after the partition healed; after it: %v; peak %d", round, d, first.Round(time.Millisecond), codes, f.peak.Load())
					if first < 0 || first > 200*time.Millisecond {
						t.Errorf("round %d: first 200 %v after the partition healed", round, first.Round(time.Millisecond))
					}
				}
			})
		}
	}
}
