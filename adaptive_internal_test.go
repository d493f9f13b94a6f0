// The adaptive limiter alone, sample by sample.

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

// playWindows feeds samples of d until n more windows have ended (each ends
// with one SetLimit).
func playWindows(l *limiter, s *fakeSetter, d time.Duration, n int) {
	for from := len(s.args); len(s.args)-from < n; {
		l.sample(l.begin(), d)
	}
}

// roundedLimit is the limiter's limit as the Backend gets it.
func roundedLimit(l *limiter) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(math.Round(l.limit))
}

// How no-load latency moves, window by window, with a Window of 10 samples
// (a probe's size too) and every slot in use.
func TestLimiterNoLoadLatency(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  AdaptiveConfig
		run  func(t *testing.T, l *limiter, s *fakeSetter)
	}{
		{"faster handlers are measured by a probe, the limit kept", AdaptiveConfig{MaxLimit: 100, Window: 10}, func(t *testing.T, l *limiter, s *fakeSetter) {
			playWindows(l, s, 5*time.Millisecond, 1+3) // the opening probe, three windows
			before, from := roundedLimit(l), len(s.args)
			playWindows(l, s, time.Millisecond, 2)
			if got := s.args[from:]; got[0] != 1 || got[1] != before {
				t.Errorf("limits %v, want a probe at 1, then %d again", got, before)
			}
			if got := l.noLoadLatency(); got != time.Millisecond {
				t.Errorf("no-load latency %v, want 1ms", got)
			}
		}},
		// After the window that follows the probe (which moves nothing):
		// 20 → 12.2 → 7.9 → 5.3 → 3.8 → 2.9 → 2.5 (rounded 2, the floor) in 6
		// windows, each at most halving; the 8th, at the floor, measures.
		{"gradient: a probe of 200 µs cache hits, measured again at the floor", AdaptiveConfig{MaxLimit: 100, Window: 10}, func(t *testing.T, l *limiter, s *fakeSetter) {
			playWindows(l, s, 200*time.Microsecond, 1)
			playWindows(l, s, 5*time.Millisecond, 8)
			if got := l.noLoadLatency(); got != 5*time.Millisecond {
				t.Errorf("no-load latency %v after 8 windows of 5 ms, want 5ms; limits %v", got, s.args)
			}
			playWindows(l, s, 5*time.Millisecond, 10)
			if got := roundedLimit(l); got < 4 { // 2.46 + 10 × 0.2
				t.Errorf("limit %d 10 windows after the floor, want at least 4; limits %v", got, s.args)
			}
		}},
		// 20 × 0.9ⁿ rounds to 1 (below 1.5) for n = 25; the 26th window measures.
		{"aimd: a probe of 200 µs cache hits, measured again at the floor", AdaptiveConfig{MaxLimit: 100, Window: 10, Algorithm: AIMD}, func(t *testing.T, l *limiter, s *fakeSetter) {
			playWindows(l, s, 200*time.Microsecond, 1)
			playWindows(l, s, 5*time.Millisecond, 26)
			if got := l.noLoadLatency(); got != 5*time.Millisecond {
				t.Errorf("no-load latency %v after 26 windows of 5 ms, want 5ms; limits %v", got, s.args)
			}
			playWindows(l, s, 5*time.Millisecond, 10)
			if got := roundedLimit(l); got < 11 {
				t.Errorf("limit %d 10 windows after the floor, want at least 11; limits %v", got, s.args)
			}
		}},
		// Every other window is a probe; the other 20 each add at least 0.2.
		{"ProbeEvery 1: the window before each probe still moves the limit", AdaptiveConfig{MaxLimit: 100, Window: 10, ProbeEvery: 1}, func(t *testing.T, l *limiter, s *fakeSetter) {
			playWindows(l, s, 5*time.Millisecond, 1+40)
			if got := roundedLimit(l); got < 24 {
				t.Errorf("limit %d after 40 windows, want at least 20 + 20 × 0.2 = 24", got)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &fakeSetter{}
			l := newLimiter(tt.cfg, 20, s, func() int { return s.args[len(s.args)-1] })
			tt.run(t, l, s)
		})
	}
}

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
