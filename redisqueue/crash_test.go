package redisqueue_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// doomedEnv makes the test binary a replica that is killed with SIGKILL: it
// holds every slot of the limit and has waiters queued, prints "ready" and
// blocks until it is killed.
const doomedEnv = "REDISQUEUE_TEST_DOOMED"

// doomedSpec is what a doomed replica is told, as JSON in doomedEnv.
type doomedSpec struct {
	Kind    string   // "plain", "cluster" or "sentinel"
	Addrs   []string // the server, the cluster's nodes or the sentinels
	Master  string   // the Sentinel master name
	Name    string
	Limit   int
	Waiters int
	Tick    time.Duration
	Call    time.Duration
	Lease   time.Duration
	Shares  bool // Shares mode; false: GlobalQueue
}

// client builds the client of s.Kind.
func (s doomedSpec) client() redis.UniversalClient {
	switch s.Kind {
	case "cluster":
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.Addrs, ContextTimeoutEnabled: true,
			ReadTimeout: 500 * time.Millisecond})
	case "sentinel":
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Addrs,
			ContextTimeoutEnabled: true})
	}
	return redis.NewClient(&redis.Options{Addr: s.Addrs[0], ContextTimeoutEnabled: true})
}

func (s doomedSpec) options() redisqueue.Options {
	if s.Shares {
		return redisqueue.Options{Name: s.Name, CallTimeout: s.Call, LeaseTTL: s.Lease}
	}
	return redisqueue.Options{Name: s.Name, CallTimeout: s.Call, LeaseTTL: s.Lease, Mode: redisqueue.GlobalQueue,
		GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: s.Tick}}
}

func (s doomedSpec) limits() backend.Limits {
	return backend.Limits{MaxConcurrent: s.Limit, MaxQueue: 4 * (s.Limit + s.Waiters), QueueTimeout: time.Minute}
}

// doomedMain is the doomed replica's process.
func doomedMain() int {
	var s doomedSpec
	if err := json.Unmarshal([]byte(os.Getenv(doomedEnv)), &s); err != nil {
		fmt.Println("error", err)
		return 1
	}
	b, err := redisqueue.New(s.client(), s.options())
	if err == nil {
		err = b.Start(s.limits())
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	ctx := context.Background()
	for range s.Limit {
		if _, err := b.Acquire(ctx, backend.Arrival{}); err != nil {
			fmt.Println("error", err)
			return 1
		}
	}
	for range s.Waiters {
		go func() { _, _ = b.Acquire(ctx, backend.Arrival{}) }()
	}
	for b.Stats().Queued < s.Waiters {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("ready")
	select {}
}

// startDoomed starts a doomed replica of s and returns it once it holds
// every slot and its waiters are queued. The test kills it at its end if it
// has not.
func startDoomed(t *testing.T, s doomedSpec) *exec.Cmd {
	t.Helper()
	spec, _ := json.Marshal(s)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), doomedEnv+"="+string(spec))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case l := <-lines:
		if l != "ready" {
			t.Fatalf("the doomed replica: %s", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the doomed replica was not ready within 20 s")
	}
	return cmd
}

// runDeadReplicaWithWaiters: a replica holding every slot, with waiters
// queued ahead of another replica's, is killed with SIGKILL. Its waiters
// are never granted once it has stopped syncing, and the fleet has its full
// capacity back within the liveness lease and a tick, far inside LeaseTTL;
// the dead replica's notice list is gone and every key has a TTL.
func runDeadReplicaWithWaiters(t *testing.T, s doomedSpec, survivorClient redis.UniversalClient) {
	ctx := context.Background()
	cmd := startDoomed(t, s)
	dead, err := survivorClient.ZRange(ctx, "ginqueue:{"+s.Name+"}:r", 0, -1).Result()
	if err != nil || len(dead) != 1 {
		t.Fatalf("the live replicas before the survivor started: %v, %v", dead, err)
	}
	survivor, err := redisqueue.New(survivorClient, s.options())
	if err != nil {
		t.Fatal(err)
	}
	if err := survivor.Start(s.limits()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = survivor.Close() })
	// A counter outside the library: the survivor's requests running.
	var running, peak atomic.Int64
	type res struct {
		at  time.Time
		err error
	}
	out := make(chan res, s.Limit)
	var wg sync.WaitGroup
	hold := make(chan struct{})
	for range s.Limit {
		wg.Go(func() {
			tk, err := survivor.Acquire(ctx, backend.Arrival{})
			out <- res{time.Now(), err}
			if err != nil {
				return
			}
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			<-hold
			running.Add(-1)
			survivor.Release(tk)
		})
	}
	eventually(t, 5*time.Second, "the survivor's waiters were not queued", func() bool {
		g, err := survivor.GlobalStats(ctx)
		return err == nil && g.Queued == s.Waiters+s.Limit
	})
	time.Sleep(2 * s.Tick) // both replicas sync: the survivor's waiters are behind the doomed one's
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = cmd.Wait()
	var last time.Time
	for range s.Limit {
		select {
		case r := <-out:
			if r.err != nil {
				t.Fatalf("a survivor's waiter: %v", r.err)
			}
			last = r.at
		case <-time.After(s.Lease):
			t.Fatalf("after the kill, the survivor got only part of the capacity within LeaseTTL %v", s.Lease)
		}
	}
	back := last.Sub(killed)
	bound := 3*s.Tick + s.Tick + 4*s.Call + 400*time.Millisecond // the liveness lease, a tick, slack for -race
	t.Logf("%s: the fleet's %d slots were all back on the survivor %v after SIGKILL of a replica with %d waiters (LeaseTTL %v)",
		s.Kind, s.Limit, back.Round(time.Millisecond), s.Waiters, s.Lease)
	if back > bound {
		t.Errorf("the capacity came back %v after the kill, want within %v", back, bound)
	}
	if p := peak.Load(); p > int64(s.Limit) {
		t.Errorf("%d ran at once on the survivor, limit %d", p, s.Limit)
	}
	g, err := survivor.GlobalStats(ctx)
	if err != nil || g.Running != s.Limit || g.Queued != 0 || g.Replicas != 1 {
		t.Errorf("after the kill: %+v, %v; want the survivor's %d running, nobody queued, 1 replica", g, err, s.Limit)
	}
	if keys, err := keysWithoutTTL(ctx, survivorClient, s.Name); err != nil || len(keys) > 0 {
		t.Errorf("keys without a TTL: %v (%v)", keys, err)
	}
	// The dead replica's notice list is gone: nothing was pushed to it
	// after it left, nor stays.
	if n, err := survivorClient.Exists(ctx, "ginqueue:{"+s.Name+"}:g:"+dead[0]).Result(); err != nil || n != 0 {
		t.Errorf("the dead replica's notice list is still there (%v)", err)
	}
	close(hold)
	wg.Wait()
	eventually(t, 3*time.Second, "slots or places left in Redis", func() bool { return globalIdle(survivor) })
}

