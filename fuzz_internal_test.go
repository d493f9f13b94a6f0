// Every fuzz target of the package (`make fuzz-smoke` runs each).

package ginqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
)

// FuzzConfigValidate: any Config either validates, and then builds a Queue
// that serves, or is refused with an error that starts "ginqueue: " and
// names a Config field. Nothing panics.
func FuzzConfigValidate(f *testing.F) {
	f.Add(1, 0, int64(0), int64(0), 0, false, false, 0, 0, 0.0, 0.0)
	f.Add(100, 1000, int64(10*time.Second), int64(0), 0, true, true, 4, 200, 1.1, 0.9)
	f.Add(0, -1, int64(-1), int64(-5), -3, true, false, -1, -1, 0.5, 2.0)
	f.Add(math.MaxInt, math.MaxInt, int64(math.MaxInt64), int64(math.MinInt64), math.MinInt, false, true, 7, 3, math.NaN(), math.Inf(1))
	f.Fuzz(func(t *testing.T, conc, queue int, timeout, retry int64, perFlow int, flows, early bool,
		minL, maxL int, tol, backoff float64) {
		cfg := Config{MaxConcurrent: conc, MaxQueue: queue, QueueTimeout: time.Duration(timeout),
			RetryAfter: time.Duration(retry), MaxQueuePerFlow: perFlow, RejectEarly: early}
		if flows {
			cfg.FlowKey = ByRoute()
			cfg.Adaptive = &AdaptiveConfig{MinLimit: minL, MaxLimit: maxL, Tolerance: tol, Backoff: backoff}
		}
		err := cfg.Validate()
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "ginqueue: Config.") {
				t.Fatalf("error does not name a Config field: %q", msg)
			}
			if _, err2 := NewQueue(cfg); err2 == nil || err2.Error() != msg {
				t.Fatalf("NewQueue disagrees with Validate: %v vs %v", err2, err)
			}
			return
		}
		q, err := NewQueue(cfg)
		if err != nil {
			t.Fatalf("valid config refused by NewQueue: %v", err)
		}
		defer q.Close()
		if st := q.Stats(); st.Limit < 1 || st.Running != 0 {
			t.Fatalf("bad initial stats %+v", st)
		}
	})
}

// FuzzSchedule turns bytes into a schedule of arrivals (with priorities,
// flows and, in some schedules, costs from 0 to 3), hang-ups, releases, limit
// changes, time passing and a Close, played against the dispatcher in fake
// time. After every step it checks: every arrival has at most one outcome
// and, at the end, exactly one; the slots the holders were granted are what
// Stats says, each between 1 and the cost asked for; the queue never exceeds
// MaxQueue nor a flow its cap; no head waits while its slots are free; within
// a priority and flow, grants follow arrival order; a timeout comes exactly
// QueueTimeout after arrival.
func FuzzSchedule(f *testing.F) {
	f.Add([]byte{0, 1, 0, 1, 0, 2, 3, 50, 1, 0, 2, 0, 3, 200})
	f.Add([]byte{9, 9, 0, 0, 0, 0, 0, 5, 0, 7, 1, 1, 4, 3, 1, 1, 2, 1, 3, 255, 5})
	f.Add([]byte("arrivals and hang-ups and time passing, then a close"))
	// Costs (data[0]&0x40): a cost-3 head on 4 slots, cost-1 and cost-2
	// arrivals behind it, releases, a lowered and a raised limit.
	f.Add([]byte{0x43, 5, 0, 0x00, 0, 0x00, 0, 0x30, 1, 0x10, 0, 0x20, 2, 0, 5, 2, 2, 1, 5, 4, 2, 0, 2, 0})
	f.Add([]byte{0xc3, 0x84, 0, 0x30, 1, 0x34, 0, 0x11, 3, 0, 4, 30, 2, 1, 0, 0x25, 4, 255, 2, 0, 2, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		synctest.Test(t, func(t *testing.T) { playSchedule(t, data) })
	})
}

type fuzzArrival struct {
	prio      int
	flow      string
	cost      int            // asked for: 0 means 1
	ticket    backend.Ticket // once granted
	at        time.Duration
	cancel    context.CancelFunc
	outcome   error // nil while waiting or holding
	done      bool
	holds     bool
	grantStep int // the step in which it was granted; 0 if never
}

