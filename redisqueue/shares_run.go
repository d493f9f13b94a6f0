package redisqueue

import (
	"math/rand/v2"
	"time"
)

// Shares mode: the coordinator and its pace.

// run is the coordinator. It renews the lease every renewEvery (with
// jitter), and syncs sooner when there is a reason: a notice from Redis,
// slots to give back, a waiter that slots free in the fleet may serve, a
// demand that grew or fell by a quarter, a turn to ask for again. While
// Redis is down it probes with backoff and jitter. After Close it goes on
// until the last running request has released its slot, then tells Redis
// it leaves.
func (s *shares) run() {
	b := s.b
	defer close(b.mainDn)
	gap := s.gap()
	p := pacer{opts: b.opts, last: time.Now()}
	p.renew = jitter(renewEvery(b.opts, 0))
	timer := time.NewTimer(time.Until(s.nextSync(&p, gap)))
	defer timer.Stop()
	stop := b.stop
	for {
		select {
		case <-timer.C:
		case <-b.kick:
		case <-stop:
			stop = nil
			s.mu.Lock()
			s.local = 0
			_ = s.share.SetShare(0)
			s.mu.Unlock()
		}
		if stop == nil && s.fast.Counts().Held == 0 {
			if s.bye() {
				return
			}
			// Redis did not answer: the share would stay counted until its
			// lease ran out. Try again soon.
			resetTimer(timer, byeRetry)
			continue
		}
		now := time.Now()
		s.endTurn(now)
		s.confirmTurn()
		s.keepTurnIfSilent(now)
		lost := s.isLost()
		if due, fell := s.due(now, &p, gap); due {
			s.syncNow(now, &p, fell)
		}
		if !lost {
			s.haltIfDown(&p)
		}
		resetTimer(timer, max(time.Until(s.nextSync(&p, gap)), 100*time.Microsecond))
	}
}

// syncNow sends the sync that due asked for at now, and records it in p.
func (s *shares) syncNow(now time.Time, p *pacer, fell bool) {
	b := s.b
	s.asked.Store(false)
	probe := b.down.Load()
	s.patience = s.probeWait(now, p.patience())
	_ = s.sync(fell, fell || !now.Before(p.last.Add(p.every(probe))))
	p.synced(now, s.fleetSize(), b.fails.Load(), b.down.Load())
	p.probeFailed = probe && b.down.Load() && p.gaveUp(s.patience)
	s.endTurn(time.Now()) // a turn that waited for this answer goes back now
}

// haltIfDown stops admitting while Redis is marked down, once there is
// nothing to admit with, or once the lease ran out and Redis looks
// unreachable (see leaseRanOut).
func (s *shares) haltIfDown(p *pacer) {
	switch {
	case !s.b.down.Load():
		if now := time.Now(); s.unreachable(now) && s.lapsed(now) {
			s.halt(whyLeaseRanOut)
		}
	case s.localLimit() == 0 && p.probeFailed:
		// Nothing to admit with, and nobody to move a share here: a
		// waiter would only wait for its QueueTimeout. Not before a probe
		// found Redis still down: calls that a burst held past their
		// CallTimeout mark it down too, and the first probe, which comes
		// soon, finds it back.
		s.halt("Redis is unreachable and this replica holds no share of the limit")
	case s.lapsed(time.Now()):
		s.halt(whyLeaseRanOut)
	}
}

// pacer keeps the coordinator's pace between syncs.
type pacer struct {
	opts   settings
	last   time.Time     // when the last sync was sent
	renew  time.Duration // from last to the next renewal, with jitter
	slow   bool          // the last sync took half a CallTimeout or more
	retry  time.Duration // after a failed call, from last to the next try
	missed int           // probes in a row that found Redis still down
	// probeFailed: the last sync was sent while Redis was marked down,
	// and found it still down.
	probeFailed bool
	replicas    int64 // the fleet's size at the last reply
}

// synced records a sync sent at now, in a fleet of the given number of
// replicas, after which fails calls in a row have failed and Redis is
// marked down or not.
func (p *pacer) synced(now time.Time, replicas int64, fails int32, down bool) {
	p.last = now
	p.slow = time.Since(now) >= p.opts.CallTimeout/2
	p.renew = jitter(renewEvery(p.opts, replicas))
	p.replicas = replicas
	p.retry = retryAfter(p.opts, fails)
	if down {
		p.missed++
	} else {
		p.missed = 0
	}
}

// every is the time from one sync to the next, with no reason to sync
// sooner.
func (p *pacer) every(down bool) time.Duration {
	switch {
	case down && p.slow && p.replicas < probesAtOnce:
		// The last probe waited its whole CallTimeout: the server holds
		// calls (paused, frozen). Keep one probe waiting on it, so that
		// the first answer comes as it answers again.
		return 0
	case down:
		// Probes with jitter, so that a fleet does not probe in lockstep,
		// and after the first a millisecond apart per replica in a large
		// fleet (see probeApart): each dials a connection of its own, and
		// a thousand replicas dialling every few milliseconds overflow the
		// server's accept queue, and keep it from answering once it is
		// back.
		return jitter(p.probeApart())
	}
	return p.renew
}

