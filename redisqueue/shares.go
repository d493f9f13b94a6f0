package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/redis/go-redis/v9"
)

// Shares mode: each replica runs the in-memory Backend of ginqueue, whose
// limit is the share this replica leases from Redis; a coordinator (the
// goroutine shares.run) reconciles it with Redis every SharePeriod, at once
// when requests start to wait here, when Redis sends a notice, and when
// slots this replica owes can be given back. script_shares.go says what
// Redis keeps and why the fleet never holds more than its limit.

// shares is the Shares-mode state of a Backend.
type shares struct {
	b     *Backend
	mem   ginqueue.Backend
	fast  ginqueue.FastBackend
	share ginqueue.ShareSetter

	// demand since the previous sync, written on the request path: the
	// peak of running + waiting (slots and requests), and whether a waiter
	// came.
	peak   atomic.Int64
	waited atomic.Bool
	// topPrio is the highest priority of a waiter since the previous sync,
	// valid while waited is set.
	topPrio atomic.Int64
	// owing is set while this replica runs more than its share (it was
	// lowered): the Release that brings it down to the share sets giveBack
	// and wakes the coordinator, which reports the slots freed.
	owing    atomic.Bool
	giveBack atomic.Bool
	// needLast is the demand reported at the last sync, and shortLast
	// whether a replica was short of its target then: a Release that finds
	// the demand here fallen by a quarter sets dropped, so that the shares
	// move now rather than at the next period.
	needLast  atomic.Int64
	shortLast atomic.Bool
	dropped   atomic.Bool
	// asked is set by an arrival that found no free slot, for the
	// coordinator: sync soon, if it may help.
	asked atomic.Bool
	// syncs numbers the syncs, so that Redis can tell one that reached it
	// after a later one (see script_shares.go).
	syncs atomic.Int64
	// waiting counts, by cost, the requests in Acquire (waiting, or about
	// to be granted), when requests have costs: the slots they wait for
	// are demand, and the largest the least share that lets them run.
	waitMu  sync.Mutex
	waiting map[int]int // guarded by waitMu

	mu sync.Mutex
	// Guarded by mu. local is the limit of mem: never above the held value
	// of Redis's last reply, so never above what Redis counts as ours.
	local    int
	epoch    string    // the epoch of Redis's last reply
	leaseEnd time.Time // the share is ours until then (monotonic clock)
	// lost is set when this replica stops admitting until a sync succeeds
	// (see halt), why says why; lostCtx ends then, to answer the waiters.
	lost       bool
	why        string
	lostCtx    context.Context
	lostCancel context.CancelFunc
	freeLast   int       // slots free in the fleet at the last reply
	lastPrio   string    // the last priority reported with waiters; see sync
	frozenTill time.Time // Redis grows no share before then (after a data loss)
	// leaseTimer fires at leaseEnd: under FailClosed the share is given up
	// then even if the coordinator is held in a call (see leaseRanOut).
	leaseTimer *time.Timer
	replicas   string // the replicas of the last reply: "id,id,..."
	version    int64  // the epoch's sync count in the last reply; see script_shares.go
}

// newShares builds the Shares-mode state; Start starts it.
func newShares(b *Backend) *shares {
	mem := ginqueue.NewMemoryBackend()
	s := &shares{b: b, mem: mem, fast: mem.(ginqueue.FastBackend), share: mem.(ginqueue.ShareSetter)}
	s.lostCtx, s.lostCancel = context.WithCancel(context.Background())
	return s
}

// start starts the in-memory Backend with l and a share of 0, makes the
// first sync and starts the coordinator and the notice reader.
func (s *shares) start(l ginqueue.Limits) error {
	b := s.b
	if err := s.mem.Start(l); err != nil {
		return err
	}
	if err := s.share.SetShare(0); err != nil {
		return err
	}
	if b.opts.OnRedisDown == FailClosed {
		s.leaseTimer = time.AfterFunc(time.Hour, s.leaseRanOut)
		s.leaseTimer.Stop()
	}
	b.mu.Lock()
	if b.started || b.closed {
		b.mu.Unlock()
		_ = s.mem.Close()
		return errors.New("redisqueue: Start called twice, or after Close; a Backend serves one Queue")
	}
	b.started = true
	b.limits = l
	b.base = []any{l.MaxConcurrent, b.opts.LeaseTTL.Milliseconds(), b.lists, b.replica}
	b.limit.Store(int64(l.MaxConcurrent))
	b.mu.Unlock()
	if err := s.sync(false); errors.Is(err, ErrConflict) {
		_ = s.mem.Close()
		b.refuseStart()
		return err
	}
	go b.read()
	go s.run()
	return nil
}

