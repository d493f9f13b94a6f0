package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// Faults of a Shares-mode fleet as it really runs: replicas as OS processes
// killed with SIGKILL and started again, three processes through a Redis
// pause, and Redis losing its last writes. Each counts the requests running
// across the fleet outside the library.

// timedAnswer is one request of a recorded load: when it came, when it was
// answered and with what.
type timedAnswer struct {
	start, at time.Time
	code      int
}

// recLoad is a closed-loop load on one replica that keeps every answer.
type recLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	ans  []timedAnswer
}

// startRec starts clients closed-loop clients on r.
func startRec(r *replica, clients int) *recLoad {
	l := &recLoad{stop: make(chan struct{})}
	for range clients {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Now()
				code := r.get()
				l.mu.Lock()
				l.ans = append(l.ans, timedAnswer{start, time.Now(), code})
				l.mu.Unlock()
				if code != 200 {
					time.Sleep(2 * time.Millisecond) // a refused client does not spin
				}
			}
		})
	}
	return l
}

// served is the number of 200s so far.
func (l *recLoad) served() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.ans {
		if a.code == 200 {
			n++
		}
	}
	return n
}

// end stops the clients and returns every answer.
func (l *recLoad) end() []timedAnswer {
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ans)
}

// replicaOn builds a replica on rdb (any client New accepts) whose route
// "/" runs h behind a Queue of cfg. The test closes the Queue at its end;
// rdb is the caller's.
func replicaOn(t *testing.T, rdb redis.UniversalClient, cfg ginqueue.Config, o redisqueue.Options, h gin.HandlerFunc) *replica {
	t.Helper()
	b, err := redisqueue.New(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{b: b}
	cfg.Backend = countTimeouts{Backend: b, n: &r.timeouts}
	if r.q, err = ginqueue.NewQueue(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.q.Close() })
	r.e = gin.New()
	r.e.GET("/", r.q.Handler(), h)
	return r
}

// redisCounter counts the requests running across a fleet of OS processes
// in a Redis key of the shared Redis (not the fleet's, which may fail),
// outside the library: handlers INCR it when they start and DECR it when
// they end; the test adds the slots a doomed replica holds while it lives.
type redisCounter struct {
	c     *redis.Client
	key   string
	limit int64
	peak  atomic.Int64
	over  atomic.Int64 // INCRs that saw more than limit
	errs  atomic.Int64 // counter calls that failed: the count is unreliable
	// full, once armed is set, is when the count first reached limit (Unix
	// ns).
	armed atomic.Bool
	full  atomic.Int64
}

func newRedisCounter(t *testing.T, name string, limit int) *redisCounter {
	t.Helper()
	f := &redisCounter{c: newClient(t, redisAddr), key: "ginqueue-test:{" + name + "}:running", limit: int64(limit)}
	t.Cleanup(func() { _ = f.c.Del(context.Background(), f.key).Err() })
	return f
}

// add adds n to the count (n < 0 takes away).
func (f *redisCounter) add(t *testing.T, n int) {
	t.Helper()
	v, err := f.c.IncrBy(context.Background(), f.key, int64(n)).Result()
	if err != nil {
		t.Fatalf("the counter: %v", err)
	}
	f.saw(v)
}

func (f *redisCounter) saw(v int64) {
	for p := f.peak.Load(); v > p && !f.peak.CompareAndSwap(p, v); p = f.peak.Load() {
	}
	if v > f.limit {
		f.over.Add(1)
	}
	if v >= f.limit && f.armed.Load() {
		f.full.CompareAndSwap(0, time.Now().UnixNano())
	}
}

func (f *redisCounter) handler(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		ctx := context.Background()
		v, err := f.c.Incr(ctx, f.key).Result()
		if err != nil {
			f.errs.Add(1)
		} else {
			f.saw(v)
		}
		time.Sleep(d)
		if err := f.c.Decr(ctx, f.key).Err(); err != nil {
			f.errs.Add(1)
		}
	}
}

// shareIDs lists the replicas that hold a record in the Shares hash of name.
func shareIDs(t *testing.T, rdb redis.UniversalClient, name string) []string {
	t.Helper()
	ids, err := rdb.HKeys(context.Background(), "ginqueue:{"+name+"}:s").Result()
	if err != nil {
		t.Fatalf("HKEYS of the shares: %v", err)
	}
	slices.Sort(ids)
	return ids
}

const (
	killClients      = 8
	killHandler      = 10 * time.Millisecond
	killQueueTimeout = 3 * time.Second
	// killSlack is scheduling slack for the race detector on a small,
	// shared machine.
	killSlack = 250 * time.Millisecond
)

