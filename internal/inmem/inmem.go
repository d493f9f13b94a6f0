// Package inmem gives the modules of this repository the root package's
// in-memory Backend, which applications reach only through a Queue.
package inmem

import (
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// New returns a new in-memory Backend: a FastPather, a LimitSetter and a
// Sharer. The root package sets it when it is loaded.
var New func() backend.Backend

// Check reports the first field of l that cannot work, naming it as a
// Limits field; nil for usable Limits. The root package sets it.
var Check func(l backend.Limits) error

// Sharer is a Backend whose slots are lent to it by another, so that it can
// hold none for a while.
type Sharer interface {
	// SetShare is SetLimit that also takes 0: nobody is granted until the
	// share is raised again. It returns an error naming n when n is below 0
	// or above backend.MaxLimit.
	SetShare(n int) error
	// SetLease bounds what is granted within the share until the next
	// SetLease: nothing from until on, by the monotonic clock; and a cost is
	// clamped to fleet slots rather than to the share, so that a request
	// whose cost is above the share waits until the share covers it. A zero
	// until means no end; a fleet of 0 or less clamps to the share.
	SetLease(until time.Time, fleet int)
}
