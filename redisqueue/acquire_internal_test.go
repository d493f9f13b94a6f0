package redisqueue

import (
	"context"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// A grant that lands in the same instant as its waiter's hang-up is given
// back: the Backend must not go on counting a slot nobody holds (Shutdown
// would wait for it, and the lease would be refreshed for ever).
func TestGrantRacingHangUpIsGivenBack(t *testing.T) {
	b, _ := internalBackend(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	leaked := 0
	for range 200 {
		b.mu.Lock()
		w := &waiter{id: b.nextID.Add(1), ready: make(chan struct{})}
		b.waiters[w.id] = w
		b.grantLocked(w) // the grant notice, as the client hangs up
		b.mu.Unlock()
		_, err, _ := b.wait(ctx, w, time.Time{}, nil)
		if err == nil {
			b.Release(backend.Ticket{ID: w.id}) // it saw its grant: it ran
			continue
		}
		b.mu.Lock()
		if _, ok := b.held[w.id]; ok {
			leaked++
		}
		b.mu.Unlock()
	}
	if leaked > 0 {
		t.Fatalf("%d hung-up waiters left a slot counted as held", leaked)
	}
	drain, cancelDrain := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelDrain()
	if err := b.Drain(drain); err != nil {
		t.Fatalf("Drain: %v; held %d", err, len(b.held))
	}
}