// runSharesKill: a Shares replica (an OS process, s) holds every slot of
// the limit with waiters queued; a survivor in this process, under a
// closed-loop load, gets nothing meanwhile. The replica is killed with
// SIGKILL: its share returns when its lease in Redis runs out, within
// LeaseTTL of the kill, and the survivor learns it at its next sync, within
// a SharePeriod. Then a replica of the same Name is started again, joins
// (it gets the whole limit from the idle survivor), and is killed in turn.
// Throughout, a counter outside the library (the doomed replica's slots and
// the survivor's handlers) never sees more than the limit, and no request
// of the survivor waits past QueueTimeout: every one is served.
func runSharesKill(t *testing.T, s doomedSpec, rdb redis.UniversalClient) {
	ctx := context.Background()
	s.Shares = true
	ctr := newRedisCounter(t, s.Name, s.Limit)
	cmd := startDoomed(t, s)
	ctr.add(t, s.Limit) // its slots run until it dies
	doomed := shareIDs(t, rdb, s.Name)
	if len(doomed) != 1 {
		t.Fatalf("share records before the survivor started: %v", doomed)
	}
	cfg := ginqueue.Config{MaxConcurrent: s.Limit, MaxQueue: 2 * killClients, QueueTimeout: killQueueTimeout}
	surv := replicaOn(t, rdb, cfg, s.options(), ctr.handler(killHandler))
	var survivorID string
	eventually(t, 2*time.Second, "the survivor did not register", func() bool {
		ids := shareIDs(t, rdb, s.Name)
		if len(ids) != 2 {
			return false
		}
		survivorID = ids[0]
		if ids[0] == doomed[0] {
			survivorID = ids[1]
		}
		return true
	})

	kill := func(round string, cmd *exec.Cmd, dead string) {
		ld := startRec(surv, killClients)
		// The survivor's waiters are reported, and the doomed replica told
		// to give back, which it cannot: its requests never end.
		time.Sleep(300 * time.Millisecond)
		if n := ld.served(); n > 0 || surv.b.Stats().Limit > 0 {
			t.Errorf("%s: the survivor served %d with a share of %d while the doomed replica held the whole limit",
				round, n, surv.b.Stats().Limit)
		}
		ctr.full.Store(0)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		_ = cmd.Wait()
		ctr.add(t, -s.Limit) // its requests died with it
		ctr.armed.Store(true)
		bound := s.Lease + redisqueue.DefaultSharePeriod + killSlack
		shareBack := shareReaches(surv, s.Limit, killed, bound+time.Second)
		if shareBack > bound+time.Second {
			shareBack = -1 // never, within the poll
		}
		time.Sleep(500 * time.Millisecond) // the survivor runs at the limit
		ans := ld.end()
		ctr.armed.Store(false)
		fullBack := time.Duration(-1)
		if ns := ctr.full.Load(); ns > 0 {
			fullBack = time.Unix(0, ns).Sub(killed)
		}
		codes, longest := map[int]int{}, time.Duration(0)
		for _, a := range ans {
			codes[a.code]++
			longest = max(longest, a.at.Sub(a.start))
		}
		t.Logf("%s %s: after SIGKILL of the replica holding all %d slots with %d waiters (LeaseTTL %v), the survivor's share "+
			"was the whole limit %s the kill, and %d ran fleet-wide %s it; survivor's answers %v, longest %v; "+
			"fleet-wide peak %d",
			s.Kind, round, s.Limit, s.Waiters, s.Lease, after(shareBack), s.Limit, after(fullBack),
			codes, longest.Round(time.Millisecond), ctr.peak.Load())
		if shareBack < 0 || shareBack > bound {
			t.Errorf("%s: the dead replica's share came back %s the kill, want within LeaseTTL + SharePeriod (%v, with slack)",
				round, after(shareBack), bound)
		}
		if fullBack < 0 || fullBack > bound+killHandler+killSlack {
			t.Errorf("%s: the fleet ran the whole limit %s the kill, want within %v",
				round, after(fullBack), bound+killHandler+killSlack)
		}
		if len(codes) != 1 || codes[200] == 0 {
			t.Errorf("%s: the survivor answered %v, want 200s only: its waiters get the share before QueueTimeout %v",
				round, codes, killQueueTimeout)
		}
		if longest > killQueueTimeout+killHandler+killSlack {
			t.Errorf("%s: a survivor's request took %v, past QueueTimeout %v", round, longest, killQueueTimeout)
		}
		if ids := shareIDs(t, rdb, s.Name); !slices.Equal(ids, []string{survivorID}) {
			t.Errorf("%s: share records after the kill %v, want the survivor's %s alone", round, ids, survivorID)
		}
		if n, err := rdb.Exists(ctx, "ginqueue:{"+s.Name+"}:sg:"+dead).Result(); err != nil || n != 0 {
			t.Errorf("%s: the dead replica's notice list is still there (%d, %v)", round, n, err)
		}
		if keys, err := keysWithoutTTL(ctx, rdb, s.Name); err != nil || len(keys) > 0 {
			t.Errorf("%s: keys without a TTL: %v (%v)", round, keys, err)
		}
	}
	kill("first", cmd, doomed[0])

	// The same replica started again: the survivor, idle now, hands it the
	// whole limit.
	start := time.Now()
	cmd = startDoomed(t, s)
	joined := time.Since(start)
	ctr.add(t, s.Limit)
	var again string
	for _, id := range shareIDs(t, rdb, s.Name) {
		if id != survivorID {
			again = id
		}
	}
	g, err := surv.b.GlobalStats(ctx)
	t.Logf("%s: the restarted replica held the whole limit with its waiters queued %v after its start; fleet %+v (%v)",
		s.Kind, joined.Round(time.Millisecond), g, err)
	if err != nil || g.Replicas != 2 || again == "" {
		t.Fatalf("after the restart: %+v, %v; want 2 replicas", g, err)
	}
	eventually(t, time.Second, "the survivor kept a share beside the restarted replica's whole limit", func() bool {
		return surv.b.Stats().Limit == 0
	})
	kill("restarted", cmd, again)

	if p := ctr.peak.Load(); p > int64(s.Limit) || ctr.over.Load() > 0 {
		t.Errorf("the counter saw %d running across the fleet (%d times above the limit of %d)", p, ctr.over.Load(), s.Limit)
	}
	if n := ctr.errs.Load(); n > 0 {
		t.Errorf("%d counter calls failed: the count is not reliable", n)
	}
}

