// CoDel in the dispatcher, in fake time: maximum waits, the timer, grants under LIFO.

package ginqueue

import (
	"context"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holdAll takes every slot of d, so that arrivals queue.
func holdAll(t *testing.T, d *dispatcher, n int) {
	t.Helper()
	for range n {
		_, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
	}
}

// The maximum wait of each waiter of a queue that never empties: arrivals every
// 2 ms for 300 ms on a held slot, so the queue stands from 100 ms on (the
// first arrival's time plus Interval). A waiter that arrives at a leaves at
// min(a + long, max(100 ms, a + short)), long and short being Interval and
// Target capped by QueueTimeout: during the burst it may wait the long
// maximum wait, but at the moment the queue starts standing every waiter that has
// waited the short one leaves at once, and later arrivals wait only that.
// Without CoDel, every waiter waits QueueTimeout. The edge cases (Target ==
// Interval, 1 ns, centuries, QueueTimeout below Target) follow the same rule.
func TestCoDelMaximumWaits(t *testing.T) {
	const (
		every = 2 * time.Millisecond
		until = 300 * time.Millisecond
		stand = 100 * time.Millisecond // when the queue starts standing, with the default Interval
	)
	never := time.Duration(math.MaxInt64)
	huge := time.Duration(math.MaxInt64 / 2)
	for _, tc := range []struct {
		name        string
		timeout     time.Duration
		codel       *CoDel
		long, short time.Duration // the maximum waits they should come to
		stand       time.Duration // when the queue stands
	}{
		{"off", time.Second, nil, time.Second, time.Second, never},
		{"defaults, no QueueTimeout", 0, &CoDel{}, 100 * time.Millisecond, 5 * time.Millisecond, stand},
		{"LIFO changes no maximum wait", 0, &CoDel{LIFO: true}, 100 * time.Millisecond, 5 * time.Millisecond, stand},
		{"QueueTimeout caps Interval", 50 * time.Millisecond, &CoDel{}, 50 * time.Millisecond, 5 * time.Millisecond, stand},
		{"QueueTimeout above Interval changes nothing", time.Minute, &CoDel{}, 100 * time.Millisecond, 5 * time.Millisecond, stand},
		{"QueueTimeout below Target caps both", 3 * time.Millisecond, &CoDel{}, 3 * time.Millisecond, 3 * time.Millisecond, stand},
		{"Target == Interval", 0, &CoDel{Target: 30 * time.Millisecond, Interval: 30 * time.Millisecond}, 30 * time.Millisecond, 30 * time.Millisecond, 30 * time.Millisecond},
		{"1 ns each", 0, &CoDel{Target: 1, Interval: 1}, 1, 1, 0},
		{"centuries", 0, &CoDel{Target: huge, Interval: never}, never, huge, never},
		{"centuries, capped", 20 * time.Millisecond, &CoDel{Target: huge, Interval: never}, 20 * time.Millisecond, 20 * time.Millisecond, never},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := startDispatcher(t, withCoDel(backend.Limits{MaxConcurrent: 1, MaxQueue: 200, QueueTimeout: tc.timeout}, tc.codel))
				holdAll(t, d, 1)
				t0 := time.Now()
				var outs []<-chan parked
				var at []time.Duration
				for a := time.Duration(0); a < until; a += every {
					time.Sleep(a - time.Since(t0))
					at = append(at, a)
					outs = append(outs, park(d, context.Background(), backend.Arrival{}))
				}
				time.Sleep(2 * time.Second)
				require.NoError(t, d.Close())
				for i, out := range outs {
					a := at[i]
					leave := min(addDur(a, tc.long), max(tc.stand, addDur(a, tc.short)))
					r := <-out
					if leave > until+2*time.Second {
						assert.ErrorIs(t, r.err, backend.ErrClosed, "waiter %d (at %v) should still have waited at Close", i, a)
						continue
					}
					assert.ErrorIs(t, r.err, backend.ErrQueueTimeout, "waiter %d (at %v)", i, a)
					assert.Equal(t, leave-a, r.waited, "waiter %d (at %v) waited", i, a)
				}
			})
		})
	}
}

