package ginqueue_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

// discardWriter is a minimal http.ResponseWriter that allocates nothing, so
// the benchmarks measure the router and the middleware, not a recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

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