// TestSharesDeadReplicaReturnsItsShare is runSharesKill on the shared
// Redis, with a LeaseTTL of 2 s and a CallTimeout of 50 ms.
func TestSharesDeadReplicaReturnsItsShare(t *testing.T) {
	needRedis(t)
	t.Parallel()
	s := doomedSpec{Kind: "plain", Addrs: []string{redisAddr}, Name: newName(t), Limit: 4, Waiters: 6,
		Call: 50 * time.Millisecond, Lease: 2 * time.Second}
	runSharesKill(t, s, newClient(t, redisAddr))
}

// TestFleetPausedSharesKeepTheLimit is TestFleetPausedKeepsTheLimit in
// Shares mode: 3 OS processes share a limit of 4 under 12 closed-loop
// clients (50 ms handlers) and Redis is paused for 3 s. The shares' lease
// (15 s) outlasts the pause, so under either policy every replica goes on
// serving within its share in every half second of the pause, every
// request is served (no 408, no 503), none waits past QueueTimeout, and
// the counter outside the library never sees more than 4 running.
func TestFleetPausedSharesKeepTheLimit(t *testing.T) {
	long(t)
	needRedis(t)
	srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
	const pauseFor, bucket = 3 * time.Second, 500 * time.Millisecond
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			s := fleetSpec{Addr: srv.addr(), CounterAddr: redisAddr, Counter: "ginqueue-test:" + newName(t),
				Name: newName(t), Policy: policy, Shares: true, Limit: 4, Workers: 4, Handler: 50 * time.Millisecond,
				Run: 6 * time.Second, QueueTimeout: 2 * time.Second}
			ctl := newClient(t, srv.addr())
			var paused time.Time
			rs := runFleet(t, s, func() {
				paused = time.Now()
				if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", pauseFor.Milliseconds(), "ALL").Err(); err != nil {
					t.Error(err)
				}
			})
			for i, r := range rs {
				during := make([]int, pauseFor/bucket)
				for _, ms := range r.Served {
					if d := time.UnixMilli(ms).Sub(paused); d >= 0 && d < pauseFor {
						during[d/bucket]++
					}
				}
				t.Logf("%s replica %d: peak %d running fleet-wide, responses %v, 200s by half second of the pause %v, "+
					"longest %v, outages %d, replicas %d",
					policy, i, r.Peak, r.Codes, during, r.Longest.Round(time.Millisecond), r.Outages, r.Replicas)
				if r.Peak > int64(s.Limit) {
					var at []time.Duration
					for _, ms := range r.Over {
						at = append(at, time.UnixMilli(ms).Sub(paused))
					}
					t.Errorf("replica %d saw %d running at once across the fleet, limit %d, at %v from the start of the pause",
						i, r.Peak, s.Limit, at)
				}
				if r.Outages == 0 {
					t.Errorf("replica %d never marked Redis down: the pause was not tested", i)
				}
				if slices.Min(during) == 0 {
					t.Errorf("replica %d served nothing in part of the pause (200s by half second %v): it holds a share", i, during)
				}
				if len(r.Codes) != 1 || r.Codes[200] == 0 {
					t.Errorf("replica %d answered %v, want 200s only: the pause is shorter than the lease", i, r.Codes)
				}
				if r.Longest > s.QueueTimeout+s.Handler+500*time.Millisecond {
					t.Errorf("replica %d: a request took %v, past its QueueTimeout %v", i, r.Longest, s.QueueTimeout)
				}
			}
		})
	}
}

// overCounter is a fleetCounter that also keeps when the count was last
// above limit.
type overCounter struct {
	fleetCounter
	limit    int64
	lastOver atomic.Int64 // Unix ns
}

func (f *overCounter) handler(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		n := f.now.Add(1)
		for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
		}
		if n > f.limit {
			f.lastOver.Store(time.Now().UnixNano())
		}
		time.Sleep(d)
		f.now.Add(-1)
	}
}

// heldOf parses the slots held out of a share record ("held need prio told
// queued"); -1 if there is none.
func heldOf(rec string) int {
	var h int
	if _, err := fmt.Sscanf(rec, "%d", &h); err != nil {
		return -1
	}
	return h
}

