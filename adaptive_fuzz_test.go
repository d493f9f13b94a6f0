package ginqueue

import (
	"errors"
	"math"
	"testing"
	"time"
)

// fakeSetter is a LimitSetter that records every limit it is given, and
// refuses them while fail is set (a Backend that is down).
type fakeSetter struct {
	args []int
	fail bool
}

func (s *fakeSetter) SetLimit(n int) error {
	s.args = append(s.args, n)
	if s.fail {
		return errors.New("ginqueue: backend down")
	}
	return nil
}

// The configurations FuzzAdaptive draws from: each index byte picks one.
var (
	fuzzMinLimits  = []int{0, 1, 2, 3, 10}
	fuzzSpans      = []int{0, 1, 3, 50, 990} // MaxLimit is MinLimit plus this; 0 and 0 mean 1000
	fuzzWindows    = []int{0, 1, 3, 10, 100}
	fuzzTolerances = []float64{0, 1, 1.05, 1.5, 3, 1e6}
	fuzzBackoffs   = []float64{0, 0.5, 0.99}
	fuzzProbes     = []int{0, 1, 2, 7, 40}
	fuzzStarts     = []int{1, 8, 200, 5000}
)

// Sample kinds: a fuzz input is a list of (kind, value, repeat) triples; each
// plays repeat+1 samples of its kind, except busy and fail, which set state.
const (
	fuzzZero      = iota // 0
	fuzzSubMicro         // value × 3 ns, under 1 µs
	fuzzMicros           // value µs
	fuzzMillis           // value ms
	fuzzHours            // value+1 hours: above the 2^32 µs cap of a sample
	fuzzAlternate        // value ns and value+1 ms, in turn
	fuzzExtreme          // MaxInt64, MinInt64, -1 ns or 1<<62 ns, by repeat
	fuzzBusy             // busy() returns value from now on; 255: the limit given
	fuzzStale            // samples of a request granted under an older gen; odd value: toggle fail
	fuzzKinds
)

// normalLoad is the handler time of the steady load after the fuzz input.
const normalLoad = 5 * time.Millisecond

// recoveryGrowth is the number of windows of normal load, after no-load
// latency has been measured under it, that FuzzAdaptive gives the limit to
// grow.
const recoveryGrowth = 200

