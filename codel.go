package ginqueue

import (
	"cmp"
	"fmt"
	"time"
)

// CoDel: the option, its defaults and checks, its compiled form, and when
// the queue is standing. The maximum wait it sets, and the timer that enforces
// it, are in timeout.go. Where the queue starts being busy, and the LIFO
// grants, are in waiters.go.

// CoDel is controlled-delay queueing ("Fail at Scale", ACM Queue, 2015).
// While the queue empties now and then, a waiter may wait up to Interval.
// Once it has gone a whole Interval without emptying, the queue is standing and a
// waiter may wait only Target. A nonzero Config.QueueTimeout caps both, and a
// waiter that runs out is a queue timeout. The zero value is usable: 5 ms,
// 100 ms, first in first out. docs/configuration.md (CoDel) says how to
// choose them.
type CoDel struct {
	// Target is how long a waiter may wait while the queue is standing. Zero
	// means 5 ms. Negative, or above Interval, is refused.
	Target time.Duration

	// Interval is how long a waiter may wait while the queue absorbs a
	// burst, and how long the queue must go without emptying before it
	// is standing. Zero means 100 ms. Negative is refused.
	Interval time.Duration

	// LIFO grants the newest waiter first while the queue is standing, still by
	// priority and flow. False means first in first out always.
	LIFO bool
}

// The CoDel defaults, for a zero Target or Interval.
const (
	defaultCoDelTarget   = 5 * time.Millisecond
	defaultCoDelInterval = 100 * time.Millisecond
)

// withDefaults returns c with its zero fields set to their defaults.
func (c CoDel) withDefaults() CoDel {
	c.Target = cmp.Or(c.Target, defaultCoDelTarget)
	c.Interval = cmp.Or(c.Interval, defaultCoDelInterval)
	return c
}

// check reports the first field of c that cannot work, naming it as a field
// of from: Config.CoDel, or Limits.CoDel for the CoDel fields of Limits.
func (c CoDel) check(from string) error {
	d := c.withDefaults()
	switch {
	case c.Target < 0:
		return fmt.Errorf("ginqueue: %s.Target must not be negative, got %v", from, c.Target)
	case c.Interval < 0:
		return fmt.Errorf("ginqueue: %s.Interval must not be negative, got %v", from, c.Interval)
	case d.Target > d.Interval:
		return fmt.Errorf("ginqueue: %s.Target must not exceed %s.Interval, got %v%s and %v%s",
			from, from, d.Target, byDefault(c.Target), d.Interval, byDefault(c.Interval))
	}
	return nil
}

// byDefault notes, in an error, that a value was zero and is its default.
func byDefault(v time.Duration) string {
	if v == 0 {
		return " (the default for zero)"
	}
	return ""
}

// codel is the CoDel of Limits as the dispatcher uses it: the two maximum waits a
// waiter can have, in nanoseconds, each already capped by QueueTimeout, so
// at any moment one of them is every waiter's maximum wait.
type codel struct {
	long     int64 // while the queue absorbs a burst: Interval, capped
	short    int64 // while it is standing: Target, capped; never above long
	interval int64 // the queue is standing once it has not emptied for this long
	lifo     bool  // while it is standing, grant the newest waiter first
}

// newCoDel compiles c, whose defaults are filled in, for a QueueTimeout.
func newCoDel(c CoDel, timeout time.Duration) *codel {
	long, short := c.Interval, c.Target
	if timeout > 0 {
		long, short = min(long, timeout), min(short, timeout)
	}
	return &codel{long: int64(long), short: int64(short), interval: int64(c.Interval), lifo: c.LIFO}
}

// standing reports whether, under CoDel, the queue is standing at now: it has
// waiters and has not emptied for a whole interval. Requires d.mu.
func (d *dispatcher) standing(now int64) bool {
	return d.room.n > 0 && now-d.busySince >= d.codel.interval
}
