package redisqueue_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// The tests of this file hold redisqueue to its promise: never more
// requests (cost) running across all replicas than MaxConcurrent. Each runs
// a fleet of OS processes (fleetMain) on a redis-server of its own, and
// counts the running handlers outside the library, in a counter on another
// Redis (redisAddr): INCRBY cost as a handler starts, DECRBY cost as it
// ends. Each replica reports the most it saw running and when.

// limitFleet is a fleet of replicas, one spec each, started at once.
type limitFleet struct {
	specs []fleetSpec
	procs []*fleetProc
	ctr   *redis.Client // the counter's Redis
}

// limitSpec is the spec every replica of a test starts from: a fleet on
// srv, counting on redisAddr, 50 ms handlers, limit limit.
func limitSpec(t *testing.T, srv *redisServer, mode redisqueue.Mode, policy redisqueue.Policy, limit int) fleetSpec {
	counter := "ginqueue-test:" + newName(t)
	ctr := newClient(t, redisAddr)
	t.Cleanup(func() {
		_ = ctr.Del(context.Background(), counter, counter+":raw").Err()
	})
	return fleetSpec{Addr: srv.addr(), CounterAddr: redisAddr, Counter: counter, Name: newName(t),
		Policy: policy, Shares: mode == redisqueue.Shares, Limit: limit, Handler: 50 * time.Millisecond, QueueTimeout: 2 * time.Second}
}

// startLimitFleet starts a replica of each spec and waits until all are
// ready.
func startLimitFleet(t *testing.T, specs ...fleetSpec) *limitFleet {
	t.Helper()
	f := &limitFleet{specs: specs, ctr: newClient(t, redisAddr)}
	for _, s := range specs {
		f.procs = append(f.procs, startFleetProc(t, s))
	}
	for _, p := range f.procs {
		p.ready(t)
	}
	return f
}

// results waits for every replica's result.
func (f *limitFleet) results(t *testing.T) []fleetResult {
	t.Helper()
	var rs []fleetResult
	for i, p := range f.procs {
		rs = append(rs, p.result(t, f.specs[i].Run+20*time.Second))
	}
	return rs
}

// withLive gives every spec a hash of its running handlers, for dropLive.
func withLive(t *testing.T, specs []fleetSpec) {
	ctr := newClient(t, redisAddr)
	for i := range specs {
		specs[i].Live = fmt.Sprintf("%s:live:%d", specs[i].Counter, i)
		live := specs[i].Live
		t.Cleanup(func() { _ = ctr.Del(context.Background(), live).Err() })
	}
}

// dropLiveScript takes the handlers entered in a replica's hash (KEYS[2])
// off the counter (KEYS[1]) and returns their cost.
var dropLiveScript = redis.NewScript(`
local n = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do n = n + tonumber(v) end
redis.call('DEL', KEYS[2])
redis.call('DECRBY', KEYS[1], n)
return n`)

// dropLive takes the handlers running on the replica of s, which is
// stopped, off the counter: a request that runs on past its lease in a
// frozen process is beyond what the fleet can see, and the others may take
// its slots. Its handlers leave the counter alone when they end.
func (f *limitFleet) dropLive(t *testing.T, s fleetSpec) int64 {
	t.Helper()
	n, err := dropLiveScript.Run(context.Background(), f.ctr, []string{s.Counter, s.Live}).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// running returns the cost running now on each replica, by its hash of
// running handlers.
func (f *limitFleet) running() []int64 {
	ns := make([]int64, len(f.specs))
	for i, s := range f.specs {
		vals, _ := f.ctr.HVals(context.Background(), s.Live).Result()
		for _, v := range vals {
			var c int64
			_, _ = fmt.Sscan(v, &c)
			ns[i] += c
		}
	}
	return ns
}

// pick returns the replica to freeze. In Shares mode it is the one with
// the most running, which holds the largest share: it admits within it
// again as it resumes. In GlobalQueue mode it is the one with the fewest
// running, so the most waiting: a grant that Redis sends one of its
// waiters while it is frozen is read as it resumes.
func (f *limitFleet) pick(mode redisqueue.Mode) int {
	ns := f.running()
	best := 0
	for i, n := range ns {
		if mode == redisqueue.Shares && n > ns[best] || mode != redisqueue.Shares && n < ns[best] {
			best = i
		}
	}
	return best
}

// since lists the times of ms as offsets from t0.
func since(t0 time.Time, ms []int64) []time.Duration {
	var ds []time.Duration
	for _, m := range ms {
		ds = append(ds, time.UnixMilli(m).Sub(t0).Round(time.Millisecond))
	}
	return ds
}

// countFrom counts the times of ms at or after t0.
func countFrom(t0 time.Time, ms []int64) int {
	n := 0
	for _, m := range ms {
		if !time.UnixMilli(m).Before(t0.Truncate(time.Millisecond)) {
			n++
		}
	}
	return n
}

// checkPeaks fails t for each replica whose counter saw more than limit
// running, naming when (from t0, the fault) and how often.
func checkPeaks(t *testing.T, rs []fleetResult, limit int, t0 time.Time, what string) {
	t.Helper()
	for i, r := range rs {
		at := "never"
		if r.PeakAt != 0 {
			at = time.UnixMilli(r.PeakAt).Sub(t0).Round(time.Millisecond).String()
		}
		t.Logf("replica %d: peak %d at %s (raw %d), %d starts over the limit, responses %v, outages %d, stall %v, local %d, longest %v",
			i, r.Peak, at, r.RawPeak, len(r.Over), r.Codes, r.Outages, r.Stall.Round(time.Millisecond), r.Local,
			r.Longest.Round(time.Millisecond))
		if r.Peak > int64(limit) {
			over := since(t0, r.Over)
			if len(over) > 5 {
				over = append(over[:5:5], over[len(over)-1])
			}
			t.Errorf("replica %d saw %d running at once across the fleet, limit %d, first at %s from %s; "+
				"%d handlers started there over the limit (at %v)", i, r.Peak, limit, at, what, len(r.Over), over)
		}
	}
}

var (
	limitModes    = []redisqueue.Mode{redisqueue.GlobalQueue, redisqueue.Shares}
	limitPolicies = []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed}
)