// acquire implements Backend.Acquire: the in-memory Backend's, within the
// share.
func (s *shares) acquire(ctx context.Context, a ginqueue.Arrival) (ginqueue.Ticket, error) {
	// A cost is weighed against the fleet's limit, not this replica's share:
	// one above the share waits until the share covers it.
	a.Cost = min(max(a.Cost, 1), int(max(s.b.limit.Load(), 1)))
	c := s.fast.Counts()
	s.notePeak(c.Held + s.queuedSlots(c) + a.Cost)
	if c.Held+a.Cost > c.Limit || c.Queued > 0 {
		s.noteWaiter(a.Priority)
	}
	if s.b.limits.Weighted {
		s.enter(a.Cost)
		defer s.leave(a.Cost)
	}
	s.mu.Lock()
	lost, lostCtx, why := s.lost, s.lostCtx, s.why
	s.mu.Unlock()
	if lost {
		// Probe on demand: Redis may answer again.
		s.asked.Store(true)
		s.b.wake()
		return ginqueue.Ticket{}, &unavailableError{cause: errors.New(why)}
	}
	// A waiter is answered unavailable if this replica stops admitting
	// while it waits (see halt).
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(lostCtx, cancel)
	defer stop()
	t, err := s.mem.Acquire(wctx, a)
	if err != nil && ctx.Err() == nil && lostCtx.Err() != nil && !errors.Is(err, ginqueue.ErrClosed) {
		s.mu.Lock()
		why := s.why
		s.mu.Unlock()
		return t, &unavailableError{cause: errors.New(why)}
	}
	return t, err
}

// enter and leave count a request of the given cost into and out of
// Acquire (see waiting).
func (s *shares) enter(cost int) {
	s.waitMu.Lock()
	if s.waiting == nil {
		s.waiting = map[int]int{}
	}
	s.waiting[cost]++
	s.waitMu.Unlock()
}

func (s *shares) leave(cost int) {
	s.waitMu.Lock()
	if s.waiting[cost]--; s.waiting[cost] == 0 {
		delete(s.waiting, cost)
	}
	s.waitMu.Unlock()
}

// waitingSlots returns the slots the requests in Acquire ask for, and the
// largest of their costs (0 when none waits, or costs are off).
func (s *shares) waitingSlots() (sum, most int) {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	for cost, n := range s.waiting {
		sum += cost * n
		most = max(most, cost)
	}
	return sum, most
}

// queuedSlots is the demand of the requests waiting here, in slots: with
// costs, what they ask for, else one each.
func (s *shares) queuedSlots(c ginqueue.Counts) int {
	if !s.b.limits.Weighted {
		return c.Queued
	}
	sum, _ := s.waitingSlots()
	return max(sum, c.Queued)
}

// notePeak raises the peak demand since the previous sync to n.
func (s *shares) notePeak(n int) {
	for {
		p := s.peak.Load()
		if int64(n) <= p || s.peak.CompareAndSwap(p, int64(n)) {
			return
		}
	}
}

// noteWaiter records a waiter of priority p since the previous sync, and
// asks the coordinator to sync if that may get it slots sooner.
func (s *shares) noteWaiter(p int) {
	for {
		if !s.waited.Load() {
			s.topPrio.Store(int64(p))
			if !s.waited.Swap(true) {
				break
			}
		}
		q := s.topPrio.Load()
		if int64(p) <= q || s.topPrio.CompareAndSwap(q, int64(p)) {
			break
		}
	}
	if !s.asked.Swap(true) {
		s.b.wake()
	}
}

