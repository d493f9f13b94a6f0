package ginqueue

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// The lock-free steps of the dispatcher (the fast path, Release, parking,
// SetLimit) are enumerated here in every order. Each actor of a scenario runs
// the real code in its own goroutine; the dispatcher's step hook pauses it
// before every atomic step on the counters and before it takes mu, and a
// controller lets one paused actor go at a time. Every sequence of choices is
// tried, depth first, each in a fresh synctest bubble; after every step the
// controller checks the slots, and at the end the scenario's own checks run.

// actor is one goroutine of a scenario; what it returns is its outcome.
type actor struct {
	name string
	run  func(d *dispatcher) string
}

type scenario struct {
	name   string
	limits backend.Limits
	setup  func(d *dispatcher) // runs before the actors, without pauses
	actors []actor
	fresh  func() []actor // if set, the actors, made anew for every order
	// final checks the end state: every actor is done or parked. It may
	// read d under mu. outcomes[i] is "" for an actor still parked.
	final func(d *dispatcher, outcomes []string) error
	// minSchedules is a floor on the number of orders explored, so that
	// a change that removes the pause points cannot pass unnoticed.
	minSchedules int
	// pauses says which of the dispatcher's steps the actors pause at; nil
	// means all but those of the room's publication for Stats (see
	// publication).
	pauses func(step) bool
}

// publication reports whether k is a step of the room's publication for
// Stats, or of Stats reading it.
func publication(k step) bool { return k == stepPublish || k == stepStatsSeq || k == stepStatsRead }

// always pauses at every step.
func always(step) bool { return true }

// sched pauses actors at their steps. All fields are guarded by mu.
type sched struct {
	mu    sync.Mutex
	ids   map[uint64]int // goroutine id -> actor
	at    []step         // where each actor is paused; stepNone if not paused
	gates []chan struct{}
	done  []bool
	free  bool // the schedule is over: nobody pauses any more
}

// goid is the current goroutine's id, parsed from its stack header.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// pause is the dispatcher's step hook: an actor stops here until the
// controller lets it go; any other goroutine runs through.
func (s *sched) pause(k step) {
	id := goid()
	s.mu.Lock()
	a, ok := s.ids[id]
	if !ok || s.free {
		s.mu.Unlock()
		return
	}
	s.at[a] = k
	g := s.gates[a]
	s.mu.Unlock()
	<-g
}

