package promqueue_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/promqueue"
)

// Export a Queue on /metrics, outside the throttle, so a scrape is never
// queued behind the traffic it reports on.
func ExampleCollector() {
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 8, MaxQueue: 100, QueueTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	defer q.Close()
	c := promqueue.NewCollector()
	if err := c.Add("api", q); err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	router := gin.New()
	router.GET("/metrics", gin.WrapH(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	api := router.Group("/api", q.Handler())
	api.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello") })

	router.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/api/hello", nil))
	w := httptest.NewRecorder()
	router.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for line := range strings.Lines(w.Body.String()) {
		if strings.HasPrefix(line, "ginqueue_limit") || strings.HasPrefix(line, "ginqueue_requests_total") {
			fmt.Print(line)
		}
	}
	// Output:
	// ginqueue_limit{queue="api"} 8
	// ginqueue_requests_total{outcome="canceled",queue="api"} 0
	// ginqueue_requests_total{outcome="closed",queue="api"} 0
	// ginqueue_requests_total{outcome="panic",queue="api"} 0
	// ginqueue_requests_total{outcome="queue_full",queue="api"} 0
	// ginqueue_requests_total{outcome="queue_timeout",queue="api"} 0
	// ginqueue_requests_total{outcome="served",queue="api"} 1
}