// release implements Backend.Release.
func (s *shares) release(t ginqueue.Ticket) {
	s.mem.Release(t)
	if !s.owing.Load() && !s.shortLast.Load() {
		return
	}
	c := s.fast.Counts()
	if s.owing.Load() && c.Held <= c.Limit && s.owing.Swap(false) {
		s.giveBack.Store(true)
		s.b.wake()
	}
	if n := s.needLast.Load(); s.shortLast.Load() && int64(c.Held+c.Queued) < n-max(1, n/4) && !s.dropped.Swap(true) {
		s.b.wake()
	}
}

// sharesFast is the Queue's FastBackend in Shares mode: the in-memory
// Backend's TryAcquire and Counts, with this mode's Acquire and Release, so
// that the arrivals that wait and the releases that free owed slots are
// seen (demand, priority, give-backs).
type sharesFast struct{ s *shares }

func (f sharesFast) Start(l ginqueue.Limits) error {
	return errors.New("redisqueue: the fast path is not started")
}
func (f sharesFast) Acquire(ctx context.Context, a ginqueue.Arrival) (ginqueue.Ticket, error) {
	return f.s.acquire(ctx, a)
}
func (f sharesFast) Release(t ginqueue.Ticket)       { f.s.release(t) }
func (f sharesFast) Stats() ginqueue.BackendStats    { return f.s.b.Stats() }
func (f sharesFast) Drain(ctx context.Context) error { return f.s.b.Drain(ctx) }
func (f sharesFast) Close() error                    { return f.s.b.Close() }
func (f sharesFast) TryAcquire() uint64              { return f.s.fast.TryAcquire() }
func (f sharesFast) Counts() ginqueue.Counts         { return f.s.fast.Counts() }

// FastPath implements ginqueue.FastPather: in Shares mode the in-memory
// Backend's fast path, so that a request that finds a slot of the share
// free runs without a lock, a clock or Redis; nil in GlobalQueue mode.
func (b *Backend) FastPath() ginqueue.FastBackend {
	if b.sh == nil {
		return nil
	}
	return sharesFast{b.sh}
}

var _ ginqueue.FastPather = (*Backend)(nil)

// run is the coordinator: it syncs every SharePeriod (every downProbe while
// Redis is down), and sooner when asked. After Close it goes on until the
// last running request has released its slot, then says goodbye.
func (s *shares) run() {
	b := s.b
	defer close(b.mainDn)
	period := b.opts.SharePeriod
	// An arrival that waits may make this replica sync at most this often
	// beyond the period: at saturation every arrival waits, and Redis would
	// otherwise see a call per request.
	gap := max(period/8, time.Millisecond)
	// pace is the time from one sync to the next, with no reason to sync
	// sooner.
	pace := func(down, slow bool) time.Duration {
		switch {
		case down && slow:
			// The last probe waited its whole CallTimeout: the server holds
			// calls (paused, frozen). Keep one probe waiting on it, so that
			// the first answer comes as it answers again.
			return 0
		case down:
			return min(period, downProbe)
		}
		return period
	}
	timer := time.NewTimer(period)
	defer timer.Stop()
	last := time.Now()
	slow := false // the last sync took half a CallTimeout or more
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
		now := time.Now()
		c := s.fast.Counts()
		if stop == nil && c.Held == 0 {
			if s.bye() {
				return
			}
			// Redis did not answer: the share would stay counted until its
			// lease ran out. Try again soon.
			resetTimer(timer, byeRetry)
			continue
		}
		s.mu.Lock()
		lost, freeLast, frozenTill := s.lost, s.freeLast, s.frozenTill
		needLast := int(s.needLast.Load())
		s.mu.Unlock()
		down := b.down.Load()
		every := pace(down, slow)
		due := !now.Before(last.Add(every))
		fell := false
		// Redis asked (a notice), or a failed call wants a probe.
		due = due || b.resync.Swap(false) || (!down && b.fails.Load() > 0)
		// Slots owed can be given back now.
		due = due || s.giveBack.Swap(false)
		// The demand fell while another replica is short.
		if s.dropped.Load() && !now.Before(last.Add(gap)) && s.dropped.Swap(false) {
			due, fell = true, true
		}
		if s.asked.Load() && !now.Before(last.Add(gap)) {
			// A waiter came: it helps to tell Redis if slots are free, or
			// if the demand here grew by a quarter (less is the wavering of
			// a saturated demand); and while Redis is down, a probe may
			// find it back.
			if need := c.Held + c.Queued; down || freeLast > 0 || need > needLast+max(1, needLast/4) {
				due = true
			}
		}
		if !frozenTill.IsZero() && !now.Before(frozenTill) {
			due = true
		}
		// The lease ran out (this process was frozen, or its syncs failed):
		// nothing is admitted here until a sync succeeds.
		lapsed := s.lapsed(now)
		due = due || lapsed && !down
		if due {
			s.asked.Store(false)
			_ = s.sync(fell)
			last = now
			slow = time.Since(now) >= b.opts.CallTimeout/2
		}
		switch {
		case lost:
		case b.down.Load() && s.localLimit() == 0:
			// Nothing to admit with, and nobody to move a share here: a
			// waiter would only wait for its QueueTimeout.
			s.halt("Redis is unreachable and this replica holds no share of the limit")
		case b.down.Load() && s.lapsed(time.Now()):
			s.halt("the share's lease ran out while Redis was unreachable")
		}
		next := last.Add(pace(b.down.Load(), slow))
		if s.asked.Load() {
			next = minTime(next, last.Add(gap))
		}
		s.mu.Lock()
		if !s.frozenTill.IsZero() {
			next = minTime(next, s.frozenTill)
		}
		s.mu.Unlock()
		resetTimer(timer, max(time.Until(next), 100*time.Microsecond))
	}
}

