package redisqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// A grant made while the notice reader is away (the server was gone for
// a while, and the reader's pauses between dials grew to a tick) reaches
// the waiter well before the safety net's next tick: the reader dials again
// as soon as the maintainer's call gets an answer, and while the reader is
// away the safety net runs faster.
func TestGrantReachesWaiterSoonAfterServerReturns(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	const tick = time.Second
	o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: 3 * tick, TickInterval: tick,
		FailureThreshold: 29} // the most LeaseTTL allows: never down, this is about the reader alone
	l := ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second}
	b := startBackends2(t, srv.addr(), l, o)
	ctx := context.Background()
	holder, err := b.Acquire(ctx, ginqueue.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			t.Errorf("the waiter got %v", err)
			close(got)
			return
		}
		got <- time.Now()
		b.Release(tk)
	}()
	waitQueued(t, b, 1)
	srv.stop()
	time.Sleep(2 * tick)
	srv.start()
	// The waiter, lost with the server, enqueues again.
	eventually(t, 2*tick, "the waiter did not enqueue again", func() bool {
		s, err := b.GlobalStats(ctx)
		return err == nil && s.Queued == 1
	})
	released := time.Now()
	b.Release(holder)
	select {
	case at, ok := <-got:
		if !ok {
			return
		}
		if d := at.Sub(released); d > tick/4 {
			t.Errorf("the grant reached the waiter %v after the release, want well within the safety net's tick (%v)", d, tick)
		}
	case <-time.After(5 * tick):
		t.Fatal("the waiter was never granted")
	}
	eventually(t, 2*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(b) })
}
