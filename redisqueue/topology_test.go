package redisqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

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
	// mode is every replica's Options.Mode, GlobalQueue unless a suite
	// sets Shares; topology_shares_test.go says what the runs expect then.
	mode redisqueue.Mode
}

func clusterTopology(c *testCluster) topology {
	return topology{
		mode: redisqueue.GlobalQueue,
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
		mode: redisqueue.GlobalQueue,
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
	t.Run("lost-writes", func(t *testing.T) {
		if top.mode == redisqueue.Shares {
			runLostWritesShares(t, top)
			return
		}
		runLostWrites(t, top)
	})
	t.Run("dead-replica-with-waiters", func(t *testing.T) {
		s := top.spec
		s.Name, s.Limit, s.Waiters = newName(t), 4, 6
		s.Tick, s.Call, s.Lease = 100*time.Millisecond, 50*time.Millisecond, 10*time.Second
		if top.mode == redisqueue.Shares {
			needRedis(t) // the counter outside the library
			s.Tick, s.Lease = 0, 2*time.Second
		}
		c := s.client()
		t.Cleanup(func() { _ = c.Close() })
		if top.mode == redisqueue.Shares {
			runSharesKill(t, s, c)
			return
		}
		runDeadReplicaWithWaiters(t, s, c)
	})
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
