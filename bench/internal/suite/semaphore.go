package suite

import (
	"context"
	"net/http"
	"sync/atomic"

	"github.com/gin-gonic/gin"
	"golang.org/x/sync/semaphore"
)

// semaphoreMiddleware is the throttle a Gin user would write on
// golang.org/x/sync/semaphore: TryAcquire first (it fails while anyone
// waits, so FIFO holds), otherwise an atomic count of waiters bounds the
// queue, and Acquire waits under a context that ends at QueueTimeout.
// Queue full and queue timeout answer 503 and 408, like ginqueue; a client
// that hung up gets nothing written and 499 recorded.
func semaphoreMiddleware(l Limits) gin.HandlerFunc {
	sem := semaphore.NewWeighted(int64(l.MaxConcurrent))
	var waiting atomic.Int64
	maxQueue := int64(l.MaxQueue)
	return func(c *gin.Context) {
		if !sem.TryAcquire(1) {
			if waiting.Add(1) > maxQueue {
				waiting.Add(-1)
				c.AbortWithStatus(http.StatusServiceUnavailable)
				return
			}
			ctx, cancel := context.WithTimeout(c.Request.Context(), l.QueueTimeout)
			err := sem.Acquire(ctx, 1)
			cancel()
			waiting.Add(-1)
			if err != nil {
				c.Abort()
				if c.Request.Context().Err() != nil {
					c.Status(499)
					return
				}
				c.AbortWithStatus(http.StatusRequestTimeout)
				return
			}
		}
		defer sem.Release(1)
		c.Next()
	}
}
