package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// read is the notice reader: one goroutine per Backend, blocked in BLPOP on
// this replica's notice list over a connection of its own, so that it never
// takes one from the pool that requests use. It hands each notice to the
// local waiter. Close closes the connection, which ends the blocked pop.
//
// A popped notice is gone from Redis: if the connection breaks between the
// pop and its reply, the notice is lost, and the safety-net tick finds the
// grant or the eviction instead.
func (b *Backend) read() {
	defer close(b.readDn)
	pause := time.Duration(0)
	for {
		c, err := b.readerClient()
		if err == nil {
			pause = 0
			var res []string
			// Bounded: go-redis would wait the block time plus 10 s on a
			// server that froze (a hung host, a partition), far past a
			// failover.
			ctx, cancel := context.WithTimeout(context.Background(), readerBlock+b.opts.CallTimeout)
			res, err = c.BLPop(ctx, readerBlock, b.list).Result()
			cancel()
			if err == nil || errors.Is(err, redis.Nil) {
				b.listening.Store(true)
			}
			if err == nil {
				if len(res) == 2 && b.notice(res[1]) {
					// Let the waiter just woken run on this P before the
					// next BLPOP's write and read: that saves a hop to
					// another P (tens of µs) on the hand-off path.
					runtime.Gosched()
				}
				continue
			}
			if errors.Is(err, redis.Nil) {
				// The block timed out: a quiet list may mean the master moved
				// (a failover turns the old one into a replica, which keeps
				// the connection open). Follow it.
				if b.onMaster(c) {
					b.checkReader() // and still the server the client uses
					continue
				}
				// No longer a master: dial again, below.
			}
		}
		b.listening.Store(false)
		select {
		case <-b.stop:
			return
		default:
		}
		b.dropReader(c)
		if cc, ok := b.rdb.(*redis.ClusterClient); ok {
			// The master may have moved: the next dial asks the slot map.
			cc.ReloadState(context.Background())
		}
		b.wake() // the maintainer's safety net runs faster while the reader is away
		// Dial again soon: grants made meanwhile wait unread in the list
		// (the safety net finds them, but only at its next tick). Quickly
		// at first, then at the safety net's pace while the server stays
		// away; at once when the maintainer's call gets an answer again.
		pause = min(max(2*pause, readerPause), b.opts.TickInterval)
		select {
		case <-b.stop:
			return
		case <-b.redial:
		case <-time.After(pause):
		}
	}
}

const (
	// readerPause is the reader's first pause before it dials again.
	readerPause = 10 * time.Millisecond
	// readerBlock is how long one BLPOP blocks.
	readerBlock = 2 * time.Second
)

// wakeReader has a reader that waits to dial again dial now.
func (b *Backend) wakeReader() {
	select {
	case b.redial <- struct{}{}:
	default:
	}
}

// readerClient returns the reader's own one-connection client, dialling it
// from the settings of the Backend's client if needed.
func (b *Backend) readerClient() (*redis.Client, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errors.New("closed")
	}
	if b.reader != nil {
		c := b.reader
		b.mu.Unlock()
		return c, nil
	}
	b.mu.Unlock()

	var src *redis.Client
	switch c := b.rdb.(type) {
	case *redis.Client:
		src = c
	case *redis.ClusterClient:
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
		node, err := c.MasterForKey(ctx, b.list)
		cancel()
		if err != nil {
			return nil, err
		}
		src = node
	}
	opt := *src.Options()
	opt.PoolSize = 1
	opt.MinIdleConns = 0
	opt.MaxIdleConns = 1
	opt.MaxActiveConns = 1
	opt.DialerRetries = 1 // one attempt per dial: read paces its own
	// Not shared with src, whose connections write to it as they start
	// (a data race); and off: a reader that only blocks in BLPOP has no
	// use for maintenance notifications.
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	c := redis.NewClient(&opt)

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		_ = c.Close()
		return nil, errors.New("closed")
	}
	b.reader = c
	b.mu.Unlock()
	if b.noteServer(c) { // a new connection may reach a new master
		b.listening.Store(true)
	}
	return c, nil
}