// playOrder runs sc once, taking choice[i] at the i-th step (0 beyond the
// prefix). It returns the choices made, the number of options at each step
// and a description of the first violation, if any.
func playOrder(t *testing.T, sc scenario, prefix []int) (choices, options []int, trace []string, bad string) {
	synctest.Test(t, func(t *testing.T) {
		d := newMemoryBackend()
		if err := d.Start(sc.limits); err != nil {
			bad = err.Error()
			return
		}
		if sc.setup != nil {
			sc.setup(d)
		}
		actors := sc.actors
		if sc.fresh != nil {
			actors = sc.fresh()
		}
		n := len(actors)
		s := &sched{ids: map[uint64]int{}, at: make([]step, n), gates: make([]chan struct{}, n), done: make([]bool, n)}
		outcomes := make([]string, n)
		for i := range s.gates {
			s.gates[i] = make(chan struct{})
		}
		pauses := sc.pauses
		if pauses == nil {
			pauses = func(k step) bool { return !publication(k) }
		}
		d.step = func(k step) {
			if pauses(k) {
				s.pause(k)
			}
		}
		for i, a := range actors {
			go func() {
				s.mu.Lock()
				s.ids[goid()] = i
				s.mu.Unlock()
				s.pause(stepStart)
				out := a.run(d)
				s.mu.Lock()
				outcomes[i], s.done[i] = out, true
				s.mu.Unlock()
			}()
		}
		prevRun, _ := d.slots()
		for depth := 0; ; depth++ {
			synctest.Wait()
			s.mu.Lock()
			var ready []int
			for i, k := range s.at {
				if k == stepNone {
					continue
				}
				if k == stepLock {
					// All actors are paused or parked: mu is free exactly
					// when nobody paused inside a locked section holds it.
					if !d.mu.TryLock() {
						continue
					}
					d.mu.Unlock()
				}
				ready = append(ready, i)
			}
			if len(ready) == 0 {
				s.mu.Unlock()
				break
			}
			c := 0
			if depth < len(prefix) {
				c = prefix[depth]
			}
			if c >= len(ready) {
				// The replay of the prefix took another path: the steps
				// between two pauses are not deterministic.
				s.mu.Unlock()
				bad = fmt.Sprintf("the replay diverged at step %d: choice %d of %d", depth, c, len(ready))
				break
			}
			choices, options = append(choices, c), append(options, len(ready))
			a := ready[c]
			k := s.at[a]
			// An actor neither paused nor done is blocked: parked in the
			// room, or a Drain waiting (both keep slowBit set).
			blocked := false
			for i := range actors {
				blocked = blocked || i != a && s.at[i] == stepNone && !s.done[i]
			}
			trace = append(trace, actors[a].name+"@"+stepNames[k])
			s.at[a] = stepNone
			g := s.gates[a]
			s.mu.Unlock()
			g <- struct{}{}
			synctest.Wait()
			run, limit := d.slots()
			if run > prevRun && run > limit {
				bad = fmt.Sprintf("running %d with limit %d", run, limit)
				break
			}
			if k == stepFastCAS && run > prevRun && blocked {
				bad = fmt.Sprintf("the fast path took slots (%d held) past a waiter", run)
				break
			}
			prevRun = run
		}
		s.mu.Lock()
		done := append([]bool(nil), s.done...)
		final := append([]string(nil), outcomes...)
		s.mu.Unlock()
		if bad == "" {
			d.mu.Lock()
			if w := d.room.peek(false); w != nil && d.fits(d.state.Load(), w.cost) != 0 {
				run, limit := d.slots()
				bad = fmt.Sprintf("%d parked while %d of %d slots are held and the head needs %d", d.room.n, run, limit, w.cost)
			}
			d.mu.Unlock()
		}
		if bad == "" && sc.final != nil {
			for i := range final {
				if !done[i] {
					final[i] = ""
				}
			}
			if err := sc.final(d, final); err != nil {
				bad = err.Error()
			}
		}
		s.mu.Lock()
		s.free = true // let everyone paused run to the end
		for i, k := range s.at {
			if k != stepNone {
				close(s.gates[i])
			}
		}
		s.mu.Unlock()
		synctest.Wait()
		_ = d.Close() // wakes anyone parked, so the bubble can end
		synctest.Wait()
	})
	return choices, options, trace, bad
}

// explore plays every order of sc and fails on the first violation.
func explore(t *testing.T, sc scenario) {
	t.Helper()
	var prefix []int
	count := 0
	for {
		choices, options, trace, bad := playOrder(t, sc, prefix)
		count++
		if bad != "" {
			t.Fatalf("%s: after %s: %s", sc.name, strings.Join(trace, " "), bad)
		}
		i := len(choices) - 1
		for i >= 0 && choices[i]+1 >= options[i] {
			i--
		}
		if i < 0 {
			break
		}
		prefix = append(choices[:i:i], choices[i]+1)
	}
	t.Logf("%s: %d orders", sc.name, count)
	if count < sc.minSchedules {
		t.Fatalf("%s: only %d orders explored, expected at least %d", sc.name, count, sc.minSchedules)
	}
}

var stepNames = map[step]string{
	stepStart: "start", stepLock: "lock", stepFastLoad: "fast-load", stepFastCAS: "fast-cas",
	stepRelease: "release-add", stepSlowLoad: "slow-load", stepSlowMark: "slow-mark", stepSlowTake: "slow-take",
	stepGrantRead: "grant-read", stepGrantTake: "grant-add", stepSettle: "settle", stepSetLimit: "setlimit-add",
	stepPublish: "publish", stepStatsSeq: "stats-seq", stepStatsRead: "stats-read", stepWake: "wake",
}

// The actors.
var (
	fastArrival = actor{"fast", func(d *dispatcher) string { return fmt.Sprint(d.TryAcquire() != 0) }}
	slowArrival = actor{"slow", func(d *dispatcher) string {
		_, err := d.acquireSlow(context.Background(), backend.Arrival{})
		return fmt.Sprint(err)
	}}
	release = actor{"release", func(d *dispatcher) string { d.Release(backend.Ticket{}); return "released" }}
)

