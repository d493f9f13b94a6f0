package ginqueue

// The steps the interleaving tests see: each atomic step on dispatcher.state
// and each lock is announced through dispatcher.step, nil in production.

// step names an atomic step for the interleaving tests.
type step uint8

const (
	stepNone step = iota
	stepStart
	stepLock
	stepFastLoad
	stepFastCAS
	stepRelease
	stepSlowLoad
	stepSlowMark
	stepSlowTake
	stepGrantRead
	stepGrantTake
	stepSettle
	stepSetLimit
	stepPublish   // a publication half written, and written before pubSeq moves to it
	stepStatsSeq  // Stats, before it reads pubSeq again
	stepStatsRead // Stats, between its reads of a publication
	stepWake      // settle, before it sends a wake-up
	stepYield     // Release, before it yields to the waiter it granted
)

// at reports step s to the interleaving tests.
func (d *dispatcher) at(s step) {
	if d.step != nil {
		d.step(s)
	}
}

// lock takes mu, after telling the interleaving tests.
func (d *dispatcher) lock() {
	d.at(stepLock)
	d.mu.Lock()
}