// Redis loses its last writes (a failover to a replica they had not
// reached yet: replication is asynchronous) after the shares moved: the
// keys of the Name go back to what they were before. The replica the
// shares moved to runs on them meanwhile, cut off from Redis (a partition,
// or only slower to sync than the others) while the others, with demand
// again, sync. The first of those finds that Redis forgot syncs it had
// seen: no share grows until the replicas it saw have synced again (or a
// lease has passed), so the fleet never runs over its limit.
func TestSharesLostWritesKeepTheLimit(t *testing.T) {
	needRedis(t)
	srv := startRedis(t) // RESTORE below
	const limit, handler = 4, 10 * time.Millisecond
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 2 * time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, CallTimeout: 50 * time.Millisecond, LeaseTTL: 10 * time.Second}
	f := &overCounter{limit: limit}
	proxy := newCutProxy(t, srv.addr())
	rs := []*replica{newReplica(t, proxy.addr(), cfg, o, f.handler(handler)),
		newReplica(t, srv.addr(), cfg, o, f.handler(handler)), newReplica(t, srv.addr(), cfg, o, f.handler(handler))}
	ld := startShape(rs, 8)
	defer ld.end()
	ld.set(4, 4, 4)
	shares := func() []int {
		var s []int
		for _, r := range rs {
			s = append(s, r.b.Stats().Limit)
		}
		return s
	}
	eventually(t, 2*time.Second, "the shares did not settle", func() bool {
		s := shares()
		return slices.Min(s) > 0 && s[0]+s[1]+s[2] == limit
	})
	ctx := context.Background()
	ctl := newClient(t, srv.addr())
	sKey := "ginqueue:{" + o.Name + "}:s"
	dumps := map[string]string{}
	for _, k := range []string{"s", "se", "sm"} {
		key := "ginqueue:{" + o.Name + "}:" + k
		d, err := ctl.Dump(ctx, key).Result()
		if err != nil {
			t.Fatalf("DUMP %s: %v", key, err)
		}
		dumps[key] = d
	}
	before, err := ctl.HGetAll(ctx, sKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	settled := shares()

	// The shares move to replica 0.
	ld.set(8, 0, 0)
	if d := shareReaches(rs[0], limit, time.Now(), 2*time.Second); d > 2*time.Second {
		t.Fatalf("replica 0 never got the whole limit: shares %v", shares())
	}
	moved := shares()
	recs, err := ctl.HGetAll(ctx, sKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	var zero string // replica 0's id: the one that holds the whole limit now
	for id, rec := range recs {
		if heldOf(rec) == limit {
			zero = id
		}
	}
	if zero == "" {
		t.Fatalf("no record holds the whole limit: %v", recs)
	}
	forgotten := limit - max(heldOf(before[zero]), 0)
	proxy.setCut(true)
	for key, d := range dumps {
		if err := ctl.RestoreReplace(ctx, key, 0, d).Err(); err != nil {
			t.Fatalf("RESTORE %s: %v", key, err)
		}
	}
	lost := time.Now()
	// Demand on the others again, while replica 0 runs on the whole limit.
	ld.set(8, 8, 8)
	time.Sleep(time.Second)
	during := shares()
	healed := time.Now()
	proxy.setCut(false)
	time.Sleep(time.Second)
	ld.end()
	ld.stop = make(chan struct{}) // the deferred end has nothing left to stop
	over := int(f.peak.Load()) - limit
	last := "never"
	if ns := f.lastOver.Load(); ns > 0 {
		last = fmt.Sprintf("until %v after the loss (replica 0 back %v after it)",
			time.Unix(0, ns).Sub(lost).Round(time.Millisecond), healed.Sub(lost).Round(time.Millisecond))
	}
	t.Logf("shares settled %v (Redis held %v), moved to replica 0 %v; Redis forgot %d of its slots; with replica 0 cut off: %v; "+
		"after it synced again: %v; peak %d running across the fleet, limit %d: over %s; answers %v",
		settled, before, moved, forgotten, during, shares(), f.peak.Load(), limit, last, ld.answers)
	if over > 0 {
		t.Errorf("the fleet ran %d over its limit of %d (Redis forgot %d slots), %s", over, limit, forgotten, last)
	}
}

// A replica shut down while Redis does not answer (a rolling deploy during
// an outage) ends its running requests, and its share goes back to the
// fleet once Redis answers again: the replicas left have the whole limit
// within 2 s, not after the closed one's LeaseTTL (1 min here).
func TestSharesShutdownDuringOutageGivesTheShareBack(t *testing.T) {
	needRedis(t)
	srv := startRedis(t) // CLIENT PAUSE below
	const limit, handler, lease = 4, 10 * time.Millisecond, time.Minute
	var f fleetCounter
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, LeaseTTL: lease}
	var rs []*replica
	for range 3 {
		rs = append(rs, newReplica(t, srv.addr(), cfg, o, f.handler(handler)))
	}
	ctx := context.Background()
	eventually(t, 2*time.Second, "the replicas did not all register", func() bool {
		g, err := rs[0].b.GlobalStats(ctx)
		return err == nil && g.Replicas == 3
	})
	// Replica 2 runs two requests.
	var tks []backend.Ticket
	for range 2 {
		c, cancel := context.WithTimeout(ctx, time.Second)
		tk, err := rs[2].b.Acquire(c, backend.Arrival{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	time.Sleep(200 * time.Millisecond)
	paused := time.Now()
	pause(t, srv, 2*time.Second)
	time.Sleep(500 * time.Millisecond) // every replica has marked Redis down
	shut := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		shut <- rs[2].q.Shutdown(c)
	}()
	time.Sleep(50 * time.Millisecond)
	for _, tk := range tks {
		rs[2].b.Release(tk)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	back := answersAgain(t, srv, paused.Add(2*time.Second))
	ld := startShape(rs[:2], 6)
	defer ld.end()
	ld.set(6, 6)
	whole := time.Duration(-1)
	for time.Since(back) < 3*time.Second {
		if rs[0].b.Stats().Limit+rs[1].b.Stats().Limit == limit {
			whole = time.Since(back)
			break
		}
		time.Sleep(time.Millisecond)
	}
	g, err := rs[0].b.GlobalStats(ctx)
	recs, _ := newClient(t, srv.addr()).HGetAll(ctx, "ginqueue:{"+o.Name+"}:s").Result()
	ld.end()
	ld.stop = make(chan struct{}) // the deferred end has nothing left to stop
	t.Logf("the replicas left had the whole limit %s Redis answered again; their shares %d and %d; "+
		"fleet %+v (%v); share records (held need prio told queued) %v; answers %v",
		after(whole), rs[0].b.Stats().Limit, rs[1].b.Stats().Limit, g, err, recs, ld.answers)
	if whole < 0 || whole > 2*time.Second {
		t.Errorf("the shut-down replica's share did not come back within 2 s of Redis answering (LeaseTTL %v): fleet %+v", lease, g)
	}
	if err != nil || g.Replicas != 2 {
		t.Errorf("after Redis answered again: %+v, %v; want the 2 replicas left", g, err)
	}
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d running across the fleet, limit %d", p, limit)
	}
}

// after writes a delay measured from an event: "never" when negative.
func after(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String() + " after"
}

// lossCase is a loss of a Name's keys under a Shares fleet whose replicas
// all have more clients than the limit.
type lossCase struct {
	name    string
	restart bool // Redis restarts empty; else FLUSHALL
	join    bool // a replica starts right after the loss
	// shares are the shares before the loss, one a replica: the limit on
	// one; the limit and 0 (the first's waiters outrank the second's); or
	// half each.
	shares []int
}

// runLoss runs c: once the shares have settled, Redis loses the Name's
// keys, and for half a second after it the slots counted outside the
// library must never exceed the limit.
func runLoss(t *testing.T, c lossCase) {
	srv := startRedis(t)
	const limit, handler = 4, 20 * time.Millisecond
	var f fleetCounter
	// A period long beside a Start, so that a joining replica syncs before
	// the others do.
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, CallTimeout: 50 * time.Millisecond, Shares: redisqueue.SharesOptions{Period: 200 * time.Millisecond}}
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 300 * time.Millisecond}
	h := func(*gin.Context) { time.Sleep(handler) }
	var rs []*replica
	for i, n := range c.shares {
		rc := cfg
		if i == 0 && n == limit && len(c.shares) > 1 {
			rc.Priority = func(*gin.Context) int { return 10 }
		}
		rs = append(rs, countedReplica(t, srv.addr(), rc, o, &f, h))
	}
	ld := startShape(rs, 6)
	defer ld.end()
	for i := range rs {
		ld.want[i].Store(6)
	}
	eventually(t, 3*time.Second, "the shares did not settle", func() bool {
		for i, r := range rs {
			if r.b.Stats().Limit != c.shares[i] {
				return false
			}
		}
		return true
	})
	if c.restart {
		srv.stop()
		srv.start()
	} else if err := newClient(t, srv.addr()).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if c.join {
		late := countedReplica(t, srv.addr(), cfg, o, &f, h)
		lj := startShape([]*replica{late}, 6)
		defer lj.end()
		lj.set(6)
	}
	time.Sleep(500 * time.Millisecond)
	t.Logf("shares before the loss %v; peak %d slots running across the fleet, limit %d", c.shares, f.peak.Load(), limit)
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d slots running across the fleet after the loss, limit %d", p, limit)
	}
}