// leaseRanOut gives the share up under FailClosed as its lease runs out
// with no answer from Redis: Redis counts it away then. It stops admitting
// a tenth of a lease before (see stopAdmitting), so that the requests
// running then end before Redis counts their slots away, unless they run
// longer than that. (FailOpen goes on within the share.) It runs on
// leaseTimer, and does nothing if a sync renewed the lease meanwhile.
func (s *shares) leaseRanOut() {
	s.mu.Lock()
	end := s.stopAdmitting()
	s.mu.Unlock()
	if !end.IsZero() && !time.Now().Before(end) {
		s.halt("the share's lease ran out while Redis was unreachable")
	}
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

// stopAdmitting is when FailClosed stops admitting within the share if no
// sync renews its lease. Requires s.mu.
func (s *shares) stopAdmitting() time.Time {
	if s.leaseEnd.IsZero() {
		return time.Time{}
	}
	return s.leaseEnd.Add(-s.b.opts.LeaseTTL / 10)
}

// halt stops admitting until a sync succeeds: the share goes to 0, and
// every waiter and arrival is answered with an error wrapping
// ErrUnavailable and ginqueue.ErrQueueFull, naming why.
func (s *shares) halt(why string) {
	s.mu.Lock()
	if s.lost {
		s.mu.Unlock()
		return
	}
	s.lost, s.why = true, why
	s.local = 0
	_ = s.share.SetShare(0)
	cancel := s.lostCancel
	s.mu.Unlock()
	cancel()
}

// localLimit is the limit of the in-memory Backend now.
func (s *shares) localLimit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.local
}

