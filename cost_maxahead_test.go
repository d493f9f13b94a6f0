package ginqueue

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cost-4 head holds two free slots. An arrival of a higher priority runs at
// once on them (Config.Cost's doc), so it would not wait at all: MaxAhead -1
// ("refused if it would wait at all"; "a request that finds a free slot runs
// whatever MaxAhead says") must not refuse it. RejectEarly sets -1 whenever
// the time left (QueueTimeout, or a client's short Deadline) is below one slot
// time over the limit.
func TestMaxAheadLetsAnArrivalGrantedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startDispatcher(t, Limits{MaxConcurrent: 4, MaxQueue: 8, Weighted: true})
		require.NotZero(t, d.TryAcquire())
		require.NotZero(t, d.TryAcquire())
		heavy := acquireCost(d, context.Background(), Arrival{Cost: 4})
		require.True(t, pending(heavy))
		run, _ := d.slots()
		require.EqualValues(t, 2, run, "two slots free, held for the head")

		tk, err := d.Acquire(context.Background(), Arrival{Priority: 1, Cost: 1, MaxAhead: -1})
		assert.NoError(t, err, "a higher priority arrival that finds a free slot is refused as if it had to wait")
		if err == nil {
			d.Release(tk)
		}
		d.Release(Ticket{})
		d.Release(Ticket{})
		r := <-heavy
		require.NoError(t, r.err)
		d.Release(r.t)
	})
}