// After Redis loses a Name's keys (FLUSHALL, or a restart without
// persistence) the replicas go on running what they were granted, and
// Redis counts none of it. Until the replicas that run those slots have
// synced again, no share may grow into them: not that of a replica that
// held no share (it reports 0, which tells Redis nothing), nor that of a
// replica that joins right after the loss (to it, the new keys look like a
// new Name, so new keys freeze share growth for a sync period).
func TestSharesAfterALossNobodyGrowsIntoHeldSlots(t *testing.T) {
	needRedis(t)
	for _, c := range []lossCase{
		{name: "flushed/without a share", shares: []int{4, 0}},
		{name: "flushed/joining", join: true, shares: []int{4}},
		{name: "restarted/joining", restart: true, join: true, shares: []int{4}},
	} {
		t.Run(c.name, func(t *testing.T) { runLoss(t, c) })
	}
}

// A replica that joins right after a loss held nothing before it: its sync
// must not count toward the replicas that the freeze after the loss waits
// for. Here two replicas hold half the limit each when a third joins: the
// first of the two to sync after the loss, counting the joiner, would find
// the freeze over and grow into the slots the other still runs.
func TestSharesAfterALossAJoinerDoesNotEndTheFreeze(t *testing.T) {
	needRedis(t)
	runLoss(t, lossCase{join: true, shares: []int{2, 2}})
}

