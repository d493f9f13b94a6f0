package redisqueue

import "github.com/ginqueue/ginqueue/backend"

// Release implements backend.Backend: it gives back the slots of t, a
// Ticket that Acquire returned.
//
// In Shares mode the slots go back to this replica's share, in memory,
// with no Redis call. When the share was lowered below what runs here, the
// Release that brings what runs down to the share has the replica report
// the freed slots to Redis at once, in the background.
//
// In GlobalQueue mode the slots go back in Redis with one call bounded by
// CallTimeout; when another release's call is in flight, Release returns at
// once and the slots go back with the next call, which carries every
// release that came meanwhile. If the call fails, or Redis is marked down,
// the release is retried in the background until Redis answers (after
// Close, until LeaseTTL has passed: the lease has expired by then).
func (b *Backend) Release(t backend.Ticket) {
	if b.sh != nil {
		b.sh.release(t)
		return
	}
	b.released.Add(uint64(max(t.Cost, 1)))
	b.release(t)
}

// release gives the slots of t back; Release, and a grant taken back. The
// slots given back in Redis are those Redis granted, whatever the limit is
// now: the script looks them up.
func (b *Backend) release(t backend.Ticket) {
	if t.ID&localBit != 0 {
		id := t.ID &^ localBit
		b.mu.Lock()
		h := b.localHeld[id]
		delete(b.localHeld, id)
		b.localSlots -= h.slots
		fb := b.fb
		b.idleCheckLocked()
		closed := b.closed
		b.mu.Unlock()
		fb.Release(backend.Ticket{Cost: t.Cost})
		if h.inRedis {
			b.leave(id, h.slots)
		}
		if closed {
			b.wake() // the maintainer may stop once nothing is held
		}
		return
	}
	b.mu.Lock()
	slots, ok := b.held[t.ID]
	if !ok {
		slots = max(t.Cost, 1)
	} else {
		delete(b.held, t.ID)
		b.slots -= slots
	}
	free := 0
	for b.fbReserved > b.slots {
		// Reserved in the fallback for slots from Redis: free there now.
		b.fbReserved--
		free++
	}
	fb := b.fb
	b.mu.Unlock()
	for range free {
		fb.Release(backend.Ticket{})
	}
	b.leave(t.ID, slots)
	b.mu.Lock()
	b.idleCheckLocked()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		b.wake() // the maintainer may stop once nothing is held
	}
}

// leave releases or cancels id, which holds or asked for slots, in Redis. When no leave call is in flight,
// it makes one now, carrying every pending id with its own; otherwise id
// joins the pending ids and leave returns at once: the call in flight has
// them sent as soon as it returns. Under concurrent releases, one call
// thus gives back many slots. Ids whose call fails stay pending and are
// retried in the background.
func (b *Backend) leave(id uint64, slots int) {
	b.mu.Lock()
	b.pending[id] = slots
	if b.flushing || b.down.Load() {
		b.mu.Unlock()
		return
	}
	b.flushing = true
	b.mu.Unlock()
	b.flushPending()
}

// flushPending sends up to 1000 pending releases and cancels in one call.
// The caller has set b.flushing, which it clears. If ids remain pending
// (they came during the call, or the call failed), it wakes the maintainer
// to send them.
func (b *Backend) flushPending() {
	b.mu.Lock()
	ids := make([]uint64, 0, len(b.pending))
	args := make([]any, 0, len(b.pending))
	for id, n := range b.pending {
		ids = append(ids, id)
		args = append(args, b.leaseArg(id, n))
		if len(ids) == 1000 {
			break
		}
	}
	b.mu.Unlock()
	var err error
	var res any
	if len(ids) > 0 {
		res, err = b.call(leaveScript, args...)
	}
	b.mu.Lock()
	b.flushing = false
	if err == nil {
		for _, id := range ids {
			delete(b.pending, id)
		}
		if n, ok := res.(int64); ok {
			b.heard.fleet, b.heard.mine = int(n), b.slots+b.localSlots
		}
	}
	b.idleCheckLocked()
	more := len(b.pending) > 0
	b.mu.Unlock()
	if more {
		b.wake()
	}
}

// idleCheckLocked tells a drainer when nothing is held or pending. Requires
// b.mu.
func (b *Backend) idleCheckLocked() {
	if b.idle != nil && len(b.held) == 0 && len(b.localHeld) == 0 && len(b.pending) == 0 {
		close(b.idle)
		b.idle = nil
	}
}