// retryAfter is how long after a call that failed, the fails-th in a row,
// the next is tried: at random up to a CallTimeout, doubled at each
// failure, so that replicas whose calls failed together (a thousand
// started at once, a pause) do not all try again at once.
func retryAfter(o settings, fails int32) time.Duration {
	if fails <= 0 {
		return 0
	}
	d := o.CallTimeout << min(fails-1, 4)
	return time.Duration(rand.Int64N(int64(d) + 1))
}

// probeApart is the time between two probes while Redis is marked down,
// before jitter: SharePeriod (at most downProbe), doubled at each probe
// that found Redis still down up to 32 times, and from the second such
// probe a millisecond per replica in a large fleet. The first comes soon
// whatever the fleet: Redis that kept calls waiting for a moment (a burst)
// answers it, and a replica without a share serves again. A replica that
// never had an answer does not know its fleet: a thousand started at once,
// marked down together, probed every 20 ms each, and the dials kept Redis
// from answering them for seconds.
func (p *pacer) probeApart() time.Duration {
	d := min(p.opts.SharePeriod, downProbe) << min(p.missed, 5)
	if p.missed < 2 {
		return d
	}
	return max(d, time.Duration(p.replicas)*time.Millisecond)
}

// patience is how long a probe waits for its answer. In a fleet of
// probesAtOnce replicas or more, or one not known yet: a CallTimeout at
// first, so that a replica without a share finds an outage soon, then
// twice as long after each probe that found Redis still down, and from
// the fourth on the longest wait (see longestWait). A Redis that a burst
// keeps busy answers late, not never: with a thousand replicas started at
// once, answers came after their CallTimeout, every probe was given up and
// sent again, and the fleet stayed marked down for tens of seconds.
func (p *pacer) patience() time.Duration {
	if p.small() {
		// A small fleet cannot keep Redis that busy; it keeps a probe
		// waiting on a server that holds calls instead (see every), and
		// a probe that a partition swallowed would hold the coordinator
		// past the moment Redis answers again.
		return p.opts.CallTimeout
	}
	longest := p.longestWait()
	if p.missed >= 3 {
		return longest
	}
	return min(p.opts.CallTimeout<<p.missed, longest)
}

// gaveUp reports whether a probe that waited wait for its answer, and
// got none, shows Redis down, not busy: in a small fleet any probe; in a
// large one, or one not known yet, only a probe of the longest wait. A
// thousand replicas started at once, then their requests, kept Redis busy
// for seconds, and replicas whose first probe missed answered 503s.
func (p *pacer) gaveUp(wait time.Duration) bool {
	return p.small() || wait >= p.longestWait()
}

// small reports whether the fleet is known and under probesAtOnce.
func (p *pacer) small() bool { return p.replicas > 0 && p.replicas < probesAtOnce }

// longestWait is the longest a probe waits for its answer: a second, or
// a CallTimeout if longer.
func (p *pacer) longestWait() time.Duration {
	return max(p.opts.CallTimeout, time.Second)
}

// probeWait is patience, cut to end when the share's lease runs out: the
// coordinator stops admitting then (see run), and must not be held in a
// call past it.
func (s *shares) probeWait(now time.Time, patience time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.local > 0 && s.leaseEnd.After(now) {
		return min(patience, s.leaseEnd.Sub(now))
	}
	return patience
}

// probeDue reports whether a probe may go now while Redis is marked down:
// every sync is then a probe, which dials a connection of its own, so
// arrivals and notices wait for the probe pace too. A fleet of a thousand
// replicas under load probed on every arrival, thousands of dials a
// second, and Redis took seconds to answer them all once it was back.
func (p *pacer) probeDue(now time.Time) bool {
	if p.slow && p.replicas < probesAtOnce {
		return true // see every
	}
	return !now.Before(p.last.Add(p.probeApart() * 4 / 5))
}

// due reports whether the coordinator syncs now, and whether because the
// demand here fell.
func (s *shares) due(now time.Time, p *pacer, gap time.Duration) (due, fell bool) {
	b := s.b
	s.mu.Lock()
	freeLast, frozenTill, againAt := s.freeLast, s.frozenTill, s.againAt
	s.mu.Unlock()
	down := b.down.Load()
	if down && !p.probeDue(now) {
		return false, false
	}
	soon := !now.Before(p.last.Add(gap))
	due = !now.Before(p.last.Add(p.every(down)))
	due = due || s.askedOrOwed(now, p, down)
	// The demand fell while another replica waits, and stayed down.
	if soon && s.fellAndStayed(now) {
		due, fell = true, true
	}
	if soon && s.asked.Load() && s.waiterWorthSync(down, freeLast) {
		due = true
	}
	// Nothing ran or waited here for an idle window: the demand is gone.
	if s.idleFor(now) {
		due, fell = true, true
	}
	due = due || s.timesDue(now, againAt, frozenTill, down)
	return due, fell
}

