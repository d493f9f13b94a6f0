// Command cluster runs three replicas of one service on three ports, sharing
// one limit through Redis (REDIS_ADDR, default 127.0.0.1:6379), then fires a
// burst at them round-robin and prints which replica served each request,
// when, and the global outcome counts. It exits by itself.
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
	"sync"
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
		s, err := startReplica(string(rune('A'+i)), addr, name, cfg)
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
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startReplica starts one replica: its own Redis client, Backend, Queue and
// HTTP server on a free port.
func startReplica(name, addr, qname string, cfg ginqueue.Config) (*server, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: qname})
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
		time.Sleep(work)
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
