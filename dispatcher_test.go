package ginqueue

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func startDispatcher(t *testing.T, l Limits) *dispatcher {
	t.Helper()
	d := NewMemoryBackend().(*dispatcher)
	require.NoError(t, d.Start(l))
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// acquireAsync parks an Acquire in its own goroutine; its error comes back
// on the returned channel.
func acquireAsync(d *dispatcher, ctx context.Context) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := d.Acquire(ctx, Arrival{})
		errc <- err
	}()
	return errc
}

// In the instant between a release and its hand-off, the freed slot belongs
// to the head waiter: an arrival on the fast path must not take it.
func TestFastPathNeverOvertakesWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 1})
		_, err := d.Acquire(context.Background(), Arrival{})
		require.NoError(t, err)
		waiter := acquireAsync(d, context.Background())
		synctest.Wait()

		d.finished.Add(1) // the first half of Release: the slot is free
		d.state.Add(^uint64(0))
		assert.Zero(t, d.TryAcquire(), "an arrival overtook the waiter")
		d.mu.Lock()
		d.grantLocked() // the second half
		d.settle()
		d.mu.Unlock()
		assert.NoError(t, <-waiter)
		assert.Equal(t, BackendStats{Running: 1, Limit: 1, Served: 2}, d.Stats())
	})
}

// A grant that lands in the same instant as its waiter's hang-up is handed on
// to the next waiter: no slot lost, none counted twice. A parked select takes
// the case whose channel fires first, so the order of cancel and grant under
// the lock picks the branch deterministically.
func TestGrantRacingHangUpHandsSlotOn(t *testing.T) {
	for _, cancelFirst := range []bool{true, false} {
		name := map[bool]string{true: "hang-up seen first", false: "grant seen first"}[cancelFirst]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 2})
				_, err := d.Acquire(context.Background(), Arrival{})
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
					assert.Equal(t, BackendStats{Running: 1, Queued: 1, Limit: 1, Served: 2,
						QueuedByPriority: []PriorityCount{{Priority: 0, Queued: 1}}}, d.Stats())
					d.Release(Ticket{})
					require.NoError(t, <-second)
					assert.Equal(t, BackendStats{Running: 1, Limit: 1, Served: 3}, d.Stats())
				} else {
					// Gone before the grant: it is not served, and the slot
					// went to the next waiter.
					assert.ErrorIs(t, err, context.Canceled)
					require.NoError(t, <-second, "the slot must reach the next waiter")
					assert.Equal(t, BackendStats{Running: 1, Limit: 1, Served: 2}, d.Stats())
				}
				d.Release(Ticket{})
				assert.Equal(t, 0, d.Stats().Running)
			})
		})
	}
}

// A waiter that leaves early makes the timer fire for nothing; it re-arms for
// the next waiter, which still times out exactly at its own deadline.
func TestTimerRearmsAfterEarlyDeparture(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 3, QueueTimeout: 100 * time.Millisecond})
		_, err := d.Acquire(context.Background(), Arrival{})
		require.NoError(t, err)
		t0 := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		early := acquireAsync(d, ctx)
		time.Sleep(30 * time.Millisecond)
		late := acquireAsync(d, context.Background())
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-early, context.Canceled)
		assert.ErrorIs(t, <-late, ErrQueueTimeout)
		assert.Equal(t, 130*time.Millisecond, time.Since(t0))
		d.Release(Ticket{})
		assert.Equal(t, BackendStats{Limit: 1, Served: 1}, d.Stats())
	})
}

