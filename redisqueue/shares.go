package redisqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
	"github.com/redis/go-redis/v9"
)

// Shares mode: each replica runs the in-memory Backend of ginqueue, whose
// limit is the share this replica leases from Redis; a coordinator (the
// goroutine shares.run) renews the lease a few times per lease, and
// reconciles the share with Redis at once when requests start to wait here
// and slots may be free, when Redis sends a notice, and when slots this
// replica owes can be given back. script_shares.go says what Redis keeps
// and why the fleet never holds more than its limit.

// shares is the Shares-mode state of a Backend.
type shares struct {
	b     *Backend
	mem   backend.Backend
	fast  backend.FastBackend
	share inmem.Sharer

	// peak is the demand since the previous sync, written on the request
	// path: the peak of running + waiting (slots and requests).
	peak atomic.Int64
	// bands splits the demand by priority for Redis.
	bands *bands
	// owing is set while this replica runs more than its share (it was
	// lowered): the Release that brings it down to the share sets giveBack
	// and wakes the coordinator, which reports the slots freed.
	owing    atomic.Bool
	giveBack atomic.Bool
	// confirm is set when a turn is up but Redis has not answered lately:
	// the coordinator asks Redis for an answer first, and gives the turn
	// back only once it comes (see endTurn).
	confirm atomic.Bool
	// needLast is the demand reported at the last sync, and shortLast
	// whether a replica was short of its target then: a Release that finds
	// the demand here fallen by a quarter sets dropped, and droppedAt (time
	// since born), so that the shares move now rather than at the next
	// period if it stays fallen for a gap (closed-loop clients between two
	// requests waver below their number for microseconds).
	needLast  atomic.Int64
	shortLast atomic.Bool
	dropped   atomic.Bool
	droppedAt atomic.Int64
	born      time.Time
	// asked is set by an arrival that found no free slot, for the
	// coordinator: sync soon, if it may help.
	asked atomic.Bool
	// wentIdle is set by the Release that leaves nothing running or
	// waiting here after a demand was reported; idleAt (guarded by mu) is
	// when the coordinator saw it.
	wentIdle atomic.Bool
	// syncs numbers the syncs, so that Redis can tell one that reached it
	// after a later one (see script_shares.go).
	syncs atomic.Int64
	// waiting counts, by cost, the requests in Acquire (waiting, or about
	// to be granted), when requests have costs: the slots they wait for
	// are demand, and the largest the least share that lets them run.
	waitMu  sync.Mutex
	waiting map[int]int // guarded by waitMu

	// floor is the lowest priority band the share serves, from the last
	// reply (noBand: every band): a request below it waits outside the
	// in-memory Backend (gated) until it falls, counted as demand, so that
	// a slot Redis made for a higher band here does not go to a lower one.
	floor  atomic.Int64
	gatedN atomic.Int64
	gateMu sync.Mutex
	gated  map[int]gatedCount // by band; guarded by gateMu
	opened chan struct{}      // closed when the floor falls; guarded by gateMu

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
	frozenTill time.Time // Redis grows no share before then (after a data loss)
	// leaseTimer fires at leaseEnd: under FailClosed the share is given up
	// then even if the coordinator is held in a call (see leaseRanOut).
	leaseTimer *time.Timer
	replicas   int64     // the replicas of the last reply
	version    int64     // the epoch's sync count in the last reply; see script_shares.go
	againAt    time.Time // when to ask again for a turn (zero: on a notice)
	turnEnd    time.Time // when the turn this replica holds goes back
	idleAt     time.Time // when the coordinator saw nothing run or wait here
	// safe is what Redis surely counts as this replica's: the held value
	// of its last reply, lowered by every report sent since that may have
	// reached it. turnShare is the turn that went back here and was not
	// reported yet (0: none).
	safe, turnShare int
}

// newShares builds the Shares-mode state; Start starts it.
func newShares(b *Backend) *shares {
	mem := inmem.New()
	s := &shares{b: b, mem: mem, fast: mem.(backend.FastBackend), share: mem.(inmem.Sharer), bands: newBands(),
		born: time.Now()}
	s.lostCtx, s.lostCancel = context.WithCancel(context.Background())
	s.floor.Store(noBand)
	s.gated, s.opened = map[int]gatedCount{}, make(chan struct{})
	return s
}

