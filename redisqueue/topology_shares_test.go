package redisqueue_test

import (
	"context"
	"net/http"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// The topology suites in Shares mode: the same Cluster and Sentinel set,
// the same failovers under the same load, with every replica leasing a
// share of the limit. A request never calls Redis there, so the targets
// differ from GlobalQueue's (topology_test.go):
//
//   - the limit is never exceeded, at any time of the run (not only in
//     steady state), a failover that lost the last writes included;
//   - a failover that ends, and whose new master the replicas reach, within
//     the shares' lease goes unnoticed: every request after the trigger is
//     served normally (no OnRedisDown answer, no 408); one that outlasts
//     the lease gives FailClosed's 503s (never 408s) until normal service
//     resumes, within 2 s of the new master, as in GlobalQueue; so does a
//     replica that held no share when Redis went away (lost-writes);
//   - the limit's full capacity is back within 2 s of the new master;
//   - nobody waits past QueueTimeout (no Redis call on a request's path);
//   - the replicas call Redis to move shares, not per request.
//
//	go test -race -count=1 -run 'Shares$' -v .

func TestTopologyClusterShares(t *testing.T) {
	long(t)
	top := clusterTopology(startCluster(t))
	top.mode = redisqueue.Shares
	runTopology(t, top)
}

func TestTopologySentinelShares(t *testing.T) {
	long(t)
	top := sentinelTopology(startSentinel(t))
	top.mode = redisqueue.Shares
	runTopology(t, top)
}

func TestFrozenMasterClusterShares(t *testing.T) {
	long(t)
	top := clusterTopology(startCluster(t))
	top.mode = redisqueue.Shares
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) { runStop(t, top, policy) })
	}
}

func TestFrozenMasterSentinelShares(t *testing.T) {
	long(t)
	top := sentinelTopology(startSentinel(t))
	top.mode = redisqueue.Shares
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) { runStop(t, top, policy) })
	}
}

// TestShutdownDuringKillClusterShares: in Shares mode the replica shut
// down during the outage says goodbye to Redis once its requests end; the
// promise is the same: nothing is leaked (only the live replicas hold
// shares once the load stops) and the full capacity is back within 2 s of
// the new master, although LeaseTTL is 1 min.
func TestShutdownDuringKillClusterShares(t *testing.T) {
	long(t)
	top := clusterTopology(startCluster(t))
	top.mode = redisqueue.Shares
	runShutdownDuringKill(t, top)
}

func TestShutdownDuringKillSentinelShares(t *testing.T) {
	long(t)
	top := sentinelTopology(startSentinel(t))
	top.mode = redisqueue.Shares
	runShutdownDuringKill(t, top)
}

func TestIdleKillThenBurstClusterShares(t *testing.T) {
	long(t)
	top := clusterTopology(startCluster(t))
	top.mode = redisqueue.Shares
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) { runIdleKillBurst(t, top, policy) })
	}
}

func TestIdleKillThenBurstSentinelShares(t *testing.T) {
	long(t)
	top := sentinelTopology(startSentinel(t))
	top.mode = redisqueue.Shares
	for _, policy := range []redisqueue.Policy{redisqueue.FailClosed, redisqueue.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) { runIdleKillBurst(t, top, policy) })
	}
}

// tracedShares is traced for a Shares-mode Backend: the Queue acquires
// through the Backend's fast path, whose Acquire is traced too.
type tracedShares struct{ traced }

func (b tracedShares) FastPath() backend.FastBackend {
	return tracedFast{b.Backend.FastPath(), b.traced}
}

type tracedFast struct {
	backend.FastBackend
	tr traced
}

// Acquire is the fast path's when no slot was free: the Backend's, traced.
func (f tracedFast) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	return f.tr.Acquire(ctx, a)
}

// callCount is a go-redis hook that counts the commands a client sends.
type callCount struct{ n atomic.Int64 }

