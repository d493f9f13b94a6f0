package ginqueue

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// Algorithm chooses how an adaptive limit moves.
type Algorithm uint8

const (
	// Gradient scales the limit, once per window, by how much slower than
	// no-load the recent handler times are, plus a little headroom. The limit
	// falls by at most half per window. Its floor is max(MinLimit, 2).
	// docs/adaptive.md has the formula.
	Gradient Algorithm = iota
	// AIMD adds one slot per window while recent handler times stay within
	// Tolerance × no-load, and else multiplies the limit by Backoff, taking
	// at least one slot. Its floor is MinLimit.
	AIMD
)

// String returns "gradient" or "aimd".
func (a Algorithm) String() string {
	if a == AIMD {
		return "aimd"
	}
	return "gradient"
}

// AdaptiveConfig makes the limit follow the measured handler latency: fewer
// slots when handlers slow down, more when they keep up. After every Window
// served requests it compares their handler times with the no-load latency
// (Stats.NoLoadLatency), which it measures by holding the limit at MinLimit
// for a few requests, at the start and every ProbeEvery windows. The zero
// value is usable: Gradient between 1 and 1000 slots. docs/adaptive.md says
// how the limit moves.
type AdaptiveConfig struct {
	// MinLimit is the lowest limit, and the limit while no-load latency is
	// measured. Zero means 1. It must be in [0, 2^30] and at most MaxLimit.
	MinLimit int
	// MaxLimit is the highest limit. Zero means 1000. It must be in
	// [0, 2^30].
	MaxLimit int
	// Algorithm is Gradient (the zero value) or AIMD.
	Algorithm Algorithm
	// Tolerance is how much slower than no-load a window may be before the
	// limit backs off. Zero means 1.1; below 1, or not finite, is refused.
	Tolerance float64
	// Backoff is AIMD's multiplicative decrease. Zero means 0.9; it must be
	// in (0, 1).
	Backoff float64
	// Window is the number of samples per update. Zero means the current
	// limit, within [10, 200]. It must be in [0, 32768].
	Window int
	// ProbeEvery is the number of windows between two measurements of the
	// no-load latency. Zero means 1000; negative is refused.
	ProbeEvery int
}

// validate reports the first field of a that cannot work, naming it as a
// field of Config.Adaptive.
func (a AdaptiveConfig) validate() error {
	if err := a.validateLimits(); err != nil {
		return err
	}
	switch {
	case a.Algorithm > AIMD:
		return fmt.Errorf("ginqueue: Config.Adaptive.Algorithm %d is not Gradient or AIMD", a.Algorithm)
	case a.Tolerance != 0 && (a.Tolerance < 1 || math.IsNaN(a.Tolerance) || math.IsInf(a.Tolerance, 0)):
		return fmt.Errorf("ginqueue: Config.Adaptive.Tolerance must be at least 1, got %v", a.Tolerance)
	case a.Backoff != 0 && !(a.Backoff > 0 && a.Backoff < 1):
		return fmt.Errorf("ginqueue: Config.Adaptive.Backoff must be in (0, 1), got %v", a.Backoff)
	case a.Window < 0 || a.Window > 1<<15:
		return fmt.Errorf("ginqueue: Config.Adaptive.Window must be in [0, %d], got %d", 1<<15, a.Window)
	case a.ProbeEvery < 0:
		return fmt.Errorf("ginqueue: Config.Adaptive.ProbeEvery must not be negative, got %d", a.ProbeEvery)
	}
	return nil
}

// validateLimits is validate for MinLimit and MaxLimit.
func (a AdaptiveConfig) validateLimits() error {
	switch {
	case a.MinLimit < 0 || a.MinLimit > backend.MaxLimit:
		return fmt.Errorf("ginqueue: Config.Adaptive.MinLimit must be in [0, %d], got %d", backend.MaxLimit, a.MinLimit)
	case a.MaxLimit < 0 || a.MaxLimit > backend.MaxLimit:
		return fmt.Errorf("ginqueue: Config.Adaptive.MaxLimit must be in [0, %d], got %d", backend.MaxLimit, a.MaxLimit)
	case a.withDefaults().MinLimit > a.withDefaults().MaxLimit:
		return fmt.Errorf("ginqueue: Config.Adaptive.MinLimit %d exceeds MaxLimit %d", a.MinLimit, a.withDefaults().MaxLimit)
	}
	return nil
}

func (a AdaptiveConfig) withDefaults() AdaptiveConfig {
	if a.MinLimit == 0 {
		a.MinLimit = 1
	}
	if a.MaxLimit == 0 {
		a.MaxLimit = 1000
	}
	if a.Tolerance == 0 {
		a.Tolerance = 1.1
	}
	if a.Backoff == 0 {
		a.Backoff = 0.9
	}
	if a.ProbeEvery == 0 {
		a.ProbeEvery = 1000
	}
	return a
}

// probeSamples is the size of the window that measures no-load latency.
const probeSamples = 10

