package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/redis/go-redis/v9"
)

// Shares mode: the sync with Redis and what its reply changes.

// sync reports this replica's slots and demand to Redis and applies the
// share Redis answers with. The demand is its peak since the previous sync
// (running and waiting requests at a saturated replica waver below the
// number of its clients; the peak does not), or, when the sync is made
// because the demand fell, the demand now: the peak would report a demand
// that has gone.
func (s *shares) sync(fell, renewal bool) error {
	b := s.b
	// The share cannot move while the call is out: only this goroutine
	// moves it (and Close, to zero). So what is reported, the limit or
	// what runs if more, bounds what runs until the reply is applied.
	s.mu.Lock()
	s.dropShareLocked(fell)
	local, epoch, seen, seenV := s.local, s.epoch, s.replicas, s.version
	s.mu.Unlock()
	d := s.demand(fell)
	wait := b.opts.CallTimeout
	if b.down.Load() {
		wait = max(s.patience, wait)
		if !b.answersFresh(wait) {
			return errStillDown
		}
	}
	sent := time.Now()
	o := b.opts
	report := max(local, d.held)
	res, err := b.callWithin(wait, sharesScript, "sync", report, min(d.need, math.MaxInt32), d.bands, d.queued,
		epoch, seen, seenV, min(2*renewMax(o, seen)+2*o.CallTimeout, o.LeaseTTL/2).Milliseconds(), s.newKeysFreeze().Milliseconds(),
		min(d.least, math.MaxInt32), s.syncs.Add(1), s.claimWindow().Milliseconds())
	if err != nil {
		// The report may have reached Redis.
		s.mu.Lock()
		s.safe = min(s.safe, report)
		s.mu.Unlock()
		return err
	}
	if done, err := s.unappliedReply(res); done {
		return err
	}
	rep, err := parseShareReply(res)
	if err != nil {
		return err
	}
	b.markUp()
	b.limit.Store(rep.limit)
	s.apply(rep, sent, d.need, renewal)
	return nil
}

// dropShareLocked gives the share up before a sync reports it: when the
// lease ran out, or when the demand fell to nothing here. Requires s.mu.
func (s *shares) dropShareLocked(fell bool) {
	if s.lapsedLocked(time.Now()) && s.local > 0 {
		// The lease ran out: Redis may have counted the share away and
		// given it to others. The in-memory Backend grants nothing past
		// the lease already; the share goes, and what runs here is
		// reported, so that Redis counts it and grows no share until the
		// fleet is back under its limit.
		s.local = 0
		_ = s.share.SetShare(0)
	}
	if fell && s.local > 0 && s.shortLast.Load() && s.idleNow() {
		// Nothing runs or waits here, and other replicas' requests wait:
		// the share goes back with this report, not with a sync after
		// the reply. An arrival meanwhile waits for the reply; one that
		// took a slot first is counted in what runs, which sync reports.
		s.local = 0
		_ = s.share.SetShare(0)
	}
}

// unappliedReply reports whether a sync's reply is one with no share to
// apply: a stale sync (no error), or a conflict, which stops admitting.
func (s *shares) unappliedReply(res any) (done bool, err error) {
	r, ok := res.([]any)
	if ok && len(r) == 1 && r[0] == "stale" {
		// Only a sync that reached Redis after a later one is stale, and
		// its caller gave up on it first: nothing to apply.
		return true, nil
	}
	if ok && len(r) == 2 && r[0] == "conflict" {
		why, _ := r[1].(string)
		err := &conflictError{name: s.b.opts.Name, why: why}
		s.refuse(err)
		return true, err
	}
	return false, nil
}

// idleNow reports whether nothing runs or waits here.
func (s *shares) idleNow() bool {
	c := s.fast.Counts()
	return c.Held == 0 && c.Queued == 0 && s.gatedN.Load() == 0
}

// demandNow is what a sync reports of this replica: the slots it runs,
// its demand in all and by band, its waiters, and the least share that
// lets its largest waiting request run.
type demandNow struct {
	held, need, queued, least int
	bands                     string
}

// demand reads this replica's demand for a sync; see sync for fell.
func (s *shares) demand(fell bool) demandNow {
	c := s.fast.Counts()
	// The slots the waiters ask for, and the least share that lets the
	// largest waiting request run.
	waiters, queued, least := s.waiters(c)
	gated := waiters - c.Queued
	need := c.Held + queued
	peak, came := s.bands.take(func() int { return int(s.peak.Swap(0)) })
	if !fell {
		need = max(need, peak)
	}
	var byPrio []backend.PriorityCount
	if c.Queued > 0 {
		byPrio = s.mem.Stats().QueuedByPriority
	}
	if gated > 0 {
		// by slots: a gated request's cost is known, and in its band
		byPrio = mergeCounts(byPrio, s.gatedBands(true))
	}
	return demandNow{held: c.Held, need: need, queued: waiters, least: least,
		bands: s.bands.report(c.Held, queued, need, byPrio, came)}
}

