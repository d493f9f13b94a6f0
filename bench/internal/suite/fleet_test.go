package suite

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue"
)

// TestFleetMeasure runs the harness of sections 14 and 15 on two in-memory
// replicas of one slot each, in a synctest bubble where the handlers'
// sleeps cost no real time, so that what a window counts is exact. The
// measurements run one after another on the same fleet, as section 15's
// phases do.
func TestFleetMeasure(t *testing.T) {
	const ms = time.Millisecond
	type figures struct {
		served, peak                   int64
		handled, busy, running, shares time.Duration
		refused                        [3]bool // the kinds of refusal that came
	}
	measurements := []struct {
		name    string
		clients []int
		moveBy  int
		warmUp  time.Duration
		want    figures
	}{
		// A client on each replica, handlers back to back from 0 ms, a
		// window from 95 ms to 1,095 ms: the handlers that end at 100 ms to
		// 1,090 ms count. The second replica is running from the start.
		{"even", []int{1, 1}, 0, 95 * ms, figures{200, 2, 2000 * ms, 2000 * ms, 0, -1, [3]bool{}}},
		// One client moves from the first replica to the second as the
		// window opens at 91 ms: it gets there at 100 ms, which the sample
		// at 101 ms sees. No Backend ever holds a share.
		{"moves", []int{1}, 1, 91 * ms, figures{100, 1, 1000 * ms, 1000 * ms, 10 * ms, -1, [3]bool{}}},
		// Three clients on a slot and one waiting place: the third is
		// refused with a 503 until one of the others leaves.
		{"refused", []int{3}, 0, 95 * ms, figures{100, 1, 1000 * ms, 1000 * ms, -1, -1, [3]bool{refused503: true}}},
	}
	synctest.Test(t, func(t *testing.T) {
		f := &fleet{replicas: make([]replica, 2), work: 10 * ms,
			cfg: ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Second}}
		defer f.close()
		if err := f.start(t.Context()); err != nil {
			t.Fatal(err)
		}
		for _, m := range measurements {
			var got figures
			pt, err := f.measure(t.Context(), m.clients, m.moveBy, m.warmUp, time.Second, func(start, end time.Time) {
				got.shares, got.running = f.converge(t.Context(), start, end)
			})
			got.served, got.peak, got.handled, got.busy = pt.Served, pt.Peak, pt.handled, pt.busy
			for i, n := range pt.Refused {
				got.refused[i] = n > 0
			}
			if err != nil || pt.Window != time.Second || pt.redis != nil || got != m.want {
				t.Errorf("%s: %v, window %v, Redis %v, %+v; want %+v", m.name, err, pt.Window, pt.redis, got, m.want)
			}
		}
	})
}
