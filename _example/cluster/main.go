// Command cluster runs three replicas of one service on three ports, sharing
// one limit through Redis (REDIS_ADDR, default 127.0.0.1:6379), in each of
// redisqueue's two modes. With the global queue it fires a burst at them
// round-robin and prints which replica served each request, when, and the
// global outcome counts. With leased shares (the default mode) it puts an
// uneven load on them, moves it from one replica to another, and prints each
// replica's share of the limit as it follows the load. It exits by itself.
//
//	go run ./cluster
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

const (
	replicas = 3
	burst    = 24
	work     = 100 * time.Millisecond
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

type server struct {
	name string
	url  string
	q    *ginqueue.Queue
	srv  *http.Server
	rdb  *redis.Client
}

func run() error {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	ping := redis.NewClient(&redis.Options{Addr: addr})
	err := ping.Ping(context.Background()).Err()
	_ = ping.Close()
	if err != nil {
		return fmt.Errorf("no Redis at %s (start one with: redis-server --port 6379 --save ''): %w", addr, err)
	}
	gin.SetMode(gin.ReleaseMode)

	// One Name per run, so that a run never meets the leases of another.
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "cluster-demo-" + hex.EncodeToString(rnd[:])
	cfg := ginqueue.Config{MaxConcurrent: 4, MaxQueue: 8, QueueTimeout: 250 * time.Millisecond}
	fmt.Printf("3 replicas, one Redis (%s), Name %q: MaxConcurrent %d, MaxQueue %d, QueueTimeout %v for the whole fleet\n",
		addr, name, cfg.MaxConcurrent, cfg.MaxQueue, cfg.QueueTimeout)

	var servers []*server
	for i := range replicas {
		s, err := startReplica(string(rune('A'+i)), addr, name, cfg, redisqueue.GlobalQueue)
		if err != nil {
			return err
		}
		defer s.stop()
		servers = append(servers, s)
		fmt.Printf("replica %s on %s\n", s.name, s.url)
	}

	type result struct {
		i          int
		via        string
		servedBy   string
		status     int
		start, end time.Duration
	}
	t0 := time.Now()
	results := make([]result, burst)
	var wg sync.WaitGroup
	for i := range burst {
		s := servers[i%replicas]
		wg.Go(func() {
			r := result{i: i, via: s.name, start: time.Since(t0)}
			resp, err := http.Get(s.url)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				r.status = resp.StatusCode
				if r.status == http.StatusOK {
					r.servedBy = string(body)
				}
			}
			r.end = time.Since(t0)
			results[i] = r
		})
		time.Sleep(2 * time.Millisecond) // a burst, in a known order
	}
	wg.Wait()

	sort.Slice(results, func(a, b int) bool { return results[a].end < results[b].end })
	fmt.Println("\nrequest  sent to  sent at   answered at  outcome")
	counts := map[int]int{}
	for _, r := range results {
		out := fmt.Sprintf("%d %s", r.status, http.StatusText(r.status))
		if r.status == http.StatusOK {
			out = "200 served by replica " + r.servedBy
		}
		fmt.Printf("#%-7d %-8s %7.1fms %9.1fms  %s\n", r.i, r.via, ms(r.start), ms(r.end), out)
		counts[r.status]++
	}
	fmt.Printf("\nglobal outcomes: %d served, %d queue full (503), %d queue timeout (408)\n",
		counts[http.StatusOK], counts[http.StatusServiceUnavailable], counts[http.StatusRequestTimeout])
	fmt.Printf("(at most %d run at once in the fleet and %d wait, so about %d of the first %d are served; the rest wait or are refused)\n",
		cfg.MaxConcurrent, cfg.MaxQueue, cfg.MaxConcurrent+cfg.MaxQueue, burst)
	return shares(addr, name+"-shares")
}

// shares runs three replicas in Shares mode under an uneven load that
// moves: each replica admits on its own within the share of the limit it
// leases from Redis, and the shares follow the clients.
func shares(addr, name string) error {
	cfg := ginqueue.Config{MaxConcurrent: 12, MaxQueue: 64, QueueTimeout: 2 * time.Second}
	fmt.Printf("\nLeased shares: 3 replicas, Name %q, MaxConcurrent %d for the whole fleet, 20 ms handlers\n", name, cfg.MaxConcurrent)
	var servers []*server
	for i := range replicas {
		s, err := startReplica(string(rune('A'+i)), addr, name, cfg, redisqueue.Shares)
		if err != nil {
			return err
		}
		defer s.stop()
		servers = append(servers, s)
	}
	// Closed-loop clients: want[i] of them send to replica i, one request
	// after another.
	var want [replicas]atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for i, s := range servers {
		for j := range 24 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if int64(j) >= want[i].Load() {
						time.Sleep(time.Millisecond)
						continue
					}
					resp, err := client.Get(s.url + "?work=20ms")
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
					}
				}
			})
		}
	}
	phases := []struct {
		what    string
		clients [replicas]int64
	}{
		{"idle", [replicas]int64{0, 0, 0}},
		{"24 clients on A, 2 on B and C", [replicas]int64{24, 2, 2}},
		{"the load moves to C", [replicas]int64{2, 2, 24}},
	}
	fmt.Println("\n  time   load                              shares of A, B, C (of 12)   running on A, B, C")
	t0 := time.Now()
	for _, p := range phases {
		for i, n := range p.clients {
			want[i].Store(n)
		}
		for k := range 5 {
			time.Sleep(100 * time.Millisecond)
			var sh, run []string
			for _, s := range servers {
				st := s.q.Stats()
				sh = append(sh, fmt.Sprintf("%2d", st.Limit))
				run = append(run, fmt.Sprintf("%2d", st.Running))
			}
			what := ""
			if k == 0 {
				what = p.what
			}
			fmt.Printf("%6.1fs  %-33s %-27s %s\n", time.Since(t0).Seconds(), what, strings.Join(sh, " "), strings.Join(run, " "))
		}
	}
	close(stop)
	wg.Wait()
	fmt.Println("(a new Name grows no share for its first Shares.Period + 2 × CallTimeout, 350 ms here; idle, the limit is then split")
	fmt.Println(" evenly as room for arrivals; under load each replica's share follows its clients, and no replica waits on Redis")
	fmt.Println(" to admit a request: Redis only moves the shares)")
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startReplica starts one replica: its own Redis client, Backend, Queue and
// HTTP server on a free port.
func startReplica(name, addr, qname string, cfg ginqueue.Config, mode redisqueue.Mode) (*server, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: qname, Mode: mode})
	if err != nil {
		return nil, err
	}
	cfg.Backend = b
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		return nil, err
	}
	e := gin.New()
	e.GET("/", q.Handler(), func(c *gin.Context) {
		d := work
		if w, err := time.ParseDuration(c.Query("work")); err == nil {
			d = w
		}
		time.Sleep(d)
		c.String(http.StatusOK, name)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &server{name: name, url: "http://" + ln.Addr().String() + "/", q: q, srv: &http.Server{Handler: e}, rdb: rdb}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "serve:", err)
		}
	}()
	return s, nil
}

// stop shuts the replica down: the HTTP server, then the Queue (waiting for
// running requests), then its Redis client.
func (s *server) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	_ = s.q.Shutdown(ctx)
	_ = s.rdb.Close()
}
