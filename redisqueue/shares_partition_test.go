package redisqueue_test

import (
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
					record := recordEvents(rs, 2)
					time.Sleep(500 * time.Millisecond)
					px.setCut(true)
					time.Sleep(d)
					back := time.Now()
					px.setCut(false)
					time.Sleep(time.Second)
					evs := record()
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
