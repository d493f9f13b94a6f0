package redisqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// Outages of the master that the topology tests do not cover, on a Cluster
// and on a Sentinel set: a frozen master, a Shutdown during an outage, an
// idle fleet then a burst.
//
//	go test -race -count=1 -run "Frozen|DuringKill|IdleKill" -v .

// TestFrozenMasterCluster: the master that owns the Name's slot is frozen
// (SIGSTOP: a hung host, or a partition that keeps its TCP connections
// open) rather than killed. The Cluster promotes its replica as for a kill;
// the promise is normal service within 2 s of the new master.
func TestFrozenMasterCluster(t *testing.T) {
	long(t)
	top := clusterTopology(startCluster(t))
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) { runStop(t, top, policy) })
	}
}

// TestFrozenMasterSentinel: the same on a Sentinel set.
func TestFrozenMasterSentinel(t *testing.T) {
	long(t)
	top := sentinelTopology(startSentinel(t))
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) { runStop(t, top, policy) })
	}
}

func runStop(t *testing.T, top topology, policy redisqueue.Policy) {
	r := newTopoRun(t, top, policy, false, 0)
	what := top.kind + " SIGSTOP " + policy.String()
	master, replica := top.owner(t, r.key())
	stopped := top.proc(master)
	stop := r.startLoad()
	time.Sleep(time.Second)
	t0 := time.Now()
	stopped.signal(syscall.SIGSTOP)
	tm := waitPromoted(t, top, replica, 20*time.Second)
	time.Sleep(time.Until(tm.Add(10 * time.Second)))
	stop()
	end := time.Now()
	res := r.analyse(t0, tm, end)
	r.check(t, what, policy, res)
	r.checkIdle(t, what)
	// Per-500 ms view of the answers after the new master, for the report.
	r.mu.Lock()
	buckets := map[int][3]int{} // 200, 408, other
	for _, e := range r.events {
		if e.answered.Before(t0) {
			continue
		}
		if e.code == http.StatusRequestTimeout {
			t.Logf("%s: a 408: came at new master%+.3fs, answered at new master%+.3fs", what,
				e.start.Sub(tm).Seconds(), e.answered.Sub(tm).Seconds())
		}
		if e.answered.Before(tm) {
			continue
		}
		i := int(e.answered.Sub(tm) / (500 * time.Millisecond))
		b := buckets[i]
		switch e.code {
		case http.StatusOK:
			b[0]++
		case http.StatusRequestTimeout:
			b[1]++
		default:
			b[2]++
		}
		buckets[i] = b
	}
	r.mu.Unlock()
	line := ""
	for i := 0; i < 20; i++ {
		b := buckets[i]
		line += fmt.Sprintf(" [+%.1fs 200=%d 408=%d other=%d]", float64(i)*0.5, b[0], b[1], b[2])
	}
	t.Logf("%s: answers by half second from the new master:%s", what, line)
	stopped.signal(syscall.SIGCONT)
	top.heal(t, nil, replica)
}

// TestShutdownDuringKillCluster: one replica of three is shut down
// (a rolling deploy) while the master of the Name's slot is dead, with two
// requests of that replica running; they end during the outage. LeaseTTL
// is 1 min. The promises: releases are retried until Redis is back, so no
// slot is leaked (GlobalStats idle once load stops), and normal service,
// the limit's full capacity included, within 2 s of the new master.
func TestShutdownDuringKillCluster(t *testing.T) {
	long(t)
	runShutdownDuringKill(t, clusterTopology(startCluster(t)))
}

// TestShutdownDuringKillSentinel: the same on a Sentinel set.
func TestShutdownDuringKillSentinel(t *testing.T) {
	long(t)
	runShutdownDuringKill(t, sentinelTopology(startSentinel(t)))
}

