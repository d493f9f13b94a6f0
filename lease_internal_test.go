package ginqueue

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Past the end of its lease a share grants nothing: not on the fast path,
// not to an arrival that finds its slots free, not to a waiter as a holder
// releases, whatever timers would say after a freeze; a renewed lease
// grants the waiter at once.
func TestNothingIsGrantedPastTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Minute})
		require.NoError(t, d.SetShare(2))
		d.SetLease(time.Now().Add(time.Second), 4)
		held, err := d.Acquire(context.Background(), backend.Arrival{})
		require.NoError(t, err, "within the lease")
		time.Sleep(time.Second) // the lease ends; no timer of the share runs here

		assert.Zero(t, d.TryAcquire(), "the fast path admitted past the lease")
		waiter := park(d, context.Background(), backend.Arrival{})
		assert.True(t, pending(waiter), "an arrival was granted a free slot past the lease")
		d.Release(held)
		synctest.Wait()
		assert.True(t, pending(waiter), "a release handed its slot on past the lease")
		run, _ := d.slots()
		assert.Zero(t, run)

		d.SetLease(time.Now().Add(time.Second), 4) // a sync renewed it
		synctest.Wait()
		require.False(t, pending(waiter), "the renewed lease did not grant the waiter")
		assert.NoError(t, (<-waiter).err)
	})
}

// With a lease, a cost is clamped to the fleet's limit, not to the share: a
// request whose cost is above the share waits until the share covers it,
// then holds its whole cost; one above the fleet's limit holds that limit.
func TestACostAboveTheShareWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, backend.Limits{MaxConcurrent: 8, MaxQueue: 4, QueueTimeout: time.Minute, Weighted: true})
		require.NoError(t, d.SetShare(2))
		d.SetLease(time.Time{}, 4) // no end; a fleet of 4
		heavy := park(d, context.Background(), backend.Arrival{Cost: 4})
		assert.True(t, pending(heavy), "a cost of 4 ran on a share of 2")
		require.NoError(t, d.SetShare(4))
		synctest.Wait()
		require.False(t, pending(heavy))
		got := <-heavy
		require.NoError(t, got.err)
		assert.Equal(t, 4, got.t.Cost, "granted its whole cost")
		d.Release(got.t)

		huge, err := d.Acquire(context.Background(), backend.Arrival{Cost: 100})
		require.NoError(t, err)
		assert.Equal(t, 4, huge.Cost, "a cost above the fleet's limit holds that limit")
		d.Release(huge)

		d.SetLease(time.Time{}, 0) // back to clamping at the share
		require.NoError(t, d.SetShare(2))
		light, err := d.Acquire(context.Background(), backend.Arrival{Cost: 4})
		require.NoError(t, err)
		assert.Equal(t, 2, light.Cost)
		d.Release(light)
	})
}