// sync reports this replica's slots and demand to Redis and applies the
// share Redis answers with. The demand is its peak since the previous sync
// (running and waiting requests at a saturated replica waver below the
// number of its clients; the peak does not), or, when the sync is made
// because the demand fell, the demand now: the peak would report a demand
// that has gone.
func (s *shares) sync(fell bool) error {
	b := s.b
	// The share cannot move while the call is out: only this goroutine
	// moves it (and Close, to zero). So what is reported, the limit or
	// what runs if more, bounds what runs until the reply is applied.
	s.mu.Lock()
	if s.lapsedLocked(time.Now()) && s.local > 0 {
		// The lease ran out: Redis may have counted the share away and
		// given it to others. The in-memory Backend grants nothing past
		// the lease already; the share goes, and what runs here is
		// reported, so that Redis counts it and grows no share until the
		// fleet is back under its limit.
		s.local = 0
		_ = s.share.SetShare(0)
	}
	local, epoch, seen, seenV := s.local, s.epoch, s.replicas, s.version
	s.mu.Unlock()
	c := s.fast.Counts()
	cur := max(local, c.Held)
	// The slots the waiters ask for, and the least share that lets the
	// largest waiting request run.
	queued, least := c.Queued, 1
	if s.b.limits.Weighted {
		sum, most := s.waitingSlots()
		queued, least = max(sum, c.Queued), max(most, 1)
	}
	need := c.Held + queued
	if peak := int(s.peak.Swap(0)); !fell {
		need = max(need, peak)
	}
	prio := ""
	if s.waited.Swap(false) || c.Queued > 0 {
		p := s.topPrio.Load()
		if c.Queued > 0 {
			if st := s.mem.Stats(); len(st.QueuedByPriority) > 0 {
				p = max(p, int64(st.QueuedByPriority[0].Priority))
			}
		}
		prio = strconv.FormatInt(p, 10)
	}
	s.mu.Lock()
	if prio != "" {
		s.lastPrio = prio
	} else {
		// Nobody waits here now, but what runs here was of the priority its
		// waiters last had: counted there, not below every waiter of the
		// fleet, or a replica whose share just fits would lose it at once
		// to any waiter elsewhere, and get it back as soon as its next
		// arrival waited.
		prio = s.lastPrio
	}
	s.mu.Unlock()
	if b.down.Load() && !b.answersFresh() {
		return errStillDown
	}
	sent := time.Now()
	o := b.opts
	res, err := b.call(sharesScript, "sync", cur, min(need, math.MaxInt32), prio, c.Queued, epoch, seen, seenV,
		(2*o.SharePeriod + 2*o.CallTimeout).Milliseconds(), (o.SharePeriod + 2*o.CallTimeout).Milliseconds(),
		min(least, math.MaxInt32), s.syncs.Add(1))
	if err != nil {
		return err
	}
	r, ok := res.([]any)
	if ok && len(r) == 1 && r[0] == "stale" {
		// Only a sync that reached Redis after a later one is stale, and
		// its caller gave up on it first: nothing to apply.
		return nil
	}
	if ok && len(r) == 2 && r[0] == "conflict" {
		why, _ := r[1].(string)
		err := fmt.Errorf("redisqueue: %s: %w", why, ErrConflict)
		b.mu.Lock()
		b.conflict = err
		b.mu.Unlock()
		// Admitting beside replicas that count otherwise would break the
		// limit: stop until the conflict is gone.
		s.halt(err.Error())
		return err
	}
	if !ok || len(r) != 11 {
		return fmt.Errorf("redisqueue: unexpected reply to the shares sync: %v", res)
	}
	held, _ := r[0].(int64)
	target, _ := r[1].(int64)
	shrink, _ := r[2].(int64)
	limit, _ := r[3].(int64)
	ep, _ := r[4].(string)
	frozenMs, _ := r[5].(int64)
	replicas, _ := r[6].(string)
	free, _ := r[7].(int64)
	short, _ := r[8].(int64)
	version, _ := r[9].(int64)
	over, _ := r[10].(int64)
	b.markUp()
	b.limit.Store(limit)

	s.mu.Lock()
	next := s.local
	if int(held) > next {
		next = int(held)
	}
	if shrink == 1 && int(target) < next {
		next = int(target)
	}
	if over == 1 {
		// The fleet holds more than its limit (this replica came back
		// after its lease ran out, or SetLimit lowered the limit): the
		// slots counted as ours stay with what runs on them, and no share
		// grows until the fleet is back under the limit.
		next = min(next, s.local)
	}
	if s.lost {
		s.lost = false
		s.lostCtx, s.lostCancel = context.WithCancel(context.Background())
	}
	if b.isClosed() {
		next = 0
	}
	lowered := next < s.local
	s.local = next
	_ = s.share.SetShare(next)
	s.epoch = ep
	s.version = version
	s.leaseEnd = sent.Add(b.opts.LeaseTTL - b.opts.LeaseTTL/100)
	// The in-memory Backend itself grants nothing past the lease, checked
	// as it grants, whatever the timers say after a freeze.
	s.share.SetLease(s.leaseEnd, int(limit))
	if s.leaseTimer != nil {
		s.leaseTimer.Reset(time.Until(s.stopAdmitting()))
	}
	s.freeLast = int(free)
	s.needLast.Store(int64(need))
	s.shortLast.Store(short == 1)
	s.replicas = replicas
	s.frozenTill = time.Time{}
	if frozenMs > 0 {
		s.frozenTill = time.Now().Add(time.Duration(frozenMs) * time.Millisecond)
	}
	s.mu.Unlock()
	if lowered || int(held) > next {
		// Redis still counts the slots above the new share as ours: give
		// them back at once if nothing runs on them, else when the
		// requests on them end.
		s.owing.Store(true)
		if s.fast.Counts().Held <= next && s.owing.Swap(false) {
			s.giveBack.Store(true)
			b.wake()
		}
	}
	return nil
}