// Under FailOpen a replica goes on admitting within its share while Redis
// does not answer, until its lease runs out. When Redis is paused for everyone
// (no partition) for longer than LeaseTTL, no replica could sync, so none
// is dead: the first to sync once Redis answers must not find the others'
// leases run out and be given their shares while they still use them
// (Redis moves every lease on by a gap in everyone's syncs). The slots
// counted outside the library never exceed the limit.
func TestSharesFailOpenPausedPastTheLeaseKeepsTheLimit(t *testing.T) {
	needRedis(t)
	srv := startRedis(t) // CLIENT PAUSE below
	const limit, handler, lease = 4, 40 * time.Millisecond, 200 * time.Millisecond
	var f fleetCounter
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: time.Second}
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, OnRedisDown: redisqueue.FailOpen, LeaseTTL: lease, CallTimeout: 25 * time.Millisecond}
	h := func(*gin.Context) { time.Sleep(handler) }
	rs := []*replica{countedReplica(t, srv.addr(), cfg, o, &f, h), countedReplica(t, srv.addr(), cfg, o, &f, h)}
	ld := startShape(rs, 6)
	defer ld.end()
	ld.set(6, 6)
	eventually(t, 2*time.Second, "the shares did not settle", func() bool {
		return rs[0].b.Stats().Limit == limit/2 && rs[1].b.Stats().Limit == limit/2
	})
	pause(t, srv, 3*lease)
	time.Sleep(3*lease + 400*time.Millisecond)
	t.Logf("peak %d slots running across the fleet, limit %d; shares after the pause %d, %d; outages %d, %d",
		f.peak.Load(), limit, rs[0].b.Stats().Limit, rs[1].b.Stats().Limit, rs[0].b.Stats().Outages, rs[1].b.Stats().Outages)
	if rs[0].b.Stats().Outages == 0 || rs[1].b.Stats().Outages == 0 {
		t.Errorf("a replica never marked Redis down: the pause was not tested")
	}
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d slots running across the fleet through a pause of %v (LeaseTTL %v), limit %d", p, 3*lease, lease, limit)
	}
}

// freezeProxy forwards TCP to a server; while frozen it holds every byte
// both ways and keeps the connections open, as a hung host or a partition
// that drops packets does: calls wait for their timeout instead of failing.
type freezeProxy struct {
	l      net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
}

func newFreezeProxy(t *testing.T, to string) *freezeProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{l: l}
	p.cond = sync.NewCond(&p.mu)
	t.Cleanup(func() { _ = l.Close(); p.setFrozen(false) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			go p.pipe(s, c)
			go p.pipe(c, s)
		}
	}()
	return p
}

// pipe copies src to dst, holding what it read while p is frozen.
func (p *freezeProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.frozen {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *freezeProxy) addr() string { return p.l.Addr().String() }

func (p *freezeProxy) setFrozen(frozen bool) {
	p.mu.Lock()
	p.frozen = frozen
	p.cond.Broadcast()
	p.mu.Unlock()
}

// untilRefused runs clients closed-loop clients on r, each until its first
// 503 or until stop is closed, and hands back every answer once all are
// done.
func untilRefused(r *replica, clients int, stop <-chan struct{}) <-chan []timedAnswer {
	each := make(chan timedAnswer)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				code := r.get()
				each <- timedAnswer{start, time.Now(), code}
				if code == http.StatusServiceUnavailable {
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(each) }()
	all := make(chan []timedAnswer, 1)
	go func() {
		var ans []timedAnswer
		for a := range each {
			ans = append(ans, a)
		}
		all <- ans
	}()
	return all
}

// Under FailClosed a replica that cannot reach Redis gives its share up
// before the lease it holds runs out, when Redis counts the share away (to
// another replica, if this one is only cut off). Its coordinator may be
// held then for a whole CallTimeout in a call to a server that does not
// answer (paused, or frozen behind a partition), so the share is given up
// on a timer of its own, a tenth of a lease early, not between calls. And
// a sync that succeeds renews the lease: no request is refused after it
// for the lease that ran out before. Here Redis stops answering for one
// lease; each client sends requests until it is refused.
func TestSharesFailClosedStopsAdmittingWithinItsLease(t *testing.T) {
	needRedis(t)
	const limit, handler, lease = 4, 10 * time.Millisecond, time.Second
	for _, tt := range []struct {
		name   string
		frozen bool // a proxy freezes the first replica alone; else Redis is paused for both
		// hold is how long Redis does not answer: a lease, and a little
		// more when frozen, as Redis ends a pause a little late on its own.
		hold time.Duration
	}{
		{name: "paused", hold: lease},
		{name: "frozen for one", frozen: true, hold: lease + 50*time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := startRedis(t)
			var f fleetCounter
			cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: time.Second}
			o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, OnRedisDown: redisqueue.FailClosed, LeaseTTL: lease}
			addrs := []string{srv.addr(), srv.addr()}
			var px *freezeProxy
			if tt.frozen {
				px = newFreezeProxy(t, srv.addr())
				addrs[0] = px.addr()
			}
			var rs []*replica
			grants := []chan time.Time{make(chan time.Time, 1<<14), make(chan time.Time, 1<<14)}
			for i, addr := range addrs {
				rs = append(rs, countedReplica(t, addr, cfg, o, &f, func(*gin.Context) {
					grants[i] <- time.Now()
					time.Sleep(handler)
				}))
			}
			stop := make(chan struct{})
			loads := []<-chan []timedAnswer{untilRefused(rs[0], 6, stop), untilRefused(rs[1], 6, stop)}
			eventually(t, 2*time.Second, "the shares did not settle", func() bool {
				return rs[0].b.Stats().Limit == limit/2 && rs[1].b.Stats().Limit == limit/2
			})
			out := time.Now()
			var back time.Time // when Redis answers the cut-off replicas again
			cut := rs
			if tt.frozen {
				px.setFrozen(true)
				time.Sleep(tt.hold)
				px.setFrozen(false)
				back = time.Now()
				cut = rs[:1]
			} else {
				pause(t, srv, tt.hold)
				back = answersAgain(t, srv, out.Add(tt.hold))
			}
			time.Sleep(200 * time.Millisecond)
			close(stop)
			for i, r := range cut {
				ans := <-loads[i]
				close(grants[i])
				late, lastLate, lastIn := 0, time.Duration(0), time.Duration(0)
				for g := range grants[i] {
					switch {
					case !g.Before(back):
					case !g.Before(out.Add(lease)):
						// The lease it holds began before Redis stopped
						// answering.
						late++
						lastLate = g.Sub(out)
					default:
						lastIn = g.Sub(out)
					}
				}
				refused, firstRefused := 0, time.Duration(-1)
				for _, a := range ans {
					if a.code == http.StatusServiceUnavailable && a.at.After(back) {
						if refused++; refused == 1 {
							firstRefused = a.at.Sub(back)
						}
					}
				}
				t.Logf("replica %d: Redis answered again %v after it stopped (LeaseTTL %v); the last admitted within the lease %v "+
					"after Redis stopped, %d after it (the last at %v); %d answered 503 after Redis answered again, the first %s; outages %d",
					i, back.Sub(out).Round(time.Millisecond), lease, lastIn.Round(time.Millisecond), late,
					lastLate.Round(time.Millisecond), refused, after(firstRefused), r.b.Stats().Outages)
				if late > 0 {
					t.Errorf("replica %d admitted %d requests after the lease it held ran out, the last %v after Redis stopped answering",
						i, late, lastLate.Round(time.Millisecond))
				}
				if refused > 0 {
					t.Errorf("replica %d answered %d requests 503 after Redis answered again, the first %s it: its sync renewed the lease",
						i, refused, after(firstRefused))
				}
			}
			for i := len(cut); i < len(rs); i++ {
				<-loads[i]
			}
			if p := f.peak.Load(); p > limit {
				t.Errorf("peak %d slots running across the fleet, limit %d, %v after Redis stopped answering",
					p, limit, time.Unix(0, f.peakAt.Load()).Sub(out).Round(time.Millisecond))
			}
		})
	}
}

