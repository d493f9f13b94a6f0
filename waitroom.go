package ginqueue

import (
	"hash/maphash"
	"strconv"

	"github.com/ginqueue/ginqueue/backend"
)

// waitroom holds the waiters of a dispatcher and decides who is next.
//
//   - Priorities: a level per priority that has waiters, kept in two indexed
//     heaps (highest first, lowest first), so the next level to serve and the
//     level to evict from are found in O(1) and levels come and go in
//     O(log P), P the number of priorities waiting.
//   - Flows: within a level, the flows with waiters form a ring served round
//     robin, one waiter per turn; a flow that becomes active joins just
//     behind the cursor, so it waits at most one turn of the others. FIFO
//     within a flow (or, for CoDel's LIFO, newest first: see newest).
//   - Arrival order: every waiter is also on one list in arrival order
//     (expiry order, for the timer) and on its level's list (newest of a
//     level, for eviction).
//
// A level or flow exists only while it has waiters, so memory is bounded by
// the waiters, whatever keys clients send. Every method requires the
// dispatcher's mu.
type waitroom struct {
	all   wlist // every waiter, in arrival order (expiry order)
	n     int
	heavy int    // the waiters whose cost is above 1
	ver   uint64 // counts pushes and removes: the split by priority changed

	levels map[int]*level
	high   levelHeap // highest priority at high.items[0]
	low    levelHeap // lowest priority at low.items[0]
	seed   maphash.Seed

	// Emptied flows and levels kept for reuse, so that flows that come and
	// go as their only waiter is served allocate nothing; at most maxSpare
	// of each, and only small maps, so spares hold little memory.
	spareFlows  []*flow
	spareLevels []*level
}

const maxSpare = 64

// level is the waiters of one priority.
type level struct {
	prio   int
	flows  map[string]*flow
	cursor *flow // the flow served next; nil when the level is empty
	all    wlist // this level's waiters, in arrival order
	n      int
	idx    [2]int // positions in waitroom.high and waitroom.low
	peak   int    // the most flows this level has had at once
}

// flow is the waiters of one flow key at one level, in arrival order.
type flow struct {
	key        string
	lvl        *level
	prev, next *flow // the level's ring of flows
	all        wlist // this flow's waiters, in arrival order
	n          int
}

// maxKeyLen bounds the flow keys a waitroom keeps: longer keys are replaced
// by a hash, so a client cannot make the queue hold megabytes per waiter.
const maxKeyLen = 64

func newWaitroom() *waitroom {
	return &waitroom{
		levels: map[int]*level{},
		high:   levelHeap{side: 0, before: func(a, b *level) bool { return a.prio > b.prio }},
		low:    levelHeap{side: 1, before: func(a, b *level) bool { return a.prio < b.prio }},
		seed:   maphash.MakeSeed(),
	}
}

// flowKey shortens keys longer than maxKeyLen to a hash. Collisions only
// merge two flows.
func (r *waitroom) flowKey(key string) string {
	if len(key) <= maxKeyLen {
		return key
	}
	return "#" + strconv.FormatUint(maphash.String(r.seed, key), 36)
}

// flowLen is the number of waiters of the flow (prio, key).
func (r *waitroom) flowLen(prio int, key string) int {
	if l := r.levels[prio]; l != nil {
		if f := l.flows[r.flowKey(key)]; f != nil {
			return f.n
		}
	}
	return 0
}