// resolution is the smallest latency a window can have: samples are whole
// microseconds, and a ratio of latencies must never be 0/0.
const resolution = time.Microsecond

// limiter moves a Backend's limit from handler latencies.
//
// The request path only loads gen and updates acc with a CAS, plus one Add
// to sq: acc packs the samples of the current window, the generation they
// belong to in the top 8 bits, their count in the next 16 and their sum of
// microseconds in the low 40; sq sums their squares, for the spread. A
// sample of another generation finds another tag and is dropped, even when
// a probe begins between its check and its add. The request whose sample
// completes the window takes it (the CAS that empties acc) and runs update;
// everything else happens under mu, once per window. sq is approximate: a
// square added just as its window is taken counts in the next one.
type limiter struct {
	cfg    AdaptiveConfig
	target backend.LimitSetter
	busy   func() int // the demand now: slots running plus requests waiting

	floor int // the lowest limit the algorithm reaches: MinLimit, for Gradient at least 2

	gen    atomic.Uint64 // samples of a request granted under another gen are dropped
	window atomic.Uint64 // samples in the current window
	acc    atomic.Uint64
	sq     atomic.Uint64

	// noLoad is the no-load latency (a time.Duration), 0 until measured. It
	// is written only under mu, and read without it: Stats must never wait
	// for mu, which an update holds while the Backend's SetLimit waits for
	// the Backend's own lock.
	noLoad atomic.Int64
	// steady is the limit outside probes, for estimates of the rate of
	// service: a probe holds the Backend at MinLimit for a few samples only.
	// Written under mu, read without it.
	steady atomic.Int64

	mu sync.Mutex
	// Guarded by mu.
	limit    float64 // always finite and within [MinLimit, backend.MaxLimit]
	noLoadSE float64 // the standard error of the no-load latency, µs
	probing  bool    // the current window measures no-load latency
	warming  bool    // the first window after a probe: its samples are biased short
	saved    float64 // the limit to return to after a probe
	windows  int     // since the last probe
}

const (
	accTagShift   = 56
	accCountShift = 40
	accCount      = 1 << accCountShift
	accSum        = accCount - 1
	accTagMask    = uint64(0xff) << accTagShift
	// sampleCap bounds a sample, in µs (about 16.8 s): 2^15 squares of it
	// still fit in sq, and 2^15 of it in acc's sum.
	sampleCap = 1<<24 - 1
)

// tagOf is the tag of a generation's window in acc.
func tagOf(gen uint64) uint64 { return gen << accTagShift }

// newLimiter starts at start, within [MinLimit, MaxLimit], and opens with
// a probe of no-load latency.
func newLimiter(cfg AdaptiveConfig, start int, target backend.LimitSetter, busy func() int) *limiter {
	l := &limiter{cfg: cfg.withDefaults(), target: target, busy: busy}
	l.floor = l.cfg.MinLimit
	if l.cfg.Algorithm == Gradient {
		l.floor = min(max(l.floor, 2), l.cfg.MaxLimit)
	}
	l.limit = min(max(float64(start), float64(l.cfg.MinLimit)), float64(l.cfg.MaxLimit))
	l.mu.Lock()
	l.startProbe()
	l.mu.Unlock()
	return l
}

// begin is called when a request is granted; its result goes to sample.
func (l *limiter) begin() uint64 { return l.gen.Load() }

// sample records the handler time d of a request granted under gen.
func (l *limiter) sample(gen uint64, d time.Duration) {
	us := min(uint64(max(d, 0)/time.Microsecond), sampleCap)
	for {
		v := l.acc.Load()
		if v&accTagMask != tagOf(gen) || gen != l.gen.Load() {
			return // a window of another generation
		}
		next := v + accCount + us
		n := next >> accCountShift & (1<<16 - 1)
		if n < l.window.Load() {
			if l.acc.CompareAndSwap(v, next) {
				l.sq.Add(us * us)
				return
			}
			continue
		}
		// This sample completes the window: take it.
		if !l.acc.CompareAndSwap(v, tagOf(gen)) {
			continue
		}
		l.update(gen, windowSums{n: n, sum: next & accSum, sq: l.sq.Swap(0) + us*us})
		return
	}
}

// windowSums is the samples of one window: count, sum and sum of squares of µs.
type windowSums struct{ n, sum, sq uint64 }

// stats returns a window's mean, floored at the resolution, and the standard
// error of that mean, in µs.
func (w windowSums) stats() (mean, se float64) {
	n := float64(w.n)
	mean = float64(w.sum) / n
	variance := max(float64(w.sq)/n-mean*mean, 0)
	return max(mean, float64(resolution/time.Microsecond)), math.Sqrt(variance / n)
}

