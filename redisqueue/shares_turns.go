package redisqueue

import (
	"context"
	"time"
)

// Shares mode: turns, health of the lease, and the ends of an outage.

// endTurn gives back the turn this replica holds once its time is up, or
// once nothing has run or waited here for an idle window: the slot is
// worth more to the replicas waiting for a turn than to arrivals here. Not
// while Redis is marked down, or the last call failed.
func (s *shares) endTurn(now time.Time) {
	if s.b.down.Load() || s.b.fails.Load() > 0 {
		// Nobody can take the slot while Redis does not answer, and Redis
		// counts it as this replica's until its lease runs out: keep
		// admitting within it. The turn goes back once Redis answers.
		return
	}
	idle := s.fast.Counts()
	s.mu.Lock()
	wentIdle := idle.Held+idle.Queued == 0 && !s.idleAt.IsZero() && !now.Before(s.idleAt.Add(s.idleWindow()))
	if s.turnEnd.IsZero() || now.Before(s.turnEnd) && !wentIdle {
		s.mu.Unlock()
		return
	}
	if !s.answeredLately(now) {
		// Given back while Redis is paused, the slot would sit unused
		// until it answers, and with every turn that ends meanwhile the
		// fleet would run less. Redis must answer first; while it does
		// not, the turn is kept (above).
		s.mu.Unlock()
		s.confirm.Store(true)
		return
	}
	s.turnEnd = time.Time{}
	s.turnShare = s.local
	s.local = 0
	_ = s.share.SetShare(0)
	s.mu.Unlock()
	s.owing.Store(true)
	if s.fast.Counts().Held == 0 && s.owing.Swap(false) {
		s.giveBack.Store(true)
		s.b.wake()
	}
}

// keepTurnIfSilent takes a turn back when the slots it ran on are to be
// reported free but Redis does not answer: the report would not land, and
// the slots, which Redis still counts as this replica's, would sit idle
// until it does. A turn's requests can outlast it, and a pause that began
// between the turn's end and their end stranded it. Only up to what Redis
// surely counts as this replica's, within the lease.
func (s *shares) keepTurnIfSilent(now time.Time) {
	s.mu.Lock()
	ts := s.turnShare
	s.mu.Unlock()
	if ts == 0 || !s.giveBack.Load() || s.answeredLately(now) || s.answers() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := min(s.safe, s.turnShare); n > s.local && !s.lapsedLocked(time.Now()) {
		s.local = n
		_ = s.share.SetShare(n)
		s.turnEnd = now // it goes back once Redis answers (see endTurn)
		s.turnShare = 0
		s.giveBack.Store(false)
	}
}

// confirmTurn asks Redis for an answer, the cheapest call there is, when a
// turn that is up waits for one (see endTurn), and gives the turn back if
// it came; a call that fails keeps it.
func (s *shares) confirmTurn() {
	if s.confirm.Swap(false) && s.answers() {
		s.endTurn(time.Now())
	}
}

// answeredLately reports whether Redis answered this replica within
// freshFor of now.
func (s *shares) answeredLately(now time.Time) bool {
	return now.Sub(time.Unix(0, s.b.lastOK.Load())) <= s.freshFor()
}

// answers asks Redis for an answer with the probe script, the cheapest
// call that reaches the Name's master, and reports whether it came.
func (s *shares) answers() bool {
	_, err := s.b.call(probeScript)
	return err == nil
}

// freshFor is how lately Redis must have answered this replica for a turn
// to go back without a sync first: a quarter of a turn, at most a
// CallTimeout. Of the turns that end as Redis pauses, about that share is
// given back before the pause shows.
func (s *shares) freshFor() time.Duration {
	return max(min(turnKeep(s.b.limit.Load())/4, s.b.opts.CallTimeout), time.Millisecond)
}

// idleWindow is how long nothing must run or wait here before the
// coordinator reports the demand gone: a SharePeriod, so that a client
// between two requests is not taken for gone.
func (s *shares) idleWindow() time.Duration {
	return max(s.b.opts.SharePeriod, 20*time.Millisecond)
}