// Many goroutines in real time, with hang-ups and timeouts, racing releases
// against parking waiters: the count never exceeds the limit and ends at 0.
func TestStressKeepsInvariants(t *testing.T) {
	const limit = 3
	d := startDispatcher(t, Limits{MaxConcurrent: limit, MaxQueue: 8, QueueTimeout: 2 * time.Millisecond})
	var mu sync.Mutex
	running, peak := 0, 0
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 300 {
				ctx, cancel := context.WithCancel(context.Background())
				if (i+j)%7 == 0 {
					cancel()
				}
				_, err := d.Acquire(ctx, Arrival{})
				cancel()
				if err != nil {
					continue
				}
				mu.Lock()
				running++
				peak = max(peak, running)
				mu.Unlock()
				time.Sleep(time.Duration(j%3) * 10 * time.Microsecond)
				mu.Lock()
				running--
				mu.Unlock()
				d.Release(Ticket{})
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, peak, limit)
	st := d.Stats()
	assert.Equal(t, 0, st.Running)
	assert.Equal(t, 0, st.Queued)
	assert.Zero(t, d.state.Load()&slowBit, "slowBit left set with nobody waiting")
}

// Flow and level state lives only while it has waiters: a million distinct
// keys through a queue of 100 places leave the memory of 100 waiters.
func TestRotatingKeysDoNotGrowMemory(t *testing.T) {
	const places = 100
	r := newWaitroom()
	var ms runtime.MemStats
	heap := func() uint64 {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var ws []*waiter
	for i := range places {
		w := &waiter{}
		r.push(w, i%3, strconv.Itoa(i))
		ws = append(ws, w)
	}
	before := heap()
	for i := places; i < 1_000_000; i++ {
		old := ws[i%places]
		r.remove(old)
		w := &waiter{}
		r.push(w, i%3, "client-"+strconv.Itoa(i))
		ws[i%places] = w
	}
	after := heap()
	assert.Equal(t, places, r.n)
	flows := 0
	for _, l := range r.levels {
		flows += len(l.flows)
	}
	assert.Equal(t, places, flows, "one flow per waiter, no more")
	assert.Len(t, r.levels, 3)
	assert.Less(t, after, before+512<<10, "heap grew from %d to %d bytes", before, after)
	runtime.KeepAlive(ws)

	long := strings.Repeat("k", 1<<20)
	w := &waiter{}
	r.push(w, 0, long)
	assert.LessOrEqual(t, len(w.flow.key), maxKeyLen, "a 1 MiB key is kept as a hash")
	assert.Equal(t, 1, r.flowLen(0, long))
}

// Stats never waits for the dispatcher's lock.
func TestStatsDoesNotWaitForTheLock(t *testing.T) {
	d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 1})
	_, err := d.Acquire(context.Background(), Arrival{Priority: 3})
	require.NoError(t, err)
	d.mu.Lock()
	defer d.mu.Unlock()
	done := make(chan BackendStats, 1)
	go func() { done <- d.Stats() }()
	select {
	case st := <-done:
		assert.Equal(t, 1, st.Running)
	case <-time.After(10 * time.Second):
		t.Fatal("Stats blocked behind the dispatcher's lock")
	}
}

// Stats sees the queue as of the last section under mu even while mu is
// held: the waiter, its priority and its wait, at once, not a view from
// before it came.
func TestStatsSeeTheQueueWhileTheLockIsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 2})
		_, err := d.Acquire(context.Background(), Arrival{})
		require.NoError(t, err)
		waiter := make(chan error, 1)
		go func() {
			_, err := d.Acquire(context.Background(), Arrival{Priority: 3})
			waiter <- err
		}()
		synctest.Wait()
		time.Sleep(time.Second)
		d.mu.Lock()
		st := d.Stats()
		d.mu.Unlock()
		assert.Equal(t, 1, st.Queued)
		assert.Equal(t, []PriorityCount{{Priority: 3, Queued: 1}}, st.QueuedByPriority)
		assert.Equal(t, time.Second, st.OldestWait)
		d.Release(Ticket{})
		require.NoError(t, <-waiter)
		d.Release(Ticket{})
	})
}

// Under contention for mu (workers on 2 slots, waiters at 3 priorities, or
// at 12, more than a publication holds without allocating), every Stats is
// one view:
// the split sums to Queued, OldestWait is zero exactly when nobody waits,
// and Queued is no older than the queue length read just before the call,
// give or take the few changes of one section under mu.
func TestStatsStayFreshUnderContention(t *testing.T) {
	for _, prios := range []int{3, 12} {
		t.Run(fmt.Sprint(prios, " priorities"), func(t *testing.T) { statsUnderContention(t, prios) })
	}
}

