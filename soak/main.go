// Command soak puts ginqueue under load, faults and a Close in the middle,
// over real HTTP on 127.0.0.1, with the in-memory and the Redis backends in
// turn, and checks that nothing is lost or leaked:
//
//   - every request gets exactly one outcome: the response its client read,
//     or its client's own hang-up; the server's OnOutcome agrees with what
//     the client read, and fires at most once per request;
//   - running requests never exceed the limit;
//   - the Queue counters equal the outcomes the server reported;
//   - goroutines and heap come back to where they started.
//
// It prints a summary and, with -out, writes RELIABILITY.md. It stops by
// itself: `make soak` runs it for about two and a half minutes.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// The shape of the load.
const (
	limit        = 8
	maxQueue     = 64
	perFlow      = 24
	queueTimeout = 150 * time.Millisecond
	keepAlive    = 120 // workers on keep-alive connections
	shortLived   = 30  // workers that open a connection per request
	clients      = 20  // flow keys
)

func main() {
	total := flag.Duration("duration", 150*time.Second, "total load time, split between the backends")
	out := flag.String("out", "", "write RELIABILITY.md to this path")
	addr := flag.String("redis", envOr("REDIS_ADDR", "127.0.0.1:6379"), "Redis address for the redisqueue run")
	only := flag.String("backend", "", `run one backend only, "memory" or "redis", for the whole duration`)
	flag.Parse()
	gin.SetMode(gin.ReleaseMode)

	backends := []string{"memory", "redis"}
	switch *only {
	case "":
	case "memory", "redis":
		backends = []string{*only}
	default:
		fmt.Fprintf(os.Stderr, "soak: -backend must be memory or redis, got %q\n", *only)
		os.Exit(2)
	}
	var results []*result
	for _, backend := range backends {
		r, err := soak(backend, *total/time.Duration(len(backends)), *addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "soak %s: %v\n", backend, err)
			os.Exit(1)
		}
		results = append(results, r)
		r.print(os.Stdout)
	}
	failed := false
	for _, r := range results {
		failed = failed || len(r.problems) > 0
	}
	if *out != "" {
		if err := writeReport(*out, results, *total); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			os.Exit(1)
		}
	}
	if failed {
		fmt.Println("soak: FAILED")
		os.Exit(1)
	}
	fmt.Println("soak: ok, nothing lost or leaked")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// record is what happened to one request, on both sides.
type record struct {
	status   int    // what the client read; 0 if it gave up
	gone     string // the client's own error, if it gave up
	panicked bool   // the handler was asked to panic
	outcomes []ginqueue.Outcome
}

// server is the system under test: a gin engine whose throttle is a Queue
// that can be swapped (the old one shut down) while requests flow.
type server struct {
	backend  string
	rdb      *redis.Client
	name     string
	cur      atomic.Pointer[ginqueue.Queue]
	gen      atomic.Int64
	mu       sync.Mutex
	queues   []*ginqueue.Queue
	records  map[int64]*record
	running  [2]atomic.Int64 // per generation parity (memory) ...
	total    atomic.Int64    // ... and over all (redis: one global limit)
	peakGen  atomic.Int64
	peakAll  atomic.Int64
	handlers atomic.Int64
}

func (s *server) newQueue() (*ginqueue.Queue, error) {
	cfg := ginqueue.Config{
		MaxConcurrent: limit, MaxQueue: maxQueue, QueueTimeout: queueTimeout,
		Priority: func(c *gin.Context) int {
			p, _ := strconv.Atoi(c.GetHeader("X-Priority"))
			return p
		},
		FlowKey:         ginqueue.ByHeader("X-Client"),
		MaxQueuePerFlow: perFlow,
		RejectEarly:     false,
		OnOutcome: func(c *gin.Context, o ginqueue.Outcome, _ time.Duration) {
			id, _ := strconv.ParseInt(c.Query("id"), 10, 64)
			s.mu.Lock()
			r := s.records[id]
			if r == nil {
				r = &record{}
				s.records[id] = r
			}
			r.outcomes = append(r.outcomes, o)
			s.mu.Unlock()
		},
	}
	if s.backend == "redis" {
		b, err := redisqueue.New(s.rdb, redisqueue.Options{Name: s.name, Mode: redisqueue.GlobalQueue})
		if err != nil {
			return nil, err
		}
		cfg.Backend = b
		cfg.MaxQueuePerFlow = 0 // the fleet's queue counts no places per flow
	}
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.queues = append(s.queues, q)
	s.mu.Unlock()
	return q, nil
}

