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
	l := b.syncListLocked(down)
	b.mu.Unlock()
	if h := b.syncHook; h != nil {
		h(down)
	}

	sent := time.Since(b.born)
	res, err := b.call(syncScript, l.args...)
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
	out, err := b.syncReply(res, first)
	if err != nil {
		return err
	}
	b.noteSyncUp(out, sent)
	var ghosts []ghost
	defer func() {
		b.leaveGhosts(ghosts)
	}()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conflict = nil
	b.replicas = int(out[1].(int64))
	b.rank = int(out[3].(int64))
	if b.adoptTokenLocked(out[5]) {
		defer b.wake()
	}
	defer func(fleet int64) {
		// after the grants below: this replica's slots as the reply had them
		b.heard.fleet, b.heard.mine = int(fleet), b.slots+b.localSlots
	}(out[4].(int64))
	for i, id := range l.ids {
		if 6+i >= len(out) {
			break
		}
		st := out[6+i].(int64)
		if i < l.holders {
			if g, ok := b.reclaimedLocked(id, st, l.slots[i]); ok {
				ghosts = append(ghosts, g)
			}
			continue
		}
		b.settleWaiterLocked(id, st)
	}
	return nil
}

// syncList is what a sync sends, and what it needs to read the reply.
type syncList struct {
	args    []any    // the sync script's arguments
	ids     []uint64 // the holders', then the queued waiters'
	slots   []int    // of the holders, for a reclaim and a ghost's leave
	holders int      // how many of ids are holders
}

// syncListLocked builds the sync script's arguments: this replica's state,
// its holders, its queued waiters, then the waiters whose acquire is in
// flight. down is whether Redis was marked down. Requires b.mu.
func (b *Backend) syncListLocked(down bool) syncList {
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
	var slots []int
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
	return syncList{args: args, ids: ids, slots: slots, holders: nh}
}

// syncReply checks the sync script's reply and returns it. A conflict with
// another replica's limits is its error; unless first, it is also
// remembered and Redis is marked up.
func (b *Backend) syncReply(res any, first bool) ([]any, error) {
	out, _ := res.([]any)
	if len(out) < 2 {
		return nil, fmt.Errorf("redisqueue: unexpected sync reply %v", res)
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
		return nil, err
	}
	if len(out) < 6 {
		return nil, fmt.Errorf("redisqueue: unexpected sync reply %v", res)
	}
	return out, nil
}

// noteSyncUp notes the limit from a sync's reply and the time the sync was
// sent, and marks Redis up.
func (b *Backend) noteSyncUp(out []any, sent time.Duration) {
	if l, ok := out[2].(int64); ok {
		b.limit.Store(l)
	}
	b.syncedAt.Store(int64(sent))
	b.markUp()
}

// ghost is a slot that a sync reclaimed for a holder already released: a
// slot nobody holds, to give back.
type ghost struct {
	id    uint64
	slots int
}

// leaveGhosts gives back the slots of ghosts in Redis, now or, if the call
// fails, in the background.
func (b *Backend) leaveGhosts(ghosts []ghost) {
	// Not through pending: the release's own leave may be in flight
	// with the same id, and would clear it from pending when it returns.
	for _, g := range ghosts {
		if _, err := b.call(leaveScript, b.leaseArg(g.id, g.slots)); err != nil {
			b.leave(g.id, g.slots) // retried in the background
		}
	}
}

// adoptTokenLocked takes the recovery token of a sync's reply, if it is new
// to this replica, and asks for a sync at once. It reports whether it did,
// and the caller is then to wake the maintainer. Requires b.mu.
func (b *Backend) adoptTokenLocked(v any) bool {
	if tok, _ := v.(string); tok != "" && tok != b.token {
		// A recovery under way that this replica has not confirmed: its
		// own, or another replica's, whose notice may not reach this one
		// (the reader can still wait on a master that froze). The next
		// sync's list is taken after this reply, so it is full: make it
		// now, with the token.
		b.token = tok
		b.resync.Store(true)
		return true
	}
	return false
}

// reclaimedLocked notes a holder's status st from a sync's reply. It
// returns the ghost to give back, and true, when Redis reclaimed the slots
// of a holder released since. Requires b.mu.
func (b *Backend) reclaimedLocked(id uint64, st int64, slots int) (ghost, bool) {
	// A holder reclaimed (status 2) that was released since the list
	// was taken: its leave ran first, and the reclaim made a slot
	// nobody holds. Give it back now.
	_, held := b.held[id]
	if h := b.localHeld[id]; h != nil {
		held = true
		h.inRedis = st > 0
	}
	if st == 2 && !held {
		return ghost{id, slots}, true
	}
	return ghost{}, false
}

// settleWaiterLocked acts on a queued waiter's status st from a sync's
// reply: granted st slots, lost, or evicted. Requires b.mu.
func (b *Backend) settleWaiterLocked(id uint64, st int64) {
	w := b.waiters[id]
	if w == nil || w.state != waiting {
		return
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

// lapsed reports whether this replica's liveness lease in Redis may have
// run out since its last sync (it was frozen, or its syncs failed): Redis
// may then have taken it for dead and given its slots to others, so a
// grant notice it reads now is acted on only once a sync confirms it.
func (b *Backend) lapsed() bool {
	synced := b.syncedAt.Load()
	return synced != 0 && time.Since(b.born)-time.Duration(synced) >= b.opts.liveTTL()-b.opts.TickInterval/2
}