// start starts the in-memory Backend with l and a share of 0, makes the
// first sync and starts the coordinator and the notice reader.
func (s *shares) start(l backend.Limits) error {
	b := s.b
	if b.sp != nil && l.Weighted {
		return errSplitCost
	}
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
	if b.sp != nil {
		// A part's limit is what the rebalancer gave it, none until then.
		b.base[0] = 0
		b.limit.Store(0)
		b.sp.total.Store(int64(l.MaxConcurrent))
	}
	b.mu.Unlock()
	err := s.joinSplit()
	if err == nil && (b.sp == nil || b.sp.joined.Load()) {
		// (A split Name whose keys did not answer would only wait a
		// CallTimeout more here: the coordinator syncs soon.)
		err = s.sync(false, true)
	}
	if errors.Is(err, ErrConflict) {
		_ = s.mem.Close()
		b.refuseStart()
		return err
	}
	go b.read()
	go s.run()
	if b.sp != nil {
		go b.sp.run()
	}
	return nil
}

// joinSplit joins a split Name; an error other than a conflict is left to
// the rebalancer, which joins when Redis answers.
func (s *shares) joinSplit() error {
	if s.b.sp == nil {
		return nil
	}
	if err := s.b.sp.join(s.b.stopCtx); errors.Is(err, ErrConflict) {
		return err
	}
	return nil
}

// refuse stops admitting for good: a live replica counts the limit
// otherwise, and admitting beside it would break the limit.
func (s *shares) refuse(err error) {
	b := s.b
	b.mu.Lock()
	b.conflict = err
	b.mu.Unlock()
	s.halt(err.Error())
}

// costCap is the most slots one request may hold: the fleet's limit, or
// the Name's for a split one.
func (s *shares) costCap() int64 {
	if s.b.sp != nil {
		return s.b.sp.total.Load()
	}
	return s.b.limit.Load()
}

// acquire implements Backend.Acquire: the in-memory Backend's, within the
// share.
func (s *shares) acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	// A cost is weighed against the fleet's limit, not this replica's share:
	// one above the share waits until the share covers it.
	a.Cost = min(max(a.Cost, 1), int(max(s.costCap(), 1)))
	c := s.fast.Counts()
	_, waiting, _ := s.waiters(c)
	s.notePeak(c.Held + waiting + a.Cost)
	if c.Held+a.Cost > c.Limit || c.Queued > 0 {
		s.noteWaiter()
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
		return backend.Ticket{}, &unavailableError{cause: errors.New(why)}
	}
	// A waiter is answered unavailable if this replica stops admitting
	// while it waits (see halt).
	wctx, cancel := context.WithCancel(ctx)
	if !s.admits(a.Priority) {
		// The time held below the floor counts toward QueueTimeout.
		deadline := time.Now().Add(s.b.limits.QueueTimeout)
		if err := s.gate(ctx, a, lostCtx, deadline); err != nil {
			cancel()
			return backend.Ticket{}, err
		}
		if s.b.limits.QueueTimeout > 0 {
			cancel()
			wctx, cancel = context.WithDeadline(ctx, deadline)
		}
	}
	defer cancel()
	stop := context.AfterFunc(lostCtx, cancel)
	defer stop()
	t, err := s.mem.Acquire(wctx, a)
	if err == nil {
		s.bands.granted(a.Priority, max(t.Cost, 1))
	}
	if err != nil && ctx.Err() == nil && lostCtx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) {
		return t, backend.ErrQueueTimeout
	}
	if err != nil && ctx.Err() == nil && lostCtx.Err() != nil && !errors.Is(err, backend.ErrClosed) {
		s.mu.Lock()
		why := s.why
		s.mu.Unlock()
		return t, &unavailableError{cause: errors.New(why)}
	}
	return t, err
}

// admits reports whether a request of priority p may wait in the
// in-memory Backend now (see floor).
func (s *shares) admits(p int) bool {
	f := s.floor.Load()
	return f == noBand || int64(clampBand(p)) >= f
}