func runShutdownDuringKill(t *testing.T, top topology) {
	policy := redisqueue.FailClosed
	r := newTopoRun(t, top, policy, true, time.Minute)
	what := top.kind + " shutdown during kill, LeaseTTL 1m"
	master, replica := top.owner(t, r.key())
	ctx := context.Background()
	gone := r.reps[2]
	hold := make(chan struct{})
	held := make(chan topoEvent, 2)
	for range 2 {
		go func() { ev, _ := r.serve(gone, hold); held <- ev }()
	}
	eventually(t, 2*time.Second, "the two slots were not taken", func() bool {
		if r.mode == redisqueue.Shares {
			return r.conc.Load() == 2 // Redis counts shares, not requests
		}
		s, err := r.reps[0].b.GlobalStats(ctx)
		return err == nil && s.Running == 2 && r.conc.Load() == 2
	})
	if n, err := top.ctl(master).Do(ctx, "WAIT", 1, 1000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 1000: %d, %v", n, err)
	}
	t0 := time.Now()
	killed := top.proc(master)
	killed.kill()
	// The deploy: Shutdown with a grace period that the two requests
	// easily make.
	shut := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		shut <- gone.q.Shutdown(sctx)
	}()
	time.Sleep(50 * time.Millisecond)
	close(hold)
	for range 2 {
		if ev := <-held; ev.code != http.StatusOK {
			t.Fatalf("a held request got %d", ev.code)
		}
	}
	err := <-shut
	t.Logf("%s: Shutdown returned %v after %.2fs", what, err, time.Since(t0).Seconds())
	tm := waitPromoted(t, top, replica, 20*time.Second)
	r.reps = r.reps[:2] // the load runs on the two replicas left
	stop := r.startLoad()
	time.Sleep(time.Until(tm.Add(4 * time.Second)))
	stop()
	end := time.Now()
	if top.mode == redisqueue.Shares {
		// The replica shut down keeps its share in Redis until the call that gives its share back
		// reaches the new master, and a replica left holding none answers
		// 503 while Redis is away (by design): only the resume bound applies.
		r.lost.unshared = true
	}
	r.check(t, what, policy, r.analyse(t0, tm, end))
	r.checkIdle(t, what)
	// How long the leak lasts: the holders' lease expiries on the new master.
	nc := top.ctl(replica).Conn()
	defer nc.Close()
	_ = nc.ReadOnly(ctx).Err()
	zs, _ := nc.ZRangeWithScores(ctx, r.key(), 0, -1).Result()
	tt, _ := nc.Time(ctx).Result()
	for _, z := range zs {
		t.Logf("%s: holder %v on the new master, lease expires in %.1fs", what, z.Member,
			(time.UnixMilli(int64(z.Score)).Sub(tt)).Seconds())
	}
	if r.mode == redisqueue.Shares {
		recs, _ := nc.HGetAll(ctx, "ginqueue:{"+r.name+"}:s").Result()
		t.Logf("%s: share records on the new master (held need prio told queued): %v", what, recs)
	}
	top.heal(t, killed, replica)
}

// TestIdleKillThenBurstCluster: the master of the Name's slot is
// killed while the fleet is idle; 3 s after the new master a burst comes.
// Every request of the burst came more than 2 s after the new master, so
// each must be served normally (no OnRedisDown answer, no 408).
func TestIdleKillThenBurstCluster(t *testing.T) {
	long(t)
	top := clusterTopology(startCluster(t))
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) { runIdleKillBurst(t, top, policy) })
	}
}

// TestIdleKillThenBurstSentinel: the same on a Sentinel set.
func TestIdleKillThenBurstSentinel(t *testing.T) {
	long(t)
	top := sentinelTopology(startSentinel(t))
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) { runIdleKillBurst(t, top, policy) })
	}
}

func runIdleKillBurst(t *testing.T, top topology, policy redisqueue.Policy) {
	r := newTopoRun(t, top, policy, false, 0)
	what := top.kind + " idle kill then burst " + policy.String()
	master, replica := top.owner(t, r.key())
	// A little traffic first, so that every replica has talked to the master.
	for _, rep := range r.reps {
		if ev, _ := r.serve(rep, nil); ev.code != http.StatusOK {
			t.Fatalf("warm-up request got %d", ev.code)
		}
	}
	r.mu.Lock()
	r.events = nil
	r.mu.Unlock()
	t0 := time.Now()
	killed := top.proc(master)
	killed.kill()
	tm := waitPromoted(t, top, replica, 20*time.Second)
	time.Sleep(time.Until(tm.Add(3 * time.Second)))
	burst := time.Now()
	// The first request of the burst on each replica, straight to its
	// Backend, to see what it gets.
	for i, rep := range r.reps {
		go func() {
			tk, err := rep.b.Acquire(context.Background(), backend.Arrival{})
			t.Logf("%s: the burst's first acquire on replica %d: err=%v (after %v)", what, i, err, time.Since(burst).Round(time.Millisecond))
			if err == nil {
				rep.b.Release(tk)
			}
		}()
	}
	stop := r.startLoad()
	time.Sleep(3 * time.Second)
	stop()
	end := time.Now()
	r.mu.Lock()
	abnormal, first, last := 0, time.Duration(0), time.Duration(0)
	for _, e := range r.events {
		if !e.normal() {
			if abnormal == 0 || e.start.Sub(burst) < first {
				first = e.start.Sub(burst)
			}
			last = max(last, e.answered.Sub(burst))
			abnormal++
		}
	}
	total := len(r.events)
	r.mu.Unlock()
	t.Logf("%s: burst at new master+%.2fs: %d of %d requests abnormal, the first came at burst+%v, the last answered at burst+%v",
		what, burst.Sub(tm).Seconds(), abnormal, total, first.Round(time.Millisecond), last.Round(time.Millisecond))
	res := r.analyse(t0, tm, end)
	// Nothing ran before the burst: measure the capacity from the burst on.
	res.under = underUntil(r.capacity(burst, end))
	r.check(t, what, policy, res)
	r.checkIdle(t, what)
	top.heal(t, killed, replica)
}
