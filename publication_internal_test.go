// The wait room's publication, which the dispatcher's Stats reads without mu.

package ginqueue

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stats never waits for the dispatcher's lock.
func TestStatsDoesNotWaitForTheLock(t *testing.T) {
	d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 1})
	_, err := d.Acquire(context.Background(), backend.Arrival{Priority: 3})
	require.NoError(t, err)
	d.mu.Lock()
	defer d.mu.Unlock()
	done := make(chan backend.Stats, 1)
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
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 2})
		_, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err)
		waiter := make(chan error, 1)
		go func() {
			_, err := d.Acquire(context.Background(), backend.Arrival{Priority: 3})
			waiter <- err
		}()
		synctest.Wait()
		time.Sleep(time.Second)
		d.mu.Lock()
		st := d.Stats()
		d.mu.Unlock()
		assert.Equal(t, 1, st.Queued)
		assert.Equal(t, []backend.PriorityCount{{Priority: 3, Queued: 1}}, st.QueuedByPriority)
		assert.Equal(t, time.Second, st.OldestWait)
		d.Release(backend.Ticket{})
		require.NoError(t, <-waiter)
		d.Release(backend.Ticket{})
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
	d := startDispatcher(t, backend.Limits{MaxConcurrent: 2, MaxQueue: 64, QueueTimeout: time.Second})
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
				if tk, err := d.Acquire(context.Background(), backend.Arrival{Priority: i % prios}); err == nil {
					d.Release(tk)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	var calls, split, manyLevels, near int
	worst := 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); calls++ {
		seq := d.pubSeq.Load()
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
		if d.pubSeq.Load()-seq > 1 {
			// More than one section published while this goroutine read:
			// it was descheduled, and the lengths read around the call say
			// nothing of the one it read.
			continue
		}
		near++
		worst = max(worst, min(before, after)-st.Queued, st.Queued-max(before, after))
	}
	t.Logf("%d Stats (%d within one publication), %d with waiters, %d with more than %d priorities; Queued at most %d off the length read around it",
		calls, near, split, manyLevels, pubLevels, worst)
	assert.LessOrEqual(t, worst, 4, "Queued lagged the queue")
	assert.Greater(t, near, 100, "too few reads within one publication to judge")
	assert.Positive(t, split, "no Stats saw a waiter")
}
