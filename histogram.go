package ginqueue

import (
	"math"
	"sync"
	"time"
)

// waitBounds are the upper bounds, in seconds, of the buckets of
// Queue.WaitHistogram: from 100 µs to a minute, finer from half a second to
// 2.5 s, where queue timeouts and clients' patience usually sit. Read only.
var waitBounds = [26]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5,
	.6, .7, .8, .9, 1, 1.25, 1.5, 1.75, 2, 2.5, 5, 10, 30, 60}

// WaitBuckets returns the upper bounds, in seconds, of the buckets of
// Queue.WaitHistogram, from 100 µs to a minute, in a new slice each call:
// WaitHistogram.Counts[i] counts the waits up to WaitBuckets()[i].
func WaitBuckets() []float64 { b := waitBounds; return b[:] }

// WaitHistogram is the distribution of the queue waits of served requests
// since the Queue was built, in the shape of a Prometheus histogram.
type WaitHistogram struct {
	// Counts[i] is the number of waits up to WaitBuckets()[i], cumulative:
	// one for each of the 26 bounds.
	Counts [26]uint64
	// Count is the number of served requests; Sum their waits in seconds.
	Count uint64
	Sum   float64
}

const (
	fineBuckets = 112 // 2^(1/4) steps from 1 µs: the last starts near 4.6 min
	subWindows  = 6
	subWindow   = 10 * time.Second // percentiles cover the last minute
)

// waitRecorder keeps the waits of served requests. Requests that ran at once
// (the fast path) record nothing: their wait of zero is counted from the
// Backend's count of them, so the fast path writes nothing here. Every
// bucket is that count, which only grows, plus recorded waits, which only
// grow: no bucket ever goes down.
type waitRecorder struct {
	mu sync.Mutex
	// All fields are guarded by mu.
	coarse [len(waitBounds) + 1]uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	n      uint64 // recorded waits

	// A ring of sub-windows; cur is the newest, started at curStart.
	subs     [subWindows]fineWindow
	cur      int
	curStart time.Time
}

// fineWindow is the recorded waits of one sub-window on a log scale, and the
// count of requests served at once when it began (to count the zero waits in
// it).
type fineWindow struct {
	fastAtStart uint64
	buckets     [fineBuckets]uint32
	n           uint64
}

// start opens the window when the Queue is built, so that requests served
// before the first wait is recorded count too.
func (r *waitRecorder) start(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rotate(now, 0)
}

// record adds the wait of one request that went through the queue and was
// served; fast is the count of requests served at once so far.
func (r *waitRecorder) record(wait time.Duration, now time.Time, fast uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	secs := wait.Seconds()
	i := 0
	for i < len(waitBounds) && secs > waitBounds[i] {
		i++
	}
	r.coarse[i]++
	r.sum += secs
	r.n++
	r.rotate(now, fast)
	w := &r.subs[r.cur]
	w.buckets[fineIndex(wait)]++
	w.n++
}

// fineIndex is the log-scale bucket of d: 4 per doubling from 1 µs.
func fineIndex(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us < 1 {
		return 0
	}
	return min(int(4*math.Log2(us))+1, fineBuckets-1)
}

// fineValue is the middle of fine bucket i, on the log scale.
func fineValue(i int) time.Duration {
	if i == 0 {
		return 0
	}
	return time.Duration(math.Exp2((float64(i)-0.5)/4) * float64(time.Microsecond))
}

// rotate moves the window to now. Requires r.mu.
func (r *waitRecorder) rotate(now time.Time, fast uint64) {
	if r.curStart.IsZero() || now.Sub(r.curStart) >= subWindows*subWindow {
		r.subs = [subWindows]fineWindow{}
		for i := range r.subs {
			r.subs[i].fastAtStart = fast
		}
		r.cur, r.curStart = 0, now
		return
	}
	for now.Sub(r.curStart) >= subWindow {
		r.cur = (r.cur + 1) % subWindows
		r.subs[r.cur] = fineWindow{fastAtStart: fast}
		r.curStart = r.curStart.Add(subWindow)
	}
}

// percentiles returns the p50, p90 and p99 of the waits of the requests
// served in the last minute, counting those that ran at once (fast so far)
// as zero.
func (r *waitRecorder) percentiles(now time.Time, fast uint64) (p50, p90, p99 time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rotate(now, fast)
	oldest := &r.subs[(r.cur+1)%subWindows]
	var merged [fineBuckets]uint64
	var recorded uint64
	for i := range r.subs {
		for b, c := range r.subs[i].buckets {
			merged[b] += uint64(c)
		}
		recorded += r.subs[i].n
	}
	// fast was read before r.mu: a record that rotated the windows since may
	// have started them from a later count.
	zeros := fast - min(fast, oldest.fastAtStart)
	total := zeros + recorded
	if total == 0 {
		return 0, 0, 0
	}
	at := func(q float64) time.Duration {
		rank := uint64(math.Ceil(q * float64(total)))
		if rank <= zeros {
			return 0
		}
		seen := zeros
		for b, c := range merged {
			seen += c
			if seen >= rank {
				return fineValue(b)
			}
		}
		return fineValue(fineBuckets - 1)
	}
	return at(0.50), at(0.90), at(0.99)
}

// histogram returns the cumulative histogram, with the fast requests that
// ran at once in the first bucket.
func (r *waitRecorder) histogram(fast uint64) WaitHistogram {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := WaitHistogram{Count: fast + r.n, Sum: r.sum}
	cum := fast
	for i := range waitBounds {
		cum += r.coarse[i]
		h.Counts[i] = cum
	}
	return h
}
