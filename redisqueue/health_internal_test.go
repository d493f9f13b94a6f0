package redisqueue

import (
	"errors"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// Redis is marked down together with the FailOpen fallback's opening, under
// mu: a request that sees it down under mu goes to the fallback, which must
// be open by then (it would find no fallback at the first outage).
func TestMarkedDownOnlyWithTheFallbackOpen(t *testing.T) {
	b, _ := internalBackend(t, backend.Limits{MaxConcurrent: 2, MaxQueue: 4})
	b.mu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.markDown(errors.New("a call failed"))
	}()
	time.Sleep(20 * time.Millisecond) // markDown waits for mu, or has marked Redis down without it
	down, open := b.down.Load(), b.fb != nil && b.downCtx != nil
	b.mu.Unlock()
	<-done
	if down && !open {
		t.Fatal("Redis marked down, while another held mu, before the fallback opened")
	}
	if b.outages.Load() != 1 || b.fb == nil {
		t.Fatal("markDown did not mark Redis down and open the fallback")
	}
}