func statsUnderContention(t *testing.T, prios int) {
	d := startDispatcher(t, Limits{MaxConcurrent: 2, MaxQueue: 64, QueueTimeout: time.Second})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if tk, err := d.Acquire(context.Background(), Arrival{Priority: i % prios}); err == nil {
					d.Release(tk)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	var calls, split, manyLevels int
	worst := 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); calls++ {
		before := d.Counts().Queued
		st := d.Stats()
		after := d.Counts().Queued
		sum := 0
		for _, c := range st.QueuedByPriority {
			sum += c.Queued
		}
		if sum != st.Queued || (st.Queued == 0) != (st.OldestWait == 0 && st.QueuedByPriority == nil) {
			t.Fatalf("Stats %+v: split sums to %d", st, sum)
		}
		if st.Queued > 0 {
			split++
		}
		if len(st.QueuedByPriority) > pubLevels {
			manyLevels++
		}
		worst = max(worst, min(before, after)-st.Queued, st.Queued-max(before, after))
	}
	t.Logf("%d Stats, %d with waiters, %d with more than %d priorities; Queued at most %d off the length read around it", calls, split, manyLevels, pubLevels, worst)
	assert.LessOrEqual(t, worst, 4, "Queued lagged the queue")
	assert.Positive(t, split, "no Stats saw a waiter")
}

// A waiter whose deadline passed before its timer fired (a loaded machine)
// is timed out when a slot frees, not granted; the slot goes to the next.
func TestLateTimerDoesNotGrantExpiredWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: 100 * time.Millisecond})
		_, err := d.Acquire(context.Background(), Arrival{})
		require.NoError(t, err)
		old := acquireAsync(d, context.Background())
		time.Sleep(50 * time.Millisecond)
		young := acquireAsync(d, context.Background())
		synctest.Wait()
		d.mu.Lock()
		d.timer.Stop() // the timer is late
		d.mu.Unlock()
		time.Sleep(60 * time.Millisecond) // old is 10 ms past its deadline
		d.Release(Ticket{})
		assert.ErrorIs(t, <-old, ErrQueueTimeout)
		assert.NoError(t, <-young)
		assert.Equal(t, 1, d.Stats().Running)
		d.Release(Ticket{})
	})
}

// The race the fast path must not lose: an arrival fails the fast path (the
// only slot is held), the slot is released before the arrival takes the
// lock, and the arrival must then take the slot instead of parking for ever.
func TestReleaseBetweenFastPathAndParking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 1})
		require.NotZero(t, d.TryAcquire())
		require.Zero(t, d.TryAcquire())
		d.Release(Ticket{}) // slowBit is clear: the fast release path
		done := make(chan error, 1)
		go func() {
			_, err := d.acquireSlow(context.Background(), Arrival{})
			done <- err
		}()
		synctest.Wait()
		select {
		case err := <-done:
			require.NoError(t, err)
		default:
			t.Fatal("parked with a free slot")
		}
		assert.Equal(t, BackendStats{Running: 1, Limit: 1, Served: 2}, d.Stats())
	})
}

// Two goroutines share one slot with no timeout, in real time: a lost
// wake-up would hang them.
func TestPingPongNeverHangs(t *testing.T) {
	d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 2})
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			for range 20_000 {
				if _, err := d.Acquire(context.Background(), Arrival{}); err != nil {
					break
				}
				d.Release(Ticket{})
			}
			done <- struct{}{}
		}()
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a waiter was never woken")
		}
	}
	assert.EqualValues(t, 40_000, d.Stats().Served)
}

// A QueueTimeout of centuries means "never", not a deadline in the past.
func TestHugeQueueTimeoutNeverFires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: math.MaxInt64})
		_, err := d.Acquire(context.Background(), Arrival{})
		require.NoError(t, err)
		w := acquireAsync(d, context.Background())
		time.Sleep(100 * time.Millisecond)
		d.Release(Ticket{})
		assert.NoError(t, <-w)
		d.Release(Ticket{})
	})
}