// Shares and GlobalQueue count a Name's slots in ways the other does not
// see, so a replica refuses to start beside live replicas of the other
// mode. After a data loss a GlobalQueue replica can start beside running
// Shares replicas (Redis no longer knows them): a Shares replica that then
// finds it live stops admitting, as its share may be spent twice: share 0,
// every request answered 503. Once the Shares replicas have synced (a
// period, and their running requests ended), the fleet never exceeds its
// limit.
func TestSharesStopBesideAGlobalQueueReplicaAfterALoss(t *testing.T) {
	needRedis(t)
	const limit, handler = 4, 10 * time.Millisecond
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			srv := startRedis(t) // FLUSHALL below
			var f fleetCounter
			cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: time.Second}
			o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, OnRedisDown: policy}
			rs := []*replica{newReplica(t, srv.addr(), cfg, o, f.handler(handler)), newReplica(t, srv.addr(), cfg, o, f.handler(handler))}
			eventually(t, 2*time.Second, "the shares did not settle", func() bool {
				return rs[0].b.Stats().Limit == limit/2 && rs[1].b.Stats().Limit == limit/2
			})
			shareLoads := []*recLoad{startRec(rs[0], 6), startRec(rs[1], 6)}
			time.Sleep(100 * time.Millisecond)
			ctl := newClient(t, srv.addr())
			// The GlobalQueue replica must start before a Shares replica
			// syncs again: they re-enter the Name's keys when they do.
			g := &replica{rdb: newClient(t, srv.addr())}
			for attempt := 1; ; attempt++ {
				var err error
				if g.b, err = redisqueue.New(g.rdb, redisqueue.Options{Name: o.Name, OnRedisDown: policy, Mode: redisqueue.GlobalQueue}); err != nil {
					t.Fatal(err)
				}
				gcfg := cfg
				gcfg.Backend = g.b
				if err := ctl.FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				q, err := ginqueue.NewQueue(gcfg)
				if err == nil {
					g.q = q
					break
				}
				if !errors.Is(err, redisqueue.ErrConflict) || attempt == 5 {
					t.Fatalf("the GlobalQueue replica did not start after FLUSHALL (attempt %d): %v", attempt, err)
				}
			}
			t.Cleanup(func() { _ = g.q.Close() })
			g.e = gin.New()
			g.e.GET("/", g.q.Handler(), f.handler(handler))
			started := time.Now()
			gLoad := startRec(g, 6)
			// Within a period each Shares replica has synced and found it,
			// and what it ran has ended.
			time.Sleep(200 * time.Millisecond)
			found := time.Now()
			early := f.peak.Swap(f.now.Load())
			time.Sleep(500 * time.Millisecond)
			peak := f.peak.Load()
			gAns := gLoad.end()
			gServed := 0
			for _, a := range gAns {
				if a.code == http.StatusOK {
					gServed++
				}
			}
			for i, r := range rs {
				ans := shareLoads[i].end()
				codes := map[int]int{}
				for _, a := range ans {
					if a.start.After(found) {
						codes[a.code]++
					}
				}
				t.Logf("Shares replica %d, from %v after the GlobalQueue replica started: share %d, answers %v",
					i, found.Sub(started).Round(time.Millisecond), r.b.Stats().Limit, codes)
				if n := r.b.Stats().Limit; n != 0 {
					t.Errorf("Shares replica %d holds a share of %d beside a live GlobalQueue replica, want 0", i, n)
				}
				if len(codes) != 1 || codes[http.StatusServiceUnavailable] == 0 {
					t.Errorf("Shares replica %d answered %v beside a live GlobalQueue replica, want 503s only", i, codes)
				}
			}
			t.Logf("the GlobalQueue replica served %d; peak %d running across the fleet until the Shares replicas had synced, %d after, limit %d",
				gServed, early, peak, limit)
			if gServed == 0 {
				t.Error("the GlobalQueue replica served nothing")
			}
			if peak > limit {
				t.Errorf("peak %d running across the fleet beside the GlobalQueue replica, limit %d", peak, limit)
			}
		})
	}
}