// onMaster reports whether c still talks to a master, and, when its server is
// not the one the reader last saw (a failover happened), asks the maintainer
// to sync at once, so that this replica's phantom slots in the new master are
// reconciled within a tick, not a lease.
func (b *Backend) onMaster(c *redis.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
	defer cancel()
	role, err := c.Do(ctx, "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		if cc, ok := b.rdb.(*redis.ClusterClient); ok {
			cc.ReloadState(ctx) // so that the next dial finds the new master
		}
		return false
	}
	b.noteServer(c)
	return true
}

// checkReader drops the reader if its server is not the one the Backend's
// client now sends its calls to. After a Sentinel failover the old master
// can go on answering as a master for seconds, while the client has moved
// to the new one: the reader, blocked on the old, would miss every grant
// notice. It runs with the safety net, while requests wait here, and when
// the reader's list has been quiet for its block time.
func (b *Backend) checkReader() {
	b.mu.Lock()
	r, seen := b.reader, b.runID
	b.mu.Unlock()
	c, ok := b.rdb.(*redis.Client)
	if !ok {
		// A cluster client: the reader must be on the master its slot map
		// names for the list (it moves there on MOVED or a reload, while a
		// frozen old master would hold the reader for the whole block).
		cc := b.rdb.(*redis.ClusterClient)
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
		defer cancel()
		if r == nil {
			return
		}
		if m, err := cc.MasterForKey(ctx, b.list); err == nil && m.Options().Addr != r.Options().Addr {
			b.dropReader(r)
			b.resync.Store(true)
			b.wake()
		}
		return
	}
	if r == nil || seen == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return
	}
	if id := runID(info); id != "" && id != seen {
		b.dropReader(r) // the reader dials again, and finds the client's server
		b.resync.Store(true)
		b.wake()
	}
}

// runID is the run_id field of an INFO server reply, or "".
func runID(info string) string {
	_, rest, ok := strings.Cut(info, "run_id:")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "\r\n")
	return id
}

// noteServer records the run id of c's server and asks for a sync when it
// changed since the last one seen. It reports whether the server answered.
func (b *Backend) noteServer(c *redis.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return false
	}
	id := runID(info)
	if id == "" {
		return true
	}
	b.mu.Lock()
	changed := b.runID != "" && b.runID != id
	b.runID = id
	b.mu.Unlock()
	if changed {
		b.resync.Store(true)
		b.wake()
	}
	return true
}

// dropReader closes c if it is still the reader's client.
func (b *Backend) dropReader(c *redis.Client) {
	if c == nil {
		return
	}
	b.mu.Lock()
	if b.reader == c {
		b.reader = nil
	}
	b.mu.Unlock()
	_ = c.Close()
}