// The drain rate covers about ten seconds however often it is asked: a burst
// of 100 finished requests 5 s ago still counts.
func TestDrainRateCoversItsWindow(t *testing.T) {
	var m drainMeter
	t0 := time.Unix(0, 0)
	m.rate(t0, 0)
	done := uint64(100) // a burst in the first second
	for at := time.Second; at <= 5*time.Second; at += 100 * time.Millisecond {
		rate, ok := m.rate(t0.Add(at), done)
		require.True(t, ok)
		if at == 5*time.Second {
			assert.InDelta(t, 140.0/5, rate, 1e-9, "the base must still be the sample at the start")
		}
		done++ // then 10 a second
	}
}

// The fields of the state word stay apart at the bounds: a limit of 1<<30
// with a thousand holders, lowered to 1 and raised back.
func TestStateWordAtTheBounds(t *testing.T) {
	d := startDispatcher(t, Limits{MaxConcurrent: MaxLimit, MaxQueue: MaxLimit, QueueTimeout: 1})
	for range 1000 {
		require.NotZero(t, d.TryAcquire(), "fast path refused below the limit")
	}
	require.NoError(t, d.SetLimit(1))
	run, limit := d.slots()
	assert.Equal(t, [2]int64{1000, 1}, [2]int64{run, limit})
	assert.Zero(t, d.TryAcquire(), "admitted past a lowered limit")
	require.NoError(t, d.SetLimit(MaxLimit))
	assert.Error(t, d.SetLimit(MaxLimit+1))
	for range 1000 {
		d.Release(Ticket{})
	}
	run, limit = d.slots()
	assert.Equal(t, [2]int64{0, MaxLimit}, [2]int64{run, limit})
	assert.Equal(t, BackendStats{Limit: MaxLimit, Served: 1000}, d.Stats())
}

// A waiter whose client has left, but which has not noticed yet, is not
// evicted, closed or timed out when its fate comes: its outcome is its own
// context's, and a slot freed meanwhile goes past it to the next waiter.
func TestGoneWaiterKeepsItsCause(t *testing.T) {
	for _, fate := range []waiterState{evicted, closedOut, timedOut, granted} {
		t.Run(map[waiterState]string{evicted: "evicted", closedOut: "closed", timedOut: "timed out", granted: "granted"}[fate], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 2})
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
					assert.Equal(t, BackendStats{Running: 1, Limit: 1, Served: 2}, d.Stats())
					d.Release(Ticket{})
				} else {
					d.Release(Ticket{})
					assert.NoError(t, <-next)
				}
				d.Release(Ticket{})
			})
		})
	}
}

// Arrival.MaxAhead: above zero, refused when that many or more would be
// served first; below zero, refused if it would wait at all; zero, no
// bound; a free slot is taken whatever it says. Refusals take no place.
func TestMaxAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 1, MaxQueue: 8})
		_, err := d.Acquire(context.Background(), Arrival{MaxAhead: -1})
		require.NoError(t, err, "a free slot is taken whatever MaxAhead says")
		wait := func(maxAhead int) <-chan error {
			errc := make(chan error, 1)
			go func() {
				_, err := d.Acquire(context.Background(), Arrival{MaxAhead: maxAhead})
				errc <- err
			}()
			synctest.Wait()
			return errc
		}
		first := wait(1)                           // 0 ahead < 1: waits
		assert.ErrorIs(t, <-wait(1), ErrQueueFull) // 1 ahead
		assert.ErrorIs(t, <-wait(-1), ErrQueueFull)
		second := wait(2) // 1 ahead < 2: waits
		third := wait(0)  // no bound: waits
		assert.Equal(t, 3, d.Stats().Queued, "refusals took no place")
		for _, w := range []<-chan error{first, second, third} {
			d.Release(Ticket{})
			assert.NoError(t, <-w)
		}
		d.Release(Ticket{})
	})
}
