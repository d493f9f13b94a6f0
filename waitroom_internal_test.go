// The wait room: its memory, and who is ahead of an arrival.

package ginqueue

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Flow and level state lives only while it has waiters: a million distinct
// keys through a queue of 100 places leave the memory of 100 waiters.
func TestRotatingKeysDoNotGrowMemory(t *testing.T) {
	const places = 100
	r := newWaitroom()
	var ms runtime.MemStats
	heap := func() uint64 {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var ws []*waiter
	for i := range places {
		w := &waiter{}
		r.push(w, i%3, strconv.Itoa(i))
		ws = append(ws, w)
	}
	before := heap()
	for i := places; i < 1_000_000; i++ {
		old := ws[i%places]
		r.remove(old)
		w := &waiter{}
		r.push(w, i%3, "client-"+strconv.Itoa(i))
		ws[i%places] = w
	}
	after := heap()
	assert.Equal(t, places, r.n)
	flows := 0
	for _, l := range r.levels {
		flows += len(l.flows)
	}
	assert.Equal(t, places, flows, "one flow per waiter, no more")
	assert.Len(t, r.levels, 3)
	assert.Less(t, after, before+512<<10, "heap grew from %d to %d bytes", before, after)
	runtime.KeepAlive(ws)

	long := strings.Repeat("k", 1<<20)
	w := &waiter{}
	r.push(w, 0, long)
	assert.LessOrEqual(t, len(w.flow.key), maxKeyLen, "a 1 MiB key is kept as a hash")
	assert.Equal(t, 1, r.flowLen(0, long))
}

// Flows take turns: an arrival has ahead of it its own flow's waiters and,
// from each other flow, one more than that or all that flow has.
func TestAheadInTheWaitroom(t *testing.T) {
	r := newWaitroom()
	push := func(prio int, flow string, n int) {
		for range n {
			r.push(&waiter{}, prio, flow)
		}
	}
	push(0, "A", 5) // the cursor is on A, then B
	push(0, "B", 1)
	push(2, "C", 2)
	for _, tc := range []struct {
		prio int
		flow string
		want int
	}{
		{3, "A", 0},         // above everyone
		{2, "C", 2},         // behind its own flow
		{2, "D", 1},         // a new flow at 2: one turn of C
		{1, "A", 2},         // a level of its own: only the higher one
		{0, "new", 2 + 2},   // one turn of A and of B
		{0, "B", 2 + 1 + 2}, // B's second: its own 1, two turns of A (before it)
		{0, "A", 2 + 5 + 1}, // A's sixth: its own 5, all of B
		{0, "new", 2 + 2},   // a new flow: one turn of each
	} {
		assert.Equal(t, tc.want, r.ahead(tc.prio, tc.flow, false), "priority %d flow %q", tc.prio, tc.flow)
	}
	// Newest first (CoDel's LIFO): an arrival is its flow's next, so a flow
	// between the cursor and its own gets one turn before it, one after none.
	for _, tc := range []struct {
		prio int
		flow string
		want int
	}{
		{2, "C", 0},     // its flow's next, at the highest priority
		{0, "A", 2},     // the cursor's flow: only the higher priority
		{0, "B", 2 + 1}, // one turn of A first
		{0, "new", 2 + 2},
	} {
		assert.Equal(t, tc.want, r.ahead(tc.prio, tc.flow, true), "newest first: priority %d flow %q", tc.prio, tc.flow)
	}
	// Flows after the arrival's own in the round get as many turns as it has
	// waiters, not one more: with the cursor on A (one waiter) and B, C
	// behind it with three each, A's second waits for A's first and one of
	// each of B and C.
	r = newWaitroom()
	push(0, "A", 1)
	push(0, "B", 3)
	push(0, "C", 3)
	assert.Equal(t, 1+1+1, r.ahead(0, "A", false))
	assert.Equal(t, 3+1+3, r.ahead(0, "B", false), "B's fourth: its own 3, A's only one, C's three (each of C's turns comes before it)")
	assert.Equal(t, 1, r.ahead(0, "B", true), "newest first: one turn of A, none of C")
	assert.Equal(t, 1+1, r.ahead(0, "C", true), "newest first: one turn of A and of B")
}
