package ginqueue

import (
	"encoding/json"
	"net/http"
	"runtime"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue/backend"
)

// What a Queue reports: Stats, its JSON and the status handler.

// Stats is a snapshot of a Queue: the Backend's figures (Running, Queued,
// Limit, Served and the rest of backend.Stats) and the Queue's own counters
// and waits. Running, Held and Limit count slots, everything else
// requests.
// Counters only grow, from the Queue's creation. docs/observability.md
// describes every field.
type Stats struct {
	backend.Stats

	QueueFull    uint64 // requests answered queue full
	QueueTimeout uint64 // requests answered queue timeout
	Canceled     uint64 // requests whose client hung up while waiting
	Closed       uint64 // requests answered because the Queue was closed
	// Panicked counts the requests answered OutcomePanic: a Config function
	// asked of them panicked, and gin.Recovery answered them.
	Panicked uint64
	// Abandoned counts the served requests whose request context had ended
	// by the time their handler chain returned: their answers most likely
	// reached nobody. It is part of Served, not an outcome of its own.
	Abandoned uint64

	// WaitP50, WaitP90 and WaitP99 are percentiles of the queue waits of the
	// requests served in the last minute, within about 10%. A request that
	// ran at once counts as a wait of zero.
	WaitP50, WaitP90, WaitP99 time.Duration
	// DrainRate is how many requests finished per second, over about the
	// last ten seconds; zero until one has finished.
	DrainRate float64
	// NoLoadLatency is the handler time the adaptive limit measured with
	// few requests in flight; zero without Config.Adaptive or until measured.
	NoLoadLatency time.Duration
}

// Count is the counter of outcome o: Served, QueueFull, QueueTimeout,
// Canceled, Closed or Panicked; 0 for a value that is no outcome.
func (s Stats) Count(o Outcome) uint64 {
	switch o {
	case OutcomeServed:
		return s.Served
	case OutcomeQueueFull:
		return s.QueueFull
	case OutcomeQueueTimeout:
		return s.QueueTimeout
	case OutcomeCanceled:
		return s.Canceled
	case OutcomeClosed:
		return s.Closed
	case OutcomePanic:
		return s.Panicked
	}
	return 0
}

// Stats returns a snapshot of the Queue's slots, queue, counters and waits.
// It never waits behind waiters. Abandoned is never above Served. The
// other counters hold values they all held at one instant, so a rejection
// answered before a request was served is never missing beside it. That
// may fail only when answers change them during each of many reads.
func (q *Queue) Stats() Stats {
	st, b := q.cut()
	now := time.Now()
	st.Stats = b
	p := q.progress()
	st.ServedAtOnce, st.Released, st.Held = p.ServedAtOnce, p.Released, b.Running
	if q.fast != nil {
		st.Held = p.Held
	}
	st.WaitP50, st.WaitP90, st.WaitP99 = q.waits.percentiles(now, p.ServedAtOnce)
	st.DrainRate, _ = q.drain.rate(now, p.Released)
	if q.adaptive != nil {
		st.NoLoadLatency = q.adaptive.noLoadLatency()
	}
	return st
}

// cutTries bounds the reads cut makes before it settles for an ordered one.
const cutTries = 64

// cut reads the Queue's counters and the Backend's Stats as of one instant.
// It reads the Queue's counters before and after the Backend's, and keeps
// them when both reads agree. The counters only grow, so equal reads mean
// they held those values all through the Backend's read. The Backend's
// Served grows by one at a time, so it held the value read at some instant
// of that read. After cutTries reads that disagree, cut uses the last pair.
// Its Abandoned was read before the Backend's Served, the reverse of the
// order in which a request moves them, so Abandoned stays at most Served.
func (q *Queue) cut() (Stats, backend.Stats) {
	t := q.tally()
	for try := 1; ; try++ {
		b := q.backend.Stats()
		again := q.tally()
		if again == t || try == cutTries {
			return t.stats(), b
		}
		t = again
		if try%8 == 0 {
			runtime.Gosched() // answers keep coming: let them pass
		}
	}
}

// tally is the counters the Queue keeps itself: the rejections by outcome
// and the abandoned requests.
type tally struct {
	counts    [numOutcomes]uint64
	abandoned uint64
}

// tally reads the Queue's counters, Abandoned first.
func (q *Queue) tally() tally {
	var t tally
	t.abandoned = q.abandoned.Load()
	for o := range t.counts {
		t.counts[o] = q.counts[o].Load()
	}
	return t
}

// stats is t as the counters of a Stats.
func (t tally) stats() Stats {
	return Stats{
		QueueFull:    t.counts[OutcomeQueueFull],
		QueueTimeout: t.counts[OutcomeQueueTimeout],
		Canceled:     t.counts[OutcomeCanceled],
		Closed:       t.counts[OutcomeClosed],
		Panicked:     t.counts[OutcomePanic],
		Abandoned:    t.abandoned,
	}
}

// WaitHistogram returns the distribution of queue waits of the requests
// served since the Queue was built; those that ran at once are in the first
// bucket. It is what the promqueue collector exports.
func (q *Queue) WaitHistogram() WaitHistogram {
	return q.waits.histogram(q.progress().ServedAtOnce)
}

// StatusHandler returns a handler that writes Stats as JSON, for an
// operations route. Durations are in seconds.
func (q *Queue) StatusHandler() gin.HandlerFunc {
	return func(c *gin.Context) { c.JSON(http.StatusOK, q.Stats()) }
}

// MarshalJSON writes Stats with snake_case names and durations in seconds.
func (s Stats) MarshalJSON() ([]byte, error) {
	type byPriority struct {
		Priority int `json:"priority"`
		Queued   int `json:"queued"`
	}
	split := make([]byPriority, len(s.QueuedByPriority))
	for i, p := range s.QueuedByPriority {
		split[i] = byPriority(p)
	}
	return json.Marshal(struct {
		Running          int          `json:"running"`
		Queued           int          `json:"queued"`
		Limit            int          `json:"limit"`
		QueuedByPriority []byPriority `json:"queued_by_priority"`
		Served           uint64       `json:"served"`
		QueueFull        uint64       `json:"queue_full"`
		QueueTimeout     uint64       `json:"queue_timeout"`
		Canceled         uint64       `json:"canceled"`
		Closed           uint64       `json:"closed"`
		Panicked         uint64       `json:"panicked"`
		Abandoned        uint64       `json:"abandoned"`
		OldestWait       float64      `json:"oldest_wait_seconds"`
		WaitP50          float64      `json:"wait_p50_seconds"`
		WaitP90          float64      `json:"wait_p90_seconds"`
		WaitP99          float64      `json:"wait_p99_seconds"`
		DrainRate        float64      `json:"drain_rate_per_second"`
		NoLoadLatency    float64      `json:"no_load_latency_seconds"`
		Unavailable      bool         `json:"unavailable"`
		Outages          uint64       `json:"outages"`
		Held             int          `json:"held"`
		ServedAtOnce     uint64       `json:"served_at_once"`
		Released         uint64       `json:"released"`
	}{s.Running, s.Queued, s.Limit, split, s.Served, s.QueueFull, s.QueueTimeout, s.Canceled, s.Closed, s.Panicked, s.Abandoned,
		s.OldestWait.Seconds(), s.WaitP50.Seconds(), s.WaitP90.Seconds(), s.WaitP99.Seconds(), s.DrainRate,
		s.NoLoadLatency.Seconds(), s.Unavailable, s.Outages, s.Held, s.ServedAtOnce, s.Released})
}