// shareReply is Redis's answer to a sync; see sharesScript.
type shareReply struct {
	held, target, limit, frozenMs, replicas, free, version, again, floor int64
	shrink, wanted, over, turn                                           bool
	epoch                                                                string
}

// parseShareReply reads the reply to a sync.
func parseShareReply(res any) (shareReply, error) {
	r, ok := res.([]any)
	if !ok || len(r) != 14 {
		return shareReply{}, fmt.Errorf("redisqueue: unexpected reply to the shares sync: %v", res)
	}
	n := func(i int) int64 { v, _ := r[i].(int64); return v }
	ep, _ := r[4].(string)
	return shareReply{held: n(0), target: n(1), shrink: n(2) == 1, limit: n(3), epoch: ep, frozenMs: n(5),
		replicas: n(6), free: n(7), wanted: n(8) == 1, version: n(9), over: n(10) == 1, turn: n(11) == 1,
		again: n(12), floor: n(13)}, nil
}

// apply sets the share a sync's reply gives, sent being when the sync was
// sent and need the demand it reported; renewal says whether the sync was
// made for the lease, or because the demand fell.
func (s *shares) apply(rep shareReply, sent time.Time, need int, renewal bool) {
	b := s.b
	s.mu.Lock()
	next := s.shareFromReplyLocked(rep, need)
	if s.lost {
		// Redis took this replica's declaration: a conflict that stopped
		// it (refuse halts) is gone. b.mu inside s.mu, as isClosed below.
		s.lost = false
		s.lostCtx, s.lostCancel = context.WithCancel(context.Background())
		b.mu.Lock()
		b.conflict = nil
		b.mu.Unlock()
	}
	if b.isClosed() {
		next = 0
	}
	lowered := next < s.local || rep.turn && s.turnEnd.IsZero()
	s.setShareLocked(next, rep, sent)
	s.noteReplyLocked(rep, need, renewal)
	s.mu.Unlock()
	s.oweAbove(next, rep.held, lowered)
}

// shareFromReplyLocked is the share a sync's reply gives, need being the
// demand the sync reported. Requires s.mu.
func (s *shares) shareFromReplyLocked(rep shareReply, need int) int {
	next := max(s.local, int(rep.held))
	shrink := s.turnFromReplyLocked(rep)
	if shrink && int(rep.target) < next {
		next = int(rep.target)
	}
	if need == 0 && rep.wanted && s.fast.Counts().Held == 0 {
		// Nothing runs or waits here while another replica's requests
		// wait: a share kept as room for arrivals goes to them.
		next = 0
	}
	if rep.over {
		// The fleet holds more than its limit (this replica came back
		// after its lease ran out, or SetLimit lowered the limit): the
		// slots counted as ours stay with what runs on them, and no share
		// grows until the fleet is back under the limit. What runs, not
		// the share: a sync sent just before the lease ran out reports
		// the share, and Redis, having counted it away meanwhile, counts
		// it again on top of the slots it gave to others.
		next = min(next, s.local, s.fast.Counts().Held)
	}
	return next
}

// turnFromReplyLocked starts or ends this replica's turn as a sync's reply
// says, and reports whether the share may shrink to the reply's target: not
// while a turn lasts. Requires s.mu.
func (s *shares) turnFromReplyLocked(rep shareReply) (shrink bool) {
	if !rep.turn || rep.over {
		s.turnEnd = time.Time{}
	}
	if rep.turn && !rep.over {
		// A turn: the waiters here are granted within it for turnKeep,
		// then it goes back as they end, to the next replica waiting for
		// one. Only slots this reply grants start one: slots still running
		// after a turn ended go back as they end.
		if s.turnEnd.IsZero() && int(rep.held) > s.local {
			s.turnEnd = time.Now().Add(jitter(turnKeep(rep.limit)))
		}
		if !s.turnEnd.IsZero() {
			return false
		}
	}
	return rep.shrink
}