// gate holds a request of a band below the floor until the floor falls to
// it; it returns ctx's error if ctx ends first, backend.ErrQueueTimeout at
// the deadline (with a QueueTimeout), an unavailable error if this replica
// stops admitting, and backend.ErrQueueFull if the waiting places are
// taken.
func (s *shares) gate(ctx context.Context, a backend.Arrival, lost context.Context, deadline time.Time) error {
	band := clampBand(a.Priority)
	s.gateMu.Lock()
	if c := s.fast.Counts(); c.Queued+int(s.gatedN.Load()) >= s.b.limits.MaxQueue {
		s.gateMu.Unlock()
		return backend.ErrQueueFull
	}
	slots := 1
	if s.b.limits.Weighted {
		slots = a.Cost
	}
	s.gated[band] = s.gated[band].add(1, slots)
	s.gatedN.Add(1)
	s.gateMu.Unlock()
	defer func() {
		s.gateMu.Lock()
		if g := s.gated[band].add(-1, -slots); g.requests > 0 {
			s.gated[band] = g
		} else {
			delete(s.gated, band)
		}
		s.gatedN.Add(-1)
		s.gateMu.Unlock()
	}()
	c := s.fast.Counts()
	_, waiting, _ := s.waiters(c)
	s.notePeak(c.Held + waiting)
	s.noteWaiter()
	var expired <-chan time.Time
	if s.b.limits.QueueTimeout > 0 {
		tm := time.NewTimer(time.Until(deadline))
		defer tm.Stop()
		expired = tm.C
	}
	for {
		s.gateMu.Lock()
		opened := s.opened
		s.gateMu.Unlock()
		if s.admits(a.Priority) {
			return nil
		}
		select {
		case <-opened:
		case <-ctx.Done():
			return ctx.Err()
		case <-expired:
			return backend.ErrQueueTimeout
		case <-lost.Done():
			s.mu.Lock()
			why := s.why
			s.mu.Unlock()
			return &unavailableError{cause: errors.New(why)}
		}
	}
}

// setFloor sets the floor a reply gave, and lets the gated requests it
// admits now go on.
func (s *shares) setFloor(f int64) {
	if old := s.floor.Swap(f); f == old || old != noBand && f != noBand && f > old {
		return
	}
	s.gateMu.Lock()
	close(s.opened)
	s.opened = make(chan struct{})
	s.gateMu.Unlock()
}

// gatedCount is what waits below the floor in one band.
type gatedCount struct{ requests, slots int }

func (g gatedCount) add(requests, slots int) gatedCount {
	return gatedCount{g.requests + requests, g.slots + slots}
}

// gatedBands is what waits below the floor by band: the requests, or the
// slots they ask for.
func (s *shares) gatedBands(slots bool) []backend.PriorityCount {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	out := make([]backend.PriorityCount, 0, len(s.gated))
	for b, g := range s.gated {
		n := g.requests
		if slots {
			n = g.slots
		}
		out = append(out, backend.PriorityCount{Priority: b, Queued: n})
	}
	return out
}