// rotate puts a new Queue in front and shuts the old one down: its waiters
// get 503 at once, its running requests finish.
func (s *server) rotate() error {
	q, err := s.newQueue()
	if err != nil {
		return err
	}
	old := s.cur.Swap(q)
	s.gen.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return old.Shutdown(ctx)
}

func (s *server) engine() *gin.Engine {
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, _ any) { c.AbortWithStatus(http.StatusInternalServerError) }))
	r.Use(func(c *gin.Context) {
		c.Set("gen", s.gen.Load())
		s.cur.Load().Handler()(c)
	})
	r.GET("/work", func(c *gin.Context) {
		gen := c.GetInt64("gen") & 1
		n := s.running[gen].Add(1)
		all := s.total.Add(1)
		s.handlers.Add(1)
		raise(&s.peakGen, n)
		raise(&s.peakAll, all)
		defer func() {
			s.running[gen].Add(-1)
			s.total.Add(-1)
		}()
		ms, _ := strconv.Atoi(c.Query("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		if c.Query("panic") == "1" {
			panic("soak: planned panic")
		}
		c.String(http.StatusOK, "ok")
	})
	return r
}

func raise(peak *atomic.Int64, n int64) {
	for {
		p := peak.Load()
		if n <= p || peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// result is one backend's run.
type result struct {
	backend                                           string
	duration                                          time.Duration
	sent                                              int
	byStatus                                          map[int]int
	gone                                              int
	goneServer                                        map[string]int // what the server did for requests whose client gave up
	outcomes                                          map[ginqueue.Outcome]int
	stats                                             ginqueue.Stats
	peakRunning, peakGlobal                           int64
	limitNote                                         string
	goroutinesBefore, goroutinesAfter, peakGoroutines int
	heapBefore, heapAfter                             uint64
	rotations                                         int
	problems                                          []string
}

func soak(backend string, d time.Duration, addr string) (*result, error) {
	res := &result{backend: backend, duration: d, byStatus: map[int]int{}, goneServer: map[string]int{},
		outcomes: map[ginqueue.Outcome]int{}}
	res.goroutinesBefore, res.heapBefore = settle(0, 0)

	s := &server{backend: backend, records: map[int64]*record{}, name: fmt.Sprintf("soak-%x", rand.Uint64())}
	if backend == "redis" {
		s.rdb = redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 64})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := s.rdb.Ping(ctx).Err()
		cancel()
		if err != nil {
			s.rdb.Close()
			return nil, fmt.Errorf("no Redis at %s (start one: redis-server --port 6379 --save ''): %w", addr, err)
		}
	}
	q, err := s.newQueue()
	if err != nil {
		return nil, err
	}
	s.cur.Store(q)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: s.engine(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	base := "http://" + ln.Addr().String() + "/work"

	keep := &http.Transport{MaxIdleConnsPerHost: keepAlive, MaxConnsPerHost: keepAlive}
	short := &http.Transport{DisableKeepAlives: true}
	ctx, stop := context.WithTimeout(context.Background(), d)
	defer stop()

	var ids atomic.Int64
	var peakG atomic.Int64
	var wg sync.WaitGroup
	var cmu sync.Mutex
	client := map[int64]*record{}
	worker := func(w int, tr *http.Transport) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(uint64(w), 42))
		hc := &http.Client{Transport: tr}
		for ctx.Err() == nil {
			id := ids.Add(1)
			rec := &record{panicked: rng.IntN(50) == 0}
			url := fmt.Sprintf("%s?id=%d&ms=%d&panic=%d", base, id, rng.IntN(21), b2i(rec.panicked))
			rctx, cancel := context.WithCancel(context.Background())
			switch k := rng.IntN(100); {
			case k < 5: // the client hangs up
				time.AfterFunc(time.Duration(rng.IntN(120))*time.Millisecond, cancel)
			case k < 8: // the client's own timeout
				rctx, cancel = context.WithTimeout(context.Background(), time.Duration(20+rng.IntN(60))*time.Millisecond)
			}
			req, _ := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
			req.Header.Set("X-Client", fmt.Sprint("c", w%clients))
			req.Header.Set("X-Priority", fmt.Sprint(rng.IntN(3)))
			resp, err := hc.Do(req)
			if err != nil {
				rec.gone = err.Error()
			} else {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				rec.status = resp.StatusCode
			}
			cancel()
			cmu.Lock()
			client[id] = rec
			cmu.Unlock()
			time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond) // think
		}
	}
	for w := range keepAlive {
		wg.Add(1)
		go worker(w, keep)
	}
	for w := range shortLived {
		wg.Add(1)
		go worker(keepAlive+w, short)
	}
	// Sample goroutines; rotate the Queue (a Close with requests in flight)
	// at a third and at two thirds of the run.
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				raise(&peakG, int64(runtime.NumGoroutine()))
			}
		}
	}()
	for i := 1; i <= 2; i++ {
		select {
		case <-ctx.Done():
		case <-time.After(d / 3):
			if err := s.rotate(); err != nil {
				res.problems = append(res.problems, "rotate: "+err.Error())
			}
			res.rotations++
		}
	}
	wg.Wait()
	close(done)

	// Shut everything down, then check.
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.cur.Load().Shutdown(shut); err != nil {
		res.problems = append(res.problems, "shutdown: "+err.Error())
	}
	if err := srv.Shutdown(shut); err != nil {
		res.problems = append(res.problems, "server shutdown: "+err.Error())
	}
	keep.CloseIdleConnections()
	short.CloseIdleConnections()
	for _, q := range s.queues {
		st := q.Stats()
		res.stats.Served += st.Served
		res.stats.QueueFull += st.QueueFull
		res.stats.QueueTimeout += st.QueueTimeout
		res.stats.Canceled += st.Canceled
		res.stats.Closed += st.Closed
		if st.Running != 0 || st.Queued != 0 {
			res.problems = append(res.problems, fmt.Sprintf("a queue still holds %d running, %d queued", st.Running, st.Queued))
		}
	}
	if s.rdb != nil {
		s.rdb.Close()
	}
	res.check(client, s)
	res.peakGoroutines = int(peakG.Load())
	client, s.records = nil, nil
	res.goroutinesAfter, res.heapAfter = settle(res.goroutinesBefore, res.heapBefore)
	if res.goroutinesAfter > res.goroutinesBefore+goroutineMargin {
		res.problems = append(res.problems, fmt.Sprintf("goroutines: %d before, %d after", res.goroutinesBefore, res.goroutinesAfter))
	}
	if res.heapAfter > res.heapBefore+heapMargin {
		res.problems = append(res.problems, fmt.Sprintf("heap: %d before, %d after", res.heapBefore, res.heapAfter))
	}
	return res, nil
}

// The margins for "back to where they started".
const (
	goroutineMargin = 2
	heapMargin      = 4 << 20
)

// settle collects garbage until goroutines and heap stop falling (at most a
// few seconds) and returns them.
func settle(goroutines int, heap uint64) (int, uint64) {
	var ms runtime.MemStats
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		g := runtime.NumGoroutine()
		if goroutines == 0 || (g <= goroutines+goroutineMargin && ms.HeapAlloc <= heap+heapMargin) || time.Now().After(deadline) {
			return g, ms.HeapAlloc
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