// addDur is a + b, or the largest Duration if that overflows.
func addDur(a, b time.Duration) time.Duration {
	return time.Duration(addSat(int64(a), int64(b)))
}

// A burst into an empty queue is absorbed: waiters that wait well past
// Target are granted, and those left time out only after Interval.
func TestCoDelAbsorbsBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, withCoDel(backend.Limits{MaxConcurrent: 1, MaxQueue: 10}, &CoDel{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond}))
		holdAll(t, d, 1)
		var outs []<-chan parked
		for range 4 {
			outs = append(outs, park(d, context.Background(), backend.Arrival{}))
		}
		time.Sleep(40 * time.Millisecond)
		d.Release(backend.Ticket{})
		synctest.Wait()
		r := <-outs[0]
		assert.NoError(t, r.err, "a waiter 40 ms into a burst is granted")
		assert.Equal(t, 40*time.Millisecond, r.waited)
		time.Sleep(30 * time.Millisecond)
		d.Release(backend.Ticket{})
		synctest.Wait()
		r = <-outs[1]
		assert.NoError(t, r.err, "a waiter 70 ms into a burst is granted")
		assert.Equal(t, 70*time.Millisecond, r.waited)
		for _, out := range outs[2:] {
			r := <-out
			assert.ErrorIs(t, r.err, backend.ErrQueueTimeout)
			assert.Equal(t, 100*time.Millisecond, r.waited, "the rest time out after Interval")
		}
		d.Release(backend.Ticket{})
		assert.Equal(t, backend.Stats{Limit: 1, Served: 3}, d.Stats())
	})
}

// The timer fires when the queue starts standing, even if the oldest
// waiter's deadline under Interval is later: here the queue has been busy
// since 20 ms (the waiter of that moment has left), so at 120 ms it stands
// and the waiter of 30 ms, 90 ms into its 100 ms, is dropped then, not at
// 130 ms. One that came 2 ms before then now has 5 ms in all.
func TestCoDelTimerFiresWhenTheQueueStands(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, withCoDel(backend.Limits{MaxConcurrent: 1, MaxQueue: 10}, &CoDel{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond}))
		holdAll(t, d, 1)
		t0 := time.Now()
		at := func(ms int) { time.Sleep(time.Duration(ms)*time.Millisecond - time.Since(t0)) }
		ctxA, cancelA := context.WithCancel(context.Background())
		a := park(d, ctxA, backend.Arrival{}) // arms the timer for 100 ms
		at(10)
		cancelA() // the queue empties
		at(20)
		ctxB, cancelB := context.WithCancel(context.Background())
		b := park(d, ctxB, backend.Arrival{}) // busy again from 20 ms
		at(30)
		c := park(d, context.Background(), backend.Arrival{})
		at(50)
		cancelB()
		at(118)
		late := park(d, context.Background(), backend.Arrival{})
		for _, out := range []<-chan parked{a, b} {
			assert.ErrorIs(t, (<-out).err, context.Canceled)
		}
		r := <-c
		assert.ErrorIs(t, r.err, backend.ErrQueueTimeout)
		assert.Equal(t, 90*time.Millisecond, r.waited, "dropped when the queue stood, at 120 ms")
		r = <-late
		assert.ErrorIs(t, r.err, backend.ErrQueueTimeout)
		assert.Equal(t, 5*time.Millisecond, r.waited, "Target, once the queue stands")
		d.Release(backend.Ticket{})
	})
}