// hangUp is a waiter whose client hangs up (the cancel actor) at any point
// of the schedule, before it parks, while it waits or as it is granted.
func hangUp() (waiter, cancel actor) {
	ctx, stop := context.WithCancel(context.Background())
	waiter = actor{"waiter", func(d *dispatcher) string {
		_, err := d.acquireSlow(ctx, backend.Arrival{})
		return fmt.Sprint(err)
	}}
	return waiter, actor{"hang-up", func(*dispatcher) string { stop(); return "" }}
}

// holders counts the actors whose outcome says they hold a slot.
func holders(out []string) int64 {
	n := int64(0)
	for _, o := range out {
		if o == "true" || o == "<nil>" {
			n++
		}
	}
	return n
}

var (
	closeActor = actor{"close", func(d *dispatcher) string { return "close " + fmt.Sprint(d.Close()) }}
	// The hour ends only after the schedule, once every actor is blocked,
	// so a Drain still waiting then does not hold the bubble for ever.
	drainActor = actor{"drain", func(d *dispatcher) string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		return "drain " + fmt.Sprint(d.Drain(ctx))
	}}
)

// held checks that the slots held at the end are those the scenario started
// with, minus its releases, plus the grants its actors kept, and that Stats
// says so.
func held(start int64) func(d *dispatcher, out []string) error {
	return func(d *dispatcher, out []string) error {
		want := start - int64(strings.Count(strings.Join(out, " "), "released")) + holders(out)
		if run, _ := d.slots(); run != want {
			return fmt.Errorf("%d slots held, want %d (outcomes %q)", run, want, out)
		}
		if st := d.Stats(); int64(st.Running) != want {
			return fmt.Errorf("Stats.Running %d, want %d (outcomes %q)", st.Running, want, out)
		}
		return nil
	}
}

// drained is held, and a Drain is not left waiting while nothing runs.
func drained(start int64) func(d *dispatcher, out []string) error {
	return func(d *dispatcher, out []string) error {
		if err := held(start)(d, out); err != nil {
			return err
		}
		if run, _ := d.slots(); run == 0 && out[0] == "" {
			return fmt.Errorf("nothing runs but Drain still waits (outcomes %q)", out)
		}
		time.Sleep(2 * time.Hour) // a Drain still waiting gives up
		return nil
	}
}

func setLimit(n int) actor {
	return actor{"setlimit", func(d *dispatcher) string { return "limit " + fmt.Sprint(d.SetLimit(n)) }}
}

// holdOne takes a slot before the actors start.
func holdOne(d *dispatcher) {
	if d.TryAcquire() == 0 {
		panic("setup: no free slot")
	}
}

// holdN takes n slots for one request before the actors start.
func holdN(n int) func(d *dispatcher) {
	return func(d *dispatcher) {
		if d.tryAcquireN(n) != uint64(n) {
			panic("setup: the slots are not free")
		}
	}
}

// weighted is an arrival of the given cost through Acquire (tryAcquireN,
// then the slow path); its outcome names the slots it was granted.
func weighted(cost int) actor {
	return actor{"cost" + strconv.Itoa(cost), func(d *dispatcher) string {
		return slotsOf(d.Acquire(context.Background(), backend.Arrival{Cost: cost}))
	}}
}

// slowWeighted is weighted on the slow path alone (fewer steps, so fewer
// orders, where the lock-free attempt adds nothing to the scenario).
func slowWeighted(cost int) actor {
	return actor{"slow" + strconv.Itoa(cost), func(d *dispatcher) string {
		return slotsOf(d.acquireSlow(context.Background(), backend.Arrival{Cost: cost}))
	}}
}

// slotsOf is the outcome of a weighted arrival.
func slotsOf(t backend.Ticket, err error) string {
	if err != nil {
		return fmt.Sprint(err)
	}
	return "slots " + strconv.Itoa(max(t.Cost, 1))
}

// releaseN releases a Ticket of n slots.
func releaseN(n int) actor {
	return actor{"release" + strconv.Itoa(n), func(d *dispatcher) string {
		d.Release(backend.Ticket{Cost: n})
		return "released " + strconv.Itoa(n)
	}}
}

// hangUpN is hangUp for a waiter of the given cost.
func hangUpN(cost int) (waiter, cancel actor) {
	ctx, stop := context.WithCancel(context.Background())
	waiter = actor{"waiter" + strconv.Itoa(cost), func(d *dispatcher) string {
		return slotsOf(d.acquireSlow(ctx, backend.Arrival{Cost: cost}))
	}}
	return waiter, actor{"hang-up", func(*dispatcher) string { stop(); return "" }}
}