func (c *callCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *callCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *callCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// lostShare is an overrun a check allows: by slots, until. unshared is set
// when the load moves,
// after the trigger, to replicas that held no share: they have nothing to
// ride the failover on and answer 503 until they reach the new master, so
// only the resume bound applies.
type lostShare struct {
	slots    int
	until    time.Time
	unshared bool
}

// topoCallsPerRequest bounds the commands the replicas' clients send per
// request served while the load runs: a Shares replica calls Redis every
// SharePeriod and when its demand moves, not per request (GlobalQueue
// makes two calls or more per request).
const topoCallsPerRequest = 0.5

// checkShares is check in Shares mode: it logs res and reports every
// target of the top of this file that it misses.
func (r *topoRun) checkShares(t *testing.T, what string, policy redisqueue.Policy, res topoResult) {
	t.Helper()
	what = "shares " + what
	r.mu.Lock()
	over, allowed, served := 0, 0, 0
	for _, e := range r.events {
		switch {
		case e.conc <= topoLimit:
		case e.conc <= topoLimit+r.lost.slots && e.ran.Before(r.lost.until):
			allowed++
		default:
			over++
		}
		if e.code == http.StatusOK {
			served++
		}
	}
	r.mu.Unlock()
	calls := r.loadCalls.Load()
	perRequest := float64(calls) / float64(max(served, 1))
	// The shares' lease covers the failover if the replicas reach the new
	// master before it runs out: it was renewed at the last sync before the
	// trigger (within a period and a call) and lasts 99% of LeaseTTL.
	rideUntil := r.lease*99/100 - redisqueue.DefaultSharePeriod - topoCallTimeout
	ride := res.newMaster+topoResumeBound < rideUntil && !r.lost.unshared
	abnormal := res.timeouts + res.policy + res.full + res.other
	t.Logf("%s: new master %.2fs after the trigger, LeaseTTL %v (rides it through: %v); after the trigger 408=%d "+
		"policy=%d full=%d other=%d, from new master+2s on: %d abnormal; longest wait %v; peak concurrency %d, %d requests "+
		"above the limit (and %d within the share a lost write forgot); short of the limit until new master+%.1fs; %d Redis commands for %d requests served (%.3f each); "+
		"capacity from the new master: %s",
		what, res.newMaster.Seconds(), r.lease, ride, res.timeouts, res.policy, res.full, res.other, res.late,
		res.maxWait.Round(time.Millisecond), res.peak, over, allowed, res.under.Seconds(), calls, served, perRequest, res.capacity)
	if over > 0 {
		t.Errorf("%s: %d requests ran above the limit of %d (peak %d; slots forgotten by a lost write: %d)",
			what, over, topoLimit, res.peak, r.lost.slots)
	}
	switch {
	case ride && abnormal > 0:
		t.Errorf("%s: the failover ended within the shares' lease, yet %d requests after the trigger were not served "+
			"normally (408=%d policy=%d full=%d other=%d)", what, abnormal, res.timeouts, res.policy, res.full, res.other)
	case !res.resumed:
		t.Errorf("%s: normal service (%d requests in a row) never resumed", what, topoResumeRun)
	case res.resume > res.newMaster+topoResumeBound:
		t.Errorf("%s: normal service resumed %v after the new master, want within %v", what,
			(res.resume - res.newMaster).Round(time.Millisecond), topoResumeBound)
	}
	if res.late > 0 {
		t.Errorf("%s: %d requests that came %v or more after the new master were not served normally", what, res.late, topoResumeBound)
	}
	if res.under > topoResumeBound {
		t.Errorf("%s: the fleet ran short of its limit of %d until %v after the new master, want within %v (capacity: %s)",
			what, topoLimit, res.under, topoResumeBound, res.capacity)
	}
	if bound := topoQueueTimeout + topoSlack; res.maxWait > bound {
		t.Errorf("%s: a request waited %v, want at most QueueTimeout (%v)", what, res.maxWait, bound)
	}
	if policy == redisqueue.FailClosed && res.timeouts > 0 {
		t.Errorf("%s: FailClosed answered %d requests 408, want 503", what, res.timeouts)
	}
	if served > 0 && perRequest > topoCallsPerRequest {
		t.Errorf("%s: %.3f Redis commands per request served, want at most %.1f: a share is not a call per request",
			what, perRequest, topoCallsPerRequest)
	}
}

// runLostWritesShares is runLostWrites in Shares mode: with the replica of
// the Name's master stopped (SIGSTOP, its link cut), the shares move to
// replica 0 on the master alone; the master is then killed and the replica,
// continued, promoted without that move. Replica 0 still runs on the whole
// limit, and the others, with demand again, sync with a master that counts
// their old shares as theirs and replica 0's old one as its own: if they
// sync before replica 0 does, their shares would grow from slots it runs
// on. The first of them finds that the new master forgot syncs it had seen,
// and no share grows until replica 0 has synced too: the limit holds.
func runLostWritesShares(t *testing.T, top topology) {
	r := newTopoRun(t, top, redisqueue.FailClosed, true, 0)
	what := top.kind + " lost-writes"
	master, replica := top.owner(t, r.key())
	ctx := context.Background()
	all := r.reps
	shares := func() []int {
		var s []int
		for _, rep := range all {
			s = append(s, rep.b.Stats().Limit)
		}
		return s
	}
	stop := r.startLoad()
	eventually(t, 3*time.Second, "the shares did not settle", func() bool {
		s := shares()
		return slices.Min(s) > 0 && s[0]+s[1]+s[2] == topoLimit
	})
	time.Sleep(300 * time.Millisecond)
	mc := top.ctl(master)
	if n, err := mc.Do(ctx, "WAIT", 1, 1000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 1000: %d, %v", n, err)
	}
	// What the master acknowledges from now on stays in its backlog.
	top.proc(replica).signal(syscall.SIGSTOP)
	if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE replica: %v", err)
	}
	settled := shares()
	stop()
	r.reps = all[:1]
	stop = r.startLoad() // every client on replica 0: the shares move to it
	eventually(t, 3*time.Second, "the shares did not move to replica 0", func() bool {
		s := shares()
		return s[0] == topoLimit && s[1] == 0 && s[2] == 0
	})
	moved := shares()
	recs, err := mc.HGetAll(ctx, "ginqueue:{"+r.name+"}:s").Result()
	if err != nil {
		t.Fatal(err)
	}
	var zero string // replica 0's id: the one that holds the whole limit now
	for id, rec := range recs {
		if heldOf(rec) == topoLimit {
			zero = id
		}
	}
	if zero == "" {
		t.Fatalf("no record holds the whole limit on the master: %v", recs)
	}
	t0 := time.Now()
	killed := top.proc(master)
	killed.kill()
	top.proc(replica).signal(syscall.SIGCONT)
	conn := top.ctl(replica).Conn()
	_ = conn.ReadOnly(ctx).Err() // a cluster replica answers reads after READONLY; elsewhere an error, ignored
	kept, err := conn.HGetAll(ctx, "ginqueue:{"+r.name+"}:s").Result()
	_ = conn.Close()
	if err != nil {
		t.Fatalf("HGETALL of the shares on %s: %v", replica, err)
	}
	tm := waitPromoted(t, top, replica, 20*time.Second)
	forgot := topoLimit - max(heldOf(kept[zero]), 0)
	r.lost = lostShare{until: tm.Add(topoResumeBound), unshared: true}
	r.reps = all[1:]
	stop2 := r.startLoad() // demand on the others again
	time.Sleep(time.Until(tm.Add(3 * time.Second)))
	atEnd := shares()
	stop2()
	stop()
	r.reps = all
	end := time.Now()
	overBy, overFor := 0, time.Duration(0)
	capa := r.capacity(tm, end)
	for i, c := range capa {
		if c > topoLimit {
			overBy = max(overBy, c-topoLimit)
			overFor = time.Duration(i+1) * topoBucket
		}
	}
	t.Logf("shares %s: shares settled %v, moved to replica 0 %v on the old master alone; the new master (%.2fs after the kill) "+
		"started from the records %v, %d of replica 0's slots forgotten; shares at the end of the load %v; "+
		"over the limit by up to %d until new master+%.1fs",
		what, settled, moved, tm.Sub(t0).Seconds(), kept, forgot, atEnd, overBy, overFor.Seconds())
	res := r.analyse(t0, tm, end)
	r.check(t, what, redisqueue.FailClosed, res)
	r.checkIdle(t, what)
	top.heal(t, killed, replica)
}