func playSchedule(t *testing.T, data []byte) {
	l := backend.Limits{
		MaxConcurrent:   1 + int(data[0]%4),
		MaxQueue:        int(data[1] % 6),
		MaxQueuePerFlow: 0,
	}
	if data[0]&0x80 != 0 {
		l.QueueTimeout = time.Duration(1+data[0]%50) * time.Millisecond
	}
	if l.MaxQueue > 1 && data[1]&0x80 != 0 {
		l.MaxQueuePerFlow = 1 + int(data[1]>>4)%l.MaxQueue
	}
	if l.MaxQueue == 0 {
		l.QueueTimeout = 0
	}
	weighted := data[0]&0x40 != 0
	d := newMemoryBackend()
	if err := d.Start(l); err != nil {
		t.Fatalf("start %+v: %v", l, err)
	}
	t0 := time.Now()
	type outcome struct {
		id  int
		t   backend.Ticket
		err error
		at  time.Duration
	}
	results := make(chan outcome, 512)
	var arrivals []*fuzzArrival
	step := 0
	collect := func() {
		synctest.Wait()
		for {
			select {
			case r := <-results:
				a := arrivals[r.id]
				if a.done || a.holds {
					t.Fatalf("arrival %d got a second outcome %v", r.id, r.err)
				}
				if r.err == nil {
					a.holds, a.grantStep, a.ticket = true, step, r.t
					if n := max(r.t.Cost, 1); n > max(a.cost, 1) {
						t.Fatalf("arrival %d of cost %d was granted %d slots", r.id, a.cost, n)
					}
				} else {
					a.done, a.outcome = true, r.err
					if errors.Is(r.err, backend.ErrQueueTimeout) && r.at-a.at != l.QueueTimeout {
						t.Fatalf("arrival %d timed out after %v, not %v", r.id, r.at-a.at, l.QueueTimeout)
					}
				}
			default:
				return
			}
		}
	}
	check := func() {
		collect()
		slots, waiting := 0, 0
		for _, a := range arrivals {
			if a.holds {
				slots += max(a.ticket.Cost, 1)
			} else if !a.done {
				waiting++
			}
		}
		st := d.Stats()
		if st.Running != slots || st.Queued != waiting {
			t.Fatalf("step %d: stats %+v, but %d slots are held and %d wait", step, st, slots, waiting)
		}
		if waiting > l.MaxQueue {
			t.Fatalf("step %d: %d waiting, MaxQueue %d", step, waiting, l.MaxQueue)
		}
		d.mu.Lock()
		if w := d.room.peek(false); w != nil && d.fits(d.state.Load(), w.cost) != 0 {
			t.Fatalf("step %d: the head waits for %d slots while %d of %d are held", step, w.cost, slots, st.Limit)
		}
		d.mu.Unlock()
		if l.MaxQueuePerFlow > 0 {
			perFlow := map[string]int{}
			for _, a := range arrivals {
				if !a.holds && !a.done {
					perFlow[fmt.Sprint(a.prio, a.flow)]++
				}
			}
			for k, n := range perFlow {
				if n > l.MaxQueuePerFlow {
					t.Fatalf("step %d: flow %s holds %d places, cap %d", step, k, n, l.MaxQueuePerFlow)
				}
			}
		}
	}
	release := func(i int) bool {
		for k := range arrivals {
			a := arrivals[(i+k)%len(arrivals)]
			if a.holds {
				a.holds, a.done = false, true
				d.Release(a.ticket)
				return true
			}
		}
		return false
	}
	for step = 2; step+1 < len(data); step += 2 {
		op, arg := data[step]%6, data[step+1]
		switch op {
		case 0, 1: // an arrival
			ctx, cancel := context.WithCancel(context.Background())
			a := &fuzzArrival{prio: int(arg%3) - 1, flow: string(rune('a' + arg>>2%3)), at: time.Since(t0), cancel: cancel}
			if weighted {
				a.cost = int(arg >> 4 % 4)
			}
			id := len(arrivals)
			arrivals = append(arrivals, a)
			go func() {
				tk, err := d.Acquire(ctx, backend.Arrival{Priority: a.prio, Flow: a.flow, Cost: a.cost})
				results <- outcome{id, tk, err, time.Since(t0)}
			}()
		case 2: // a holder finishes
			if len(arrivals) > 0 {
				release(int(arg))
			}
		case 3: // a client hangs up
			if len(arrivals) > 0 {
				arrivals[int(arg)%len(arrivals)].cancel()
			}
		case 4: // time passes
			time.Sleep(time.Duration(arg) * 100 * time.Microsecond)
		case 5: // the limit moves, or the dispatcher closes
			if arg%8 == 0 {
				_ = d.Close()
			} else if err := d.SetLimit(1 + int(arg%5)); err != nil {
				t.Fatal(err)
			}
		}
		check()
	}
	// Drain: let every holder finish and every waiter be granted or leave.
	for step = len(data); len(arrivals) > 0 && release(0); step++ {
		check()
	}
	for _, a := range arrivals {
		a.cancel()
	}
	check()
	// Within a priority and flow, grants follow arrival order: no later
	// arrival was granted in an earlier step than an earlier one.
	last := map[string]int{}
	for id, a := range arrivals {
		if !a.done {
			t.Fatalf("arrival %d has no outcome", id)
		}
		if a.grantStep == 0 {
			continue
		}
		k := fmt.Sprint(a.prio, a.flow)
		if a.grantStep < last[k] {
			t.Fatalf("arrival %d of class %s was granted before an earlier one", id, k)
		}
		last[k] = a.grantStep
	}
	_ = d.Close()
	if st := d.Stats(); st.Running != 0 || st.Queued != 0 {
		t.Fatalf("left behind: %+v", st)
	}
}

