package main

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
)

func main() {
	q, err := ginqueue.NewQueue(ginqueue.Config{
		MaxConcurrent: 4,                      // requests running at once
		MaxQueue:      8,                      // requests waiting; the next one gets 503
		QueueTimeout:  300 * time.Millisecond, // the longest wait; then 408
	})
	if err != nil {
		log.Fatal(err) // the error names the bad field
	}

	r := gin.New()                           // gin.Default() would also log every request
	r.Use(gin.Recovery())                    // a panic gives 500 (and its slot back)
	r.GET("/debug/queue", q.StatusHandler()) // Stats as JSON, outside the throttle

	api := r.Group("/api", q.Handler()) // every route of the group is throttled
	api.GET("/report", func(c *gin.Context) {
		time.Sleep(200 * time.Millisecond) // the expensive work
		c.String(http.StatusOK, "done")
	})

	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: r}
	go func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	sig, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-sig.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = q.Shutdown(ctx)   // waiters and new arrivals get 503 now; waits for running requests
	_ = srv.Shutdown(ctx) // then stops listening and closes idle connections
}