// askedOrOwed reports whether Redis asked for a sync, a failed call wants
// a probe, or slots owed can be given back: it takes the flag it finds.
func (s *shares) askedOrOwed(now time.Time, p *pacer, down bool) bool {
	b := s.b
	// Redis asked (a notice), or a failed call wants a probe.
	if b.resync.Swap(false) || (!down && b.fails.Load() > 0 && !now.Before(p.last.Add(p.retry))) {
		return true
	}
	// Slots owed can be given back now.
	return s.giveBack.Swap(false)
}

// fellAndStayed reports whether the demand here fell while another replica
// waits, and stayed down; it clears the mark when it finds one.
func (s *shares) fellAndStayed(now time.Time) bool {
	return s.dropped.Load() && !now.Before(s.droppedUntil()) && s.dropped.Swap(false) && s.fell(s.fast.Counts())
}

// waiterWorthSync reports whether a waiter that came is worth a sync; if
// not, it clears asked.
func (s *shares) waiterWorthSync(down bool, freeLast int) bool {
	// A waiter came: it helps to tell Redis if slots are free, or if the
	// demand here grew by a quarter (less is the wavering of a saturated
	// demand); and while Redis is down, a probe may find it back.
	c := s.fast.Counts()
	needLast := int(s.needLast.Load())
	if need := c.Held + c.Queued; down || freeLast > 0 || need > needLast+max(1, needLast/4) {
		return true
	}
	// Not worth a sync: the next waiter asks again (else the coordinator
	// would look again every gap while it waits).
	s.asked.Store(false)
	return false
}

// timesDue reports whether a time set by Redis's last reply came, or the
// lease ran out with Redis up.
func (s *shares) timesDue(now, againAt, frozenTill time.Time, down bool) bool {
	// A turn to ask for again, and a freeze that ended.
	due := !againAt.IsZero() && !now.Before(againAt)
	due = due || !frozenTill.IsZero() && !now.Before(frozenTill)
	// The lease ran out (this process was frozen, or its syncs failed):
	// nothing is admitted here until a sync succeeds.
	return due || s.lapsed(now) && !down
}

// nextSync is when the coordinator looks again with no reason sooner.
func (s *shares) nextSync(p *pacer, gap time.Duration) time.Time {
	down := s.b.down.Load()
	next := p.last.Add(p.every(down))
	if s.asked.Load() {
		next = minTime(next, p.last.Add(gap))
	}
	if down && !p.probeDue(time.Now()) {
		return maxTime(next, p.last.Add(p.probeApart()*4/5))
	}
	if !down && s.b.fails.Load() > 0 {
		next = minTime(next, p.last.Add(p.retry))
	}
	if s.dropped.Load() {
		next = minTime(next, maxTime(p.last.Add(gap), s.droppedUntil()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	idleEnd := s.idleAt
	if !idleEnd.IsZero() {
		idleEnd = idleEnd.Add(s.idleWindow())
	}
	for _, t := range []time.Time{s.frozenTill, s.againAt, s.turnEnd, idleEnd} {
		// A time already passed at the last sync was acted on then (or that
		// sync failed, and the pace above tries again).
		if !t.IsZero() && t.After(p.last) {
			next = minTime(next, t)
		}
	}
	return next
}

// renewEvery is how often a replica whose share needs no change renews its
// lease, in a fleet of the given number of replicas: every SharePeriod in a
// small fleet, and as the fleet grows, so that its renewals stay near 250
// calls a second on the Redis they share; never less than four times per
// lease, so that a lost call or two never lets it run out.
// renewMax is the longest it waits, with jitter.
func renewEvery(o settings, replicas int64) time.Duration {
	return min(max(o.SharePeriod, time.Duration(replicas)*renewPerReplica), o.LeaseTTL/4)
}

func renewMax(o settings, replicas int64) time.Duration { return renewEvery(o, replicas) * 5 / 4 }

// probesAtOnce is the fleet size from which a replica does not keep a
// probe waiting on a server that holds calls (see pacer.every).
const probesAtOnce = 64

// renewPerReplica is what each replica adds to the renewal period: a
// thousand replicas renew about every four seconds each, 250 calls a
// second in all.
const renewPerReplica = 4 * time.Millisecond

// jitter is d moved at random by up to a fifth either way, so that
// replicas started together do not sync together.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/5 + time.Duration(rand.Int64N(int64(d/5)*2+1))
}

// turnKeep is how long a replica keeps a turn, under a limit of n: 2 ms
// per slot, so that the fleet's turns stay near 500 a second on Redis
// whatever its limit. Under a small limit that is less than a handler's
// time: a turn then serves the waiters it finds, once.
func turnKeep(n int64) time.Duration {
	return time.Duration(max(n, 1)) * 2 * time.Millisecond
}