// FuzzCoDel plays a schedule of arrivals, hang-ups, releases and time
// passing against a dispatcher with any CoDel and QueueTimeout. A CoDel that
// Validate refuses is refused by Start with the same error, naming a
// Limits.CoDel field. Otherwise: every arrival has exactly one outcome; a
// waiter times out no sooner than the short maximum wait and no later than the
// long one, and is granted before the long one; nobody waits while a slot is
// free; without LIFO, grants within a priority and flow follow arrival order.
func FuzzCoDel(f *testing.F) {
	ms := int64(time.Millisecond)
	sched := []byte{0, 0, 0, 1, 0, 2, 4, 30, 0, 1, 2, 0, 4, 200, 0, 0, 4, 255, 2, 1, 3, 1, 4, 90}
	f.Add(int64(0), int64(0), int64(0), false, sched)                                         // defaults
	f.Add(5*ms, 100*ms, int64(time.Second), true, sched)                                      // LIFO
	f.Add(10*ms, 10*ms, int64(0), true, sched)                                                // Target == Interval
	f.Add(int64(1), int64(1), int64(0), false, sched)                                         // 1 ns
	f.Add(int64(1), int64(1), int64(1), true, sched)                                          // 1 ns, capped at 1 ns
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), true, sched)      // centuries
	f.Add(int64(math.MaxInt64/2), int64(math.MaxInt64), int64(2*ms), false, sched)            // centuries, capped
	f.Add(5*ms, 100*ms, int64(ms), true, sched)                                               // QueueTimeout below Target
	f.Add(int64(-1), int64(0), int64(0), false, sched)                                        // refused
	f.Add(200*ms, int64(0), int64(0), false, sched)                                           // refused: above the default Interval
	f.Add(int64(math.MinInt64), int64(math.MinInt64), int64(math.MinInt64), false, []byte{0}) // refused
	f.Fuzz(func(t *testing.T, target, interval, timeout int64, lifo bool, data []byte) {
		cd := CoDel{Target: time.Duration(target), Interval: time.Duration(interval), LIFO: lifo}
		l := withCoDel(backend.Limits{MaxConcurrent: 1, MaxQueue: 6, QueueTimeout: time.Duration(timeout)}, &cd)
		if len(data) > 0 {
			l.MaxConcurrent += int(data[0] % 3)
		}
		if err := checkLimits(l, codelOf(l), "Limits"); err != nil {
			if !strings.HasPrefix(err.Error(), "ginqueue: Limits.") {
				t.Fatalf("error does not name a Limits field: %v", err)
			}
			if err2 := newMemoryBackend().Start(l); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("Start disagrees with Validate: %v vs %v", err2, err)
			}
			return
		}
		synctest.Test(t, func(t *testing.T) { playCoDel(t, l, data) })
	})
}