// grantLocked finds a waiter due under the maximum wait now, before the timer has
// fired (a loaded machine): once the queue stands, a waiter that has waited
// Target is timed out, not granted, though it is within Interval.
func TestCoDelGrantChecksTheEffectiveDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, withCoDel(backend.Limits{MaxConcurrent: 1, MaxQueue: 10}, &CoDel{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond}))
		holdAll(t, d, 1)
		ctx, cancel := context.WithCancel(context.Background())
		first := park(d, ctx, backend.Arrival{}) // the queue is busy from 0 ms
		time.Sleep(3 * time.Millisecond)
		old := park(d, context.Background(), backend.Arrival{})
		time.Sleep(time.Millisecond)
		cancel()
		assert.ErrorIs(t, (<-first).err, context.Canceled)
		time.Sleep(94 * time.Millisecond)
		young := park(d, context.Background(), backend.Arrival{})
		time.Sleep(time.Millisecond)
		d.mu.Lock()
		d.timer.Stop() // the timer is late; timerAt stays set, so nobody re-arms it
		d.mu.Unlock()
		time.Sleep(3 * time.Millisecond) // 102 ms: the queue stands
		d.Release(backend.Ticket{})
		synctest.Wait()
		r := <-old
		assert.ErrorIs(t, r.err, backend.ErrQueueTimeout, "waited 99 ms of a 5 ms maximum wait")
		assert.Equal(t, 99*time.Millisecond, r.waited)
		r = <-young
		assert.NoError(t, r.err, "waited 4 ms of a 5 ms maximum wait")
		d.Release(backend.Ticket{})
	})
}

// TestCoDelGrantChecksTheEffectiveDeadline with the due waiter the last one
// in the room: grantLocked removes it before it asks for the maximum wait, so the
// room looks empty, the queue "not standing", and the waiter gets Interval
// instead of Target. It waited 99 ms of a 5 ms maximum wait and must time out.
func TestCoDelLastWaiterGetsTheStandingMaximumWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, withCoDel(backend.Limits{MaxConcurrent: 1, MaxQueue: 10}, &CoDel{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond}))
		holdAll(t, d, 1)
		ctx, cancel := context.WithCancel(context.Background())
		first := park(d, ctx, backend.Arrival{}) // the queue is busy from 0 ms
		time.Sleep(3 * time.Millisecond)
		old := park(d, context.Background(), backend.Arrival{})
		time.Sleep(time.Millisecond)
		cancel()
		assert.ErrorIs(t, (<-first).err, context.Canceled)
		time.Sleep(95 * time.Millisecond)
		d.mu.Lock()
		d.timer.Stop() // the timer is late (a loaded machine), as in TestCoDelGrantChecksTheEffectiveDeadline
		d.mu.Unlock()
		time.Sleep(3 * time.Millisecond) // 102 ms: the queue has stood for 2 ms
		d.Release(backend.Ticket{})
		synctest.Wait()
		r := <-old
		assert.ErrorIs(t, r.err, backend.ErrQueueTimeout, "waited 99 ms of a 5 ms maximum wait in a standing queue")
		assert.Equal(t, 99*time.Millisecond, r.waited)
		if r.err == nil {
			d.Release(backend.Ticket{})
		}
	})
}

