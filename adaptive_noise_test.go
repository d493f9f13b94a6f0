package ginqueue

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Handler times that do not depend on load at all, with an ordinary spread
// (exponential, or log-normal with σ 0.5 or 0.8, mean about 5 ms), every
// slot in use: nothing is overloaded, so the limit has no reason to fall. It
// must stay in the upper half of [MinLimit, MaxLimit] most of the time, not
// collapse to the floor.
func TestSteadySpreadLatencyKeepsLimit(t *testing.T) {
	dists := []struct {
		name string
		draw func(r *rand.Rand) time.Duration
	}{
		{"exponential 5ms", func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * 5e6) }},
		{"lognormal σ0.5", func(r *rand.Rand) time.Duration { return time.Duration(5e6 * math.Exp(0.5*r.NormFloat64())) }},
		{"lognormal σ0.8", func(r *rand.Rand) time.Duration { return time.Duration(5e6 * math.Exp(0.8*r.NormFloat64())) }},
		{"90% 1ms, 10% 50ms", func(r *rand.Rand) time.Duration {
			if r.IntN(10) == 0 {
				return 50 * time.Millisecond
			}
			return time.Millisecond
		}},
	}
	for _, d := range dists {
		for _, alg := range []Algorithm{Gradient, AIMD} {
			t.Run(d.name+" "+alg.String(), func(t *testing.T) {
				s := &fakeSetter{}
				l := newLimiter(AdaptiveConfig{MaxLimit: 1000, Algorithm: alg}, 1000, s,
					func() int { return s.args[len(s.args)-1] }) // every slot in use
				r := rand.New(rand.NewPCG(1, 2))
				for len(s.args) < 4000 {
					l.sample(l.begin(), d.draw(r))
				}
				last := slices.Clone(s.args[2000:])
				slices.Sort(last)
				if median := last[len(last)/2]; median < 500 {
					t.Errorf("median limit of windows 2000-4000 is %d of MaxLimit 1000 under a load that is not overloaded; no-load latency %v; last limits %v",
						median, l.noLoadLatency(), s.args[len(s.args)-20:])
				}
			})
		}
	}
}

// A SetLimit the Backend refuses "changes nothing": a probe in progress
// keeps its short window of probeSamples, at MinLimit.
func TestFailedSetLimitKeepsProbeShort(t *testing.T) {
	s := &fakeSetter{}
	l := newLimiter(AdaptiveConfig{MaxLimit: 100}, 50, s, func() int { return 50 })
	s.fail = true
	if err := l.set(80); err == nil {
		t.Fatal("set succeeded on a failing Backend")
	}
	s.fail = false
	n := 0
	for from := len(s.args); len(s.args) == from && n < 1000; n++ {
		l.sample(l.begin(), time.Millisecond)
	}
	if n != probeSamples {
		t.Errorf("the probe at MinLimit lasted %d samples after a refused SetLimit, want %d; limits %v", n, probeSamples, s.args)
	}
}

// AIMD with a Backoff just below 1 (valid: it must be in (0, 1)) and rare
// probes: a probe that caught a burst of instant responses leaves no-load
// latency at 1 µs; normal load must then bring the limit back up (the
// README: AIMD "always reaches its floor", where no-load latency is measured
// again). Here the limit never gets there and never grows.
func TestAIMDBackoffNearOneRecovers(t *testing.T) {
	s := &fakeSetter{}
	l := newLimiter(AdaptiveConfig{MinLimit: 1, MaxLimit: 100, Algorithm: AIMD, Backoff: math.Nextafter(1, 0), ProbeEvery: 1 << 40}, 2, s,
		func() int { return s.args[len(s.args)-1] })
	playWindows(l, s, 0, 1)                      // the opening probe: a run of instant 401s
	playWindows(l, s, 5*time.Millisecond, 10000) // then normal load, every slot in use
	if got := roundedLimit(l); got <= 2 {
		t.Errorf("after 10000 windows of steady 5 ms the limit is %d (MaxLimit 100), no-load latency %v", got, l.noLoadLatency())
	}
}

// "Samples of a request granted under another gen are dropped": a request
// granted before a probe began, under full load, must not count in the
// probe's window. Here one such request (an hour-long handler, granted under
// the gen before the probe) finishes while the probe begins, in another
// goroutine; the probe itself sees only 1 ms handlers. Its no-load latency
// must be 1 ms. sample checks gen, then adds to acc: a probe that starts in
// between (newGen resets acc) takes the stale sample in.
func TestProbeDropsSamplesGrantedBefore(t *testing.T) {
	s := &fakeSetter{}
	l := newLimiter(AdaptiveConfig{MaxLimit: 100, Window: 1 << 15, ProbeEvery: 1 << 40}, 50, s, func() int { return 50 })
	playWindows(l, s, time.Millisecond, 1) // the opening probe
	const probes = 2000
	bad, first := 0, time.Duration(0)
	for range probes {
		before := l.begin() // granted under the gen before the probe
		var stop atomic.Bool
		var wg sync.WaitGroup
		running := make(chan struct{})
		wg.Go(func() {
			close(running)
			for !stop.Load() {
				l.sample(before, time.Hour)
			}
		})
		<-running
		l.mu.Lock()
		l.startProbe()
		l.mu.Unlock()
		stop.Store(true)
		wg.Wait()
		for l.probing {
			l.sample(l.begin(), time.Millisecond)
		}
		if d := l.noLoadLatency(); d != time.Millisecond {
			if bad++; bad == 1 {
				first = d
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d probes of 1 ms handlers took in a sample granted before them (no-load latency %v, first)", bad, probes, first)
	}
}