// setShareLocked makes next the share, under the lease a sync's reply
// gives, sent being when the sync was sent. Requires s.mu.
func (s *shares) setShareLocked(next int, rep shareReply, sent time.Time) {
	b := s.b
	s.safe, s.turnShare = int(rep.held), 0
	s.local = next
	_ = s.share.SetShare(next)
	s.epoch = rep.epoch
	s.version = rep.version
	s.leaseEnd = sent.Add(b.opts.LeaseTTL - b.opts.LeaseTTL/100)
	// The in-memory Backend itself grants nothing past the lease, checked
	// as it grants, whatever the timers say after a freeze.
	s.share.SetLease(s.leaseEnd, int(rep.limit))
	s.leaseTimer.Reset(time.Until(s.stopAdmitting()))
}

// noteReplyLocked keeps the rest of a sync's reply for the coordinator:
// free slots, floor, fleet size, and when to sync again. Requires s.mu.
func (s *shares) noteReplyLocked(rep shareReply, need int, renewal bool) {
	s.freeLast = int(rep.free)
	s.setFloor(rep.floor)
	// The demand a waiter must grow beyond to be worth a sync: the highest
	// reported since the last renewal, as a saturated demand wavers.
	if renewal || int64(need) > s.needLast.Load() {
		s.needLast.Store(int64(need))
	}
	s.shortLast.Store(rep.wanted)
	s.replicas = rep.replicas
	s.frozenTill = time.Time{}
	if rep.frozenMs > 0 {
		s.frozenTill = time.Now().Add(time.Duration(rep.frozenMs) * time.Millisecond)
	}
	s.againAt = time.Time{}
	if rep.again > 0 {
		s.againAt = time.Now().Add(jitter(time.Duration(rep.again) * time.Millisecond))
	} else if int(rep.target) > s.local && need > s.local {
		// Short of its target, out of turns: the holders this sync asked
		// for slots may give them to replicas ahead of this one, and no
		// notice may come before the renewal, seconds away in a large
		// fleet. Ask again after a claim window while still short.
		s.againAt = time.Now().Add(jitter(s.claimWindow()))
	}
}

// oweAbove marks the slots Redis counts as ours above the share next as
// owed, and asks for them to go back at once if nothing runs on them.
func (s *shares) oweAbove(next int, held int64, lowered bool) {
	if lowered || int(held) > next {
		// Redis still counts the slots above the new share as ours: give
		// them back at once if nothing runs on them, else when the
		// requests on them end.
		s.owing.Store(true)
		if s.fast.Counts().Held <= next && s.owing.Swap(false) {
			s.giveBack.Store(true)
			s.b.wake()
		}
	}
}

// newKeysFreeze is how long no share grows after Redis lost a Name's keys,
// when the replica that finds it knew nothing before: long enough for the
// replicas that held slots to sync. Each syncs when its notice connection
// breaks (a restart or a failover breaks it) and at its next renewal.
func (s *shares) newKeysFreeze() time.Duration {
	o := s.b.opts
	return renewMax(o, s.fleetSize()) + downProbe + 2*o.CallTimeout
}

// fleetSize is the number of replicas of the last reply.
func (s *shares) fleetSize() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replicas
}

// claimWindow is how soon a replica notified that slots are free for it must
// sync: one that does not leaves the turns, so that a dead replica costs
// the fleet no slot.
func (s *shares) claimWindow() time.Duration {
	o := s.b.opts
	return max(4*o.SharePeriod, 2*o.CallTimeout, 20*time.Millisecond)
}

// byeRetry is how often a closed Backend tries its leave call (bye) again.
const byeRetry = 100 * time.Millisecond

// resetTimer makes t fire after d, whether or not it fired and was read.
func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}

// errStillDown is a probe's answer while Redis does not answer.
var errStillDown = errors.New("redisqueue: Redis still does not answer")

// bye tells Redis this replica left, so that its share goes back at once.
// It reports whether the coordinator may stop: Redis answered, the client
// was closed (it never will), or the keys of the Name have expired (10
// lease TTLs after Close). Running out of the lease is not enough: after an
// outage of the whole fleet every lease is moved on by its length (see
// script_shares.go), this replica's too.
func (s *shares) bye() bool {
	b := s.b
	b.mu.Lock()
	closedAt := b.closedAt
	b.mu.Unlock()
	gone := time.Since(closedAt) >= 10*b.opts.LeaseTTL
	// Through the Backend's client even while Redis is marked down: one
	// that its owner closed answers redis.ErrClosed at once, and then the
	// leave call will never get through.
	_, err := b.call(sharesScript, "bye")
	if err == nil {
		b.markUp()
		return true
	}
	return errors.Is(err, redis.ErrClosed) || gone
}
