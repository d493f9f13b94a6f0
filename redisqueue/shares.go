package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	// The root package sets inmem.New, the in-memory Backend that Shares
	// mode admits on: a program that imports only this package needs it.
	_ "github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// Shares mode: each replica runs the in-memory Backend of ginqueue, whose
// limit is the share this replica leases from Redis; a coordinator (the
// goroutine shares.run) renews the lease (every renewEvery), and
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
	// patience is how long a sync waits for its answer while Redis is
	// marked down (zero: a CallTimeout). Only the coordinator uses it.
	patience time.Duration

	demandState
	gateState
	leaseState
}

// demandState is what the request path writes for the coordinator: the
// demand here and the reasons to sync.
type demandState struct {
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
}

// gateState holds the requests below the priority floor outside the
// in-memory Backend.
type gateState struct {
	// floor is the lowest priority band the share serves, from the last
	// reply (noBand: every band): a request below it waits outside the
	// in-memory Backend (gated) until it falls, counted as demand, so that
	// a slot Redis made for a higher band here does not go to a lower one.
	floor  atomic.Int64
	gatedN atomic.Int64
	gateMu sync.Mutex
	gated  map[int]gatedCount // by band; guarded by gateMu
	opened chan struct{}      // closed when the floor falls; guarded by gateMu
}

// leaseState is the share this replica holds and what Redis last said of
// it.
type leaseState struct {
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
	// leaseTimer fires at stopAdmitting: the share is given up then even
	// if the coordinator is held in a call (see leaseRanOut).
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
	s := &shares{b: b, mem: mem, fast: mem.(backend.FastBackend), share: mem.(inmem.Sharer)}
	s.bands, s.born = newBands(), time.Now()
	s.lostCtx, s.lostCancel = context.WithCancel(context.Background())
	s.floor.Store(noBand)
	s.gated, s.opened = map[int]gatedCount{}, make(chan struct{})
	// Made here, not in start: Close, which may run beside start, stops it.
	s.leaseTimer = time.AfterFunc(time.Hour, s.leaseRanOut)
	s.leaseTimer.Stop()
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
	s.noteArrival(a)
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
	return t, s.waitError(ctx, wctx, lostCtx, err)
}

// noteArrival records the demand of a request as it comes, with its cost
// clamped, its band, and whether it will wait.
func (s *shares) noteArrival(a backend.Arrival) {
	cost := a.Cost
	c := s.fast.Counts()
	_, waiting, _ := s.waiters(c)
	s.bands.arrived(a.Priority, cost, func() { s.notePeak(c.Held + waiting + cost) })
	if c.Held+cost > c.Limit || c.Queued > 0 {
		s.noteWaiter()
	}
}

// waitError is the error acquire returns for err from the in-memory
// Backend: a queue timeout if wctx ran out, unavailable if lostCtx ended.
func (s *shares) waitError(ctx, wctx, lostCtx context.Context, err error) error {
	if err != nil && ctx.Err() == nil && lostCtx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) {
		return backend.ErrQueueTimeout
	}
	if err != nil && ctx.Err() == nil && lostCtx.Err() != nil && !errors.Is(err, backend.ErrClosed) {
		s.mu.Lock()
		why := s.why
		s.mu.Unlock()
		return &unavailableError{cause: errors.New(why)}
	}
	return err
}

// admits reports whether a request of priority p may wait in the
// in-memory Backend now (see floor).
func (s *shares) admits(p int) bool {
	f := s.floor.Load()
	return f == noBand || int64(clampBand(p)) >= f
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
	s.leaseTimer.Stop()
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
		// The leave call (bye): at once if Redis answers; else the
		// coordinator tries again in the background, every byeRetry, until
		// it does, the client is closed, or the keys have expired (10
		// lease TTLs).
		b.awaitLeave()
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
	return GlobalStats{Stats: backend.Stats{Running: int(v[0]), Queued: int(v[1]), Limit: int(v[3])}, Replicas: int(v[2])}, nil
}

// setLimit implements Backend.SetLimit, once its checks passed.
func (s *shares) setLimit(n int) error {
	if s.b.sp != nil {
		return s.b.sp.setLimit(n)
	}
	res, err := s.b.call(sharesScript, "limit", n)
	if err != nil {
		return errorf("redisqueue: SetLimit(%d): %w: %w", n, ErrUnavailable, err)
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