// While the queue stands, LIFO grants the newest waiter of the highest
// priority first, and within a priority the newest of the flow whose turn it
// is; once the queue has emptied, the same arrivals are served first in
// first out again.
func TestCoDelLIFO(t *testing.T) {
	type arrival struct {
		id   string
		prio int
		flow string
	}
	for _, tc := range []struct {
		name           string
		arrivals       []arrival
		standing, fifo []string // the grant orders
	}{
		{
			name:     "priorities",
			arrivals: []arrival{{"n1", 0, ""}, {"n2", 1, ""}, {"n3", 1, ""}, {"n4", 0, ""}},
			standing: []string{"n3", "n2", "n4", "n1"},
			fifo:     []string{"n2", "n3", "n1", "n4"},
		},
		{
			name:     "flows",
			arrivals: []arrival{{"a1", 0, "a"}, {"a2", 0, "a"}, {"a3", 0, "a"}, {"b1", 0, "b"}, {"b2", 0, "b"}},
			standing: []string{"a3", "b2", "a2", "b1", "a1"},
			fifo:     []string{"a1", "b1", "a2", "b2", "a3"},
		},
		{
			name:     "flows and priorities",
			arrivals: []arrival{{"a1", 0, "a"}, {"h1", 2, "h"}, {"b1", 0, "b"}, {"a2", 0, "a"}, {"h2", 2, "h"}},
			standing: []string{"h2", "h1", "a2", "b1", "a1"},
			fifo:     []string{"h1", "h2", "a1", "b1", "a2"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := startDispatcher(t, withCoDel(backend.Limits{MaxConcurrent: 1, MaxQueue: 20}, &CoDel{Target: 50 * time.Millisecond, Interval: 100 * time.Millisecond, LIFO: true}))
				holdAll(t, d, 1)
				t0 := time.Now()
				// Fillers of the lowest priority keep the queue busy until it
				// stands at 100 ms; the one of 80 ms is still there then.
				var fillers []<-chan parked
				for _, at := range []time.Duration{0, 40 * time.Millisecond, 80 * time.Millisecond} {
					time.Sleep(at - time.Since(t0))
					fillers = append(fillers, park(d, context.Background(), backend.Arrival{Priority: -1}))
				}
				time.Sleep(101*time.Millisecond - time.Since(t0))
				for _, f := range fillers[:2] {
					assert.ErrorIs(t, (<-f).err, backend.ErrQueueTimeout, "the queue stood at 100 ms")
				}
				serve := func(want []string) {
					t.Helper()
					outs := map[string]<-chan parked{}
					for _, a := range tc.arrivals {
						outs[a.id] = park(d, context.Background(), backend.Arrival{Priority: a.prio, Flow: a.flow})
					}
					var got []string
					for range want {
						d.Release(backend.Ticket{})
						synctest.Wait()
						for id, out := range outs {
							select {
							case r := <-out:
								assert.NoError(t, r.err, id)
								got = append(got, id)
							default:
							}
						}
					}
					assert.Equal(t, want, got)
				}
				serve(tc.standing)
				d.Release(backend.Ticket{})
				synctest.Wait()
				assert.NoError(t, (<-fillers[2]).err, "the filler goes last, and the queue empties")
				serve(tc.fifo)
				d.Release(backend.Ticket{})
				assert.Equal(t, 0, d.Stats().Running)
			})
		})
	}
}