// idleFor reports whether nothing has run or waited here for an idle
// window since a Release left the replica idle after it reported demand.
func (s *shares) idleFor(now time.Time) bool {
	if !s.wentIdle.Load() {
		return false
	}
	c := s.fast.Counts()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case c.Held+c.Queued > 0 || s.needLast.Load() == 0:
		s.idleAt = time.Time{}
		s.wentIdle.Store(false)
	case s.idleAt.IsZero():
		s.idleAt = now
	case !now.Before(s.idleAt.Add(s.idleWindow())):
		s.idleAt = time.Time{}
		s.wentIdle.Store(false)
		return true
	}
	return false
}

// isLost reports whether this replica stopped admitting (see halt).
func (s *shares) isLost() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// leaseRanOut gives the share up as its lease runs out with no answer
// from Redis: Redis counts it away then. Under FailClosed it stops
// admitting a tenth of a lease before (see stopAdmitting), so that the
// requests running then end before Redis counts their slots away, unless
// they run longer than that. Under FailOpen it stops when the lease ends,
// if Redis looks unreachable (see unreachable); else the answer to the
// call out is on its way, late only because this process is busy, and
// waiters wait for it. It runs on leaseTimer, not between the
// coordinator's calls, which a server that does not answer holds for a
// CallTimeout. It does nothing if a sync renewed the lease meanwhile.
func (s *shares) leaseRanOut() {
	// Checked and halted under one lock: a sync that renews the lease
	// meanwhile applies its reply before or after, never between.
	now := time.Now()
	s.mu.Lock()
	end := s.stopAdmitting()
	ran := !end.IsZero() && !now.Before(end)
	if !ran || s.b.opts.OnRedisDown != FailClosed && !s.unreachable(now) {
		s.mu.Unlock()
		return
	}
	cancel := s.haltLocked(whyLeaseRanOut)
	s.mu.Unlock()
	cancel()
}

// whyLeaseRanOut is why a replica stops admitting when its lease ran out.
const whyLeaseRanOut = "the share's lease ran out while Redis was unreachable"

// unreachable reports whether Redis looks unreachable from here at now:
// marked down, or the last call failed and no call got an answer for 9/10
// of a lease. Redis is marked down only after FailureThreshold calls failed
// in a row, each after a CallTimeout, and a lease can run out first: then
// the last answer came a whole lease ago, less the time it took to read
// it. A process whose cores are busy reads answers late, and a call of
// its can time out while Redis answers: that is not an outage, and its
// last answer was read well within the lease.
func (s *shares) unreachable(now time.Time) bool {
	b := s.b
	if b.down.Load() {
		return true
	}
	return b.fails.Load() > 0 && now.Sub(time.Unix(0, b.lastOK.Load())) >= b.opts.LeaseTTL*9/10
}

// lapsed reports whether the share's lease has run out at now.
func (s *shares) lapsed(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lapsedLocked(now)
}

// lapsedLocked is lapsed. Requires s.mu.
func (s *shares) lapsedLocked(now time.Time) bool {
	return !s.leaseEnd.IsZero() && !now.Before(s.leaseEnd)
}

// stopAdmitting is when the replica stops admitting within the share if
// no sync renews its lease: under FailClosed a tenth of a lease before it
// ends, under FailOpen when it ends. Requires s.mu.
func (s *shares) stopAdmitting() time.Time {
	if s.leaseEnd.IsZero() || s.b.opts.OnRedisDown != FailClosed {
		return s.leaseEnd
	}
	return s.leaseEnd.Add(-s.b.opts.LeaseTTL / 10)
}

// halt stops admitting until a sync succeeds: the share goes to 0, and
// every waiter and arrival is answered with an error wrapping
// ErrUnavailable and backend.ErrQueueFull, naming why.
func (s *shares) halt(why string) {
	s.mu.Lock()
	cancel := s.haltLocked(why)
	s.mu.Unlock()
	cancel()
}

// haltLocked is halt under s.mu; the caller calls what it returns once
// it unlocks, to answer the waiters.
func (s *shares) haltLocked(why string) context.CancelFunc {
	if s.lost {
		return func() {}
	}
	s.lost, s.why = true, why
	s.local = 0
	_ = s.share.SetShare(0)
	return s.lostCancel
}

// localLimit is the limit of the in-memory Backend now.
func (s *shares) localLimit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.local
}