// heldSlots is held for scenarios with costs: the slots held at the end are
// start, less the slots released, plus the slots granted to the actors
// ("true" and "<nil>" are one slot, "slots n" n; "released" one, "released
// n" n); and Stats counts the same slots.
func heldSlots(start int64) func(d *dispatcher, out []string) error {
	return func(d *dispatcher, out []string) error {
		want := start
		for _, o := range out {
			var n int64
			switch {
			case o == "true" || o == "<nil>":
				want++
			case o == "released":
				want--
			case strings.HasPrefix(o, "slots "):
				n, _ = strconv.ParseInt(strings.TrimPrefix(o, "slots "), 10, 64)
				want += n
			case strings.HasPrefix(o, "released "):
				n, _ = strconv.ParseInt(strings.TrimPrefix(o, "released "), 10, 64)
				want -= n
			}
		}
		if run, _ := d.slots(); run != want {
			return fmt.Errorf("%d slots held, want %d (outcomes %q)", run, want, out)
		}
		if st := d.Stats(); int64(st.Running) != want {
			return fmt.Errorf("Stats.Running %d, want %d (outcomes %q)", st.Running, want, out)
		}
		return nil
	}
}

func TestInterleavings(t *testing.T) {
	for _, sc := range []scenario{
		{
			// Two arrivals, one holder releasing, one of the arrivals
			// parking: whatever the order, at most one slot is held, and
			// the freed slot reaches the parked waiter.
			name:   "release, fast arrival and parking arrival",
			limits: backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:  holdOne,
			actors: []actor{fastArrival, slowArrival, release},
			final: func(d *dispatcher, out []string) error {
				run, _ := d.slots()
				if run != 1 {
					return fmt.Errorf("%d slots held at the end, want 1 (outcomes %q)", run, out)
				}
				return nil
			},
			minSchedules: 2000,
		},
		{
			// A lowered limit holds from the moment SetLimit returns: a
			// fast path that read the old limit must not get in after it.
			name:         "fast arrival and a lowered limit",
			limits:       backend.Limits{MaxConcurrent: 2, MaxQueue: 1},
			setup:        holdOne,
			actors:       []actor{fastArrival, setLimit(1)},
			minSchedules: 30,
		},
		{
			name:         "fast arrival, release and a lowered limit",
			limits:       backend.Limits{MaxConcurrent: 2, MaxQueue: 1},
			setup:        func(d *dispatcher) { holdOne(d); holdOne(d) },
			actors:       []actor{fastArrival, setLimit(1), release},
			minSchedules: 500,
		},
		{
			// Raising the limit wakes the parked waiter at once.
			name:   "raised limit, parking arrival and fast arrival",
			limits: backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:  holdOne,
			actors: []actor{slowArrival, setLimit(2), fastArrival},
			final: func(d *dispatcher, out []string) error {
				if run, _ := d.slots(); run != 2 {
					return fmt.Errorf("%d slots held at the end, want 2 (outcomes %q)", run, out)
				}
				return nil
			},
			minSchedules: 1500,
		},
		{
			// Two holders release while an arrival parks: it gets a slot,
			// and one stays free.
			name:   "two releases and a parking arrival",
			limits: backend.Limits{MaxConcurrent: 2, MaxQueue: 2},
			setup:  func(d *dispatcher) { holdOne(d); holdOne(d) },
			actors: []actor{slowArrival, release, release},
			final: func(d *dispatcher, out []string) error {
				if run, _ := d.slots(); run != 1 || holders(out) != 1 {
					return fmt.Errorf("%d slots held at the end, want 1 (outcomes %q)", run, out)
				}
				return nil
			},
			minSchedules: 300,
		},
		{
			// A hang-up at any point (before the waiter parks, while it
			// waits, as it is granted) against a release: the slots held
			// are exactly those of the actors that say they hold one; a
			// grant that meets the hang-up is given back, never lost.
			name:   "hang-up and release",
			limits: backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:  holdOne,
			fresh: func() []actor {
				waiter, cancel := hangUp()
				return []actor{waiter, cancel, release}
			},
			final: func(d *dispatcher, out []string) error {
				if run, _ := d.slots(); run != holders(out) {
					return fmt.Errorf("%d slots held at the end, but the outcomes %q say %d", run, out, holders(out))
				}
				return nil
			},
			minSchedules: 100,
		},
		{
			name:         "close racing a release and a fast arrival",
			limits:       backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:        holdOne,
			actors:       []actor{fastArrival, release, closeActor},
			final:        held(1),
			minSchedules: 300,
		},
		{
			name:         "close racing a parking arrival and a release",
			limits:       backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:        holdOne,
			actors:       []actor{slowArrival, release, closeActor},
			final:        held(1),
			minSchedules: 300,
		},
		{
			name:         "drain racing a release and a fast arrival",
			limits:       backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:        holdOne,
			actors:       []actor{drainActor, release, fastArrival},
			final:        drained(1),
			minSchedules: 300,
		},
		{
			name:         "a lowered limit racing a parking arrival and a release",
			limits:       backend.Limits{MaxConcurrent: 2, MaxQueue: 1},
			setup:        func(d *dispatcher) { holdOne(d); holdOne(d) },
			actors:       []actor{slowArrival, setLimit(1), release},
			final:        held(2),
			minSchedules: 300,
		},
		// Costs. A cost-2 arrival finds one of two slots held: it parks and
		// blocks the queue, so the cost-1 arrival on the fast path gets in
		// only before it parks (the per-step check), and the release that
		// frees its second slot grants it.
		{
			name:         "a cost-2 waiter at the head, a fast arrival and a release",
			limits:       backend.Limits{MaxConcurrent: 2, MaxQueue: 2},
			setup:        holdOne,
			actors:       []actor{slowWeighted(2), fastArrival, release},
			final:        heldSlots(1),
			minSchedules: 15000,
		},
		{
			// A cost-2 holder releases both slots at once: the parked
			// arrival gets one, the fast one the other unless it came
			// while the first was parked.
			name:         "release of a cost-2 holder, a parking arrival and a fast arrival",
			limits:       backend.Limits{MaxConcurrent: 2, MaxQueue: 2},
			setup:        holdN(2),
			actors:       []actor{slowArrival, fastArrival, releaseN(2)},
			final:        heldSlots(2),
			minSchedules: 2000,
		},
		{
			// A cost-2 holder hands both slots to a cost-2 waiter, while a
			// cost-1 arrival tries the fast path.
			name:         "release of a cost-2 holder to a cost-2 waiter and a fast arrival",
			limits:       backend.Limits{MaxConcurrent: 2, MaxQueue: 2},
			setup:        holdN(2),
			actors:       []actor{weighted(2), fastArrival, releaseN(2)},
			final:        heldSlots(2),
			minSchedules: 4000,
		},
		{
			// The cost-2 head hangs up while a cost-1 waiter is parked
			// behind it with a slot free: that waiter is granted (the
			// final check: nobody parked whose slots are free).
			name:   "a cost-2 head hangs up before a cost-1 waiter",
			limits: backend.Limits{MaxConcurrent: 2, MaxQueue: 2},
			setup:  holdOne,
			fresh: func() []actor {
				waiter, cancel := hangUpN(2)
				return []actor{waiter, slowArrival, cancel}
			},
			final:        heldSlots(1),
			minSchedules: 150,
		},
		{
			// A cost-3 waiter and a lowered limit: it is granted 3 or,
			// once the limit is 2, 2, never past the limit.
			name:         "a cost-3 waiter, a lowered limit and a release",
			limits:       backend.Limits{MaxConcurrent: 3, MaxQueue: 1},
			setup:        holdOne,
			actors:       []actor{slowWeighted(3), setLimit(2), release},
			final:        heldSlots(1),
			minSchedules: 1000,
		},
		{
			// A cost-2 holder releases after the limit dropped to 1: both
			// slots come back, not one.
			name:         "release of a cost-2 holder after a lowered limit, and a fast arrival",
			limits:       backend.Limits{MaxConcurrent: 2, MaxQueue: 1},
			setup:        holdN(2),
			actors:       []actor{setLimit(1), releaseN(2), fastArrival},
			final:        heldSlots(2),
			minSchedules: 600,
		},
	} {
		t.Run(sc.name, func(t *testing.T) { explore(t, sc) })
	}
}