// notice acts on one notice from Redis and reports whether a waiter was
// woken: a lease id is a grant of one slot, a lease id, "*" and n a grant of
// n slots, "!" and a lease id an eviction, "?" and a token a request to
// sync at once with that token. A lease that
// no longer waits here was abandoned: for a grant, its leave, already sent
// or pending, runs after the grant in Redis and frees the slot; an evicted
// lease holds nothing.
func (b *Backend) notice(n string) bool {
	if tok, ok := strings.CutPrefix(n, "?"); ok {
		// A recovery waits for this replica's sync, with its token.
		b.mu.Lock()
		b.token = tok
		b.mu.Unlock()
		b.resync.Store(true)
		b.wake()
		return false
	}
	lease, evicted := strings.CutPrefix(n, "!")
	slots := 1
	if l, s, ok := strings.Cut(lease, "*"); ok {
		var err error
		if slots, err = strconv.Atoi(s); err != nil || slots < 1 {
			return false
		}
		lease = l
	}
	id, ok := b.parseLease(lease)
	if !ok {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[id]
	if w == nil || w.state != waiting {
		return false
	}
	if evicted {
		b.finishLocked(w, evictedOut)
	} else {
		w.granted = slots
		b.grantLocked(w)
		// Handed on by a release elsewhere, most likely: the fleet holds as
		// many as before, this replica more.
		b.heard.mine += max(slots, 1)
	}
	return true
}

// parseLease is the inverse of leaseID for this replica's leases.
func (b *Backend) parseLease(lease string) (uint64, bool) {
	rest, ok := strings.CutPrefix(lease, b.replica)
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(rest, 36, 64)
	return id, err == nil
}

// maintain is the maintainer goroutine. Every TickInterval it syncs (the
// heartbeat, the lease refresh and the safety net); every downProbe while
// Redis is down (the probe); at once when a release or cancel is pending.
// After Close it goes on until nothing is held here, then says goodbye to
// Redis and returns.
func (b *Backend) maintain() {
	defer close(b.mainDn)
	tick := b.opts.TickInterval
	probeEvery := min(tick, downProbe)
	timer := time.NewTimer(tick)
	defer timer.Stop()
	last := time.Now() // Start synced
	checked := last    // when checkReader last ran
	// While requests wait, the reader is checked more often than the
	// safety net runs: after a Sentinel switch the old master goes on
	// answering as a master, and until the reader moves every grant
	// notice is missed.
	checkEvery := max(tick/5, readerPause)
	stop := b.stop
	for {
		select {
		case <-timer.C:
		case <-b.kick:
		case <-stop:
			stop = nil
		}
		b.mu.Lock()
		closed, held := b.closed, len(b.held)+len(b.localHeld)
		queued := false
		for _, w := range b.waiters {
			if w.queued {
				queued = true
				break
			}
		}
		b.mu.Unlock()
		if stop == nil && held == 0 && b.bye() {
			return
		}
		if !b.down.Load() {
			b.mu.Lock()
			flush := !b.flushing && len(b.pending) > 0
			if flush {
				b.flushing = true
			}
			b.mu.Unlock()
			if flush {
				b.flushPending()
			}
		}
		every := tick
		if b.down.Load() {
			every = probeEvery
		}
		if !b.listening.Load() && !closed && queued {
			// The reader lost its server: a failover may be under way.
			// Grant notices may sit unread until the reader is back, and
			// the safety net is their only way: ten times as often.
			every = min(every, max(tick/10, readerPause))
		}
		now := time.Now()
		// A call failed but Redis is not marked down: probe at once. The
		// reader saw another server: reconcile at once.
		probe := !b.down.Load() && b.fails.Load() > 0 || b.resync.Swap(false)
		if probe || !now.Before(last.Add(every)) {
			if b.sync(false) == nil {
				if !b.listening.Load() {
					b.wakeReader() // the server answers: no need to wait
				} else if queued {
					b.checkReader()
					checked = now
				}
			}
			last = now
			if b.down.Load() {
				every = probeEvery
			}
		}
		next := last.Add(every)
		if queued && b.listening.Load() && !b.down.Load() {
			if !now.Before(checked.Add(checkEvery)) {
				b.checkReader()
				checked = now
			}
			next = minTime(next, checked.Add(checkEvery))
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(time.Until(next), time.Millisecond))
	}
}

// downProbe is how often the maintainer probes a Redis marked down (or
// each TickInterval, if shorter): the first request after Redis answers
// again goes to Redis within about that.
const downProbe = 20 * time.Millisecond

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

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
	if tok, _ := out[5].(string); tok != "" && down {
		// This replica's own recovery: the next sync confirms it.
		b.token = tok
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

// bye gives back every pending id and removes this replica from Redis. It
// reports whether the maintainer may stop: Redis answered, the client was
// closed, nothing was pending, or LeaseTTL has passed since Close (the
// leases have expired by then). Until then the pending ids stay pending, so
// that Drain still waits for them, and the maintainer tries again at its
// tick. With nothing pending one try is enough: the replica's entry expires
// with its lease, and Close need not wait for a Redis that does not answer.
func (b *Backend) bye() bool {
	b.mu.Lock()
	args := []any{b.replica}
	for id, n := range b.pending {
		args = append(args, b.leaseArg(id, n))
	}
	closedAt := b.closedAt
	b.mu.Unlock()
	_, err := b.call(byeScript, args...)
	if err != nil && len(args) > 1 && !errors.Is(err, redis.ErrClosed) && time.Since(closedAt) < b.opts.LeaseTTL {
		return false // a client closed by its owner will never answer: stop
	}
	if err == nil {
		b.markUp() // Redis answered: Stats and OnStateChange say so
	}
	b.mu.Lock()
	clear(b.pending)
	b.idleCheckLocked()
	b.mu.Unlock()
	return true
}
