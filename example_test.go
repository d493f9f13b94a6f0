package ginqueue_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

// The middleware on a whole router: at most 2 requests run at once and 8
// wait their turn for up to 5 seconds.
func ExampleNew() {
	cfg := ginqueue.DefaultConfig()
	cfg.MaxConcurrent = 2
	cfg.MaxQueue = 8
	cfg.QueueTimeout = 5 * time.Second

	r := gin.New()
	r.Use(ginqueue.New(cfg))
	r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "hello") })

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(w.Code, w.Body.String())
	// Output: 200 hello
}

// One Queue guarding two route groups gives them one shared limit; Stats
// reads its slots, queue and counters.
func ExampleQueue_Handler() {
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 16, QueueTimeout: time.Second})
	if err != nil {
		panic(err)
	}
	defer q.Close()

	r := gin.New()
	r.Group("/api", q.Handler()).GET("/users", func(c *gin.Context) { c.Status(http.StatusOK) })
	r.Group("/admin", q.Handler()).GET("/jobs", func(c *gin.Context) { c.Status(http.StatusOK) })

	for _, path := range []string{"/api/users", "/admin/jobs"} {
		r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	st := q.Stats()
	fmt.Printf("limit %d, served %d, running %d\n", st.Limit, st.Served, st.Running)
	// Output: limit 4, served 2, running 0
}

// Shutdown on the way out: new arrivals and waiters get 503 at once, running
// requests finish.
func ExampleQueue_Shutdown() {
	q, err := ginqueue.NewQueue(ginqueue.DefaultConfig())
	if err != nil {
		panic(err)
	}
	r := gin.New()
	r.Use(q.Handler())
	r.GET("/", func(c *gin.Context) { c.Status(http.StatusOK) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println(q.Shutdown(ctx))

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(w.Code, w.Header().Get("Retry-After"))
	// Output:
	// <nil>
	// 503 1
}

// Validate names the field that is wrong.
func ExampleConfig_Validate() {
	cfg := ginqueue.DefaultConfig()
	cfg.MaxQueue = -1
	fmt.Println(cfg.Validate())
	// Output: ginqueue: Config.MaxQueue must not be negative, got -1
}

// Config.Cost weighs a request: an export holds 3 of the 4 slots while it
// runs, so one ordinary request fits beside it. Running counts slots, Served
// requests.
func ExampleConfig_cost() {
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 8, QueueTimeout: time.Second,
		Cost: func(c *gin.Context) int {
			if c.FullPath() == "/export" {
				return 3
			}
			return 1
		}})
	if err != nil {
		panic(err)
	}
	defer q.Close()

	r := gin.New()
	r.Use(q.Handler())
	r.GET("/export", func(c *gin.Context) {
		fmt.Println("export running, slots held:", q.Stats().Running)
		c.Status(http.StatusOK)
	})
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/export", nil))
	st := q.Stats()
	fmt.Printf("served %d, running %d\n", st.Served, st.Running)
	// Output:
	// export running, slots held: 3
	// served 1, running 0
}

// A client says how long it will wait in a header: the handler's context
// ends then, and a client with no time left is answered at once, without
// running the handler.
func ExampleDeadlineHeader() {
	cfg := ginqueue.DefaultConfig()
	cfg.Deadline = ginqueue.DeadlineHeader("X-Client-Timeout")

	r := gin.New()
	r.Use(ginqueue.New(cfg))
	r.GET("/", func(c *gin.Context) {
		_, ok := c.Request.Context().Deadline()
		c.String(http.StatusOK, "deadline: %v", ok)
	})

	for _, wait := range []string{"1.5", "2500ms", "0"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Client-Timeout", wait)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Printf("%s: %d %s\n", wait, w.Code, w.Body.String())
	}
	// Output:
	// 1.5: 200 deadline: true
	// 2500ms: 200 deadline: true
	// 0: 408
}
