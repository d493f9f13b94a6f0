package redisqueue

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// maintain is the maintainer goroutine. Every TickInterval it syncs (the
// heartbeat, the lease refresh and the safety net); every downProbe while
// Redis is down (the probe); at once when a release or cancel is pending.
// After Close it goes on until nothing is held here, then tells Redis it
// leaves and returns.
func (b *Backend) maintain() {
	defer close(b.mainDn)
	defer b.givenUp.Wait()
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
		closed, held, queued := b.maintainState()
		if stop == nil && held == 0 && b.bye() {
			return
		}
		b.flushIfUp()
		every := b.syncEvery(tick, probeEvery, closed, queued)
		now := time.Now()
		if b.syncDue(now, last, every) {
			if b.syncAndCheckReader(queued) {
				checked = now
			}
			last = now
			if b.down.Load() {
				every = probeEvery
			}
		}
		next := last.Add(every)
		checked, next = b.watchReader(queued, now, checked, next, checkEvery)
		resetTimer(timer, max(time.Until(next), time.Millisecond))
	}
}

// maintainState returns whether the Backend is closed, how many slots are
// held here, and whether a request waits in the Redis queue.
func (b *Backend) maintainState() (closed bool, held int, queued bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	closed, held = b.closed, len(b.held)+len(b.localHeld)
	for _, w := range b.waiters {
		if w.queued {
			return closed, held, true
		}
	}
	return closed, held, false
}

// flushIfUp sends the pending releases and cancels, unless Redis is marked
// down or a call for them is already in flight.
func (b *Backend) flushIfUp() {
	if b.down.Load() {
		return
	}
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

// syncEvery returns how long the maintainer waits between syncs: a tick,
// probeEvery while Redis is down, and shorter while the reader is lost and
// requests wait.
func (b *Backend) syncEvery(tick, probeEvery time.Duration, closed, queued bool) time.Duration {
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
	return every
}

// syncDue reports whether the maintainer syncs now: a sync is asked for, or
// every has passed since the last one.
func (b *Backend) syncDue(now, last time.Time, every time.Duration) bool {
	// A call failed but Redis is not marked down: probe at once. The
	// reader saw another server: reconcile at once.
	probe := !b.down.Load() && b.fails.Load() > 0 || b.resync.Swap(false)
	return probe || !now.Before(last.Add(every))
}

// syncAndCheckReader syncs with Redis and, when Redis answers, wakes the
// reader if it is not listening and checks it when it may be stuck. It
// reports whether it checked the reader.
func (b *Backend) syncAndCheckReader(queued bool) bool {
	wasDown := b.down.Load()
	if b.maintainSync() != nil {
		return false
	}
	if !b.listening.Load() {
		b.wakeReader() // the server answers: no need to wait
	}
	if wasDown || queued || !b.listening.Load() {
		// After an outage the reader may wait on a master that froze
		// while the client moved to a new one.
		b.checkReader()
		return true
	}
	return false
}

// watchReader checks the reader every checkEvery while requests wait in
// the queue, the reader listens and Redis is up. It returns when the reader
// was last checked, and when the maintainer wakes next: next, or the next
// check if sooner.
func (b *Backend) watchReader(queued bool, now, checked, next time.Time, checkEvery time.Duration) (time.Time, time.Time) {
	if !queued || !b.listening.Load() || b.down.Load() {
		return checked, next
	}
	if !now.Before(checked.Add(checkEvery)) {
		b.checkReader()
		checked = now
	}
	return checked, minTime(next, checked.Add(checkEvery))
}

// downProbe is how often the maintainer probes a Redis marked down (or
// each TickInterval, if shorter), and how long a probe that a request
// starts meanwhile may take (see probeLocked).
const downProbe = 20 * time.Millisecond

// maintainSync is the maintainer's sync. While Redis is marked down a
// probe goes first, and the sync only once Redis answers it. A call sent
// while Redis could not be reached may never be answered (a partition
// swallowed it), and waiting for it would hold the next back for the rest of
// its CallTimeout; but only a probe, which changes nothing, may be left
// unanswered: a sync left so could still run in Redis after the next one,
// and start a recovery that this replica never hears of.
func (b *Backend) maintainSync() error {
	if b.down.Load() {
		if err := b.probeDown(); err != nil {
			return err
		}
	}
	return b.sync(false)
}

// probeDown probes a Redis marked down, with CallTimeout so that a slow
// Redis is found too, and returns nil once it answers, or once a request's
// probe got an answer meanwhile (see probeLocked). go-redis ends a call at
// its deadline, not when it is cancelled: the probe runs on a goroutine of
// its own, which the maintainer waits for when it stops (givenUp), and is
// left to run out its time, its answer dropped, when the request's probe
// answered first.
func (b *Backend) probeDown() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.mu.Lock()
	b.stopProbe = cancel
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.stopProbe = nil
		b.mu.Unlock()
	}()
	done := make(chan error, 1)
	b.givenUp.Go(func() {
		_, err := b.callIn(ctx, probeScript)
		done <- err
	})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return nil
	}
}

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// maxTime is the later of a and b.
func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
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

// awaitLeave waits for the goroutine that tells Redis this replica leaves,
// at most 2 × CallTimeout: if Redis does not answer, it goes on trying in
// the background.
func (b *Backend) awaitLeave() {
	t := time.NewTimer(2 * b.opts.CallTimeout)
	defer t.Stop()
	select {
	case <-b.mainDn:
	case <-t.C:
	}
}
