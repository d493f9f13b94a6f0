// Acquire's slow path, grants, hang-ups and MaxAhead.

package ginqueue

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A grant that lands in the same instant as its waiter's hang-up is handed on
// to the next waiter: no slot lost, none counted twice. A parked select takes
// the case whose channel fires first, so the order of cancel and grant under
// the lock picks the branch deterministically.
func TestGrantRacingHangUpHandsSlotOn(t *testing.T) {
	for _, cancelFirst := range []bool{true, false} {
		name := map[bool]string{true: "hang-up seen first", false: "grant seen first"}[cancelFirst]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 2})
				_, err := d.Acquire(context.Background(), backend.Arrival{})
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(context.Background())
				first := acquireAsync(d, ctx)
				synctest.Wait()
				second := acquireAsync(d, context.Background())
				synctest.Wait()

				d.mu.Lock()
				if cancelFirst {
					cancel()
				}
				d.finished.Add(1) // Release, done by hand under the lock
				d.state.Add(^uint64(0))
				d.grantLocked()
				d.settle()
				cancel()
				if cancelFirst {
					// Its client had left when the slot freed: the grant went
					// past it, to the next waiter.
					assert.Zero(t, d.room.n, "both waiters have left the room")
				}
				d.mu.Unlock()

				err = <-first
				if !cancelFirst {
					// It saw its grant: it runs, the second still waits.
					require.NoError(t, err)
					assert.Equal(t, backend.Stats{Running: 1, Queued: 1, Limit: 1, Served: 2,
						QueuedByPriority: []backend.PriorityCount{{Priority: 0, Queued: 1}}}, d.Stats())
					d.Release(backend.Ticket{})
					require.NoError(t, <-second)
					assert.Equal(t, backend.Stats{Running: 1, Limit: 1, Served: 3}, d.Stats())
				} else {
					// Gone before the grant: it is not served, and the slot
					// went to the next waiter.
					assert.ErrorIs(t, err, context.Canceled)
					require.NoError(t, <-second, "the slot must reach the next waiter")
					assert.Equal(t, backend.Stats{Running: 1, Limit: 1, Served: 2}, d.Stats())
				}
				d.Release(backend.Ticket{})
				assert.Equal(t, 0, d.Stats().Running)
			})
		})
	}
}

// The race the fast path must not lose: an arrival fails the fast path (the
// only slot is held), the slot is released before the arrival takes the
// lock, and the arrival must then take the slot instead of parking for ever.
func TestReleaseBetweenFastPathAndParking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 1})
		require.NotZero(t, d.TryAcquire())
		require.Zero(t, d.TryAcquire())
		d.Release(backend.Ticket{}) // slowBit is clear: the fast release path
		done := make(chan error, 1)
		go func() {
			_, err := d.acquireSlow(context.Background(), backend.Arrival{})
			done <- err
		}()
		synctest.Wait()
		select {
		case err := <-done:
			require.NoError(t, err)
		default:
			t.Fatal("parked with a free slot")
		}
		assert.Equal(t, backend.Stats{Running: 1, Limit: 1, Served: 2}, d.Stats())
	})
}

// A waiter whose client has left, but which has not noticed yet, is not
// evicted, closed or timed out when its fate comes: its outcome is its own
// context's, and a slot freed meanwhile goes past it to the next waiter.
func TestGoneWaiterKeepsItsCause(t *testing.T) {
	for _, fate := range []waiterState{evicted, closedOut, timedOut, granted} {
		t.Run(map[waiterState]string{evicted: "evicted", closedOut: "closed", timedOut: "timed out", granted: "granted"}[fate], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 2})
				require.NotZero(t, d.TryAcquire())
				ctx, cancel := context.WithCancel(context.Background())
				gone := acquireAsync(d, ctx)
				synctest.Wait()
				next := acquireAsync(d, context.Background())
				synctest.Wait()

				d.mu.Lock() // the waiter cannot act on its hang-up before its fate comes
				cancel()
				w := d.room.all.first
				if fate == granted {
					d.finished.Add(1) // a release, by hand
					d.state.Add(^uint64(0))
					d.grantLocked()
				} else {
					d.finish(w, fate)
				}
				d.settle()
				d.mu.Unlock()
				assert.ErrorIs(t, <-gone, context.Canceled)
				if fate == granted {
					assert.NoError(t, <-next, "the slot went past the gone waiter")
					assert.Equal(t, backend.Stats{Running: 1, Limit: 1, Served: 2}, d.Stats())
					d.Release(backend.Ticket{})
				} else {
					d.Release(backend.Ticket{})
					assert.NoError(t, <-next)
				}
				d.Release(backend.Ticket{})
			})
		})
	}
}