// mergeCounts is a and b in one list, highest priority first, one entry
// per priority.
func mergeCounts(a, b []backend.PriorityCount) []backend.PriorityCount {
	all := append(slices.Clone(a), b...)
	slices.SortFunc(all, func(x, y backend.PriorityCount) int { return cmp.Compare(y.Priority, x.Priority) })
	var out []backend.PriorityCount
	for _, pc := range all {
		if n := len(out); n > 0 && out[n-1].Priority == pc.Priority {
			out[n-1].Queued += pc.Queued
			continue
		}
		out = append(out, pc)
	}
	return out
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

// waiters is what waits here, in the in-memory Backend and below the
// floor: the requests, the slots they ask for (with costs, what they
// entered with, else one each), and the largest cost among them.
func (s *shares) waiters(c backend.Stats) (requests, slots, most int) {
	requests = c.Queued + int(s.gatedN.Load())
	slots, most = requests, 1
	if s.b.limits.Weighted {
		sum, m := s.waitingSlots()
		slots, most = max(sum, requests), max(m, 1)
	}
	return requests, slots, most
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

// noteWaiter asks the coordinator to sync, if that may get the waiter
// slots sooner.
func (s *shares) noteWaiter() {
	if !s.asked.Swap(true) {
		s.b.wake()
	}
}

// release implements Backend.Release.
func (s *shares) release(t backend.Ticket) {
	s.mem.Release(t)
	c := s.fast.Counts()
	if c.Held == 0 && c.Queued == 0 && s.needLast.Load() > 0 && !s.wentIdle.Swap(true) {
		// Nothing runs or waits here any more: if it stays so for an idle
		// window, the coordinator reports it, so that the slots held here
		// can go where requests wait.
		s.b.wake()
	}
	if !s.owing.Load() && !s.shortLast.Load() {
		return
	}
	if s.owing.Load() && c.Held <= c.Limit && s.owing.Swap(false) {
		s.giveBack.Store(true)
		s.b.wake()
	}
	if s.fell(c) && !s.dropped.Load() {
		s.droppedAt.Store(int64(time.Since(s.born)))
		if !s.dropped.Swap(true) {
			s.b.wake()
		}
	}
}

// fell reports whether the demand here, as c counts it, fell by a quarter
// below the demand last reported while another replica was short of its
// target.
func (s *shares) fell(c backend.Stats) bool {
	n := s.needLast.Load()
	return s.shortLast.Load() && int64(c.Held+c.Queued)+s.gatedN.Load() < n-max(1, n/4)
}

// droppedUntil is when a fall of the demand seen by a Release is worth a
// sync, if the demand is still down then: a gap later.
func (s *shares) droppedUntil() time.Time {
	return s.born.Add(time.Duration(s.droppedAt.Load()) + s.gap())
}

// gap is how often an arrival that waits may make this replica sync: at
// saturation every arrival waits, and Redis would otherwise see a call per
// request. A fall of the demand must last as long to be reported.
func (s *shares) gap() time.Duration {
	return max(s.b.opts.SharePeriod/8, time.Millisecond)
}

// sharesFast is the Queue's FastBackend in Shares mode: the in-memory
// Backend's TryAcquire and Counts, with this mode's Acquire and Release, so
// that the arrivals that wait and the releases that free owed slots are
// seen (demand, priority, give-backs).
type sharesFast struct{ s *shares }

func (f sharesFast) Start(l backend.Limits) error {
	return errors.New("redisqueue: the fast path is not started")
}
func (f sharesFast) Acquire(ctx context.Context, a backend.Arrival) (backend.Ticket, error) {
	return f.s.acquire(ctx, a)
}
func (f sharesFast) Release(t backend.Ticket)        { f.s.release(t) }
func (f sharesFast) Stats() backend.Stats            { return f.s.b.Stats() }
func (f sharesFast) Drain(ctx context.Context) error { return f.s.b.Drain(ctx) }
func (f sharesFast) Close() error                    { return f.s.b.Close() }
func (f sharesFast) TryAcquire() uint64 {
	if f.s.floor.Load() != noBand {
		return 0 // a request's band is known only in Acquire
	}
	return f.s.fast.TryAcquire()
}
func (f sharesFast) Counts() backend.Stats { return f.s.fast.Counts() }

// FastPath implements backend.FastPather: in Shares mode the in-memory
// Backend's fast path, so that a request that finds a slot of the share
// free runs without a lock, a clock or Redis; nil in GlobalQueue mode.
func (b *Backend) FastPath() backend.FastBackend {
	if b.sh == nil {
		return nil
	}
	return sharesFast{b.sh}
}

var _ backend.FastPather = (*Backend)(nil)

// run is the coordinator. It renews the lease a few times per lease
// (renewEvery, with jitter), and syncs sooner when there is a reason: a
// notice from Redis, slots to give back, a waiter that slots free in the
// fleet may serve, a demand that grew or fell by a quarter, a turn to ask
// for again. While Redis is down it probes with backoff and jitter. After
// Close it goes on until the last running request has released its slot,
// then says goodbye.
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
			s.asked.Store(false)
			_ = s.sync(fell, fell || !now.Before(p.last.Add(p.every(b.down.Load()))))
			p.synced(now, s.fleetSize(), b.fails.Load(), b.down.Load())
			s.endTurn(time.Now()) // a turn that waited for this answer goes back now
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
		resetTimer(timer, max(time.Until(s.nextSync(&p, gap)), 100*time.Microsecond))
	}
}