// statsActor reads Stats and reports what it saw, or BAD and why, if the
// view is not one the room was ever in: a split that does not add up to
// Queued, more waiters than the scenario ever had, or a priority that never
// waited.
func statsActor(most int, prios ...int) actor {
	return actor{"stats", func(d *dispatcher) string {
		st := d.Stats()
		sum := 0
		for _, c := range st.QueuedByPriority {
			sum += c.Queued
			if !slices.Contains(prios, c.Priority) {
				return fmt.Sprintf("BAD priority %d in %+v", c.Priority, st)
			}
		}
		if sum != st.Queued || st.Queued > most || (st.Queued == 0) != (st.QueuedByPriority == nil) {
			return fmt.Sprintf("BAD %+v", st)
		}
		return fmt.Sprintf("stats queued %d", st.Queued)
	}}
}

// atPriority is a parking arrival of priority p.
func atPriority(p int) actor {
	return actor{"prio" + strconv.Itoa(p), func(d *dispatcher) string {
		_, err := d.acquireSlow(context.Background(), backend.Arrival{Priority: p})
		return fmt.Sprint(err)
	}}
}

// noBad fails a scenario in which an actor reported BAD, then runs next.
func noBad(next func(d *dispatcher, out []string) error) func(d *dispatcher, out []string) error {
	return func(d *dispatcher, out []string) error {
		for _, o := range out {
			if strings.HasPrefix(o, "BAD") {
				return fmt.Errorf("outcomes %q", out)
			}
		}
		return next(d, out)
	}
}