// FuzzAdaptive plays an arbitrary sequence of handler times (zero, under a
// microsecond, hours, negative, alternating fast and slow, with any number
// of requests in flight) into the limiter of either algorithm, for a range
// of MinLimit, MaxLimit, Window, Tolerance, Backoff and ProbeEvery. After
// every sample the limit is finite and within [MinLimit, MaxLimit], and so is
// every limit given to the Backend. Then a steady normal load (5 ms, with
// every slot in use) must bring the limit back up:
//
// Every window ends with exactly one SetLimit (the new limit, or MinLimit for
// a probe), so windows are counted by SetLimit calls. The first window of
// normal load may still hold samples of the fuzz input; every later one is
// pure. Within ProbeEvery more windows a probe starts, and the window after it
// measures no-load latency as exactly 5 ms (earlier if a window at the floor,
// or one faster than the no-load latency, measures it first): so by window
// ProbeEvery + 2 no-load latency is 5 ms. From then on every window is within
// Tolerance (5 ms ≤ Tolerance × 5 ms), none is faster than no-load /
// Tolerance, and nothing is app-limited, so every window that is not a probe
// raises the limit: AIMD by 1, Gradient by at least a fifth of its headroom
// max(1, √limit / 2), so by at least 0.2. A probe and the window after it
// (the first requests to finish once the limit is restored, which moves
// nothing) come at most once every three windows (ProbeEvery ≥ 1 windows
// between two probes), so in the next recoveryGrowth = 200 windows at least
// 66 raise the limit: by at least 66 × 1 (AIMD) or 66 × 0.2 = 13 (Gradient),
// from at least MinLimit, up to MaxLimit.
func FuzzAdaptive(f *testing.F) {
	// alg, min, span, window, tolerance, backoff, probe, start, samples
	f.Add(uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), make([]byte, 3*256)) // all zeros
	f.Add(uint8(1), uint8(1), uint8(3), uint8(0), uint8(0), uint8(0), uint8(0), uint8(1),
		[]byte{fuzzZero, 0, 255, fuzzZero, 0, 255})
	f.Add(uint8(0), uint8(2), uint8(3), uint8(0), uint8(0), uint8(0), uint8(0), uint8(2),
		[]byte{fuzzBusy, 255, 0, fuzzMillis, 10, 100, fuzzSubMicro, 200, 255, fuzzMillis, 10, 255, fuzzMillis, 10, 255}) // sub-µs burst, then 10 ms
	f.Add(uint8(1), uint8(4), uint8(2), uint8(3), uint8(2), uint8(1), uint8(4), uint8(2),
		[]byte{fuzzBusy, 255, 0, fuzzMillis, 10, 100, fuzzSubMicro, 7, 40, fuzzMillis, 10, 255})
	f.Add(uint8(0), uint8(1), uint8(4), uint8(0), uint8(3), uint8(0), uint8(3), uint8(3),
		[]byte{fuzzHours, 200, 30, fuzzExtreme, 0, 0, fuzzExtreme, 0, 1, fuzzExtreme, 0, 2, fuzzExtreme, 0, 3, fuzzHours, 0, 255}) // huge values
	f.Add(uint8(1), uint8(0), uint8(0), uint8(1), uint8(5), uint8(2), uint8(1), uint8(0),
		[]byte{fuzzHours, 255, 255, fuzzMillis, 255, 255})
	f.Add(uint8(0), uint8(1), uint8(4), uint8(2), uint8(1), uint8(0), uint8(2), uint8(1),
		[]byte{fuzzBusy, 255, 0, fuzzAlternate, 0, 255, fuzzAlternate, 9, 255, fuzzAlternate, 100, 255}) // alternating fast and slow
	f.Add(uint8(1), uint8(2), uint8(3), uint8(4), uint8(0), uint8(0), uint8(3), uint8(2),
		[]byte{fuzzBusy, 0, 0, fuzzAlternate, 0, 255, fuzzStale, 1, 0, fuzzMillis, 3, 100, fuzzStale, 0, 50, fuzzStale, 1, 0})
	f.Fuzz(func(t *testing.T, alg, minI, spanI, winI, tolI, backI, probeI, startI uint8, data []byte) {
		minL := fuzzMinLimits[int(minI)%len(fuzzMinLimits)]
		cfg := AdaptiveConfig{
			Algorithm:  Algorithm(alg % 2),
			MinLimit:   minL,
			MaxLimit:   minL + fuzzSpans[int(spanI)%len(fuzzSpans)],
			Window:     fuzzWindows[int(winI)%len(fuzzWindows)],
			Tolerance:  fuzzTolerances[int(tolI)%len(fuzzTolerances)],
			Backoff:    fuzzBackoffs[int(backI)%len(fuzzBackoffs)],
			ProbeEvery: fuzzProbes[int(probeI)%len(fuzzProbes)],
		}
		if cfg.validate() != nil {
			return
		}
		s := &fakeSetter{}
		busy, follow := 0, false
		l := newLimiter(cfg, fuzzStarts[int(startI)%len(fuzzStarts)], s, func() int {
			if follow && len(s.args) > 0 {
				return s.args[len(s.args)-1]
			}
			return busy
		})
		lo, hi := l.cfg.MinLimit, l.cfg.MaxLimit
		checked := 0
		check := func(step string) {
			t.Helper()
			l.mu.Lock()
			limit := l.limit
			l.mu.Unlock()
			if math.IsNaN(limit) || math.IsInf(limit, 0) || limit < float64(lo) || limit > float64(hi) {
				t.Fatalf("%s: limit %v outside [%d, %d]", step, limit, lo, hi)
			}
			for ; checked < len(s.args); checked++ {
				if n := s.args[checked]; n < lo || n > hi {
					t.Fatalf("%s: SetLimit(%d), outside [%d, %d]", step, n, lo, hi)
				}
			}
			if d := l.noLoadLatency(); d < 0 {
				t.Fatalf("%s: no-load latency %v", step, d)
			}
		}
		check("start")
		for i := 0; i+2 < len(data); i += 3 {
			kind, v, rep := data[i]%fuzzKinds, data[i+1], int(data[i+2])+1
			switch kind {
			case fuzzBusy:
				busy, follow = int(v), v == 255
				continue
			case fuzzStale:
				if v%2 == 1 {
					s.fail = !s.fail
					continue
				}
			}
			for j := range rep {
				var d time.Duration
				switch kind {
				case fuzzSubMicro:
					d = time.Duration(v) * 3
				case fuzzMicros:
					d = time.Duration(v) * time.Microsecond
				case fuzzMillis, fuzzStale:
					d = time.Duration(v) * time.Millisecond
				case fuzzHours:
					d = time.Duration(v+1) * time.Hour
				case fuzzAlternate:
					d = time.Duration(v)
					if j%2 == 1 {
						d = time.Duration(v+1) * time.Millisecond
					}
				case fuzzExtreme:
					d = []time.Duration{math.MaxInt64, math.MinInt64, -1, 1 << 62}[rep%4]
				}
				gen := l.begin()
				if kind == fuzzStale {
					gen--
				}
				l.sample(gen, d)
				check("fuzz input")
			}
		}

		// Steady normal load: see the derivation above.
		follow, s.fail = true, false
		windows := l.cfg.ProbeEvery + 2 + recoveryGrowth
		maxSamples := windows * max(l.cfg.Window, 200, probeSamples)
		from := len(s.args)
		for n := 0; len(s.args)-from < windows; n++ {
			if n > maxSamples {
				t.Fatalf("%d windows of normal load did not end in %d samples", windows, maxSamples)
			}
			l.sample(l.begin(), normalLoad)
			check("normal load")
		}
		l.mu.Lock()
		limit := int(math.Round(l.limit))
		l.mu.Unlock()
		step := 0.2 // Gradient: a fifth of a headroom of at least 1
		if l.cfg.Algorithm == AIMD {
			step = 1
		}
		want := min(hi, lo+int(step*float64(recoveryGrowth/3)))
		if limit < want {
			t.Fatalf("after %d windows of normal load the limit is %d, want at least %d (no-load latency %v)",
				windows, limit, want, l.noLoadLatency())
		}
		if hi > lo && limit <= lo {
			t.Fatalf("the limit is stuck at MinLimit %d", lo)
		}
		if got := l.noLoadLatency(); got != normalLoad {
			t.Fatalf("no-load latency %v after normal load, want %v", got, normalLoad)
		}
	})
}

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