// push adds w, of priority prio and flow key, as the newest waiter.
func (r *waitroom) push(w *waiter, prio int, key string) {
	l := r.levels[prio]
	if l == nil {
		l = r.newLevel(prio)
		r.levels[prio] = l
		r.high.push(l)
		r.low.push(l)
	}
	key = r.flowKey(key)
	f := l.flows[key]
	if f == nil {
		f = r.newFlow(key, l)
		l.flows[key] = f
		l.peak = max(l.peak, len(l.flows))
		if l.cursor == nil {
			f.prev, f.next = f, f
			l.cursor = f
		} else { // join just behind the cursor: served after one turn
			f.next = l.cursor
			f.prev = l.cursor.prev
			f.prev.next = f
			l.cursor.prev = f
		}
	}
	w.flow = f
	f.all.pushBack(w, inFlow)
	f.n++
	l.all.pushBack(w, inLevel)
	l.n++
	r.all.pushBack(w, inAll)
	r.n++
	if w.cost > 1 {
		r.heavy++
	}
	r.ver++
}

// remove takes w out, wherever it is, and drops a flow or level it empties.
func (r *waitroom) remove(w *waiter) {
	f := w.flow
	l := f.lvl
	f.all.remove(w, inFlow)
	f.n--
	l.all.remove(w, inLevel)
	l.n--
	r.all.remove(w, inAll)
	r.n--
	if w.cost > 1 {
		r.heavy--
	}
	r.ver++
	w.flow = nil
	if f.n == 0 {
		delete(l.flows, f.key)
		if f.next == f {
			l.cursor = nil
		} else {
			if l.cursor == f {
				l.cursor = f.next
			}
			f.prev.next = f.next
			f.next.prev = f.prev
		}
		if len(r.spareFlows) < maxSpare {
			*f = flow{}
			r.spareFlows = append(r.spareFlows, f)
		}
	}
	if l.n == 0 {
		delete(r.levels, l.prio)
		r.high.remove(l)
		r.low.remove(l)
		if len(r.spareLevels) < maxSpare && l.peak <= maxSpare {
			*l = level{flows: l.flows} // empty: every flow was deleted
			r.spareLevels = append(r.spareLevels, l)
		}
	}
}

func (r *waitroom) newFlow(key string, l *level) *flow {
	if n := len(r.spareFlows); n > 0 {
		f := r.spareFlows[n-1]
		r.spareFlows = r.spareFlows[:n-1]
		f.key, f.lvl = key, l
		return f
	}
	return &flow{key: key, lvl: l}
}

func (r *waitroom) newLevel(prio int) *level {
	if n := len(r.spareLevels); n > 0 {
		l := r.spareLevels[n-1]
		r.spareLevels = r.spareLevels[:n-1]
		l.prio = prio
		return l
	}
	return &level{prio: prio, flows: map[string]*flow{}}
}

// peek returns the waiter next (or, with lifo, newest) would return,
// leaving it in and the turn where it is; nil when empty.
func (r *waitroom) peek(lifo bool) *waiter {
	if r.n == 0 {
		return nil
	}
	f := r.high.items[0].cursor
	if lifo {
		return f.all.last
	}
	return f.all.first
}

// next removes and returns the waiter to grant next: the highest priority,
// the flow whose turn it is, the oldest of that flow. Nil when empty.
func (r *waitroom) next() *waiter {
	if r.n == 0 {
		return nil
	}
	w := r.turn().all.first
	r.remove(w)
	return w
}

// newest is next in last-in-first-out order, for CoDel's LIFO: the highest
// priority, the flow whose turn it is, the newest of that flow. Nil when
// empty.
func (r *waitroom) newest() *waiter {
	if r.n == 0 {
		return nil
	}
	w := r.turn().all.last
	r.remove(w)
	return w
}

// turn returns the flow whose turn it is at the highest priority, and gives
// the turn to the next flow, even if this one stays active. Requires r.n > 0.
func (r *waitroom) turn() *flow {
	l := r.high.items[0]
	f := l.cursor
	l.cursor = f.next
	return f
}

// victim returns the newest waiter of the lowest priority below prio, the
// one a full queue gives up for an arrival of priority prio; nil if every
// waiter has priority prio or more.
func (r *waitroom) victim(prio int) *waiter {
	if r.n == 0 || r.low.items[0].prio >= prio {
		return nil
	}
	return r.low.items[0].all.last
}

