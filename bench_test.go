package ginqueue_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

func benchEngine(mw ...gin.HandlerFunc) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(mw...)
	r.GET("/", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	return r
}

func runParallel(b *testing.B, r *gin.Engine) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		w := &discardWriter{h: http.Header{}}
		for pb.Next() {
			r.ServeHTTP(w, req)
		}
	})
}

// BenchmarkUncontended compares one request through a bare gin route with
// the same route behind ginqueue whose limit is never reached.
func BenchmarkUncontended(b *testing.B) {
	b.Run("bare", func(b *testing.B) { runParallel(b, benchEngine()) })
	b.Run("ginqueue", func(b *testing.B) {
		q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1 << 20, MaxQueue: 16, QueueTimeout: 0})
		if err != nil {
			b.Fatal(err)
		}
		defer q.Close()
		runParallel(b, benchEngine(q.Handler()))
	})
}