// update ends a window of samples.
//
// Window means are noisy when handler times spread (a window of 10
// exponential samples is off by a third as often as not), and a limit that
// falls on noise and grows back slowly would drift to its floor under a load
// that is not overloaded. So every comparison allows for the noise: a window
// is slow only when even its mean less two standard errors is above
// Tolerance × (noLoad plus two of its own standard errors), and much faster
// than no-load only when its mean plus two standard errors is below noLoad
// less two of its own, over Tolerance.
func (l *limiter) update(gen uint64, w windowSums) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen.Load() {
		return // a probe began or ended since
	}
	mean, se := w.stats()
	if l.probing {
		l.setNoLoad(mean, se)
		l.probing = false
		l.warming = true
		l.limit = l.saved
		l.newGen()
		_ = l.apply()
		return
	}
	if l.warming {
		// The first window after a probe is the first requests to finish
		// once the limit is restored, the short ones: no evidence.
		l.warming = false
		_ = l.apply()
		return
	}
	noLoad := float64(l.noLoad.Load()) / float64(time.Microsecond)
	switch {
	case noLoad == 0 || int(math.Round(l.limit)) <= l.floor:
		// Never measured (a probe was cut short), or few requests in flight:
		// a measurement, as a probe's. At the floor this is what corrects a
		// no-load latency that is too low, and so lets the limit climb back.
		l.setNoLoad(mean, se)
		noLoad = mean
	case (mean+2*se)*l.cfg.Tolerance < noLoad-2*l.noLoadSE:
		// Much faster than no-load: measure again rather than trust it.
		l.startProbe()
		return
	}
	// A limit that is not used tells nothing about a higher one; a queue
	// that waits uses it whatever is running at this instant.
	appLimited := float64(l.busy()) < l.limit/2
	threshold := (noLoad + 2*l.noLoadSE) * l.cfg.Tolerance // at least 1 µs, perhaps +Inf
	recent := max(mean-2*se, noLoad/2, 1)                  // the least the window's latency is likely to be
	next := l.limit
	switch l.cfg.Algorithm {
	case AIMD:
		if recent > threshold {
			// At least one slot, so that a Backoff just below 1 still
			// reaches the floor.
			next = min(l.limit*l.cfg.Backoff, l.limit-1)
		} else if !appLimited {
			next = l.limit + 1
		}
	default:
		gradient := min(max(threshold/recent, 0.5), 1)
		next = l.limit*gradient + max(1, math.Sqrt(l.limit)/2)
		if next > l.limit {
			if appLimited {
				next = l.limit
			}
			next = l.limit + (next-l.limit)/5
		}
	}
	// min and max pass NaN through: a limit that is not a number stays out.
	if !math.IsNaN(next) && !math.IsInf(next, 0) {
		l.limit = min(max(next, float64(l.cfg.MinLimit)), float64(l.cfg.MaxLimit))
	}
	if l.windows++; l.windows >= l.cfg.ProbeEvery {
		l.startProbe() // from the limit this window chose
		return
	}
	_ = l.apply()
}

// setNoLoad records a measured no-load latency, mean and standard error in
// µs. Requires l.mu.
func (l *limiter) setNoLoad(mean, se float64) {
	l.noLoad.Store(int64(mean * float64(time.Microsecond)))
	l.noLoadSE = se
}

// startProbe holds the limit at MinLimit for one short window. Requires l.mu.
func (l *limiter) startProbe() {
	l.probing = true
	l.saved = l.limit
	l.steady.Store(int64(math.Round(l.limit)))
	l.windows = 0
	l.newGen()
	l.window.Store(probeSamples)
	_ = l.target.SetLimit(l.cfg.MinLimit)
}

// newGen drops the samples of requests granted so far: they ran under the
// limit before a probe began or ended, which says nothing of the limit
// after it. Requires l.mu.
func (l *limiter) newGen() {
	l.acc.Store(tagOf(l.gen.Add(1)))
	l.sq.Store(0)
}

// apply gives the limit to the Backend and sizes the next window. A Backend
// that fails to take it keeps its old limit; the next window tries again.
// Requires l.mu.
func (l *limiter) apply() error {
	n := int(math.Round(l.limit))
	if err := l.target.SetLimit(n); err != nil {
		return err
	}
	w := l.cfg.Window
	if w == 0 {
		w = min(max(n, 10), 200)
	}
	l.window.Store(uint64(w))
	l.steady.Store(int64(n))
	return nil
}

// noLoadLatency is the measured no-load latency; zero until measured. It
// never waits for l.mu.
func (l *limiter) noLoadLatency() time.Duration { return time.Duration(l.noLoad.Load()) }

// set moves the limit to n, within MinLimit and MaxLimit, at once (ending a
// probe in progress), and goes on from there. It returns the Backend's error,
// and then changes nothing.
func (l *limiter) set(n int) error {
	if err := backend.CheckLimit(n); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.limit
	l.limit = min(max(float64(n), float64(l.cfg.MinLimit)), float64(l.cfg.MaxLimit))
	if err := l.apply(); err != nil {
		l.limit = old
		return err
	}
	if l.probing {
		// The caller's limit wins over a probe in progress; no-load latency
		// is measured at the next probe, or taken from the next window.
		l.probing = false
		l.newGen()
	}
	return nil
}