func TestDeadReplicaWithWaitersStallsNobody(t *testing.T) {
	needRedis(t)
	t.Parallel()
	s := doomedSpec{Kind: "plain", Addrs: []string{redisAddr}, Name: newName(t), Limit: 4, Waiters: 6,
		Tick: 100 * time.Millisecond, Call: 50 * time.Millisecond, Lease: 10 * time.Second}
	runDeadReplicaWithWaiters(t, s, newClient(t, redisAddr))
}

// Every key a Name's replicas write expires once none is live: after a
// short run that ends with Close, and after one whose only replica is
// killed.
func TestKeysExpireWithTheLastReplica(t *testing.T) {
	needRedis(t)
	t.Parallel()
	ctx := context.Background()
	rdb := newClient(t, redisAddr)
	t.Run("closed", func(t *testing.T) {
		name := newName(t)
		b, err := redisqueue.New(newClient(t, redisAddr), redisqueue.Options{Name: name, Mode: redisqueue.GlobalQueue})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(backend.Limits{MaxConcurrent: 1, MaxQueue: 4, Weighted: true}); err != nil {
			t.Fatal(err)
		}
		if err := b.SetLimit(2); err != nil {
			t.Fatal(err)
		}
		tk, err := b.Acquire(ctx, backend.Arrival{Cost: 2})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan backend.Ticket)
		go func() {
			t2, _ := b.Acquire(ctx, backend.Arrival{Cost: 2})
			done <- t2
		}()
		waitQueued(t, b, 1)
		b.Release(tk)
		b.Release(<-done)
		_ = b.Close()
		if keys, err := keysWithoutTTL(ctx, rdb, name); err != nil || len(keys) > 0 {
			t.Errorf("keys without a TTL after a short run: %v (%v)", keys, err)
		}
	})
	t.Run("killed", func(t *testing.T) {
		s := doomedSpec{Kind: "plain", Addrs: []string{redisAddr}, Name: newName(t), Limit: 2, Waiters: 3,
			Tick: 5 * time.Second, Call: 150 * time.Millisecond, Lease: 15 * time.Second}
		cmd := startDoomed(t, s) // a tick of 5 s: no sync after Start's
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		if keys, err := keysWithoutTTL(ctx, rdb, s.Name); err != nil || len(keys) > 0 {
			t.Errorf("keys without a TTL after the only replica was killed: %v (%v)", keys, err)
		}
		n, _ := rdb.Keys(ctx, "ginqueue:{"+s.Name+"}:*").Result()
		if !strings.Contains(strings.Join(n, " "), ":seq") {
			t.Errorf("the run wrote no sequence key (keys %v): the test does not test it", n)
		}
	})
}
