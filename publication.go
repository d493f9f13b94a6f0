package ginqueue

import (
	"cmp"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// The publication of the wait room that Stats reads without the mutex.

// roomPub is one publication of the room for Stats. Every field is an
// atomic only so that a reader may race with the writer of the half it then
// discards.
type roomPub struct {
	queued   atomic.Int64
	oldestAt atomic.Int64 // arrival of the oldest waiter + 1; 0 when none
	// levels is the number of priorities waiting, whose (priority, count)
	// are in prio and count, in no order; -1 when there are more than
	// pubLevels, and the split is in many, sorted highest first.
	levels atomic.Int64
	prio   [pubLevels]atomic.Int64
	count  [pubLevels]atomic.Int64
	many   atomic.Pointer[[]backend.PriorityCount]
}

// pubLevels is how many priorities a publication holds without allocating.
const pubLevels = 8

// publish writes the room into the half of pubs that readers are not
// reading, then makes it the last publication. O(P) for P priorities
// waiting; it allocates only when P > pubLevels. A field that already holds
// its value (from two publications ago) is not written again: on a hand-off
// the priorities and their number seldom change. Requires d.mu.
func (d *dispatcher) publish() {
	seq := d.pubSeq.Load() + 1
	p := &d.pubs[seq%2]
	store(&p.queued, int64(d.room.n))
	oldest := int64(0)
	if w := d.room.all.first; w != nil {
		oldest = w.arrived + 1
	}
	store(&p.oldestAt, oldest)
	d.at(stepPublish)
	if levels := d.room.high.items; len(levels) <= pubLevels {
		for i, l := range levels {
			store(&p.prio[i], int64(l.prio))
			store(&p.count[i], int64(l.n))
		}
		store(&p.levels, int64(len(levels)))
		if p.many.Load() != nil {
			p.many.Store(nil)
		}
	} else {
		split := d.room.byPriority()
		sortByPriority(split)
		p.many.Store(&split)
		p.levels.Store(-1)
	}
	d.at(stepPublish)
	d.pubSeq.Store(seq)
	d.pubVer = d.room.ver
}

// store writes v to a unless a holds it already (a load is cheaper than a
// store). Only for fields with one writer.
func store(a *atomic.Int64, v int64) {
	if a.Load() != v {
		a.Store(v)
	}
}

// sortByPriority sorts a split highest priority first.
func sortByPriority(split []backend.PriorityCount) {
	slices.SortFunc(split, func(a, b backend.PriorityCount) int { return cmp.Compare(b.Priority, a.Priority) })
}

// Stats implements Backend. It never waits for mu: the counts come from
// atomics, and Queued, OldestWait and the split by priority from the last
// publication of the room (see dispatcher.pubs), one consistent view as of
// the last section under mu.
func (d *dispatcher) Stats() backend.Stats {
	c, served := d.counts()
	st := backend.Stats{Running: c.Running, Limit: c.Limit, Served: served}
	var split [pubLevels]backend.PriorityCount
	var many *[]backend.PriorityCount
	var queued, oldest, levels int64
	for try := 1; ; try++ {
		seq := d.pubSeq.Load()
		p := &d.pubs[seq%2]
		d.at(stepStatsRead)
		queued, oldest = p.queued.Load(), p.oldestAt.Load()
		d.at(stepStatsRead)
		levels = p.levels.Load()
		if levels < 0 {
			many = p.many.Load()
		} else {
			for i := range min(levels, pubLevels) {
				split[i] = backend.PriorityCount{Priority: int(p.prio[i].Load()), Queued: int(p.count[i].Load())}
			}
		}
		if d.at(stepStatsSeq); d.pubSeq.Load() == seq {
			break // nobody wrote that half while it was read
		}
		if try%16 == 0 {
			runtime.Gosched() // publications keep coming: let them pass
		}
	}
	if queued == 0 {
		return st // nobody waits: no split
	}
	st.Queued = int(queued)
	st.OldestWait = time.Duration(max(d.now()-(oldest-1), 0))
	if levels < 0 {
		st.QueuedByPriority = slices.Clone(*many)
	} else {
		st.QueuedByPriority = slices.Clone(split[:levels])
		sortByPriority(st.QueuedByPriority)
	}
	return st
}
