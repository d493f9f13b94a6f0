package ginqueue

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Algorithm chooses how an adaptive limit moves.
type Algorithm uint8

const (
	// Gradient compares the recent handler latency with the no-load latency
	// and scales the limit by their ratio, plus a little headroom:
	//
	//	gradient = clamp(Tolerance × noLoad / recent, 0.5, 1)
	//	limit    = limit × gradient + max(1, √limit / 2)
	//
	// While recent latency stays within Tolerance × noLoad the limit grows by
	// the headroom each window; when it rises, the limit shrinks in
	// proportion, at most by half per window. Growth is smoothed (a fifth of
	// the step per window), a fall is not. The headroom of at least one slot
	// holds a limit that keeps falling at 2, so Gradient's floor is
	// max(MinLimit, 2), within MaxLimit. A limit that is less than half used
	// does not grow. It is the idea of Netflix's Gradient2 and Envoy's
	// adaptive concurrency.
	Gradient Algorithm = iota
	// AIMD adds one slot per window while recent latency stays within
	// Tolerance × noLoad, and multiplies the limit by Backoff when it does
	// not; its floor is MinLimit. A limit that is less than half used does
	// not grow.
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
// requests in flight when handlers slow down, more when they keep up. The
// zero value is usable: Gradient between 1 and 1000 slots.
//
// Samples are the handler times of served requests (the rest of the chain
// after the throttle), those that panic included; 408, 503 and canceled
// requests are not samples. They are read in whole microseconds, capped at
// 2^32 µs (about 71 minutes), and a window whose mean is under 1 µs (instant
// 204s or 401s) counts as 1 µs, so no ratio of latencies divides by zero.
// Every Window samples the limit is recomputed; it always stays within
// [MinLimit, MaxLimit], and a computed limit that is not a finite number
// leaves it where it is.
//
// The no-load latency is measured, never inferred from load:
//   - by a probe, which holds the limit at MinLimit for one short window (10
//     samples) and then restores it: at the start, after every ProbeEvery
//     windows, and at once after a window faster than no-load latency /
//     Tolerance (a burst of instant errors, or handlers that got faster). One
//     such window is a reason to measure, not a measurement: taken as the
//     no-load latency it would make every normal window after it look slow;
//   - by any window run while the limit is at its floor (see Gradient and
//     AIMD), where few requests are in flight, as in a probe;
//   - by the first window after Queue.SetLimit cut the opening probe short.
//
// Nothing else moves it, down or up. A windowed minimum of recent windows
// would rise under sustained overload, when every window is slow, and the
// limit would grow with the very latency it should react to. So a no-load
// latency that is too low (a probe that caught a burst of instant responses,
// or handlers that became slower at every load) makes the windows look slow
// and the limit fall: AIMD's always reaches its floor, and Gradient's does
// within a few windows when they look at least about twice Tolerance too
// slow; there it is measured again and the limit climbs back. A Gradient
// limit told that latency is only a little above Tolerance × noLoad settles
// lower instead, until the next probe.
type AdaptiveConfig struct {
	// MinLimit is the lowest limit, and the one no-load latency is measured
	// at. Zero means 1.
	MinLimit int
	// MaxLimit is the highest limit. Zero means 1000.
	MaxLimit int
	// Algorithm is Gradient (the zero value) or AIMD.
	Algorithm Algorithm
	// Tolerance is how much slower than no-load a window may be before the
	// limit backs off. Zero means 1.1; below 1 is refused.
	Tolerance float64
	// Backoff is AIMD's multiplicative decrease. Zero means 0.9; it must be
	// in (0, 1).
	Backoff float64
	// Window is the number of samples per update. Zero means the current
	// limit, within [10, 200].
	Window int
	// ProbeEvery is the number of windows between two probes of the no-load
	// latency: the last of them moves the limit, then the probe starts. Zero
	// means 1000.
	ProbeEvery int
}

// validate checks a against the limit it starts from.
func (a AdaptiveConfig) validate() error {
	switch {
	case a.MinLimit < 0 || a.MinLimit > maxLimit:
		return fmt.Errorf("ginqueue: Config.Adaptive.MinLimit must be in [0, %d], got %d", maxLimit, a.MinLimit)
	case a.MaxLimit < 0 || a.MaxLimit > maxLimit:
		return fmt.Errorf("ginqueue: Config.Adaptive.MaxLimit must be in [0, %d], got %d", maxLimit, a.MaxLimit)
	case a.withDefaults().MinLimit > a.withDefaults().MaxLimit:
		return fmt.Errorf("ginqueue: Config.Adaptive.MinLimit %d exceeds MaxLimit %d", a.MinLimit, a.withDefaults().MaxLimit)
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
// The request path only loads gen and adds to acc: acc packs the samples of
// the current window, a count in the top 16 bits and a sum of microseconds
// in the low 48 (a sample is capped at 2^32 µs, about 71 minutes). The request whose add completes the window takes it (CAS to
// zero) and runs update; everything else happens under mu, once per window.
type limiter struct {
	cfg    AdaptiveConfig
	target LimitSetter
	busy   func() int // requests running now

	floor int // the lowest limit the algorithm reaches: MinLimit, for Gradient at least 2

	gen    atomic.Uint64 // samples of a request granted under another gen are dropped
	window atomic.Uint64 // samples in the current window
	acc    atomic.Uint64

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
	limit   float64 // always finite and within [MinLimit, MaxLimit]
	probing bool    // the current window measures no-load latency
	saved   float64 // the limit to return to after a probe
	windows int     // since the last probe
}

const (
	accCount = 1 << 48
	accSum   = accCount - 1
)

// newLimiter starts at limit and opens with a probe of no-load latency.
func newLimiter(cfg AdaptiveConfig, start int, target LimitSetter, busy func() int) *limiter {
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
	if gen != l.gen.Load() {
		return
	}
	us := min(uint64(max(d, 0)/time.Microsecond), accSum>>16)
	v := l.acc.Add(accCount | us)
	n := v / accCount
	// The first add to find the window full takes it; if another add slips
	// in between, the CAS fails and the next add tries again.
	if n < l.window.Load() || !l.acc.CompareAndSwap(v, 0) {
		return
	}
	l.update(gen, time.Duration((v&accSum)/n)*time.Microsecond)
}

// update ends a window of samples whose mean is avg.
func (l *limiter) update(gen uint64, avg time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen.Load() {
		return // a probe began or ended since
	}
	avg = max(avg, resolution)
	if l.probing {
		l.noLoad.Store(int64(avg))
		l.probing = false
		l.limit = l.saved
		l.newGen()
		_ = l.apply()
		return
	}
	noLoad := time.Duration(l.noLoad.Load())
	switch {
	case noLoad == 0 || int(math.Round(l.limit)) <= l.floor:
		// Never measured (a probe was cut short), or few requests in flight:
		// a measurement, as a probe's. At the floor this is what corrects a
		// no-load latency that is too low, and so lets the limit climb back.
		noLoad = avg
		l.noLoad.Store(int64(avg))
	case float64(avg)*l.cfg.Tolerance < float64(noLoad):
		// Much faster than no-load: measure again rather than trust it.
		l.startProbe()
		return
	}
	// A limit that is not used tells nothing about a higher one.
	appLimited := float64(l.busy()) < l.limit/2
	threshold := float64(noLoad) * l.cfg.Tolerance // at least 1 µs, perhaps +Inf
	next := l.limit
	switch l.cfg.Algorithm {
	case AIMD:
		if float64(avg) > threshold {
			next = l.limit * l.cfg.Backoff
		} else if !appLimited {
			next = l.limit + 1
		}
	default:
		gradient := min(max(threshold/float64(avg), 0.5), 1)
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

// newGen drops the samples of requests granted so far: they ran under a
// limit that no longer says anything (around a probe). Requires l.mu.
func (l *limiter) newGen() {
	l.gen.Add(1)
	l.acc.Store(0)
}

// apply gives the limit to the Backend and sizes the next window. A Backend
// that fails to take it keeps its old limit; the next window tries again.
// Requires l.mu.
func (l *limiter) apply() error {
	n := int(math.Round(l.limit))
	w := l.cfg.Window
	if w == 0 {
		w = min(max(n, 10), 200)
	}
	l.window.Store(uint64(w))
	if err := l.target.SetLimit(n); err != nil {
		return err
	}
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
	if n < 1 || n > maxLimit {
		return fmt.Errorf("ginqueue: limit must be in [1, %d], got %d", maxLimit, n)
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
