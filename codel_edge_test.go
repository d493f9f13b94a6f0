package ginqueue

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestCoDelGrantChecksTheEffectiveDeadline with the due waiter the last one
// in the room: grantLocked removes it before it asks for the maximum wait, so the
// room looks empty, the queue "not standing", and the waiter gets Interval
// instead of Target. It waited 99 ms of a 5 ms maximum wait and must time out.
func TestCoDelLastWaiterGetsTheStandingBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 10, CoDel: &CoDel{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond}})
		holdAll(t, d, 1)
		ctx, cancel := context.WithCancel(context.Background())
		first := park(d, ctx, Arrival{}) // the queue is busy from 0 ms
		time.Sleep(3 * time.Millisecond)
		old := park(d, context.Background(), Arrival{})
		time.Sleep(time.Millisecond)
		cancel()
		assert.ErrorIs(t, (<-first).err, context.Canceled)
		time.Sleep(95 * time.Millisecond)
		d.mu.Lock()
		d.timer.Stop() // the timer is late (a loaded machine), as in TestCoDelGrantChecksTheEffectiveDeadline
		d.mu.Unlock()
		time.Sleep(3 * time.Millisecond) // 102 ms: the queue has stood for 2 ms
		d.Release(Ticket{})
		synctest.Wait()
		r := <-old
		assert.ErrorIs(t, r.err, ErrQueueTimeout, "waited 99 ms of a 5 ms maximum wait in a standing queue")
		assert.Equal(t, 99*time.Millisecond, r.waited)
		if r.err == nil {
			d.Release(Ticket{})
		}
	})
}

// With QueueTimeout at or below Target (so CoDel's two maximum waits are equal,
// short == long), wakeAt arms no timer for the moment the queue starts
// standing. Under LIFO that moment changes the head, though: here a cost-4
// FIFO head holds two free slots, and at 100 ms the standing queue's head
// becomes the newest waiter, of cost 1, whose slot is free. Nobody runs
// grantLocked then, so it waits with its slot free until the next event
// (a filler's timeout at 110 ms): the "no head waits while its slots are
// free" invariant FuzzSchedule checks.
func TestCoDelLIFOHeadChangeWithEqualBudgets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 4, MaxQueue: 20, QueueTimeout: 30 * time.Millisecond, Weighted: true,
			CoDel: &CoDel{Target: 50 * time.Millisecond, Interval: 100 * time.Millisecond, LIFO: true}})
		holdAll(t, d, 4)
		t0 := time.Now()
		at := func(ms int) { time.Sleep(time.Duration(ms)*time.Millisecond - time.Since(t0)) }
		var fillers []<-chan parked
		var heavy, light <-chan acquired
		for _, ms := range []int{0, 20, 40, 60, 80, 85, 90, 92, 95} {
			at(ms)
			switch ms {
			case 92:
				d.Release(Ticket{})
				d.Release(Ticket{}) // 2 of 4 free: not enough for the head
			case 85:
				heavy = acquireCost(d, context.Background(), Arrival{Cost: 4}) // FIFO head of priority 0
			case 90:
				light = acquireCost(d, context.Background(), Arrival{Cost: 1}) // the newest of priority 0
			default:
				// Lower-priority fillers keep the queue from emptying; each
				// times out after 30 ms.
				fillers = append(fillers, park(d, context.Background(), Arrival{Priority: -1}))
			}
		}
		at(100) // the queue has not emptied for 100 ms: it stands, LIFO
		synctest.Wait()
		d.mu.Lock()
		standing := d.standing(d.now())
		d.mu.Unlock()
		assert.True(t, standing)
		if !assert.False(t, pending(light), "at 100 ms the LIFO head (cost 1) has a free slot but is not granted") {
			at(110)
			synctest.Wait()
			t.Logf("granted only at 110 ms: pending=%v", pending(light))
		}
		at(200)
		for _, f := range fillers {
			<-f
		}
		if r := <-light; r.err == nil {
			d.Release(r.t)
		}
		<-heavy
	})
}