// parkOne holds the only slot and parks a waiter of priority 0, in a
// goroutine that is not an actor (it never pauses); granted, it keeps the
// slot, since taking mu while an actor is paused under it would block it on
// a mutex, which synctest.Wait does not count as blocked.
func parkOne(d *dispatcher) {
	holdOne(d)
	go func() { _, _ = d.acquireSlow(context.Background(), backend.Arrival{}) }()
	synctest.Wait()
}

// slotsHeld checks the slots held and the waiters left at the end.
func slotsHeld(run int64, queued int) func(d *dispatcher, out []string) error {
	return noBad(func(d *dispatcher, out []string) error {
		if r, _ := d.slots(); r != run || d.room.n != queued {
			return fmt.Errorf("%d slots held and %d waiting, want %d and %d (outcomes %q)", r, d.room.n, run, queued, out)
		}
		return nil
	})
}

// Stats reads the room without mu while sections under mu publish it: in
// every order of its reads against the publication of a waiter parking, of
// two (the second rewriting the half Stats reads), of a release handing the
// slot on, and of an eviction by priority, it returns a view the room was in.
func TestInterleavingsOfStats(t *testing.T) {
	for _, sc := range []scenario{
		{
			name:         "stats and a parking arrival",
			limits:       backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:        holdOne,
			actors:       []actor{statsActor(1, 0), slowArrival},
			final:        slotsHeld(1, 1),
			minSchedules: 20,
		},
		{
			name:         "stats and a release handing the slot to a waiter",
			limits:       backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:        parkOne,
			actors:       []actor{statsActor(1, 0), release},
			final:        slotsHeld(1, 0),
			minSchedules: 20,
		},
		{
			// Two publications while one Stats reads: the second writes
			// the half it reads, which it must notice and read again.
			// Only the publication's steps pause, and taking mu (the
			// controller lets nobody block on it); the orders of the rest
			// are the scenarios above and TestInterleavings'.
			name:         "stats and two parking arrivals",
			limits:       backend.Limits{MaxConcurrent: 1, MaxQueue: 2},
			setup:        holdOne,
			actors:       []actor{statsActor(2, 0), slowArrival, slowArrival},
			final:        slotsHeld(1, 2),
			minSchedules: 100,
			pauses:       func(k step) bool { return publication(k) || k == stepLock },
		},
		{
			name:         "stats and an eviction by priority",
			limits:       backend.Limits{MaxConcurrent: 1, MaxQueue: 1},
			setup:        parkOne,
			actors:       []actor{statsActor(1, 0, 5), atPriority(5)},
			final:        slotsHeld(1, 1),
			minSchedules: 20,
		},
	} {
		if sc.pauses == nil {
			sc.pauses = always
		}
		t.Run(sc.name, func(t *testing.T) { explore(t, sc) })
	}
}