// byeRetry is how often a closed Backend tries its goodbye again.
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
	// goodbye will never get through.
	_, err := b.call(sharesScript, "bye")
	if err == nil {
		b.markUp()
		return true
	}
	return errors.Is(err, redis.ErrClosed) || gone
}

// stats implements Backend.Stats: the in-memory Backend's, whose Limit is
// this replica's share.
func (s *shares) stats() ginqueue.BackendStats {
	st := s.mem.Stats()
	st.Unavailable = s.b.down.Load()
	st.Outages = s.b.outages.Load()
	return st
}

// close implements Backend.Close.
func (s *shares) close() error {
	b := s.b
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.closedAt = time.Now()
	started := b.started
	r := b.reader
	b.reader = nil
	b.mu.Unlock()
	if s.leaseTimer != nil {
		s.leaseTimer.Stop()
	}
	err := s.mem.Close() // answers the waiters; running requests keep their slots
	if !started {
		return err
	}
	b.stopCancel()
	close(b.stop)
	if r != nil {
		_ = r.Close() // unblocks BLPOP
	}
	<-b.readDn
	if s.fast.Counts().Held == 0 {
		// The goodbye: at once if Redis answers; else the coordinator tries
		// again in the background, every byeRetry, until it does, the
		// client is closed, or the keys have expired (10 lease TTLs).
		select {
		case <-b.mainDn:
		case <-time.After(2 * b.opts.CallTimeout):
		}
	}
	return err
}

// globalStats implements Backend.GlobalStats: Running is the slots the
// replicas hold (a bound of what they run), Queued their waiters as of
// their last syncs.
func (s *shares) globalStats(ctx context.Context) (GlobalStats, error) {
	ctx, cancel := context.WithTimeout(ctx, s.b.opts.CallTimeout)
	defer cancel()
	res, err := s.b.callIn(ctx, sharesScript, "stats")
	if err != nil {
		return GlobalStats{}, err
	}
	r, ok := res.([]any)
	if !ok || len(r) != 4 {
		return GlobalStats{}, fmt.Errorf("redisqueue: unexpected reply to the shares stats: %v", res)
	}
	var v [4]int64
	for i := range v {
		v[i], _ = r[i].(int64)
	}
	return GlobalStats{Running: int(v[0]), Queued: int(v[1]), Replicas: int(v[2]), Limit: int(v[3])}, nil
}

// setLimit implements Backend.SetLimit, once its checks passed.
func (s *shares) setLimit(n int) error {
	res, err := s.b.call(sharesScript, "limit", n)
	if err != nil {
		return fmt.Errorf("redisqueue: SetLimit(%d): %w: %w", n, ErrUnavailable, err)
	}
	l, ok := res.(int64)
	if !ok {
		return fmt.Errorf("redisqueue: SetLimit(%d): unexpected reply %v", n, res)
	}
	s.b.limit.Store(l)
	s.b.resync.Store(true)
	s.b.wake() // this replica's share follows at once too
	return nil
}

// isClosed reports whether Close was called.
func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}