// Under CoDel's LIFO, while the queue stands, the head is the newest waiter:
// a cost-4 newest waiter holds the line as an oldest one does, nobody is
// granted past it, and it is granted its 4 slots, not the 1 that would fit
// the waiter before it.
func TestLIFOHeadHoldsTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, withCoDel(backend.Limits{MaxConcurrent: 4, MaxQueue: 8, QueueTimeout: time.Minute}, &CoDel{Target: 10 * time.Millisecond, Interval: 10 * time.Millisecond, LIFO: true}))
		for range 4 {
			require.NotZero(t, d.TryAcquire())
		}
		first := park(d, context.Background(), backend.Arrival{Cost: 1}) // the queue is busy from now on
		time.Sleep(8 * time.Millisecond)
		light := park(d, context.Background(), backend.Arrival{Cost: 1})
		time.Sleep(time.Millisecond)
		heavy := park(d, context.Background(), backend.Arrival{Cost: 4})
		time.Sleep(time.Millisecond) // 10 ms: the queue stands, the first waiter is dropped
		synctest.Wait()
		assert.ErrorIs(t, (<-first).err, backend.ErrQueueTimeout)

		d.Release(backend.Ticket{})
		synctest.Wait()
		assert.True(t, pending(light), "a waiter passed the newest, heavy head")
		assert.True(t, pending(heavy))
		for range 3 {
			d.Release(backend.Ticket{})
		}
		h := <-heavy
		require.NoError(t, h.err)
		assert.Equal(t, 4, h.t.Cost)
		assert.True(t, pending(light))
		d.Release(h.t)
		l := <-light
		require.NoError(t, l.err)
		d.Release(l.t)
		assert.Equal(t, backend.Stats{Limit: 4, Served: 6}, d.Stats())
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
func TestCoDelLIFOHeadChangeWithEqualMaximumWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, withCoDel(backend.Limits{MaxConcurrent: 4, MaxQueue: 20, QueueTimeout: 30 * time.Millisecond, Weighted: true}, &CoDel{Target: 50 * time.Millisecond, Interval: 100 * time.Millisecond, LIFO: true}))
		holdAll(t, d, 4)
		t0 := time.Now()
		at := func(ms int) { time.Sleep(time.Duration(ms)*time.Millisecond - time.Since(t0)) }
		var fillers []<-chan parked
		var heavy, light <-chan parked
		for _, ms := range []int{0, 20, 40, 60, 80, 85, 90, 92, 95} {
			at(ms)
			switch ms {
			case 92:
				d.Release(backend.Ticket{})
				d.Release(backend.Ticket{}) // 2 of 4 free: not enough for the head
			case 85:
				heavy = park(d, context.Background(), backend.Arrival{Cost: 4}) // FIFO head of priority 0
			case 90:
				light = park(d, context.Background(), backend.Arrival{Cost: 1}) // the newest of priority 0
			default:
				// Lower-priority fillers keep the queue from emptying; each
				// times out after 30 ms.
				fillers = append(fillers, park(d, context.Background(), backend.Arrival{Priority: -1}))
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

// Start checks CoDel, naming the Limits field; Start fills in the
// defaults of a CoDel given to it directly.
func TestCoDelLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		codel CoDel
		err   string
	}{
		{CoDel{Target: -1}, "ginqueue: Limits.CoDel.Target must not be negative, got -1ns"},
		{CoDel{Interval: -time.Second}, "ginqueue: Limits.CoDel.Interval must not be negative, got -1s"},
		{CoDel{Target: time.Second}, "ginqueue: Limits.CoDel.Target must not exceed Limits.CoDel.Interval, got 1s and 100ms (the default for zero)"},
		{CoDel{Target: 2, Interval: 1}, "ginqueue: Limits.CoDel.Target must not exceed Limits.CoDel.Interval, got 2ns and 1ns"},
		{CoDel{Interval: time.Millisecond}, "ginqueue: Limits.CoDel.Target must not exceed Limits.CoDel.Interval, got 5ms (the default for zero) and 1ms"},
		{CoDel{}, ""},
		{CoDel{Target: 1, Interval: 1}, ""},
		{CoDel{Target: math.MaxInt64, Interval: math.MaxInt64}, ""},
	} {
		t.Run(fmt.Sprint(tc.codel), func(t *testing.T) {
			l := withCoDel(backend.Limits{MaxConcurrent: 1, MaxQueue: 1}, &tc.codel)
			err := checkLimits(l, codelOf(l), "Limits")
			d := newMemoryBackend()
			startErr := d.Start(l)
			if startErr == nil {
				defer d.Close()
			}
			if tc.err != "" {
				assert.EqualError(t, err, tc.err)
				assert.EqualError(t, startErr, tc.err)
				return
			}
			require.NoError(t, err)
			require.NoError(t, startErr)
			want := tc.codel.withDefaults()
			assert.Equal(t, &codel{long: int64(want.Interval), short: int64(want.Target), interval: int64(want.Interval)}, d.codel)
		})
	}
}

// withCoDel is l with the CoDel setting c as given (nil: off); a zero c
// means its defaults, as in a Config.
func withCoDel(l backend.Limits, c *CoDel) backend.Limits {
	if c == nil {
		return l
	}
	cd := *c
	if cd == (CoDel{}) {
		cd = cd.withDefaults()
	}
	l.CoDelTarget, l.CoDelInterval, l.CoDelLIFO = cd.Target, cd.Interval, cd.LIFO
	return l
}