// A head waiter that needs more slots than are free holds the line: the
// fast path refuses cost-1 arrivals while it waits, and a cost-1 waiter
// behind it is not granted the free slots; once its slots are free it runs,
// then those behind it.
func TestHeadOfLineHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 4, MaxQueue: 8})
		require.NotZero(t, d.TryAcquire())
		require.NotZero(t, d.TryAcquire())
		heavy := park(d, context.Background(), backend.Arrival{Cost: 4})
		require.True(t, pending(heavy))
		assert.Zero(t, d.TryAcquire(), "the fast path passed a heavy waiter")
		light := park(d, context.Background(), backend.Arrival{Cost: 1})
		other := park(d, context.Background(), backend.Arrival{Cost: 1, Flow: "other"}) // a flow of its own joins behind the head
		assert.Equal(t, 3, d.Stats().Queued)

		d.Release(backend.Ticket{}) // 3 of 4 free: not enough for the head
		synctest.Wait()
		assert.True(t, pending(heavy))
		assert.True(t, pending(light), "a cost-1 waiter overtook the head")
		assert.True(t, pending(other), "a cost-1 waiter of another flow overtook the head")
		assert.Zero(t, d.TryAcquire())

		d.Release(backend.Ticket{})
		h := <-heavy
		require.NoError(t, h.err)
		assert.Equal(t, 4, h.t.Cost)
		assert.True(t, pending(light))
		assert.Equal(t, 4, d.Stats().Running)

		d.Release(h.t)
		require.NoError(t, (<-light).err)
		require.NoError(t, (<-other).err)
		assert.Equal(t, backend.Stats{Running: 2, Limit: 4, Served: 5}, d.Stats())
		d.Release(backend.Ticket{Cost: 1})
		d.Release(backend.Ticket{Cost: 1})
	})
}

// What can change the head while free slots wait for it lets the line move
// at once: a higher priority arrival (it runs on the free slots), the head
// hanging up, timing out or being evicted (the waiter behind it runs).
func TestALeavingHeadLetsTheLineMove(t *testing.T) {
	// blocked is a dispatcher of limit 4 with 2 slots held, a cost-4 head
	// and, for most cases, a cost-1 waiter behind it.
	blocked := func(t *testing.T, l backend.Limits, ctx context.Context, behind bool) (d *dispatcher, heavy, light <-chan parked) {
		d = startDispatcher(t, l)
		require.NotZero(t, d.TryAcquire())
		require.NotZero(t, d.TryAcquire())
		heavy = park(d, ctx, backend.Arrival{Cost: 4})
		require.True(t, pending(heavy))
		if behind {
			time.Sleep(time.Second) // the heavy waiter's deadline comes first
			light = park(d, context.Background(), backend.Arrival{Cost: 1})
			require.True(t, pending(light))
		}
		return d, heavy, light
	}
	t.Run("a higher priority", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, heavy, light := blocked(t, backend.Limits{MaxConcurrent: 4, MaxQueue: 4}, context.Background(), true)
			high := park(d, context.Background(), backend.Arrival{Cost: 1, Priority: 1})
			require.False(t, pending(high), "a higher priority waited behind the free slots")
			assert.NoError(t, (<-high).err)
			assert.True(t, pending(light), "the same priority passed the head")
			assert.Equal(t, 3, d.Stats().Running)
			for range 3 {
				d.Release(backend.Ticket{})
			}
			assert.NoError(t, (<-heavy).err)
			d.Release(backend.Ticket{Cost: 4})
			assert.NoError(t, (<-light).err)
			d.Release(backend.Ticket{})
		})
	})
	t.Run("the head hangs up", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			d, heavy, light := blocked(t, backend.Limits{MaxConcurrent: 4, MaxQueue: 4}, ctx, true)
			cancel()
			synctest.Wait()
			assert.ErrorIs(t, (<-heavy).err, context.Canceled)
			require.False(t, pending(light), "the free slots waited for a head that left")
			assert.NoError(t, (<-light).err)
			assert.Equal(t, backend.Stats{Running: 3, Limit: 4, Served: 3}, d.Stats())
			for range 3 {
				d.Release(backend.Ticket{})
			}
		})
	})
	t.Run("the head times out", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, heavy, light := blocked(t, backend.Limits{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: 5 * time.Second}, context.Background(), true)
			time.Sleep(4 * time.Second) // the head's deadline passes, not the other's
			synctest.Wait()
			assert.ErrorIs(t, (<-heavy).err, backend.ErrQueueTimeout)
			require.False(t, pending(light), "the free slots waited for a head that timed out")
			assert.NoError(t, (<-light).err)
			for range 3 {
				d.Release(backend.Ticket{})
			}
		})
	})
	t.Run("the head is evicted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, heavy, _ := blocked(t, backend.Limits{MaxConcurrent: 4, MaxQueue: 1}, context.Background(), false)
			high := park(d, context.Background(), backend.Arrival{Cost: 1, Priority: 1})
			assert.ErrorIs(t, (<-heavy).err, backend.ErrQueueFull)
			require.False(t, pending(high), "the arrival that took the head's place waited behind free slots")
			assert.NoError(t, (<-high).err)
			for range 3 {
				d.Release(backend.Ticket{})
			}
		})
	})
}

