package suite

import (
	"cmp"
	"context"
	"maps"
	"os"
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

// TestRoundTrips: a command a hook saw, one Redis refuses to run in a
// script, INFO and PING are round trips; the rest ran inside scripts; the
// measurement's own INFO is left out. It asks the Redis at REDIS_ADDR.
func TestRoundTrips(t *testing.T) {
	addr := cmp.Or(os.Getenv("REDIS_ADDR"), DefaultRedisAddr)
	ctl := newRedisClient(addr)
	defer ctl.Close()
	ctx := context.Background()
	if err := ctl.Ping(ctx).Err(); err != nil {
		t.Skipf("no Redis at %s: %v", addr, err)
	}
	var seen seenNames
	seen.note("evalsha")
	d := redisLoad{calls: map[string]float64{"evalsha": 10, "blpop": 3, "client|id": 2, "hset": 50, "info": 2, "ping": 1, "get": 0}}
	sent, inScript, err := roundTrips(ctx, ctl, &seen, d)
	wantSent := map[string]float64{"evalsha": 10, "blpop": 3, "client|id": 2, "info": 1, "ping": 1}
	if err != nil || !maps.Equal(sent, wantSent) || !maps.Equal(inScript, map[string]float64{"hset": 50, "get": 0}) {
		t.Errorf("sent %v, in scripts %v, %v; want %v and hset 50, get 0", sent, inScript, err, wantSent)
	}
	for code, want := range map[int]int{503: refused503, 408: refused408, 429: refusedOther, 500: refusedOther} {
		if got := refusal(code); got != want {
			t.Errorf("refusal(%d) = %d, want %d", code, got, want)
		}
	}
}