func playCoDel(t *testing.T, l backend.Limits, data []byte) {
	d := newMemoryBackend()
	if err := d.Start(l); err != nil {
		t.Fatalf("start %+v: %v", l, err)
	}
	c := newCoDel(codelOf(l).withDefaults(), l.QueueTimeout)
	long, short := time.Duration(c.long), time.Duration(c.short)
	type arrival struct {
		prio       int
		flow       string
		cancel     context.CancelFunc
		out        <-chan parked
		done, hold bool
		granted    int // the grant's rank among all grants; 0 if never
	}
	var arrivals []*arrival
	grants := 0
	collect := func() {
		synctest.Wait()
		for i, a := range arrivals {
			select {
			case r := <-a.out:
				switch {
				case r.err == nil:
					grants++
					a.hold, a.granted = true, grants
					if r.waited >= long {
						t.Fatalf("arrival %d granted after %v, past the long maximum wait %v", i, r.waited, long)
					}
				case errors.Is(r.err, backend.ErrQueueTimeout):
					a.done = true
					if r.waited < short || r.waited > long {
						t.Fatalf("arrival %d timed out after %v, outside [%v, %v]", i, r.waited, short, long)
					}
				default:
					a.done = true
				}
			default:
			}
		}
		holders, waiting := 0, 0
		for _, a := range arrivals {
			if a.hold {
				holders++
			} else if !a.done {
				waiting++
			}
		}
		if st := d.Stats(); st.Running != holders || st.Queued != waiting {
			t.Fatalf("stats %+v, but %d hold and %d wait", st, holders, waiting)
		}
		if waiting > 0 && holders < l.MaxConcurrent {
			t.Fatalf("%d wait while %d of %d slots are held", waiting, holders, l.MaxConcurrent)
		}
	}
	release := func(i int) bool {
		for k := range arrivals {
			if a := arrivals[(i+k)%len(arrivals)]; a.hold {
				a.hold, a.done = false, true
				d.Release(backend.Ticket{})
				return true
			}
		}
		return false
	}
	for step := 1; step+1 < len(data); step += 2 {
		op, arg := data[step]%4, data[step+1]
		switch op {
		case 0: // an arrival
			ctx, cancel := context.WithCancel(context.Background())
			a := &arrival{prio: int(arg % 2), flow: string(rune('a' + arg>>1%2)), cancel: cancel}
			a.out = park(d, ctx, backend.Arrival{Priority: a.prio, Flow: a.flow})
			arrivals = append(arrivals, a)
		case 1: // a holder finishes
			release(int(arg))
		case 2: // a client hangs up
			if len(arrivals) > 0 {
				arrivals[int(arg)%len(arrivals)].cancel()
			}
		case 3: // time passes
			time.Sleep(time.Duration(arg) * time.Millisecond)
		}
		collect()
	}
	for release(0) {
		collect()
	}
	for _, a := range arrivals {
		a.cancel()
	}
	collect()
	last := map[string]int{}
	for i, a := range arrivals {
		if !a.done {
			t.Fatalf("arrival %d has no outcome", i)
		}
		if a.granted == 0 || l.CoDelLIFO {
			continue
		}
		k := fmt.Sprint(a.prio, a.flow)
		if a.granted < last[k] {
			t.Fatalf("arrival %d of class %s was granted before an earlier one", i, k)
		}
		last[k] = a.granted
	}
	_ = d.Close()
}

// The configurations FuzzAdaptive draws from: each index byte picks one.
var (
	fuzzMinLimits  = []int{0, 1, 2, 3, 10}
	fuzzSpans      = []int{0, 1, 3, 50, 990} // backend.MaxLimit is MinLimit plus this; 0 and 0 mean 1000
	fuzzWindows    = []int{0, 1, 3, 10, 100}
	fuzzTolerances = []float64{0, 1, 1.05, 1.5, 3, 1e6}
	fuzzBackoffs   = []float64{0, 0.5, 0.99}
	fuzzProbes     = []int{0, 1, 2, 7, 40}
	fuzzStarts     = []int{1, 8, 200, 5000}
)

// Sample kinds: a fuzz input is a list of (kind, value, repeat) triples; each
// plays repeat+1 samples of its kind, except busy and fail, which set state.
const (
	fuzzZero      = iota // 0
	fuzzSubMicro         // value × 3 ns, under 1 µs
	fuzzMicros           // value µs
	fuzzMillis           // value ms
	fuzzHours            // value+1 hours: above the 2^32 µs cap of a sample
	fuzzAlternate        // value ns and value+1 ms, in turn
	fuzzExtreme          // MaxInt64, MinInt64, -1 ns or 1<<62 ns, by repeat
	fuzzBusy             // busy() returns value from now on; 255: the limit given
	fuzzStale            // samples of a request granted under an older gen; odd value: toggle fail
	fuzzKinds
)

