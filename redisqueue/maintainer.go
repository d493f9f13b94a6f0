package redisqueue

import (
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

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
