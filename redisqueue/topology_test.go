package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// The topology tests drive 3 replicas (3 Queues, each with its own Backend
// on its own client) under a closed-loop load on a Redis Cluster and on a
// Sentinel set of their own, trigger each kind of failover and check the
// targets:
//
//   - normal service (grants from Redis, no 408, no OnRedisDown answer, the
//     limit's full capacity) resumes within 2 s of the topology having a new
//     master, with the default LeaseTTL of 15 s, with 3 s and with 1 min, and
//     after two manual failovers in a row;
//   - nobody waits past QueueTimeout + CallTimeout;
//   - FailClosed answers 503, never 408;
//   - once the load stops, GlobalStats is idle within a few seconds;
//   - in steady state the handlers running across the 3 replicas never
//     exceed the limit.
//
// Each run prints what it measured (t.Logf): run them with
//
//	go test -race -count=1 -run Topology -v .
const (
	topoLimit        = 4
	topoClients      = 12
	topoHandler      = 10 * time.Millisecond
	topoQueueTimeout = time.Second
	topoCallTimeout  = 150 * time.Millisecond
	topoResumeBound  = 2 * time.Second // from the new master to normal service
	topoResumeRun    = 30              // requests in a row served normally that mark service resumed
	topoIdleBound    = 5 * time.Second // from the end of the load to GlobalStats idle
	topoBucket       = 100 * time.Millisecond
	// Scheduling slack for the race detector on a small machine.
	topoSlack = 150 * time.Millisecond
)

// topology is what the runs need of a Cluster or a Sentinel set.
type topology struct {
	kind string
	// client builds a Backend's client; universal builds it with
	// redis.NewUniversalClient.
	client func(universal bool) redis.UniversalClient
	// owner returns the master that holds key now and its replica.
	owner func(t *testing.T, key string) (master, replica string)
	proc  func(addr string) *proc
	ctl   func(addr string) *redis.Client
	// manual is the failover by command: CLUSTER FAILOVER on the replica,
	// SENTINEL FAILOVER.
	manual func(t *testing.T, replica string)
	// promoted reports whether replica is the master now, as a client can
	// learn it (ROLE; and, for Sentinel, get-master-addr-by-name).
	promoted func(replica string) bool
	// heal restarts a killed node and waits until the topology is whole.
	heal func(t *testing.T, killed *proc, master string)
	// again is how long after one manual failover the next can succeed: a
	// Cluster master votes for a replica of the same slots at most once in
	// two node timeouts.
	again time.Duration
	// spec is how a doomed replica (another OS process) reaches it.
	spec doomedSpec
}

func clusterTopology(c *testCluster) topology {
	return topology{
		kind: "cluster",
		client: func(universal bool) redis.UniversalClient {
			// ReadTimeout bounds the client's own slot-map reloads, which a
			// frozen node would otherwise hold for the default 3 s (see the
			// README).
			if universal {
				return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: c.addrs(), ContextTimeoutEnabled: true,
					ReadTimeout: 500 * time.Millisecond})
			}
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs(), ContextTimeoutEnabled: true,
				ReadTimeout: 500 * time.Millisecond})
		},
		owner: func(t *testing.T, key string) (string, string) {
			t.Helper()
			var m, r string
			eventually(t, 5*time.Second, "no master owns "+key, func() bool {
				for _, a := range c.addrs() {
					var err error
					if m, r, err = c.owner(a, key); err == nil && r != "" {
						return true
					}
				}
				return false
			})
			return m, r
		},
		proc: c.proc,
		ctl:  func(a string) *redis.Client { return c.ctl[a] },
		manual: func(t *testing.T, replica string) {
			if err := c.ctl[replica].Do(context.Background(), "CLUSTER", "FAILOVER").Err(); err != nil {
				t.Fatalf("CLUSTER FAILOVER on %s: %v", replica, err)
			}
		},
		promoted: func(replica string) bool { return role(context.Background(), c.ctl[replica]) == "master" },
		heal: func(t *testing.T, killed *proc, _ string) {
			if killed != nil {
				killed.start() // its nodes.conf makes it rejoin, as a replica of the new master
			}
			c.waitHealthy()
		},
		again: 3 * time.Second,
		spec:  doomedSpec{Kind: "cluster", Addrs: c.addrs()},
	}
}