// Arrival.MaxAhead: above zero, refused when that many or more would be
// served first; below zero, refused if it would wait at all; zero, no
// bound; a free slot is taken whatever it says. Refusals take no place.
func TestMaxAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 8})
		_, err := d.Acquire(context.Background(), backend.Arrival{MaxAhead: -1})
		require.NoError(t, err, "a free slot is taken whatever MaxAhead says")
		wait := func(maxAhead int) <-chan error {
			errc := make(chan error, 1)
			go func() {
				_, err := d.Acquire(context.Background(), backend.Arrival{MaxAhead: maxAhead})
				errc <- err
			}()
			synctest.Wait()
			return errc
		}
		first := wait(1)                                   // 0 ahead < 1: waits
		assert.ErrorIs(t, <-wait(1), backend.ErrQueueFull) // 1 ahead
		assert.ErrorIs(t, <-wait(-1), backend.ErrQueueFull)
		second := wait(2) // 1 ahead < 2: waits
		third := wait(0)  // no bound: waits
		assert.Equal(t, 3, d.Stats().Queued, "refusals took no place")
		for _, w := range []<-chan error{first, second, third} {
			d.Release(backend.Ticket{})
			assert.NoError(t, <-w)
		}
		d.Release(backend.Ticket{})
	})
}

// A cost-4 head holds two free slots. An arrival of a higher priority runs at
// once on them (Config.Cost's doc), so it would not wait at all: MaxAhead -1
// ("refused if it would wait at all"; "a request that finds a free slot runs
// whatever MaxAhead says") must not refuse it. RejectEarly sets -1 whenever
// the time left (QueueTimeout, or a client's short Deadline) is below one slot
// time over the limit.
func TestMaxAheadLetsAnArrivalGrantedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 4, MaxQueue: 8, Weighted: true})
		require.NotZero(t, d.TryAcquire())
		require.NotZero(t, d.TryAcquire())
		heavy := park(d, context.Background(), backend.Arrival{Cost: 4})
		require.True(t, pending(heavy))
		run, _ := d.slots()
		require.EqualValues(t, 2, run, "two slots free, held for the head")

		tk, err := d.Acquire(context.Background(), backend.Arrival{Priority: 1, Cost: 1, MaxAhead: -1})
		assert.NoError(t, err, "a higher priority arrival that finds a free slot is refused as if it had to wait")
		if err == nil {
			d.Release(tk)
		}
		d.Release(backend.Ticket{})
		d.Release(backend.Ticket{})
		r := <-heavy
		require.NoError(t, r.err)
		d.Release(r.t)
	})
}

