package redisqueue_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// Every replica of a service runs the same code: the same Name and
// MaxConcurrent on the same Redis give the whole fleet one limit of 4
// requests at once. In Shares mode each replica admits in memory, within a
// share of those 4 that it leases from Redis.
//
// The examples read the Redis address from REDIS_ADDR, as the tests do, and
// give each run a KeyPrefix of its own so that runs never share a limit; a
// service sets neither.
func Example() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close() // the Backend never closes the client

	b, err := redisqueue.New(rdb, redisqueue.Options{
		Name:      "api", // Shares mode, the default
		KeyPrefix: "example-" + rand.Text(),
	})
	if err != nil {
		panic(err)
	}
	defer b.Close() // gives this replica's share back to the fleet

	r := gin.New()
	// New panics if the Backend cannot start, for instance when a live
	// replica of "api" declared another MaxConcurrent (ErrConflict).
	r.Use(ginqueue.New(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 20,
		QueueTimeout: 2 * time.Second, Backend: b}))
	r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "hello") })

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(w.Code, w.Body.String())
	// Output: 200 hello
}

// A fleet in front of a scarce resource, where the order of grants across
// replicas matters more than speed, uses the global queue; with FailClosed
// it answers 503 while Redis cannot be reached rather than admit requests on
// its own. NewQueue returns the error that ginqueue.New would panic with.
func ExampleNew() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()

	b, err := redisqueue.New(rdb, redisqueue.Options{
		Name:        "payments",
		KeyPrefix:   "example-" + rand.Text(),
		Mode:        redisqueue.GlobalQueue,
		OnRedisDown: redisqueue.FailClosed,
		OnStateChange: func(down bool, err error) {
			log.Printf("redis down: %v (%v)", down, err)
		},
	})
	if err != nil {
		panic(err) // a bad option, named
	}
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 2, MaxQueue: 10,
		QueueTimeout: time.Second, Backend: b})
	if err != nil {
		panic(err) // also: limits unlike those of a live replica of "payments"
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = q.Shutdown(ctx) // closes the Backend, then waits for running requests
	}()

	r := gin.New()
	r.POST("/pay", q.Handler(), func(c *gin.Context) { c.Status(http.StatusCreated) })

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/pay", nil))
	fmt.Println(w.Code)
	// Output: 201
}

// GlobalStats asks Redis for the figures of the whole fleet, where Stats
// reports this replica's own. Here two replicas share one Name (in one
// process, for the example): a request running on the first shows in the
// second's GlobalStats, and SetLimit on either moves the fleet's limit.
func ExampleBackend_GlobalStats() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	// GlobalQueue mode: Redis counts every running request as it starts
	// and ends, so the fleet's figures are exact at every instant.
	opts := redisqueue.Options{Name: "api", Mode: redisqueue.GlobalQueue, KeyPrefix: "example-" + rand.Text()}
	cfg := ginqueue.Config{MaxConcurrent: 4, MaxQueue: 20, QueueTimeout: 2 * time.Second}

	first, err := redisqueue.New(rdb, opts)
	if err != nil {
		panic(err)
	}
	cfg.Backend = first
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		panic(err)
	}
	defer q.Close()

	second, err := redisqueue.New(rdb, opts)
	if err != nil {
		panic(err)
	}
	cfg.Backend = second
	q2, err := ginqueue.NewQueue(cfg)
	if err != nil {
		panic(err)
	}
	defer q2.Close()

	report := func() {
		s, err := second.GlobalStats(context.Background())
		if err != nil {
			panic(err)
		}
		fmt.Printf("fleet: %d running of %d, %d queued, %d replicas; second replica: %d running\n",
			s.Running, s.Limit, s.Queued, s.Replicas, q2.Stats().Running)
	}

	r := gin.New()
	r.GET("/", q.Handler(), func(c *gin.Context) { report() })
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))

	if err := q.SetLimit(8); err != nil {
		panic(err)
	}
	report()
	// Output:
	// fleet: 1 running of 4, 0 queued, 2 replicas; second replica: 0 running
	// fleet: 0 running of 8, 0 queued, 2 replicas; second replica: 0 running
}