// normalLoad is the handler time of the steady load after the fuzz input.
const normalLoad = 5 * time.Millisecond

// recoveryGrowth is the number of windows of normal load, after no-load
// latency has been measured under it, that FuzzAdaptive gives the limit to
// grow.
const recoveryGrowth = 200

// FuzzAdaptive plays an arbitrary sequence of handler times (zero, under a
// microsecond, hours, negative, alternating fast and slow, with any number
// of requests in flight) into the limiter of either algorithm, for a range
// of MinLimit, MaxLimit, Window, Tolerance, Backoff and ProbeEvery. After
// every sample the limit is finite and within [MinLimit, MaxLimit], and so is
// every limit given to the Backend. Then a steady normal load (5 ms, with
// every slot in use) must bring the limit back up:
//
// Every window ends with exactly one SetLimit (the new limit, or MinLimit for
// a probe), so windows are counted by SetLimit calls. The first window of
// normal load may still hold samples of the fuzz input; every later one is
// pure. Within ProbeEvery more windows a probe starts, and the window after it
// measures no-load latency as exactly 5 ms (earlier if a window at the floor,
// or one faster than the no-load latency, measures it first): so by window
// ProbeEvery + 2 no-load latency is 5 ms. From then on every window is within
// Tolerance (5 ms ≤ Tolerance × 5 ms), none is faster than no-load /
// Tolerance, and nothing is app-limited, so every window that is not a probe
// raises the limit: AIMD by 1, Gradient by at least a fifth of its headroom
// max(1, √limit / 2), so by at least 0.2. A probe and the window after it
// (the first requests to finish once the limit is restored, which moves
// nothing) come at most once every three windows (ProbeEvery ≥ 1 windows
// between two probes), so in the next recoveryGrowth = 200 windows at least
// 66 raise the limit: by at least 66 × 1 (AIMD) or 66 × 0.2 = 13 (Gradient),
// from at least MinLimit, up to MaxLimit.
func FuzzAdaptive(f *testing.F) {
	// alg, min, span, window, tolerance, backoff, probe, start, samples
	f.Add(uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), make([]byte, 3*256)) // all zeros
	f.Add(uint8(1), uint8(1), uint8(3), uint8(0), uint8(0), uint8(0), uint8(0), uint8(1),
		[]byte{fuzzZero, 0, 255, fuzzZero, 0, 255})
	f.Add(uint8(0), uint8(2), uint8(3), uint8(0), uint8(0), uint8(0), uint8(0), uint8(2),
		[]byte{fuzzBusy, 255, 0, fuzzMillis, 10, 100, fuzzSubMicro, 200, 255, fuzzMillis, 10, 255, fuzzMillis, 10, 255}) // sub-µs burst, then 10 ms
	f.Add(uint8(1), uint8(4), uint8(2), uint8(3), uint8(2), uint8(1), uint8(4), uint8(2),
		[]byte{fuzzBusy, 255, 0, fuzzMillis, 10, 100, fuzzSubMicro, 7, 40, fuzzMillis, 10, 255})
	f.Add(uint8(0), uint8(1), uint8(4), uint8(0), uint8(3), uint8(0), uint8(3), uint8(3),
		[]byte{fuzzHours, 200, 30, fuzzExtreme, 0, 0, fuzzExtreme, 0, 1, fuzzExtreme, 0, 2, fuzzExtreme, 0, 3, fuzzHours, 0, 255}) // huge values
	f.Add(uint8(1), uint8(0), uint8(0), uint8(1), uint8(5), uint8(2), uint8(1), uint8(0),
		[]byte{fuzzHours, 255, 255, fuzzMillis, 255, 255})
	f.Add(uint8(0), uint8(1), uint8(4), uint8(2), uint8(1), uint8(0), uint8(2), uint8(1),
		[]byte{fuzzBusy, 255, 0, fuzzAlternate, 0, 255, fuzzAlternate, 9, 255, fuzzAlternate, 100, 255}) // alternating fast and slow
	f.Add(uint8(1), uint8(2), uint8(3), uint8(4), uint8(0), uint8(0), uint8(3), uint8(2),
		[]byte{fuzzBusy, 0, 0, fuzzAlternate, 0, 255, fuzzStale, 1, 0, fuzzMillis, 3, 100, fuzzStale, 0, 50, fuzzStale, 1, 0})
	f.Fuzz(func(t *testing.T, alg, minI, spanI, winI, tolI, backI, probeI, startI uint8, data []byte) {
		minL := fuzzMinLimits[int(minI)%len(fuzzMinLimits)]
		cfg := AdaptiveConfig{
			Algorithm:  Algorithm(alg % 2),
			MinLimit:   minL,
			MaxLimit:   minL + fuzzSpans[int(spanI)%len(fuzzSpans)],
			Window:     fuzzWindows[int(winI)%len(fuzzWindows)],
			Tolerance:  fuzzTolerances[int(tolI)%len(fuzzTolerances)],
			Backoff:    fuzzBackoffs[int(backI)%len(fuzzBackoffs)],
			ProbeEvery: fuzzProbes[int(probeI)%len(fuzzProbes)],
		}
		if cfg.validate() != nil {
			return
		}
		s := &fakeSetter{}
		busy, follow := 0, false
		l := newLimiter(cfg, fuzzStarts[int(startI)%len(fuzzStarts)], s, func() int {
			if follow && len(s.args) > 0 {
				return s.args[len(s.args)-1]
			}
			return busy
		})
		lo, hi := l.cfg.MinLimit, l.cfg.MaxLimit
		checked := 0
		check := func(step string) {
			t.Helper()
			l.mu.Lock()
			limit := l.limit
			l.mu.Unlock()
			if math.IsNaN(limit) || math.IsInf(limit, 0) || limit < float64(lo) || limit > float64(hi) {
				t.Fatalf("%s: limit %v outside [%d, %d]", step, limit, lo, hi)
			}
			for ; checked < len(s.args); checked++ {
				if n := s.args[checked]; n < lo || n > hi {
					t.Fatalf("%s: SetLimit(%d), outside [%d, %d]", step, n, lo, hi)
				}
			}
			if d := l.noLoadLatency(); d < 0 {
				t.Fatalf("%s: no-load latency %v", step, d)
			}
		}
		check("start")
		for i := 0; i+2 < len(data); i += 3 {
			kind, v, rep := data[i]%fuzzKinds, data[i+1], int(data[i+2])+1
			switch kind {
			case fuzzBusy:
				busy, follow = int(v), v == 255
				continue
			case fuzzStale:
				if v%2 == 1 {
					s.fail = !s.fail
					continue
				}
			}
			for j := range rep {
				var d time.Duration
				switch kind {
				case fuzzSubMicro:
					d = time.Duration(v) * 3
				case fuzzMicros:
					d = time.Duration(v) * time.Microsecond
				case fuzzMillis, fuzzStale:
					d = time.Duration(v) * time.Millisecond
				case fuzzHours:
					d = time.Duration(v+1) * time.Hour
				case fuzzAlternate:
					d = time.Duration(v)
					if j%2 == 1 {
						d = time.Duration(v+1) * time.Millisecond
					}
				case fuzzExtreme:
					d = []time.Duration{math.MaxInt64, math.MinInt64, -1, 1 << 62}[rep%4]
				}
				gen := l.begin()
				if kind == fuzzStale {
					gen--
				}
				l.sample(gen, d)
				check("fuzz input")
			}
		}

		// Steady normal load: see the derivation above.
		follow, s.fail = true, false
		windows := l.cfg.ProbeEvery + 2 + recoveryGrowth
		maxSamples := windows * max(l.cfg.Window, 200, probeSamples)
		from := len(s.args)
		for n := 0; len(s.args)-from < windows; n++ {
			if n > maxSamples {
				t.Fatalf("%d windows of normal load did not end in %d samples", windows, maxSamples)
			}
			l.sample(l.begin(), normalLoad)
			check("normal load")
		}
		l.mu.Lock()
		limit := int(math.Round(l.limit))
		l.mu.Unlock()
		step := 0.2 // Gradient: a fifth of a headroom of at least 1
		if l.cfg.Algorithm == AIMD {
			step = 1
		}
		want := min(hi, lo+int(step*float64(recoveryGrowth/3)))
		if limit < want {
			t.Fatalf("after %d windows of normal load the limit is %d, want at least %d (no-load latency %v)",
				windows, limit, want, l.noLoadLatency())
		}
		if hi > lo && limit <= lo {
			t.Fatalf("the limit is stuck at MinLimit %d", lo)
		}
		if got := l.noLoadLatency(); got != normalLoad {
			t.Fatalf("no-load latency %v after normal load, want %v", got, normalLoad)
		}
	})
}
