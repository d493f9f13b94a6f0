package redisqueue

import (
	"fmt"
	"time"
)

// sync runs the sync script: heartbeat and declaration, lease refresh, and
// the state of every queued waiter, which it acts on. first is Start's call:
// a conflict is returned rather than remembered.
func (b *Backend) sync(first bool) error {
	// While Redis is marked down, requests may be admitted here after this
	// list is taken: Redis waits for the next sync, made as soon as this
	// one marks Redis up, when no more can be.
	down := b.down.Load()
	b.mu.Lock()
	args := make([]any, 0, 8+len(b.held)+len(b.localHeld)+len(b.waiters))
	// Every id given out so far is above nothing new: an acquire that begins
	// after this list takes a higher id, which the reconcile leaves alone.
	flag, policy := "0", "c"
	if down {
		flag = "1"
	}
	if b.opts.OnRedisDown == FailOpen {
		policy = "o"
	}
	args = append(args, b.replica, b.decl, len(b.held), 0, b.nextID.Load(), flag, policy, b.replicas, b.token)
	var ids []uint64
	var slots []int // of the holders, for a reclaim and a ghost's leave
	for id, n := range b.held {
		args = append(args, b.leaseArg(id, n))
		ids = append(ids, id)
		slots = append(slots, n)
	}
	for id, h := range b.localHeld {
		args = append(args, b.leaseArg(id, h.slots))
		ids = append(ids, id)
		slots = append(slots, h.slots)
	}
	nh := len(ids)
	args[2] = nh
	for id, w := range b.waiters {
		if w.queued {
			args = append(args, b.leaseID(id))
			ids = append(ids, id)
		}
	}
	args[3] = len(ids) - nh
	// Waiters whose acquire is in flight may already hold a place or a slot
	// in Redis: they are ours too, not phantoms.
	for id, w := range b.waiters {
		if !w.queued {
			args = append(args, b.leaseID(id))
		}
	}
	b.mu.Unlock()
	if h := b.syncHook; h != nil {
		h(down)
	}

	sent := time.Since(b.born)
	res, err := b.call(syncScript, args...)
	if err != nil {
		if first {
			// Start: nothing was heard from Redis yet; do not wait for
			// more failures before OnRedisDown applies.
			b.markDown(err)
		}
		return err
	}
	if down {
		// The full list, now that nothing more is admitted on its own.
		defer func() {
			b.resync.Store(true)
			b.wake()
		}()
	}
	out, _ := res.([]any)
	if len(out) < 2 {
		return fmt.Errorf("redisqueue: unexpected sync reply %v", res)
	}
	if out[0].(int64) == 0 {
		err := fmt.Errorf("%w: replica %v of Name %q declared %v, this one %s; use another Name to change limits",
			ErrConflict, out[1], b.opts.Name, out[2], b.decl)
		if !first {
			b.mu.Lock()
			b.conflict = err
			b.mu.Unlock()
			b.markUp()
		}
		return err
	}
	if len(out) < 6 {
		return fmt.Errorf("redisqueue: unexpected sync reply %v", res)
	}
	if l, ok := out[2].(int64); ok {
		b.limit.Store(l)
	}
	b.syncedAt.Store(int64(sent))
	b.markUp()
	type ghost struct {
		id    uint64
		slots int
	}
	var ghosts []ghost
	defer func() {
		// Not through pending: the release's own leave may be in flight
		// with the same id, and would clear it from pending when it returns.
		for _, g := range ghosts {
			if _, err := b.call(leaveScript, b.leaseArg(g.id, g.slots)); err != nil {
				b.leave(g.id, g.slots) // retried in the background
			}
		}
	}()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conflict = nil
	b.replicas = int(out[1].(int64))
	b.rank = int(out[3].(int64))
	if tok, _ := out[5].(string); tok != "" && tok != b.token {
		// A recovery under way that this replica has not confirmed: its
		// own, or another replica's, whose notice may not reach this one
		// (the reader can still wait on a master that froze). The next
		// sync's list is taken after this reply, so it is full: make it
		// now, with the token.
		b.token = tok
		b.resync.Store(true)
		defer b.wake()
	}
	defer func(fleet int64) {
		// after the grants below: this replica's slots as the reply had them
		b.heard.fleet, b.heard.mine = int(fleet), b.slots+b.localSlots
	}(out[4].(int64))
	for i, id := range ids {
		if 6+i >= len(out) {
			break
		}
		st := out[6+i].(int64)
		if i < nh {
			// A holder reclaimed (status 2) that was released since the list
			// was taken: its leave ran first, and the reclaim made a slot
			// nobody holds. Give it back now.
			_, held := b.held[id]
			if h := b.localHeld[id]; h != nil {
				held = true
				h.inRedis = st > 0
			}
			if st == 2 && !held {
				ghosts = append(ghosts, ghost{id, slots[i]})
			}
			continue
		}
		w := b.waiters[id]
		if w == nil || w.state != waiting {
			continue
		}
		switch {
		case st >= 1: // granted st slots
			w.granted = int(st)
			b.grantLocked(w)
		case st == -1:
			b.finishLocked(w, lost)
		case st == -2:
			b.finishLocked(w, evictedOut)
		}
	}
	return nil
}

// lapsed reports whether this replica's liveness lease in Redis may have
// run out since its last sync (it was frozen, or its syncs failed): Redis
// may then have taken it for dead and given its slots to others, so a
// grant notice it reads now is acted on only once a sync confirms it.
func (b *Backend) lapsed() bool {
	synced := b.syncedAt.Load()
	return synced != 0 && time.Since(b.born)-time.Duration(synced) >= b.opts.liveTTL()-b.opts.TickInterval/2
}
