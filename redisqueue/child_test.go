package redisqueue_test

import (
	"bufio"
	"bytes"
	"cmp"
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
	"github.com/ginqueue/ginqueue/backend"
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
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: name, CallTimeout: 2 * time.Second, LeaseTTL: 10 * time.Second, Mode: redisqueue.GlobalQueue})
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
	Shares                           bool // Shares mode; false: GlobalQueue
	Limit, Workers                   int
	Handler, Run, QueueTimeout       time.Duration

	// The fields below may differ between the replicas of one fleet. Zero
	// values keep the defaults: no Config.Cost, a MaxQueue of 20,
	// redisqueue's own Options defaults, a plain counter.

	// Cost, when above 0, sets Config.Cost to give every request this
	// cost, and its handler counts that many on the counter.
	Cost int
	// MaxQueue is the Queue's; zero means 20.
	MaxQueue int
	// The Options fields of the same names; zero takes redisqueue's
	// default.
	LeaseTTL, CallTimeout, TickInterval time.Duration
	FailureThreshold                    int
	Parts                               int
	RebalancePeriod                     time.Duration
	// Live, when set, is a Redis hash on CounterAddr, of this replica
	// alone, where each running handler enters itself: dropLive can then
	// take the handlers of a stopped replica off the counter.
	Live string
}

// options are the redisqueue.Options of s.
func (s fleetSpec) options() redisqueue.Options {
	o := redisqueue.Options{Name: s.Name, OnRedisDown: s.Policy, Mode: redisqueue.GlobalQueue, LeaseTTL: s.LeaseTTL,
		CallTimeout: s.CallTimeout, FailureThreshold: s.FailureThreshold,
		GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: s.TickInterval}}
	if s.Shares {
		o.Mode, o.GlobalQueue = redisqueue.Shares, redisqueue.GlobalQueueOptions{}
		o.Shares = redisqueue.SharesOptions{Parts: s.Parts, RebalancePeriod: s.RebalancePeriod}
	}
	return o
}

type fleetResult struct {
	Peak     int64       // the most handlers the counter saw running at once, fleet-wide
	PeakAt   int64       // when the counter first saw Peak (Unix ms)
	RawPeak  int64       // with Live: Peak with the handlers dropLive took off still counted
	Codes    map[int]int // responses by status
	Local    int         // grants of the FailOpen fallback
	Longest  time.Duration
	Outages  uint64
	Replicas int
	Over     []int64 // when the counter saw more than Limit (Unix ms)
	Served   []int64 // when each 200 was answered (Unix ms)
	// Stall is the longest time this process did not run: how much longer
	// than its period a 10 ms ticker waited (a SIGSTOP shows here).
	Stall time.Duration
}

