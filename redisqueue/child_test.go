package redisqueue_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// childEnv makes the test binary a child replica: "addr name requests".
const childEnv = "REDISQUEUE_TEST_CHILD"

const childLimit = 3

// childMain is one OS process of TestThreeProcessesShareOneLimit. It counts
// the requests running in the whole fleet with a Redis counter and prints
// the highest count it saw and its outcomes.
func childMain() int {
	f := strings.Fields(os.Getenv(childEnv))
	addr, name := f[0], f[1]
	n, _ := strconv.Atoi(f[2])
	gin.SetMode(gin.ReleaseMode)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: name, CallTimeout: 2 * time.Second, LeaseTTL: 10 * time.Second})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: childLimit, MaxQueue: 100, QueueTimeout: 20 * time.Second, Backend: b})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer q.Close()
	counter := "ginqueue-test:{" + name + "}:running"
	var peak atomic.Int64
	e := gin.New()
	e.GET("/", q.Handler(), func(c *gin.Context) {
		ctx := context.Background()
		v, _ := rdb.Incr(ctx, counter).Result()
		for p := peak.Load(); v > p && !peak.CompareAndSwap(p, v); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		rdb.Decr(ctx, counter)
	})
	r := &replica{e: e}
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := i; j < n; j += 8 {
				if r.get() == 200 {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("peak=%d served=%d\n", peak.Load(), ok.Load())
	return 0
}

func TestThreeProcessesShareOneLimit(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const procs, requests = 3, 60
	name := newName(t)
	type result struct {
		out []byte
		err error
	}
	results := make(chan result, procs)
	for range procs {
		go func() {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", childEnv, redisAddr, name, requests))
			out, err := cmd.CombinedOutput()
			results <- result{out, err}
		}()
	}
	for range procs {
		r := <-results
		if r.err != nil {
			t.Fatalf("child: %v\n%s", r.err, r.out)
		}
		var peak, served int
		sc := bufio.NewScanner(bytes.NewReader(r.out))
		for sc.Scan() {
			if _, err := fmt.Sscanf(sc.Text(), "peak=%d served=%d", &peak, &served); err == nil {
				break
			}
		}
		t.Logf("child: peak %d, served %d", peak, served)
		if peak > childLimit {
			t.Fatalf("%d requests ran at once across the processes, limit %d", peak, childLimit)
		}
		if served != requests {
			t.Fatalf("a child served %d of %d\n%s", served, requests, r.out)
		}
	}
}

// fleetEnv makes the test binary one replica of a fleet under load: it runs
// closed-loop clients through a Queue for a while and prints what it saw as
// JSON. The handlers count themselves in a Redis counter of their own, on
// another server than the fleet's: a counter outside the library.
const fleetEnv = "REDISQUEUE_TEST_FLEET"

type fleetSpec struct {
	Addr, CounterAddr, Counter, Name string
	Policy                           redisqueue.Policy
	Mode                             redisqueue.Mode // GlobalQueue (the zero value) or Shares
	Limit, Workers                   int
	Handler, Run, QueueTimeout       time.Duration
}

type fleetResult struct {
	Peak     int64       // the most handlers the counter saw running at once, fleet-wide
	Codes    map[int]int // responses by status
	Local    int         // grants of the FailOpen fallback
	Longest  time.Duration
	Outages  uint64
	Replicas int
	Over     []int64 // when the counter saw more than Limit (Unix ms)
	Served   []int64 // when each 200 was answered (Unix ms)
}

// fleetMain is one replica of runFleet.
func fleetMain() int {
	var s fleetSpec
	if err := json.Unmarshal([]byte(os.Getenv(fleetEnv)), &s); err != nil {
		fmt.Println("error", err)
		return 1
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	ctr := redis.NewClient(&redis.Options{Addr: s.CounterAddr})
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: s.Name, OnRedisDown: s.Policy, Mode: s.Mode})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var local atomic.Int64
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: s.Limit, MaxQueue: 20, QueueTimeout: s.QueueTimeout,
		Backend: countLocal{b, &local}})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var peak atomic.Int64
	var overMu sync.Mutex
	var over []int64
	h := func(c *gin.Context) {
		ctx := context.Background()
		n, err := ctr.Incr(ctx, s.Counter).Result()
		if err == nil {
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			if n > int64(s.Limit) {
				overMu.Lock()
				over = append(over, time.Now().UnixMilli())
				overMu.Unlock()
			}
		}
		time.Sleep(s.Handler)
		ctr.Decr(ctx, s.Counter)
	}
	e := gin.New()
	e.GET("/", q.Handler(), h)
	rep := &replica{e: e}
	fmt.Println("ready")
	var mu sync.Mutex
	res := fleetResult{Codes: map[int]int{}}
	end := time.Now().Add(s.Run)
	var wg sync.WaitGroup
	for range s.Workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				start := time.Now()
				code := rep.get()
				d := time.Since(start)
				mu.Lock()
				res.Codes[code]++
				res.Longest = max(res.Longest, d)
				if code == 200 {
					res.Served = append(res.Served, time.Now().UnixMilli())
				}
				mu.Unlock()
				if code != 200 {
					time.Sleep(5 * time.Millisecond) // a client that was refused does not spin
				}
			}
		})
	}
	wg.Wait()
	res.Peak, res.Local, res.Over = peak.Load(), int(local.Load()), over
	res.Outages = b.Stats().Outages
	if g, err := b.GlobalStats(context.Background()); err == nil {
		res.Replicas = g.Replicas
	}
	_ = q.Close()
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	return 0
}