// Under FailOpen a replica admits within its share while Redis is down,
// until the lease on the share runs out; from then on it answers 503 at
// once, as under FailClosed. Requests that come just after the lease ends
// must not wait in the queue for their QueueTimeout (408) until the
// coordinator happens to look again, until a call it waits on gives up,
// or until enough calls failed to mark Redis down: it stops admitting when
// the lease ends. Here one replica of eight holds the whole limit, and
// Redis is killed (connections refused) or paused (calls wait for their
// CallTimeout; in "slow to mark down", ten of them must fail in a row,
// and the lease runs out first); each client sends requests until its
// first 503.
func TestSharesFailOpenRefusesOnceTheLeaseRunsOut(t *testing.T) {
	needRedis(t)
	slow := redisqueue.Options{CallTimeout: 99 * time.Millisecond, FailureThreshold: 10}
	slow.Shares.Period = 250 * time.Millisecond
	for _, tt := range []struct {
		name   string
		paused bool
		o      redisqueue.Options
	}{
		{name: "killed"},
		{name: "paused", paused: true},
		{name: "slow to mark down", paused: true, o: slow},
	} {
		for round := range 3 {
			t.Run(fmt.Sprintf("%s/%d", tt.name, round), func(t *testing.T) { failOpenLeaseEnd(t, tt.o, tt.paused) })
		}
	}
}

// failOpenLeaseEnd is one round of TestSharesFailOpenRefusesOnceTheLeaseRunsOut.
func failOpenLeaseEnd(t *testing.T, o redisqueue.Options, paused bool) {
	const limit, replicas, lease = 2, 8, time.Second
	srv := startRedis(t)
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 50 * time.Millisecond}
	o.Name, o.Mode, o.OnRedisDown, o.LeaseTTL = newName(t), redisqueue.Shares, redisqueue.FailOpen, lease
	var rs []*replica
	for range replicas {
		rs = append(rs, newReplica(t, srv.addr(), cfg, o, func(*gin.Context) { time.Sleep(2 * time.Millisecond) }))
	}
	stop := make(chan struct{})
	end := sync.OnceFunc(func() { close(stop) })
	defer end()
	busy := rs[0]
	loadDone := untilRefused(busy, 4, stop)
	eventually(t, 3*time.Second, "the busy replica did not get the whole limit", func() bool {
		return busy.b.Stats().Limit == limit
	})
	out := time.Now()
	if paused {
		pause(t, srv, 3*lease)
	} else {
		srv.stop()
	}
	time.AfterFunc(2*lease, end)
	ans := <-loadDone
	timeouts, first503, last200 := 0, time.Duration(-1), time.Duration(0)
	for _, a := range ans {
		if a.start.Before(out) {
			continue // the share was still moving here
		}
		switch a.code {
		case http.StatusOK:
			last200 = max(last200, a.at.Sub(out))
		case http.StatusRequestTimeout:
			timeouts++
		case http.StatusServiceUnavailable:
			if first503 < 0 || a.at.Sub(out) < first503 {
				first503 = a.at.Sub(out)
			}
		}
	}
	t.Logf("Redis stopped answering; %d answers, the last 200 %v after, the first 503 %s, %d × 408 (LeaseTTL %v, QueueTimeout %v)",
		len(ans), last200.Round(time.Millisecond), after(first503), timeouts, lease, cfg.QueueTimeout)
	if timeouts > 0 {
		t.Errorf("%d requests got 408 after Redis stopped answering: once the lease ran out they waited for their QueueTimeout "+
			"instead of a 503 (the last 200 %v after, the first 503 %s)", timeouts, last200.Round(time.Millisecond), after(first503))
	}
	if first503 < 0 {
		t.Errorf("no 503 within %v of Redis stopping", 2*lease)
	}
}