func sentinelTopology(s *testSentinel) topology {
	return topology{
		kind: "sentinel",
		client: func(universal bool) redis.UniversalClient {
			if universal {
				return redis.NewUniversalClient(&redis.UniversalOptions{MasterName: s.name, Addrs: s.sentinelAddrs(),
					ContextTimeoutEnabled: true})
			}
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.name, SentinelAddrs: s.sentinelAddrs(),
				ContextTimeoutEnabled: true})
		},
		owner: func(t *testing.T, _ string) (string, string) {
			m := s.masterSeenBy(s.sentinels[0].addr())
			return m, s.other(m)
		},
		proc: s.proc,
		ctl:  func(a string) *redis.Client { return s.ctl[a] },
		manual: func(t *testing.T, _ string) {
			if err := s.ctl[s.sentinels[0].addr()].Do(context.Background(), "SENTINEL", "FAILOVER", s.name).Err(); err != nil {
				t.Fatalf("SENTINEL FAILOVER: %v", err)
			}
		},
		promoted: func(replica string) bool {
			if role(context.Background(), s.ctl[replica]) != "master" {
				return false
			}
			for _, p := range s.sentinels {
				if s.masterSeenBy(p.addr()) == replica {
					return true
				}
			}
			return false
		},
		heal: func(t *testing.T, killed *proc, master string) {
			if killed != nil {
				killed.start()
				// The sentinels would turn it into a replica within a
				// few seconds; this does the same at once.
				host, port, _ := strings.Cut(master, ":")
				if err := s.ctl[killed.addr()].Do(context.Background(), "REPLICAOF", host, port).Err(); err != nil {
					t.Fatalf("REPLICAOF on the restarted %s: %v", killed.addr(), err)
				}
			}
			s.waitHealthy()
		},
		spec: doomedSpec{Kind: "sentinel", Addrs: s.sentinelAddrs(), Master: s.name},
	}
}

func TestTopologyCluster(t *testing.T) {
	long(t)
	top := clusterTopology(startCluster(t))
	runTopology(t, top)
}

// TestTopologySentinel: the failovers of a Sentinel set, under load. After
// SENTINEL FAILOVER the old master goes on answering as a master for about
// 2.5 s while the client moves to the new one: the notice reader must
// follow the client, not the old master's ROLE.
func TestTopologySentinel(t *testing.T) {
	long(t)
	top := sentinelTopology(startSentinel(t))
	runTopology(t, top)
}

// runTopology runs every failover kind under both policies, then the lost
// writes. Kills use clients from redis.NewUniversalClient, the others the
// topology's own constructor: both must work.
func runTopology(t *testing.T, top topology) {
	for _, kind := range []string{"manual", "kill"} {
		for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
			t.Run(kind+"/"+policy.String(), func(t *testing.T) {
				runFailover(t, top, kind, policy, 0)
			})
		}
	}
	// Whatever LeaseTTL is: the reconcile, not the leases, heals a
	// failover. "double" is two manual failovers in a row, the second back
	// to the first master as soon as it is a healthy replica.
	for _, lease := range []time.Duration{3 * time.Second, time.Minute} {
		for _, kind := range []string{"double", "kill"} {
			t.Run(fmt.Sprintf("%s/FailClosed/lease-%v", kind, lease), func(t *testing.T) {
				runFailover(t, top, kind, redisqueue.FailClosed, lease)
			})
		}
	}
	t.Run("lost-writes", func(t *testing.T) { runLostWrites(t, top) })
	t.Run("dead-replica-with-waiters", func(t *testing.T) {
		s := top.spec
		s.Name, s.Limit, s.Waiters = newName(t), 4, 6
		s.Tick, s.Call, s.Lease = 100*time.Millisecond, 50*time.Millisecond, 10*time.Second
		c := s.client()
		t.Cleanup(func() { _ = c.Close() })
		runDeadReplicaWithWaiters(t, s, c)
	})
}

// trace is what one request saw, filled in its own goroutine: by the
// traced Backend's Acquire and by the handler.
type trace struct {
	answered time.Time // when Acquire returned
	local    bool      // granted by the FailOpen fallback
	policy   bool      // FailClosed's ErrUnavailable
	conc     int       // handlers running across the replicas when it started, itself included
	ran      time.Time
	hold     <-chan struct{} // for /hold: run until closed
}

type traceKey struct{}

// traced is a Backend that notes each Acquire's outcome in the request's
// trace.
type traced struct{ *redisqueue.Backend }

