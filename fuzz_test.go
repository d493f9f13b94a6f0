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
	cost      int    // asked for: 0 means 1
	ticket    Ticket // once granted
	at        time.Duration
	cancel    context.CancelFunc
	outcome   error // nil while waiting or holding
	done      bool
	holds     bool
	grantStep int // the step in which it was granted; 0 if never
}

func playSchedule(t *testing.T, data []byte) {
	l := Limits{
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
	d := NewMemoryBackend().(*dispatcher)
	if err := d.Start(l); err != nil {
		t.Fatalf("start %+v: %v", l, err)
	}
	t0 := time.Now()
	type outcome struct {
		id  int
		t   Ticket
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
					if errors.Is(r.err, ErrQueueTimeout) && r.at-a.at != l.QueueTimeout {
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
		if w := d.room.peek(false); w != nil && fits(d.state.Load(), w.cost) != 0 {
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
				tk, err := d.Acquire(ctx, Arrival{Priority: a.prio, Flow: a.flow, Cost: a.cost})
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