// TestFleetLimitCostInShares: in Shares mode with Config.Cost, replica A
// sends cost-4 requests (1 client) and replica B cost-1 requests (8
// clients), 50 ms handlers, under a limit of 4. The counter outside the
// library must never see more than 4 slots running.
func TestFleetLimitCostInShares(t *testing.T) {
	long(t)
	needRedis(t)
	srv := startRedis(t)
	base := limitSpec(t, srv, redisqueue.Shares, redisqueue.FailOpen, 4)
	base.Run = 6 * time.Second
	a, b := base, base
	a.Cost, a.Workers = 4, 1
	b.Cost, b.Workers = 1, 8
	start := time.Now()
	f := startLimitFleet(t, a, b)
	rs := f.results(t)
	over := 0
	for _, r := range rs {
		over += len(r.Over)
	}
	t.Logf("%d handlers started over the limit in %v", over, base.Run)
	checkPeaks(t, rs, base.Limit, start, "the start")
	for i, r := range rs {
		if r.Codes[200] == 0 {
			t.Errorf("replica %d served nothing (%v): the mix was not tested", i, r.Codes)
		}
	}
}

// TestFleetLimitFrozenReplica: one replica of a fleet under load is frozen
// (SIGSTOP) for 3 s, past its 1 s lease, while the others go on and take
// its slots; then it resumes (SIGCONT). The requests it was running when
// frozen are taken off the counter outside the library (dropLive): they
// run on past their lease, which the fleet cannot see. What the promise
// covers is what comes next: the resumed replica must not start requests
// while the others hold the whole limit, neither on the share it held nor
// for the waiters it had (their QueueTimeout outlasts the freeze). For 3
// replicas under a limit of 12 and 2 under a limit of 1, in both modes and
// under both policies; pick says which replica is frozen.
func TestFleetLimitFrozenReplica(t *testing.T) {
	long(t)
	needRedis(t)
	const lease, frozen = time.Second, 3 * time.Second
	shapes := []struct{ replicas, limit, workers int }{{3, 12, 12}, {2, 1, 3}}
	for _, sh := range shapes {
		for _, mode := range limitModes {
			for _, policy := range limitPolicies {
				name := fmt.Sprintf("%dx%d/%s/%s", sh.replicas, sh.limit, mode, policy)
				t.Run(name, func(t *testing.T) {
					srv := startRedis(t)
					base := limitSpec(t, srv, mode, policy, sh.limit)
					base.Workers, base.LeaseTTL, base.Run = sh.workers, lease, 7*time.Second
					base.QueueTimeout = 5 * time.Second // waiters outlive the freeze
					specs := make([]fleetSpec, sh.replicas)
					for i := range specs {
						specs[i] = base
					}
					withLive(t, specs)
					f := startLimitFleet(t, specs...)
					time.Sleep(time.Second)
					i := f.pick(mode)
					p := f.procs[i]
					stopped := time.Now()
					if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
						t.Fatal(err)
					}
					// Whatever it had sent before it stopped has reached
					// Redis by now.
					time.Sleep(50 * time.Millisecond)
					dropped := f.dropLive(t, specs[i])
					time.Sleep(time.Until(stopped.Add(frozen)))
					resumed := time.Now()
					if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
						t.Fatal(err)
					}
					rs := f.results(t)
					t.Logf("froze replica %d with %d slots running, for %v", i, dropped, resumed.Sub(stopped).Round(time.Millisecond))
					checkPeaks(t, rs, sh.limit, resumed, "SIGCONT")
					if n := countFrom(resumed, rs[i].Over); n > 0 {
						t.Errorf("the resumed replica %d started %d handlers while the counter was over the limit after SIGCONT",
							i, n)
					}
					if rs[i].Stall < lease {
						t.Errorf("the frozen replica stalled for %v, not past its lease %v: the freeze was not tested",
							rs[i].Stall, lease)
					}
				})
			}
		}
	}
}