// pacer keeps the coordinator's pace between syncs.
type pacer struct {
	opts     Options
	last     time.Time     // when the last sync was sent
	renew    time.Duration // from last to the next renewal, with jitter
	slow     bool          // the last sync took half a CallTimeout or more
	retry    time.Duration // after a failed call, from last to the next try
	missed   int           // probes in a row that found Redis still down
	replicas int64         // the fleet's size at the last reply
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
		// and a millisecond apart per replica in a large fleet: each dials
		// a connection of its own, and a thousand replicas dialling every
		// few milliseconds overflow the server's accept queue, and keep it
		// from answering once it is back.
		return jitter(p.probeApart())
	}
	return p.renew
}

// retryAfter is how long after a call that failed, the fails-th in a row,
// the next is tried: at random up to a CallTimeout, doubled at each
// failure, so that replicas whose calls failed together (a thousand
// started at once, a pause) do not all try again at once.
func retryAfter(o Options, fails int32) time.Duration {
	if fails <= 0 {
		return 0
	}
	d := o.CallTimeout << min(fails-1, 4)
	return time.Duration(rand.Int64N(int64(d) + 1))
}

// probeApart is the time between two probes while Redis is marked down,
// before jitter: SharePeriod (at most downProbe), doubled at each probe
// that found Redis still down up to 32 times, and a millisecond per
// replica in a large fleet. A replica that never had an answer does not
// know its fleet: a thousand started at once, marked down together,
// probed every 20 ms each, and the dials kept Redis from answering them
// for seconds.
func (p *pacer) probeApart() time.Duration {
	return max(min(p.opts.SharePeriod, downProbe)<<min(p.missed, 5), time.Duration(p.replicas)*time.Millisecond)
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
	// Redis asked (a notice), or a failed call wants a probe.
	due = due || b.resync.Swap(false) || (!down && b.fails.Load() > 0 && !now.Before(p.last.Add(p.retry)))
	// Slots owed can be given back now.
	due = due || s.giveBack.Swap(false)
	// The demand fell while another replica waits, and stayed down.
	if soon && s.dropped.Load() && !now.Before(s.droppedUntil()) && s.dropped.Swap(false) && s.fell(s.fast.Counts()) {
		due, fell = true, true
	}
	if soon && s.asked.Load() {
		// A waiter came: it helps to tell Redis if slots are free, or if
		// the demand here grew by a quarter (less is the wavering of a
		// saturated demand); and while Redis is down, a probe may find it
		// back.
		c := s.fast.Counts()
		needLast := int(s.needLast.Load())
		if need := c.Held + c.Queued; down || freeLast > 0 || need > needLast+max(1, needLast/4) {
			due = true
		} else {
			// Not worth a sync: the next waiter asks again (else the
			// coordinator would look again every gap while it waits).
			s.asked.Store(false)
		}
	}
	// Nothing ran or waited here for an idle window: the demand is gone.
	if s.idleFor(now) {
		due, fell = true, true
	}
	// A turn to ask for again, and a freeze that ended.
	due = due || !againAt.IsZero() && !now.Before(againAt)
	due = due || !frozenTill.IsZero() && !now.Before(frozenTill)
	// The lease ran out (this process was frozen, or its syncs failed):
	// nothing is admitted here until a sync succeeds.
	due = due || s.lapsed(now) && !down
	return due, fell
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
func renewEvery(o Options, replicas int64) time.Duration {
	return min(max(o.SharePeriod, time.Duration(replicas)*renewPerReplica), o.LeaseTTL/4)
}

func renewMax(o Options, replicas int64) time.Duration { return renewEvery(o, replicas) * 5 / 4 }

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
		// Given back while Redis is paused, the slot would stand unused
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
// the slots, which Redis still counts as this replica's, would stand idle
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
// ErrUnavailable and backend.ErrQueueFull, naming why.
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
func (s *shares) sync(fell, renewal bool) error {
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
	if fell && s.local > 0 && s.shortLast.Load() && s.idleNow() {
		// Nothing runs or waits here, and other replicas' requests wait:
		// the share goes back with this report, not with a sync after
		// the reply. An arrival meanwhile waits for the reply; one that
		// took a slot first is counted in what runs, below.
		s.local = 0
		_ = s.share.SetShare(0)
	}
	local, epoch, seen, seenV := s.local, s.epoch, s.replicas, s.version
	s.mu.Unlock()
	d := s.demand(fell)
	if b.down.Load() && !b.answersFresh() {
		return errStillDown
	}
	sent := time.Now()
	o := b.opts
	report := max(local, d.held)
	res, err := b.call(sharesScript, "sync", report, min(d.need, math.MaxInt32), d.bands, d.queued,
		epoch, seen, seenV, min(2*renewMax(o, seen)+2*o.CallTimeout, o.LeaseTTL/2).Milliseconds(), s.newKeysFreeze().Milliseconds(),
		min(d.least, math.MaxInt32), s.syncs.Add(1), s.claimWindow().Milliseconds())
	if err != nil {
		// The report may have reached Redis.
		s.mu.Lock()
		s.safe = min(s.safe, report)
		s.mu.Unlock()
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
		s.refuse(err)
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
	if peak := int(s.peak.Swap(0)); !fell {
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
		bands: s.bands.report(c.Held, queued, need, byPrio)}
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
	next := max(s.local, int(rep.held))
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
			rep.shrink = false
		}
	}
	if rep.shrink && int(rep.target) < next {
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
	if s.lost {
		s.lost = false
		s.lostCtx, s.lostCancel = context.WithCancel(context.Background())
	}
	if b.isClosed() {
		next = 0
	}
	lowered := next < s.local || rep.turn && s.turnEnd.IsZero()
	s.safe, s.turnShare = int(rep.held), 0
	s.local = next
	_ = s.share.SetShare(next)
	s.epoch = rep.epoch
	s.version = rep.version
	s.leaseEnd = sent.Add(b.opts.LeaseTTL - b.opts.LeaseTTL/100)
	// The in-memory Backend itself grants nothing past the lease, checked
	// as it grants, whatever the timers say after a freeze.
	s.share.SetLease(s.leaseEnd, int(rep.limit))
	if s.leaseTimer != nil {
		s.leaseTimer.Reset(time.Until(s.stopAdmitting()))
	}
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
	}
	s.mu.Unlock()
	if lowered || int(rep.held) > next {
		// Redis still counts the slots above the new share as ours: give
		// them back at once if nothing runs on them, else when the
		// requests on them end.
		s.owing.Store(true)
		if s.fast.Counts().Held <= next && s.owing.Swap(false) {
			s.giveBack.Store(true)
			b.wake()
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

// claimWindow is how soon a replica told that slots are free for it must
// sync: one that does not leaves the turns, so that a dead replica costs
// the fleet no slot.
func (s *shares) claimWindow() time.Duration {
	o := s.b.opts
	return max(4*o.SharePeriod, 2*o.CallTimeout, 20*time.Millisecond)
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
func (s *shares) stats() backend.Stats {
	st := s.mem.Stats()
	if g := s.gatedBands(false); len(g) > 0 {
		// Requests below the floor wait too, outside the in-memory Backend.
		for _, pc := range g {
			st.Queued += pc.Queued
		}
		st.QueuedByPriority = mergeCounts(st.QueuedByPriority, g)
	}
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
	s.setFloor(noBand)   // and the gated ones, as they go on to it
	if !started {
		return err
	}
	b.stopCancel()
	close(b.stop)
	if r != nil {
		_ = r.Close() // unblocks BLPOP
	}
	<-b.readDn
	if b.sp != nil {
		<-b.sp.done
	}
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
	if s.b.sp != nil {
		return s.b.sp.globalStats(ctx)
	}
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
	if s.b.sp != nil {
		return s.b.sp.setLimit(n)
	}
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