func (b traced) Acquire(ctx context.Context, a ginqueue.Arrival) (ginqueue.Ticket, error) {
	t, err := b.Backend.Acquire(ctx, a)
	if tr, ok := ctx.Value(traceKey{}).(*trace); ok {
		tr.answered = time.Now()
		tr.local = err == nil && redisqueue.GrantedLocally(t)
		tr.policy = errors.Is(err, redisqueue.ErrUnavailable)
	}
	return t, err
}

// topoEvent is one request of the load.
type topoEvent struct {
	start, answered time.Time
	ran             time.Time // when its handler started; zero if it did not run
	code            int
	local, policy   bool
	conc            int
}

func (e topoEvent) normal() bool { return e.code == http.StatusOK && !e.local }

// topoRun is 3 replicas of one fresh Name and the load on them.
type topoRun struct {
	t    *testing.T
	name string
	reps []*topoReplica
	conc atomic.Int64 // handlers running now, across the replicas

	mu     sync.Mutex
	events []topoEvent
}

type topoReplica struct {
	b *redisqueue.Backend
	q *ginqueue.Queue
	e *gin.Engine
}

func newTopoRun(t *testing.T, top topology, policy redisqueue.Policy, universal bool, lease time.Duration) *topoRun {
	t.Helper()
	r := &topoRun{t: t, name: newName(t)}
	for range 3 {
		rdb := top.client(universal)
		t.Cleanup(func() { _ = rdb.Close() })
		b, err := redisqueue.New(rdb, redisqueue.Options{Name: r.name, CallTimeout: topoCallTimeout, OnRedisDown: policy,
			LeaseTTL: lease})
		if err != nil {
			t.Fatal(err)
		}
		q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: topoLimit, MaxQueue: 16,
			QueueTimeout: topoQueueTimeout, Backend: traced{b}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = q.Close() }) // before its client: cleanups run last-in first-out
		e := gin.New()
		h := func(c *gin.Context) {
			tr := c.Request.Context().Value(traceKey{}).(*trace)
			tr.conc = int(r.conc.Add(1))
			tr.ran = time.Now()
			if tr.hold != nil {
				<-tr.hold
			} else {
				time.Sleep(topoHandler)
			}
			r.conc.Add(-1)
		}
		e.GET("/", q.Handler(), h)
		r.reps = append(r.reps, &topoReplica{b: b, q: q, e: e})
	}
	return r
}

// key is a key of the Name: its slot is the queue's.
func (r *topoRun) key() string { return "ginqueue:{" + r.name + "}:h" }

// serve runs one request on rep; hold, if not nil, keeps its handler
// running until closed.
func (r *topoRun) serve(rep *topoReplica, hold <-chan struct{}) (topoEvent, *trace) {
	tr := &trace{hold: hold}
	w := &statusRecorder{}
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req = req.WithContext(context.WithValue(context.Background(), traceKey{}, tr))
	ev := topoEvent{start: time.Now()}
	rep.e.ServeHTTP(w, req)
	ev.code = w.status()
	ev.answered = tr.answered
	if ev.answered.IsZero() {
		ev.answered = time.Now()
	}
	ev.local, ev.policy, ev.conc, ev.ran = tr.local, tr.policy, tr.conc, tr.ran
	return ev, tr
}