// TestFleetLimitSplitFrozenReplica: a Name split into 2 parts, 4 replicas
// as OS processes under a limit of 6, rebalancing 5 times a second. One
// replica is frozen with SIGSTOP for 2 s, past its 1 s lease, while the
// others go on and the limit moves between the parts; another is killed
// with SIGKILL while it holds slots and its requests wait. The counter
// outside the library must never see more than 6 running after the frozen
// one resumes (the requests the two ran when stopped are taken off it, as
// in TestFleetLimitFrozenReplica), and the survivors go on serving.
func TestFleetLimitSplitFrozenReplica(t *testing.T) {
	long(t)
	needRedis(t)
	const lease, frozen, limit = time.Second, 2 * time.Second, 6
	srv := startRedis(t)
	base := limitSpec(t, srv, redisqueue.Shares, redisqueue.FailOpen, limit)
	base.Workers, base.LeaseTTL, base.Run = 6, lease, 6*time.Second
	base.QueueTimeout = 4 * time.Second
	base.Parts, base.RebalancePeriod = 2, 200*time.Millisecond
	specs := []fleetSpec{base, base, base, base}
	withLive(t, specs)
	f := startLimitFleet(t, specs...)
	time.Sleep(time.Second)
	p := f.procs[1]
	stopped := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	dropped := f.dropLive(t, specs[1])
	// 6 workers on a replica of 4 sharing 6 slots: some run, some wait.
	killed := f.procs[3]
	if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = killed.cmd.Wait()
	lost := f.dropLive(t, specs[3])
	f.procs, f.specs = f.procs[:3], f.specs[:3]
	time.Sleep(time.Until(stopped.Add(frozen)))
	resumed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	rs := f.results(t)
	t.Logf("froze replica 1 with %d slots running, for %v; killed replica 3 with %d running",
		dropped, resumed.Sub(stopped).Round(time.Millisecond), lost)
	checkPeaks(t, rs, limit, resumed, "SIGCONT")
	if n := countFrom(resumed, rs[1].Over); n > 0 {
		t.Errorf("the resumed replica started %d handlers while the counter was over the limit", n)
	}
	served := 0
	for _, r := range rs {
		served += r.Codes[200]
	}
	if lost == 0 {
		t.Error("the killed replica ran nothing when killed: the kill with slots held was not tested")
	}
	if served == 0 || rs[1].Stall < lease {
		t.Errorf("served %d, the frozen replica stalled %v: the freeze under load was not tested", served, rs[1].Stall)
	}
}

// TestFleetLimitReplicaStartsDuringPause: the fleet's Redis is paused
// (CLIENT PAUSE 2500 ALL) for longer than the 1 s lease while 2 replicas
// run under a limit of 6, and a third replica starts 2.2 s into the pause
// (its Start's call times out, so it is ready before the pause ends).
// Whichever replica syncs first after the pause, the new one included, the
// counter outside the library must never see more than 6 running. In both
// modes and under both policies.
func TestFleetLimitReplicaStartsDuringPause(t *testing.T) {
	long(t)
	needRedis(t)
	for _, mode := range limitModes {
		for _, policy := range limitPolicies {
			t.Run(fmt.Sprintf("%s/%s", mode, policy), func(t *testing.T) { startDuringPause(t, mode, policy, 0) })
		}
	}
	// A Name split into 2 parts: the late replica cannot join the Name's
	// own keys either until Redis answers.
	t.Run("shares-in-parts/fail-open", func(t *testing.T) { startDuringPause(t, redisqueue.Shares, redisqueue.FailOpen, 2) })
}

