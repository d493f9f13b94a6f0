package redisqueue

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// Shares mode on the request path: the gate that holds requests below the
// priority floor, the counts of what waits, releases and the fast path.

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
