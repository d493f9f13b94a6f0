package ginqueue

import (
	"fmt"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// The root's side of the Backend contract (package backend): the in-memory
// Backend for the other modules of this repository, and the checks of
// Limits.

func init() {
	inmem.New = func() backend.Backend { return newMemoryBackend() }
	inmem.Check = func(l backend.Limits) error { return checkLimits(l, codelOf(l), "Limits") }
}

// newMemoryBackend returns the in-memory Backend that NewQueue uses when
// Config.Backend is nil: one process, first in first out within a priority
// and flow (unless CoDel.LIFO applies), no polling. It honours every Limits
// field, and is a FastPather, a LimitSetter and an inmem.Sharer; other
// Backends may use it as a local fallback. It belongs to one Queue: a
// second Start fails. Close and Drain work before Start too, and one closed
// before it started refuses to Start.
func newMemoryBackend() *dispatcher { return &dispatcher{room: newWaitroom()} }

// codelOf is the CoDel setting that l carries, nil when CoDel is off.
func codelOf(l backend.Limits) *CoDel {
	if l.CoDelTarget == 0 && l.CoDelInterval == 0 && !l.CoDelLIFO {
		return nil
	}
	return &CoDel{Target: l.CoDelTarget, Interval: l.CoDelInterval, LIFO: l.CoDelLIFO}
}

// checkLimits reports the first field of l, or of cd (its CoDel as given),
// that cannot work, naming it as a field of the struct called from.
func checkLimits(l backend.Limits, cd *CoDel, from string) error {
	field := func(name, rule string, got any) error {
		return fmt.Errorf("ginqueue: %s.%s %s, got %v", from, name, rule, got)
	}
	switch {
	case l.MaxConcurrent < 1:
		return field("MaxConcurrent", "must be at least 1", l.MaxConcurrent)
	case l.MaxConcurrent > backend.MaxLimit:
		return field("MaxConcurrent", fmt.Sprintf("must be at most %d", backend.MaxLimit), l.MaxConcurrent)
	case l.MaxQueue < 0:
		return field("MaxQueue", "must not be negative", l.MaxQueue)
	case l.MaxQueue > backend.MaxLimit:
		return field("MaxQueue", fmt.Sprintf("must be at most %d", backend.MaxLimit), l.MaxQueue)
	case l.QueueTimeout < 0:
		return field("QueueTimeout", "must not be negative", l.QueueTimeout)
	case l.MaxQueuePerFlow < 0:
		return field("MaxQueuePerFlow", "must not be negative", l.MaxQueuePerFlow)
	case l.MaxQueuePerFlow > l.MaxQueue:
		return field("MaxQueuePerFlow", fmt.Sprintf("must not exceed %s.MaxQueue (%d)", from, l.MaxQueue), l.MaxQueuePerFlow)
	case cd != nil:
		return cd.check(from + ".CoDel")
	}
	return nil
}