// startDuringPause is TestFleetLimitReplicaStartsDuringPause for one mode,
// policy and number of parts (0: one).
func startDuringPause(t *testing.T, mode redisqueue.Mode, policy redisqueue.Policy, parts int) {
	const limit, pauseLen, lateBy = 6, 2500 * time.Millisecond, 2200 * time.Millisecond
	srv := startRedis(t)
	base := limitSpec(t, srv, mode, policy, limit)
	base.Workers, base.LeaseTTL = 6, time.Second
	if parts > 1 {
		base.Parts, base.RebalancePeriod = parts, 200*time.Millisecond
	}
	old := base
	old.Run = 7 * time.Second
	late := base
	late.Run = 3 * time.Second
	f := startLimitFleet(t, old, old)
	time.Sleep(time.Second)
	paused := time.Now()
	wait := pauseFor(t, srv)(pauseLen)
	ended := make(chan time.Time, 1)
	go func() { ended <- wait() }()
	time.Sleep(time.Until(paused.Add(lateBy)))
	started := time.Now()
	p := startFleetProc(t, late)
	p.ready(t)
	ready := time.Now()
	back := <-ended
	f.procs, f.specs = append(f.procs, p), append(f.specs, late)
	rs := f.results(t)
	t.Logf("paused at 0, the late replica started at %v, ready at %v; Redis back at %v",
		started.Sub(paused).Round(time.Millisecond), ready.Sub(paused).Round(time.Millisecond),
		back.Sub(paused).Round(time.Millisecond))
	checkPeaks(t, rs, limit, paused, "the start of the pause")
	if back.IsZero() || back.Sub(paused) < pauseLen-50*time.Millisecond {
		t.Errorf("Redis was back %v after the pause began, not past %v: the pause was not tested",
			back.Sub(paused), pauseLen)
	}
	if !ready.Before(back) {
		// Its Start's sync would have waited for the pause to end.
		t.Errorf("the late replica was ready %v after Redis was back: it did not start during the pause",
			ready.Sub(back))
	}
	for i, r := range rs[:2] {
		if r.Outages == 0 {
			t.Errorf("replica %d never marked Redis down: the pause was not tested", i)
		}
	}
}

// TestFleetLimitFailureThresholdOutlastsLease: FailureThreshold 10 ×
// CallTimeout 150 ms outlasts LeaseTTL 600 ms, and the fleet's Redis is
// paused for 1.2 s: longer than the lease, too short for any replica to
// mark Redis down. 3 replicas share a limit of 6 under 12 clients; the
// counter outside the library must never see more than 6 running. Options
// where a replica cannot tell that Redis was gone before its lease ran out
// may be refused instead: then New's error must name FailureThreshold and
// LeaseTTL.
func TestFleetLimitFailureThresholdOutlastsLease(t *testing.T) {
	long(t)
	needRedis(t)
	const limit, lease, pauseLen = 6, 600 * time.Millisecond, 1200 * time.Millisecond
	for _, mode := range limitModes {
		for _, policy := range limitPolicies {
			t.Run(fmt.Sprintf("%s/%s", mode, policy), func(t *testing.T) {
				srv := startRedis(t)
				s := limitSpec(t, srv, mode, policy, limit)
				s.Workers, s.Run = 4, 5*time.Second
				s.LeaseTTL, s.CallTimeout, s.FailureThreshold = lease, 150*time.Millisecond, 10
				procs := []*fleetProc{startFleetProc(t, s), startFleetProc(t, s), startFleetProc(t, s)}
				if l := procs[0].first(t); l != "ready" {
					if !strings.Contains(l, "FailureThreshold") || !strings.Contains(l, "LeaseTTL") {
						t.Fatalf("a replica: %q; want ready, or an error naming FailureThreshold and LeaseTTL", l)
					}
					t.Logf("refused: %s", l)
					return
				}
				for _, p := range procs[1:] {
					p.ready(t)
				}
				f := &limitFleet{specs: []fleetSpec{s, s, s}, procs: procs}
				time.Sleep(time.Second)
				paused := time.Now()
				back := pauseFor(t, srv)(pauseLen)()
				rs := f.results(t)
				t.Logf("Redis back %v after the pause began", back.Sub(paused).Round(time.Millisecond))
				checkPeaks(t, rs, limit, paused, "the start of the pause")
				if back.IsZero() || back.Sub(paused) < pauseLen-50*time.Millisecond {
					t.Errorf("Redis was back %v after the pause began, not past %v: the pause was not tested",
						back.Sub(paused), pauseLen)
				}
			})
		}
	}
}