// ahead is the number of waiters that would be served before a new waiter
// of priority prio and flow key. That is every waiter of a higher priority,
// plus some at its own priority, where flows take turns from the cursor:
// the waiters of its own flow, and from every other flow as many as get a
// turn before it. A flow between the cursor and its own gets one more turn
// than its own flow has waiters, and a flow after it as many, each capped
// at what that flow has. A new flow joins just behind the cursor, so it
// waits one turn of each flow.
//
// With lifo, which is CoDel's LIFO while the queue stands (see newest), a
// new waiter is its flow's next, so its flow needs one turn. A flow between
// the cursor and its own is then served once before it, and a flow after
// it not at all. ahead costs O(P) for the levels, plus the level's flows
// when its flow already waits.
func (r *waitroom) ahead(prio int, key string, lifo bool) int {
	n := 0
	for _, l := range r.levels {
		if l.prio > prio {
			n += l.n
		}
	}
	l := r.levels[prio]
	if l == nil {
		return n
	}
	f := l.flows[r.flowKey(key)]
	if f == nil {
		return n + len(l.flows)
	}
	own := f.n // f's waiters served before the new one
	if lifo {
		own = 0
	}
	turns := own + 1 // flows before f in this round
	for g := l.cursor; ; {
		if g == f {
			turns = own // flows after f
		} else {
			n += min(g.n, turns)
		}
		if g = g.next; g == l.cursor {
			break
		}
	}
	return n + own
}

// byPriority lists the number of waiters per priority, in no order (the
// caller sorts it, outside the lock).
func (r *waitroom) byPriority() []backend.PriorityCount {
	if r.n == 0 {
		return nil
	}
	out := make([]backend.PriorityCount, 0, len(r.levels))
	for _, l := range r.levels {
		out = append(out, backend.PriorityCount{Priority: l.prio, Queued: l.n})
	}
	return out
}

// links are a waiter's neighbours on one list.
type links struct{ prev, next *waiter }

// The three lists a waiter is on.
func inAll(w *waiter) *links   { return &w.inAll }
func inLevel(w *waiter) *links { return &w.inLevel }
func inFlow(w *waiter) *links  { return &w.inFlow }

// wlist is a doubly linked list of waiters through the links at(w).
type wlist struct{ first, last *waiter }

func (q *wlist) pushBack(w *waiter, at func(*waiter) *links) {
	*at(w) = links{prev: q.last}
	if q.last == nil {
		q.first = w
	} else {
		at(q.last).next = w
	}
	q.last = w
}

func (q *wlist) remove(w *waiter, at func(*waiter) *links) {
	l := at(w)
	if l.prev == nil {
		q.first = l.next
	} else {
		at(l.prev).next = l.next
	}
	if l.next == nil {
		q.last = l.prev
	} else {
		at(l.next).prev = l.prev
	}
	*l = links{}
}

// levelHeap is a binary heap of levels that knows each level's position
// (level.idx[side]), so a level can be removed from the middle in O(log P).
type levelHeap struct {
	items  []*level
	side   int
	before func(a, b *level) bool
}

func (h *levelHeap) push(l *level) {
	l.idx[h.side] = len(h.items)
	h.items = append(h.items, l)
	h.up(len(h.items) - 1)
}

func (h *levelHeap) remove(l *level) {
	i := l.idx[h.side]
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	if i != last {
		h.down(i)
		h.up(i)
	}
}

func (h *levelHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].idx[h.side] = i
	h.items[j].idx[h.side] = j
}

func (h *levelHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.before(h.items[i], h.items[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *levelHeap) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h.items) {
			return
		}
		if c+1 < len(h.items) && h.before(h.items[c+1], h.items[c]) {
			c++
		}
		if !h.before(h.items[c], h.items[i]) {
			return
		}
		h.swap(i, c)
		i = c
	}
}