// startLoad starts the closed-loop clients; the function it returns stops
// them and waits until they are done.
func (r *topoRun) startLoad() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range topoClients {
		rep := r.reps[i%len(r.reps)]
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				ev, _ := r.serve(rep, nil)
				r.mu.Lock()
				r.events = append(r.events, ev)
				r.mu.Unlock()
				if ev.code != http.StatusOK {
					time.Sleep(time.Millisecond) // a 503 is instant: do not spin
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// waitPromoted polls the topology every 10 ms until replica is the master.
func waitPromoted(t *testing.T, top topology, replica string, within time.Duration) time.Time {
	t.Helper()
	end := time.Now().Add(within)
	for !top.promoted(replica) {
		if time.Now().After(end) {
			t.Fatalf("no new master within %v", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}

// waitIdle waits until GlobalStats is idle and every replica's Queue is
// empty, up to topoIdleBound, and returns how long that took and what was
// left in Redis at the end.
func (r *topoRun) waitIdle() (time.Duration, string, bool) {
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		s, err := r.reps[0].b.GlobalStats(ctx)
		cancel()
		idle := err == nil && s.Running == 0 && s.Queued == 0
		left := fmt.Sprintf("GlobalStats %+v, error %v; replicas' running/queued:", s, err)
		for _, rep := range r.reps {
			st := rep.q.Stats()
			idle = idle && st.Running == 0 && st.Queued == 0
			left += fmt.Sprintf(" %d/%d", st.Running, st.Queued)
		}
		if idle {
			return time.Since(start), left, true
		}
		if time.Since(start) > topoIdleBound {
			return time.Since(start), left, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// capacity is the highest handler concurrency seen in each topoBucket from
// from to to: under a saturating load, the capacity the fleet was given.
func (r *topoRun) capacity(from, to time.Time) []int {
	n := int(to.Sub(from)/topoBucket) + 1
	out := make([]int, n)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.ran.IsZero() || e.ran.Before(from) || !e.ran.Before(to) {
			continue
		}
		i := int(e.ran.Sub(from) / topoBucket)
		out[i] = max(out[i], e.conc)
	}
	return out
}

// timeline writes buckets as runs: "+0.0–0.3 s: 0, +0.3–2.1 s: 4".
func timeline(b []int) string {
	var parts []string
	for i := 0; i < len(b); {
		j := i
		for j < len(b) && b[j] == b[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("+%.1f–%.1fs: %d", float64(i)*topoBucket.Seconds(), float64(j)*topoBucket.Seconds(), b[i]))
		i = j
	}
	return strings.Join(parts, ", ")
}

// underUntil is the end, from the start of b, of the last run of 3 or more
// buckets below the limit (zero if none): how long the fleet ran short of
// its limit.
func underUntil(b []int) time.Duration {
	var end time.Duration
	for i := 0; i < len(b); {
		if b[i] >= topoLimit {
			i++
			continue
		}
		j := i
		for j < len(b) && b[j] < topoLimit {
			j++
		}
		if j-i >= 3 {
			end = time.Duration(j) * topoBucket
		}
		i = j
	}
	return end
}

// topoResult is what a run measured after the trigger t0, the new master
// at tm, until the end of the load.
type topoResult struct {
	newMaster, resume time.Duration // from t0
	resumed           bool
	timeouts, policy  int // 408s; OnRedisDown answers (FailClosed's 503s, FailOpen's local grants)
	full, other       int // 503s of a full queue; any other status
	late              int // abnormal answers to requests that came 2 s after the new master or later
	maxWait           time.Duration
	peakSteady, peak  int
	over              int           // requests that ran above the limit in steady state
	under             time.Duration // from tm: how long the fleet ran short of its limit
	capacity          string
}

func (r *topoRun) analyse(t0, tm, end time.Time) topoResult {
	r.mu.Lock()
	ev := slices.Clone(r.events)
	r.mu.Unlock()
	slices.SortFunc(ev, func(a, b topoEvent) int { return a.answered.Compare(b.answered) })
	res := topoResult{newMaster: tm.Sub(t0)}
	steadyFrom := tm.Add(topoResumeBound)
	first := -1
	for i, e := range ev {
		res.maxWait = max(res.maxWait, e.answered.Sub(e.start))
		res.peak = max(res.peak, e.conc)
		// Steady state: handlers that started before the trigger or 2 s
		// after the new master.
		if !e.ran.IsZero() && (e.ran.Before(t0) || !e.ran.Before(steadyFrom)) {
			res.peakSteady = max(res.peakSteady, e.conc)
			if e.conc > topoLimit {
				res.over++
			}
		}
		if e.answered.Before(t0) {
			continue
		}
		switch {
		case e.code == http.StatusRequestTimeout:
			res.timeouts++
		case e.policy || e.local:
			res.policy++
		case e.code == http.StatusServiceUnavailable:
			res.full++
		case e.code != http.StatusOK:
			res.other++
		}
		if !e.normal() {
			if first < 0 {
				first = i
			}
			if !e.start.Before(steadyFrom) {
				res.late++
			}
		}
	}
	if first < 0 {
		res.resumed = true // no interruption at all
	} else {
		for i := first + 1; i+topoResumeRun <= len(ev); i++ {
			ok := true
			for _, e := range ev[i : i+topoResumeRun] {
				if !e.normal() {
					ok = false
					break
				}
			}
			if ok {
				res.resume, res.resumed = ev[i].answered.Sub(t0), true
				break
			}
		}
	}
	capa := r.capacity(tm, end)
	res.under = underUntil(capa)
	res.capacity = timeline(capa)
	return res
}

// check logs res and reports every target it misses.
func (r *topoRun) check(t *testing.T, what string, policy redisqueue.Policy, res topoResult) {
	t.Helper()
	resume := "no interruption"
	if !res.resumed {
		resume = "never, in the run"
	} else if res.resume > 0 {
		resume = fmt.Sprintf("%.2fs after the trigger, %+.2fs from the new master", res.resume.Seconds(), (res.resume - res.newMaster).Seconds())
	}
	t.Logf("%s: new master %.2fs after the trigger; normal service: %s; after the trigger 408=%d policy=%d full=%d other=%d, "+
		"abnormal answers to requests from new master+2s on: %d; longest wait %v; peak concurrency %d steady, %d in all; "+
		"short of the limit until new master+%.1fs; capacity from the new master: %s",
		what, res.newMaster.Seconds(), resume, res.timeouts, res.policy, res.full, res.other, res.late,
		res.maxWait.Round(time.Millisecond), res.peakSteady, res.peak, res.under.Seconds(), res.capacity)
	if !res.resumed {
		t.Errorf("%s: normal service (%d requests in a row) never resumed", what, topoResumeRun)
	} else if res.resume > res.newMaster+topoResumeBound {
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
	if bound := topoQueueTimeout + topoCallTimeout + topoSlack; res.maxWait > bound {
		t.Errorf("%s: a request waited %v, want at most QueueTimeout + CallTimeout (%v)", what, res.maxWait, bound)
	}
	if policy == redisqueue.FailClosed && res.timeouts > 0 {
		t.Errorf("%s: FailClosed answered %d requests 408, want 503", what, res.timeouts)
	}
	if res.over > 0 {
		t.Errorf("%s: %d requests ran above the limit of %d in steady state (peak %d)", what, res.over, topoLimit, res.peakSteady)
	}
}

// checkIdle waits for the fleet to be idle once the load stopped.
func (r *topoRun) checkIdle(t *testing.T, what string) {
	t.Helper()
	d, left, ok := r.waitIdle()
	if !ok {
		t.Errorf("%s: not idle %v after the load stopped: %s", what, d.Round(time.Millisecond), left)
		return
	}
	t.Logf("%s: idle %v after the load stopped, nothing leaked", what, d.Round(time.Millisecond))
}

// runFailover triggers one failover of the master that holds the Name's
// slot under load (two for "double") and checks the targets. lease is the
// LeaseTTL; zero is the default.
func runFailover(t *testing.T, top topology, kind string, policy redisqueue.Policy, lease time.Duration) {
	r := newTopoRun(t, top, policy, kind == "kill", lease)
	what := top.kind + " " + kind + " " + policy.String()
	if lease > 0 {
		what += fmt.Sprintf(" LeaseTTL %v", lease)
	}
	master, replica := top.owner(t, r.key())
	stop := r.startLoad()
	time.Sleep(time.Second)
	t0 := time.Now()
	var killed *proc
	switch kind {
	case "manual", "double":
		top.manual(t, replica)
	case "kill":
		killed = top.proc(master)
		killed.kill()
	}
	tm := waitPromoted(t, top, replica, 20*time.Second)
	if kind == "double" {
		top.heal(t, nil, replica) // the old master is a healthy replica again
		time.Sleep(time.Until(tm.Add(top.again)))
		t.Logf("%s: first new master %.2fs after the trigger, the second failover %.2fs after it",
			what, tm.Sub(t0).Seconds(), time.Since(t0).Seconds())
		top.manual(t, master)
		tm = waitPromoted(t, top, master, 20*time.Second)
		replica = master
	}
	time.Sleep(time.Until(tm.Add(3 * time.Second)))
	stop()
	end := time.Now()
	r.check(t, what, policy, r.analyse(t0, tm, end))
	r.checkIdle(t, what)
	top.heal(t, killed, replica)
}

// runLostWrites measures what asynchronous replication costs: with the
// replica stopped (SIGSTOP), two slots are released and four taken on the
// master, which acknowledges them; the master is then killed and the
// replica, continued, is promoted without those writes. Redis then holds
// two phantom slots (released, but not on the new master: the fleet runs
// under its limit) and lacks four that are running (over it), until the
// library or the leases reconcile. The four are held 0.5 s past the new
// master; the load runs until the capacity is back at the limit, or 20 s.
func runLostWrites(t *testing.T, top topology) {
	r := newTopoRun(t, top, redisqueue.FailClosed, true, 0)
	what := top.kind + " lost-writes"
	master, replica := top.owner(t, r.key())
	ctx := context.Background()
	hold := func(n int, ch <-chan struct{}) chan topoEvent {
		out := make(chan topoEvent, n)
		for i := range n {
			go func() {
				ev, _ := r.serve(r.reps[i%len(r.reps)], ch)
				out <- ev
			}()
		}
		return out
	}
	running := func(n int) func() bool {
		return func() bool {
			s, err := r.reps[0].b.GlobalStats(ctx)
			return err == nil && s.Running == n && int(r.conc.Load()) == n
		}
	}
	released := make(chan struct{})
	first := hold(2, released)
	eventually(t, 2*time.Second, "the first two slots were not taken", running(2))
	// Make sure the replica has them.
	mc := top.ctl(master)
	if err := mc.Set(ctx, "ginqueue:{"+r.name+"}:probe", 1, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := mc.Do(ctx, "WAIT", 1, 1000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 1000: %d, %v", n, err)
	}
	holders := func(addr string) map[string]bool {
		// READONLY lets a cluster replica answer; elsewhere it is an error, ignored.
		conn := top.ctl(addr).Conn()
		defer conn.Close()
		_ = conn.ReadOnly(ctx).Err()
		m, err := conn.ZRange(ctx, r.key(), 0, -1).Result()
		if err != nil {
			t.Fatalf("ZRANGE on %s: %v", addr, err)
		}
		set := map[string]bool{}
		for _, id := range m {
			set[id] = true
		}
		return set
	}
	releasedIDs := holders(master)
	// Stop the replica and cut its link: what the master acknowledges from
	// now on stays in its backlog (bytes already in the socket would still
	// reach a replica that is merely stopped).
	top.proc(replica).signal(syscall.SIGSTOP)
	if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE replica: %v", err)
	}
	close(released)
	for range 2 {
		if ev := <-first; ev.code != http.StatusOK {
			t.Fatalf("a held request got %d", ev.code)
		}
	}
	eventually(t, time.Second, "the releases did not reach the master", running(0))
	lost := make(chan struct{})
	second := hold(4, lost)
	eventually(t, time.Second, "the four slots were not taken", running(4))

	acquiredIDs := holders(master)
	t0 := time.Now()
	killed := top.proc(master)
	killed.kill()
	top.proc(replica).signal(syscall.SIGCONT)
	kept := holders(replica) // what the replica will start from as master
	phantoms, missing := 0, 0
	for id := range releasedIDs {
		if kept[id] {
			phantoms++
		}
	}
	for id := range acquiredIDs {
		if !kept[id] {
			missing++
		}
	}
	tm := waitPromoted(t, top, replica, 20*time.Second)
	stop := r.startLoad()
	time.Sleep(time.Until(tm.Add(500 * time.Millisecond))) // within QueueTimeout: nobody has to time out
	close(lost)
	for range 4 {
		<-second
	}
	// Until the capacity has been back at the limit for 1 s, or 20 s.
	for time.Since(tm) < 20*time.Second {
		time.Sleep(200 * time.Millisecond)
		c := r.capacity(time.Now().Add(-time.Second), time.Now())
		if time.Since(tm) > 2*time.Second && slices.Min(c[:len(c)-1]) == topoLimit && slices.Max(c) == topoLimit {
			break
		}
	}
	stop()
	end := time.Now()
	capa := r.capacity(tm, end)
	overBy, overFor := 0, time.Duration(0)
	for i, c := range capa {
		if c > topoLimit {
			overBy = max(overBy, c-topoLimit)
			overFor = time.Duration(i+1) * topoBucket
		}
	}
	t.Logf("%s: new master %.2fs after the kill; it started with %d phantom holders (of the 2 released on the old master) "+
		"and without %d of the 4 slots taken on the old master, whose requests ran until new master+0.5s; "+
		"over the limit by up to %d until new master+%.1fs; short of it until new master+%.1fs; capacity from the new master: %s",
		what, tm.Sub(t0).Seconds(), phantoms, missing, overBy, overFor.Seconds(), underUntil(capa).Seconds(), timeline(capa))
	res := r.analyse(t0, tm, end)
	r.check(t, what, redisqueue.FailClosed, res)
	r.checkIdle(t, what)
	top.heal(t, killed, replica)
}