// fleetMain is one replica of a fleet: see fleetEnv.
func fleetMain() int {
	var s fleetSpec
	if err := json.Unmarshal([]byte(os.Getenv(fleetEnv)), &s); err != nil {
		fmt.Println("error", err)
		return 1
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	ctr := newOutsideCounter(s)
	b, err := redisqueue.New(rdb, s.options())
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var local atomic.Int64
	cfg := ginqueue.Config{MaxConcurrent: s.Limit, MaxQueue: cmp.Or(s.MaxQueue, 20), QueueTimeout: s.QueueTimeout,
		Backend: countLocal{b, &local}}
	if s.Cost > 0 {
		cfg.Cost = func(*gin.Context) int { return s.Cost }
	}
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	e := gin.New()
	e.GET("/", q.Handler(), ctr.handler(s.Handler))
	stall := watchStall()
	fmt.Println("ready")
	res := runClients(&replica{e: e}, s.Workers, s.Run)
	res.Stall = stall()
	ctr.report(&res)
	res.Local = int(local.Load())
	res.Outages = b.Stats().Outages
	if g, err := b.GlobalStats(context.Background()); err == nil {
		res.Replicas = g.Replicas
	}
	_ = q.Close()
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	return 0
}

// runClients runs n closed-loop clients of rep until run has passed and
// returns their responses.
func runClients(rep *replica, n int, run time.Duration) fleetResult {
	var mu sync.Mutex
	res := fleetResult{Codes: map[int]int{}}
	end := time.Now().Add(run)
	var wg sync.WaitGroup
	for range n {
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
	return res
}

// watchStall starts a 10 ms ticker; the func it returns stops it and
// returns the longest it waited beyond its period.
func watchStall() func() time.Duration {
	const period = 10 * time.Millisecond
	done := make(chan struct{})
	longest := make(chan time.Duration)
	go func() {
		tk := time.NewTicker(period)
		defer tk.Stop()
		var most time.Duration
		last := time.Now()
		for {
			select {
			case <-tk.C:
				now := time.Now()
				most = max(most, now.Sub(last)-period)
				last = now
			case <-done:
				longest <- most
				return
			}
		}
	}()
	return func() time.Duration {
		close(done)
		return <-longest
	}
}

// outsideCounter counts the handlers running across a fleet in a Redis
// counter of its own (INCRBY cost as a handler starts, DECRBY cost as it
// ends), and what one replica saw of it.
type outsideCounter struct {
	s    fleetSpec
	ctr  *redis.Client
	seq  atomic.Uint64
	mu   sync.Mutex
	peak int64
	at   int64
	raw  int64
	over []int64
}

func newOutsideCounter(s fleetSpec) *outsideCounter {
	return &outsideCounter{s: s, ctr: redis.NewClient(&redis.Options{Addr: s.CounterAddr})}
}

// liveStart counts a handler (ARGV[1], of cost ARGV[2]) in the counter
// (KEYS[1]) and in the replica's hash of running handlers (KEYS[2]), and in
// the raw count (KEYS[3]) that dropLive leaves alone; liveEnd takes it off,
// from the counter only if dropLive has not already.
var (
	liveStart = redis.NewScript(`
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return {redis.call('INCRBY', KEYS[1], ARGV[2]), redis.call('INCRBY', KEYS[3], ARGV[2])}`)
	liveEnd = redis.NewScript(`
redis.call('DECRBY', KEYS[3], ARGV[2])
if redis.call('HDEL', KEYS[2], ARGV[1]) == 1 then redis.call('DECRBY', KEYS[1], ARGV[2]) end
return 0`)
)

// handler returns the route's handler: it counts itself for d.
func (o *outsideCounter) handler(d time.Duration) gin.HandlerFunc {
	cost := int64(max(o.s.Cost, 1))
	return func(c *gin.Context) {
		ctx := context.Background()
		if o.s.Live == "" {
			if n, err := o.ctr.IncrBy(ctx, o.s.Counter, cost).Result(); err == nil {
				o.saw(n, n)
			}
			time.Sleep(d)
			o.ctr.DecrBy(ctx, o.s.Counter, cost)
			return
		}
		keys := []string{o.s.Counter, o.s.Live, o.s.Counter + ":raw"}
		id := strconv.FormatUint(o.seq.Add(1), 36)
		if v, err := liveStart.Run(ctx, o.ctr, keys, id, cost).Int64Slice(); err == nil && len(v) == 2 {
			o.saw(v[0], v[1])
		}
		time.Sleep(d)
		liveEnd.Run(ctx, o.ctr, keys, id, cost)
	}
}

// saw records that a handler starting now saw n running, raw with the
// handlers dropLive took off.
func (o *outsideCounter) saw(n, raw int64) {
	now := time.Now().UnixMilli()
	o.mu.Lock()
	defer o.mu.Unlock()
	if n > o.peak {
		o.peak, o.at = n, now
	}
	o.raw = max(o.raw, raw)
	if n > int64(o.s.Limit) {
		o.over = append(o.over, now)
	}
}

// report puts what the counter saw in r.
func (o *outsideCounter) report(r *fleetResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r.Peak, r.PeakAt, r.Over = o.peak, o.at, o.over
	r.RawPeak = max(o.raw, o.peak)
}

// countLocal counts the grants of the FailOpen fallback.
type countLocal struct {
	*redisqueue.Backend
	n *atomic.Int64
}

func (b countLocal) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	t, err := b.Backend.Acquire(ctx, a)
	if err == nil && redisqueue.GrantedLocally(t) {
		b.n.Add(1)
	}
	return t, err
}

// fleetProc is one replica of a fleet, an OS process running fleetMain.
type fleetProc struct {
	cmd   *exec.Cmd
	lines chan string // what it prints, a line at a time
}

// startFleetProc starts a replica of s; it is killed at the end of the test.
func startFleetProc(t *testing.T, s fleetSpec) *fleetProc {
	t.Helper()
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
	return &fleetProc{cmd, lines}
}

// first returns the first line p printed: "ready", or why it could not
// start.
func (p *fleetProc) first(t *testing.T) string {
	t.Helper()
	select {
	case l := <-p.lines:
		return l
	case <-time.After(20 * time.Second):
		t.Fatal("a replica did not start")
	}
	return ""
}

// ready waits until p is ready.
func (p *fleetProc) ready(t *testing.T) {
	t.Helper()
	if l := p.first(t); l != "ready" {
		t.Fatalf("a replica: %s", l)
	}
}

// result waits up to d for p's result.
func (p *fleetProc) result(t *testing.T, d time.Duration) fleetResult {
	t.Helper()
	var r fleetResult
	select {
	case l := <-p.lines:
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("a replica printed %q", l)
		}
	case <-time.After(d):
		t.Fatal("a replica did not finish")
	}
	return r
}

// runFleet runs 3 replicas of s as OS processes; during the run, fault
// is applied after a second. It returns each replica's result.
func runFleet(t *testing.T, s fleetSpec, fault func()) []fleetResult {
	t.Helper()
	const procs = 3
	var ps []*fleetProc
	for range procs {
		ps = append(ps, startFleetProc(t, s))
	}
	for _, p := range ps {
		p.ready(t)
	}
	time.Sleep(time.Second)
	fault()
	var rs []fleetResult
	for _, p := range ps {
		rs = append(rs, p.result(t, s.Run+20*time.Second))
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