// At a grant, the waiters passed over (client gone, past their cutoff or
// their expiry) are woken after the waiter granted, so that it runs first:
// each of them goes on to write a response, and under overload there are
// several for each grant, at times dozens. Every one gets its own outcome.
func TestPassedOverAreWokenAfterTheGrant(t *testing.T) {
	for _, passedOver := range []int{3, 100} {
		t.Run(fmt.Sprintf("%d passed over", passedOver), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 128, QueueTimeout: time.Minute})
				var recording atomic.Bool
				// Appended under d.mu: the grant, and the fate of each
				// waiter as its wake-up is sent.
				var steps []string
				d.step = func(s step) {
					switch {
					case !recording.Load():
					case s == stepGrantTake:
						steps = append(steps, "grant")
					case s == stepWake:
						steps = append(steps, map[waiterState]string{granted: "wake granted",
							timedOut: "wake timed out", gone: "wake gone"}[d.wakeFirst.state])
					}
				}
				_, err := d.Acquire(context.Background(), backend.Arrival{}) // the slot, released by hand below
				require.NoError(t, err)
				var late []<-chan error
				var hangUps []context.CancelFunc
				for i := range passedOver {
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					if i%2 == 1 {
						// Its client leaves before the grant.
						ctx, cancel = context.WithCancel(context.Background())
						hangUps = append(hangUps, cancel)
					}
					defer cancel()
					errc := make(chan error, 1)
					go func() {
						_, err := d.Acquire(ctx, backend.Arrival{MinTimeLeft: 150 * time.Millisecond})
						errc <- err
					}()
					late = append(late, errc)
					synctest.Wait()
				}
				granted := acquireAsync(d, context.Background())
				synctest.Wait()
				time.Sleep(100 * time.Millisecond) // the cutoffs have passed, the deadlines not
				d.mu.Lock()
				for _, cancel := range hangUps {
					cancel() // seen at the grant, before the waiters notice
				}
				recording.Store(true)
				// Release, done by hand under the same lock, so that no
				// waiter that hung up leaves the room before the grant.
				d.finished.Add(1)
				d.state.Add(^uint64(0))
				d.grantLocked()
				d.settle()
				recording.Store(false)
				d.mu.Unlock()
				require.NoError(t, <-granted)
				for i, errc := range late {
					if i%2 == 1 {
						assert.ErrorIs(t, <-errc, context.Canceled, "waiter %d", i)
					} else {
						assert.ErrorIs(t, <-errc, backend.ErrQueueTimeout, "waiter %d", i)
					}
				}
				require.Len(t, steps, passedOver+2)
				assert.Equal(t, []string{"grant", "wake granted"}, steps[:2], "a waiter passed over was woken before the grant")
				for i, s := range steps[2:] {
					assert.Contains(t, []string{"wake timed out", "wake gone"}, s, "wake-up %d", i)
				}
			})
		})
	}
}

// A heavy head past its cutoff, with a slot free and a light waiter behind
// it, holds the line for nobody: it is answered at its cutoff, though no
// release or arrival comes then, and the light waiter is granted.
func TestHeavyHeadPastItsCutoffGivesUpTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 2, MaxQueue: 4, Weighted: true})
		held, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
		defer d.Release(held)

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		heavy := park(d, ctx, backend.Arrival{Cost: 2, MinTimeLeft: 500 * time.Millisecond}) // cutoff at 500ms
		light := park(d, context.Background(), backend.Arrival{})                            // behind it; one slot is free
		require.True(t, pending(heavy))
		require.True(t, pending(light))

		time.Sleep(600 * time.Millisecond) // past the heavy head's cutoff, before its deadline
		synctest.Wait()
		assert.False(t, pending(light), "a slot is free and the head past its cutoff holds the line for nobody")
		require.False(t, pending(heavy), "the head past its cutoff is answered then, not at its deadline")
		p := <-heavy
		assert.ErrorIs(t, p.err, backend.ErrQueueTimeout)
		if l := <-light; l.err == nil {
			d.Release(l.t)
		}
	})
}

// Round robin between flows: a waiter passed over for its cutoff does not
// use its flow's turn, as one that leaves the room by itself does not, so
// which waiter gets the freed slot does not depend on who noticed first.
func TestPassedOverWaiterLeavesItsFlowsTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 4})
		held, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		a1 := park(d, ctx, backend.Arrival{Flow: "a", MinTimeLeft: 500 * time.Millisecond}) // cutoff at 500ms
		a2 := park(d, context.Background(), backend.Arrival{Flow: "a"})
		b1 := park(d, context.Background(), backend.Arrival{Flow: "b"})

		time.Sleep(600 * time.Millisecond)
		d.Release(held) // a1 is passed over (408): whose turn is the slot?
		synctest.Wait()
		require.False(t, pending(a1))
		assert.False(t, pending(a2), "flow a's turn went to its dead head; flow a's next waiter should be granted")
		assert.True(t, pending(b1), "flow b was granted out of turn")
		for _, c := range []<-chan parked{a2, b1} {
			select {
			case p := <-c:
				if p.err == nil {
					d.Release(p.t)
				}
			default:
			}
		}
		synctest.Wait()
	})
}