// countLocal counts the grants of the FailOpen fallback.
type countLocal struct {
	*redisqueue.Backend
	n *atomic.Int64
}

func (b countLocal) Acquire(ctx context.Context, a ginqueue.Arrival) (ginqueue.Ticket, error) {
	t, err := b.Backend.Acquire(ctx, a)
	if err == nil && redisqueue.GrantedLocally(t) {
		b.n.Add(1)
	}
	return t, err
}

// runFleet runs 3 replicas of s as OS processes; during the run, fault
// is applied after a second. It returns each replica's result.
func runFleet(t *testing.T, s fleetSpec, fault func()) []fleetResult {
	t.Helper()
	const procs = 3
	type started struct {
		cmd   *exec.Cmd
		lines chan string
	}
	var ps []started
	for range procs {
		spec, _ := json.Marshal(s)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fleetEnv+"="+string(spec))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		lines := make(chan string, 4)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		ps = append(ps, started{cmd, lines})
	}
	for _, p := range ps {
		if l := <-p.lines; l != "ready" {
			t.Fatalf("a replica: %s", l)
		}
	}
	time.Sleep(time.Second)
	fault()
	var rs []fleetResult
	for _, p := range ps {
		var r fleetResult
		select {
		case l := <-p.lines:
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("a replica printed %q", l)
			}
		case <-time.After(s.Run + 20*time.Second):
			t.Fatal("a replica did not finish")
		}
		rs = append(rs, r)
	}
	return rs
}

// TestFleetPausedKeepsTheLimit: 3 OS processes of one service share a limit
// of 4 under a load of 12 closed-loop clients (50 ms handlers), and Redis is
// paused for 3 s (CLIENT PAUSE ALL). Under FailOpen the replicas admit on
// their own meanwhile, and the counter outside the library never sees more
// than 4 running, at the start of the pause, during it or at its end; under
// FailClosed neither, and nobody gets a 408.
func TestFleetPausedKeepsTheLimit(t *testing.T) {
	long(t)
	needRedis(t)
	srv := startRedis(t) // CLIENT PAUSE would stall every user of a shared Redis
	for _, policy := range []redisqueue.Policy{redisqueue.FailOpen, redisqueue.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			s := fleetSpec{Addr: srv.addr(), CounterAddr: redisAddr, Counter: "ginqueue-test:" + newName(t),
				Name: newName(t), Policy: policy, Limit: 4, Workers: 4, Handler: 50 * time.Millisecond,
				Run: 6 * time.Second, QueueTimeout: 2 * time.Second}
			ctl := newClient(t, srv.addr())
			var paused time.Time
			rs := runFleet(t, s, func() {
				paused = time.Now()
				if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", 3000, "ALL").Err(); err != nil {
					t.Error(err)
				}
			})
			for i, r := range rs {
				t.Logf("%s replica %d: peak %d running fleet-wide, %d local grants, responses %v, longest %v, outages %d",
					policy, i, r.Peak, r.Local, r.Codes, r.Longest.Round(time.Millisecond), r.Outages)
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
				if policy == redisqueue.FailClosed && r.Codes[408] > 0 {
					t.Errorf("FailClosed: replica %d answered %d × 408", i, r.Codes[408])
				}
				if r.Longest > s.QueueTimeout+s.Handler+500*time.Millisecond {
					t.Errorf("replica %d: a request took %v, past its QueueTimeout %v", i, r.Longest, s.QueueTimeout)
				}
			}
		})
	}
}
