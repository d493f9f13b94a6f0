package ginqueue

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
)

// StatusClientClosedRequest is the status recorded for a request whose
// client hung up while it waited, so access logs can tell it apart; no body
// is written, and the status line goes only to a connection that is already
// gone. It is nginx's 499.
const StatusClientClosedRequest = 499

// Outcome is what became of one request that passed through a Queue.
type Outcome uint8

// The outcomes. Each has its own counter in Stats and its own default
// response.
const (
	// OutcomeServed: the request got a slot and ran the rest of the chain.
	OutcomeServed Outcome = iota
	// OutcomeQueueFull: no free slot and no waiting place (the queue or the
	// flow's share of it full, a place given to a higher priority, a wait
	// RejectEarly expects past QueueTimeout or the client's deadline, a
	// client deadline RejectEarly finds passed on arrival, or a Backend that
	// cannot answer); 503.
	OutcomeQueueFull
	// OutcomeQueueTimeout: waited QueueTimeout without a slot, or the
	// request context's own deadline (a timeout middleware in front, say) or
	// the client's (Config.Deadline) passed while it waited, with or without
	// a QueueTimeout, or the client's had passed on arrival (without
	// RejectEarly); 408, or Config.QueueTimeoutStatus.
	OutcomeQueueTimeout
	// OutcomeCanceled: the client hung up while waiting (its request context
	// was canceled); no body is written, 499 is recorded. Over HTTP/1.x,
	// Go's server notices a client that left only once the request body has
	// been read to its end, so a waiting request with an unread body (a POST
	// or PUT with content) is not canceled: it keeps its place until its turn
	// (its handler then runs, and fails reading the body) or its timeout.
	// HTTP/2 cancels it at once. Reading small bodies before the throttle
	// (a middleware ahead of it) makes their hang-ups visible too.
	OutcomeCanceled
	// OutcomeClosed: the Queue was closed before the request got a slot; 503.
	OutcomeClosed
)

// String returns the outcome's name as used in metric labels: "served",
// "queue_full", "queue_timeout", "canceled" or "closed".
func (o Outcome) String() string {
	switch o {
	case OutcomeServed:
		return "served"
	case OutcomeQueueFull:
		return "queue_full"
	case OutcomeQueueTimeout:
		return "queue_timeout"
	case OutcomeCanceled:
		return "canceled"
	case OutcomeClosed:
		return "closed"
	}
	return "unknown"
}

// Stats is a snapshot of a Queue. Running and Limit count slots, everything
// else requests: without Config.Cost a request holds one slot, so the two are
// the same. Counters only grow, from the Queue's creation. Without
// Config.Cost, Served is never below Running; with it, Running is never
// above the slots granted to the requests counted in Served. Queued,
// QueuedByPriority (which always adds up to Queued) and OldestWait come from
// one view of the queue, as it was at the latest change the in-memory Backend
// has completed. Reading it never waits for the queue's lock.
type Stats struct {
	Running int // slots held by running requests now (Config.Cost each, else 1)
	Queued  int // requests waiting now
	Limit   int // slots in all
	// QueuedByPriority splits Queued by priority, highest first; nil when
	// nobody waits.
	QueuedByPriority []PriorityCount

	Served       uint64 // requests that got their slots (counted when they take them, not when they finish)
	QueueFull    uint64 // requests answered queue full
	QueueTimeout uint64 // requests answered queue timeout
	Canceled     uint64 // requests whose client hung up while waiting
	Closed       uint64 // requests answered because the Queue was closed

	// OldestWait is how long the oldest waiter has waited so far; zero when
	// nobody waits.
	OldestWait time.Duration
	// WaitP50, WaitP90 and WaitP99 are percentiles of the queue waits of the
	// requests served in the last minute, those that ran at once counting as
	// zero; on a log scale, within about 10%.
	WaitP50, WaitP90, WaitP99 time.Duration
	// DrainRate is how many requests finished per second, over about the
	// last ten seconds (or since the previous look, when nobody looked for
	// longer); zero until one has finished. It is what was delivered, which
	// is the demand when nobody waits; Retry-After and RejectEarly use the
	// measured slot time (handler time × slots held) instead.
	DrainRate float64
	// NoLoadLatency is the handler time the adaptive limit measured with
	// few requests in flight; zero without Config.Adaptive or until measured.
	NoLoadLatency time.Duration

	// Unavailable is the Backend's BackendStats.Unavailable: set while it
	// cannot reach the store it shares with other replicas and applies its
	// fallback policy; always false for the in-memory Backend. promqueue's
	// gauge ginqueue_backend_unavailable reads it.
	Unavailable bool
	// Outages is the Backend's BackendStats.Outages: how many times it
	// turned Unavailable since it started; it only grows, and is zero for
	// the in-memory Backend. promqueue's counter
	// ginqueue_backend_outages_total reads it.
	Outages uint64
}

// Queue is one throttle: a set of slots and the queue in front of them. Its
// Handler may guard several route groups, which then share one limit. A
// Queue is safe for concurrent use. Build it with NewQueue.
type Queue struct {
	backend      Backend
	fast         FastBackend // backend, when it has a fast path
	skip         func(*gin.Context) bool
	cost         func(*gin.Context) int       // nil: every request holds one slot
	deadline     func(*gin.Context) time.Time // nil: no client deadlines
	priority     func(*gin.Context) int
	flowKey      func(*gin.Context) string
	onFull       gin.HandlerFunc
	onTimeout    gin.HandlerFunc
	onClosed     gin.HandlerFunc
	onOutcome    func(*gin.Context, Outcome, time.Duration)
	retryAfter   string // before any request has finished
	serverTiming bool
	noWait       []string // {"queue;dur=0"}, the Server-Timing of a request that did not wait
	rejectEarly  bool
	timeout      time.Duration
	timeoutCode  int // the status of the default queue-timeout response
	handler      gin.HandlerFunc

	waits    waitRecorder
	drain    drainMeter
	service  serviceMeter
	adaptive *limiter // nil unless Config.Adaptive

	// finished counts the requests that released their slot, for a Backend
	// that is not a FastBackend (a FastBackend counts them itself).
	finished atomic.Uint64

	// counts of the rejections, by Outcome; the Backend counts Served, so
	// that a request that runs writes nothing here.
	counts [OutcomeClosed + 1]atomic.Uint64

	// closed is set by Close before the Backend closes, so that an arrival
	// after Close is closed whatever RejectEarly would say of it.
	closed atomic.Bool
}

// New returns the middleware of a new Queue built from cfg. It panics with a
// message starting "ginqueue: " that names the bad field if cfg is invalid
// (see Config.Validate). Every call makes an independent limit; to share one
// limit between route groups, build one Queue and use its Handler.
func New(cfg Config) gin.HandlerFunc {
	q, err := NewQueue(cfg)
	if err != nil {
		panic(err)
	}
	return q.Handler()
}

// NewQueue builds a Queue from cfg. It returns an error naming the bad field
// if cfg is invalid, or the Backend's error if it cannot start.
func NewQueue(cfg Config) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := cfg.Backend
	if b == nil {
		b = NewMemoryBackend()
	}
	if err := b.Start(cfg.limits()); err != nil {
		return nil, err
	}
	q := &Queue{
		backend:      b,
		skip:         cfg.Skip,
		cost:         cfg.Cost,
		deadline:     cfg.Deadline,
		priority:     cfg.Priority,
		flowKey:      cfg.FlowKey,
		onFull:       cfg.OnQueueFull,
		onTimeout:    cfg.OnQueueTimeout,
		onClosed:     cfg.OnClosed,
		onOutcome:    cfg.OnOutcome,
		retryAfter:   retryAfterHeader(cfg.RetryAfter),
		serverTiming: cfg.ServerTiming,
		noWait:       []string{serverTiming(0)},
		rejectEarly:  cfg.RejectEarly,
		timeout:      cfg.QueueTimeout,
		timeoutCode:  cmp.Or(cfg.QueueTimeoutStatus, http.StatusRequestTimeout),
	}
	q.fast, _ = b.(FastBackend)
	now := time.Now()
	q.drain.rate(now, 0) // the base of the first drain rate
	q.waits.start(now)
	if cfg.Adaptive != nil {
		ls, ok := b.(LimitSetter)
		if !ok {
			_ = b.Close()
			return nil, fmt.Errorf("ginqueue: Config.Adaptive needs a Backend that implements LimitSetter; %T does not", b)
		}
		// The demand on the limit: the slots in use and the requests waiting
		// for one. Running alone, read at the instant a window ends, can be
		// low while a queue waits (the handlers that just ended have released
		// and the next ones are not yet granted), and would hold the limit.
		q.adaptive = newLimiter(*cfg.Adaptive, cfg.MaxConcurrent, ls, func() int {
			l := q.load()
			return l.running + l.queued
		})
	}
	q.handler = q.serve
	return q, nil
}

// Handler returns the Queue's middleware. Every call returns the same
// throttle: route groups that use it share the Queue's slots and queue.
func (q *Queue) Handler() gin.HandlerFunc { return q.handler }

// serviceEvery: one in this many requests served at once is timed.
const serviceEvery = 16

// serve is the middleware. It waits in the request's own goroutine and runs
// the rest of the chain there, so the pooled gin.Context never leaves it.
func (q *Queue) serve(c *gin.Context) {
	if q.skip != nil && q.skip(c) {
		c.Next()
		return
	}
	if q.deadline != nil {
		r, cancel, err := q.bindDeadline(c)
		if err != nil {
			q.reject(c, err, 0)
			return
		}
		if cancel != nil {
			defer unbindDeadline(c, r, cancel) // after the slot is released and OnOutcome has run
		}
	}
	var t Ticket
	var wait time.Duration
	var n uint64 // slots the fast path took so far, this one included; 0 if not
	// The slots asked for: only a request of cost 1 tries the fast path.
	cost := 1
	if q.cost == nil {
		if q.fast != nil {
			n = q.fast.TryAcquire()
		}
	} else if cost = max(q.cost(c), 1); cost == 1 && q.fast != nil {
		n = q.fast.TryAcquire()
	}
	if n == 0 {
		var err error
		if t, wait, err = q.wait(c, cost); err != nil {
			q.reject(c, err, wait)
			return
		}
	}
	// The handler time of every request that went through Acquire, and of
	// one in serviceEvery of the others (the first included), is a sample
	// of how long a request holds its slots; it stands for the requests of
	// its path that it was timed among (see serviceMeter).
	var of int // 0: not timed
	switch {
	case n == 0:
		of = 1
	case n%serviceEvery == 1:
		of = serviceEvery
	}
	if q.serverTiming {
		if wait == 0 {
			// Preset, so the fast path allocates nothing: len and cap 1, so
			// an Add by a handler copies instead of writing into it.
			c.Writer.Header()["Server-Timing"] = q.noWait[:1:1]
		} else {
			c.Header("Server-Timing", serverTiming(wait))
		}
	}
	// A deferred release gives the slot back even when a handler panics and
	// gin.Recovery catches it further up.
	if of == 0 && q.onOutcome == nil && q.adaptive == nil {
		defer q.release(t)
		c.Next()
		return
	}
	var gen uint64
	var start time.Time
	if q.adaptive != nil {
		gen = q.adaptive.begin()
	}
	if of > 0 || q.adaptive != nil {
		start = time.Now()
	}
	defer q.done(c, t, wait, gen, start, of)
	c.Next()
}

// done ends a served request that is timed, or has a hook or an adaptive
// limit: the handler time becomes a sample, the slot is released, then
// OnOutcome runs, so a hook that panics cannot keep the slot.
func (q *Queue) done(c *gin.Context, t Ticket, wait time.Duration, gen uint64, start time.Time, of int) {
	if !start.IsZero() {
		took := time.Since(start)
		if q.adaptive != nil {
			q.adaptive.sample(gen, took)
		}
		if of > 0 {
			q.service.sample(took, max(t.Cost, 1), of)
		}
	}
	q.release(t)
	if q.onOutcome != nil {
		q.onOutcome(c, OutcomeServed, wait)
	}
}

// release gives a slot back, counting it for a Backend that does not.
func (q *Queue) release(t Ticket) {
	if q.fast == nil {
		q.finished.Add(1)
	}
	q.backend.Release(t)
}

// wait gets cost slots for c from the Backend when the fast path could not
// (or, for a cost above 1, was not tried). Only a request that may have to
// wait pays for its priority, flow key and clock.
func (q *Queue) wait(c *gin.Context, cost int) (Ticket, time.Duration, error) {
	if q.closed.Load() {
		return Ticket{}, 0, ErrClosed
	}
	start := time.Now()
	ctx, a := c.Request.Context(), q.arrival(c)
	a.Cost = cost
	budget := q.budget(ctx, start)
	var t Ticket
	var err error
	if q.fast != nil {
		a.MaxAhead = q.maxAhead(q.fast.Counts().Limit, budget) // applied as the arrival takes its place
		t, err = q.fast.Acquire(ctx, a)
	} else if q.rejectEarly && q.tooFarBack(a, budget) {
		err = errRejectedEarly
	} else {
		t, err = q.backend.Acquire(ctx, a)
	}
	now := time.Now()
	wait := now.Sub(start)
	if err == nil {
		fast, _ := q.progress()
		q.waits.record(wait, now, fast)
	}
	return t, wait, err
}

// loadCounts is the Backend's slots and queue now.
type loadCounts struct{ running, queued, limit int }

// load reads the Backend's counts, cheaply for the in-memory one (no split
// by priority, no allocation).
func (q *Queue) load() loadCounts {
	if q.fast != nil {
		c := q.fast.Counts()
		return loadCounts{running: c.Running, queued: c.Queued, limit: c.Limit}
	}
	b := q.backend.Stats()
	return loadCounts{running: b.Running, queued: b.Queued, limit: b.Limit}
}

// progress is how many requests were served without waiting (by the fast
// path, which records no wait) and how many released their slot.
func (q *Queue) progress() (fast, finished uint64) {
	if q.fast != nil {
		c := q.fast.Counts()
		return c.Fast, c.Finished
	}
	return 0, q.finished.Load()
}

// errRejectedEarly is ErrQueueFull for RejectEarly.
var errRejectedEarly = fmt.Errorf("%w: the expected wait exceeds QueueTimeout or the client's deadline", ErrQueueFull)

// maxAhead is RejectEarly's bound, as Arrival.MaxAhead, for slots of the
// given limit and an arrival that may wait budget (see budget): an arrival
// whose expected wait, (ahead + 1) × slot time / limit, would exceed budget
// has at least budget × limit / slot time waiters ahead. The slot time is
// the measured mean of handler time × slots held, so with Config.Cost the
// waiters ahead count as requests of the mix served so far, whatever each
// of them costs. Zero (no bound) with RejectEarly off, or before a handler
// time is measured, so nobody is refused on a guess; -1 when even the first
// in line would wait too long.
func (q *Queue) maxAhead(limit int, budget time.Duration) int {
	if !q.rejectEarly {
		return 0
	}
	perSlot, ok := q.service.mean()
	if !ok || perSlot <= 0 {
		return 0
	}
	n := math.Floor(float64(budget) * float64(q.servingLimit(limit)) / float64(perSlot))
	switch {
	case !(n < math.MaxInt32):
		return 0
	case n < 1:
		return -1
	}
	return int(n)
}

// tooFarBack applies maxAhead's bound for a Backend that is not a
// FastBackend, from its Stats: the waiters of a's priority or higher. An
// arrival that finds a free slot and nobody waiting would not wait, so no
// bound refuses it (Arrival.MaxAhead's rule).
func (q *Queue) tooFarBack(a Arrival, budget time.Duration) bool {
	b := q.backend.Stats()
	if b.Queued == 0 && b.Running < b.Limit {
		return false
	}
	m := q.maxAhead(b.Limit, budget)
	return m < 0 || m > 0 && aheadIn(b, a) >= m
}

// aheadIn is the number of waiters of a Backend other than the in-memory
// one that would be served before a: those of a's priority or higher (the
// in-memory one also counts the turns of flows exactly).
func aheadIn(b BackendStats, a Arrival) int {
	if b.QueuedByPriority == nil {
		return b.Queued
	}
	n := 0
	for _, p := range b.QueuedByPriority {
		if p.Priority >= a.Priority {
			n += p.Queued
		}
	}
	return n
}

// drainTime is how long limit slots take to serve n requests of perSlot
// each, saturating instead of overflowing.
func drainTime(n int, perSlot time.Duration, limit int) time.Duration {
	d := float64(n) * float64(perSlot) / float64(max(limit, 1))
	if !(d < math.MaxInt64) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(d)
}

// retryAfterNow is the Retry-After for a request turned away now, in whole
// seconds, at least one: how long the slots take to serve the queue at the
// measured slot time, and never more than QueueTimeout, by which time
// every waiter now has left. Config.RetryAfter until a timed request has
// finished.
func (q *Queue) retryAfterNow() string {
	perSlot, ok := q.service.mean()
	if !ok {
		return q.retryAfter
	}
	l := q.load()
	secs := math.Ceil(drainTime(l.queued+1, perSlot, q.servingLimit(l.limit)).Seconds())
	if q.timeout > 0 {
		// Whole seconds, rounded down: a header above QueueTimeout would
		// send clients back later than every waiter has gone.
		secs = min(secs, math.Floor(q.timeout.Seconds()))
	}
	return strconv.Itoa(int(max(secs, 1)))
}

// servingLimit is the limit the slots serve at, for estimates: the Backend's
// limit, or with Adaptive the limit outside probes (a probe holds MinLimit
// for a few samples only).
func (q *Queue) servingLimit(limit int) int {
	if q.adaptive != nil {
		return int(q.adaptive.steady.Load())
	}
	return limit
}

// serverTiming renders a queue wait as a Server-Timing value in ms.
func serverTiming(wait time.Duration) string {
	if wait == 0 {
		return "queue;dur=0"
	}
	return "queue;dur=" + strconv.FormatFloat(float64(wait)/float64(time.Millisecond), 'f', 3, 64)
}

// arrival describes c for the Backend.
func (q *Queue) arrival(c *gin.Context) Arrival {
	var a Arrival
	if q.priority != nil {
		a.Priority = q.priority(c)
	}
	if q.flowKey != nil {
		a.Flow = q.flowKey(c)
	}
	return a
}

// reject answers a request that got no slot, after waiting wait.
func (q *Queue) reject(c *gin.Context, err error, wait time.Duration) {
	o := outcomeOf(c.Request.Context(), err)
	q.counts[o].Add(1)
	c.Abort()
	switch o {
	case OutcomeCanceled:
		// Nobody is listening: record the status for access logs only.
		c.Status(StatusClientClosedRequest)
	case OutcomeQueueTimeout:
		q.respond(c, q.onTimeout, q.timeoutCode)
	case OutcomeClosed:
		q.respond(c, q.onClosed, http.StatusServiceUnavailable)
	default:
		q.respond(c, q.onFull, http.StatusServiceUnavailable)
	}
	if q.onOutcome != nil {
		q.onOutcome(c, o, wait)
	}
}

// respond answers with status and a Retry-After header, or runs hook with
// both preset: a hook that writes nothing then answers with the default
// (gin writes the preset status once the chain returns), so a rejected
// request never looks served; one that sets its own status or writes a body
// wins. A response an earlier middleware wrote is left alone: a later status
// would be ignored.
func (q *Queue) respond(c *gin.Context, hook gin.HandlerFunc, status int) {
	if !c.Writer.Written() {
		c.Header("Retry-After", q.retryAfterNow())
		if hook == nil {
			c.AbortWithStatus(status)
			return
		}
		c.Status(status)
	}
	if hook != nil {
		hook(c)
	}
}

// outcomeOf maps an Acquire error for a request whose context is ctx to its
// outcome. What the Backend says wins over any cause its error wraps: a
// remote Backend whose own call timed out wraps context.DeadlineExceeded,
// and that is an unavailable backend (queue full), not a queue timeout. Only
// ErrQueueTimeout or the request's own context makes a queue timeout.
func outcomeOf(ctx context.Context, err error) Outcome {
	switch {
	case errors.Is(err, ErrClosed):
		return OutcomeClosed
	case errors.Is(err, ErrQueueFull):
		return OutcomeQueueFull
	case errors.Is(err, ErrQueueTimeout):
		return OutcomeQueueTimeout
	}
	switch cerr := ctx.Err(); {
	case cerr == nil:
		// The request is still there: the Backend failed it some other way.
		return OutcomeQueueFull
	case errors.Is(cerr, context.DeadlineExceeded):
		// A deadline on the request's context (a timeout middleware, say)
		// that passes in the queue is a queue timeout: the client is still
		// there and gets its queue-timeout response.
		return OutcomeQueueTimeout
	}
	return OutcomeCanceled
}

// Stats returns a snapshot of the Queue's slots, queue, counters and waits.
func (q *Queue) Stats() Stats {
	b := q.backend.Stats()
	now := time.Now()
	st := Stats{
		Running:          b.Running,
		Queued:           b.Queued,
		Limit:            b.Limit,
		QueuedByPriority: b.QueuedByPriority,
		Served:           b.Served,
		QueueFull:        q.counts[OutcomeQueueFull].Load(),
		QueueTimeout:     q.counts[OutcomeQueueTimeout].Load(),
		Canceled:         q.counts[OutcomeCanceled].Load(),
		Closed:           q.counts[OutcomeClosed].Load(),
		OldestWait:       b.OldestWait,
		Unavailable:      b.Unavailable,
		Outages:          b.Outages,
	}
	fast, finished := q.progress()
	st.WaitP50, st.WaitP90, st.WaitP99 = q.waits.percentiles(now, fast)
	st.DrainRate, _ = q.drain.rate(now, finished)
	if q.adaptive != nil {
		st.NoLoadLatency = q.adaptive.noLoadLatency()
	}
	return st
}

// SetLimit changes the number of slots while the Queue runs. Raising it wakes
// waiters at once; lowering it preempts nobody: running requests finish and
// a request is admitted only once its slots (Config.Cost) fit under n beside
// those still held. A request keeps the slots it was granted, and gives back
// exactly those. With Config.Adaptive the algorithm goes on from n (within
// its MinLimit and MaxLimit). It returns an error (CheckLimit's) for n < 1
// or n > MaxLimit, or for a Backend that cannot change its limit.
func (q *Queue) SetLimit(n int) error {
	ls, ok := q.backend.(LimitSetter)
	if !ok {
		return fmt.Errorf("ginqueue: SetLimit: the Backend %T cannot change its limit", q.backend)
	}
	if q.adaptive != nil {
		return q.adaptive.set(n)
	}
	return ls.SetLimit(n)
}

// WaitHistogram returns the distribution of queue waits of the requests
// served since the Queue was built; those that ran at once are in the first
// bucket. It is what the promqueue collector exports.
func (q *Queue) WaitHistogram() WaitHistogram {
	fast, _ := q.progress()
	return q.waits.histogram(fast)
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
		OldestWait       float64      `json:"oldest_wait_seconds"`
		WaitP50          float64      `json:"wait_p50_seconds"`
		WaitP90          float64      `json:"wait_p90_seconds"`
		WaitP99          float64      `json:"wait_p99_seconds"`
		DrainRate        float64      `json:"drain_rate_per_second"`
		NoLoadLatency    float64      `json:"no_load_latency_seconds"`
		Unavailable      bool         `json:"unavailable"`
		Outages          uint64       `json:"outages"`
	}{s.Running, s.Queued, s.Limit, split, s.Served, s.QueueFull, s.QueueTimeout, s.Canceled, s.Closed,
		s.OldestWait.Seconds(), s.WaitP50.Seconds(), s.WaitP90.Seconds(), s.WaitP99.Seconds(), s.DrainRate,
		s.NoLoadLatency.Seconds(), s.Unavailable, s.Outages})
}

// Close stops admitting: new arrivals and every waiting request are answered
// as closed (503) at once. Requests already running finish normally. It
// returns the Backend's error, if any, and may be called more than once.
func (q *Queue) Close() error {
	q.closed.Store(true)
	return q.backend.Close()
}

// Shutdown closes the Queue, then waits until every request running on it
// has finished, or until ctx ends, when it returns ctx.Err(); Close's error,
// if any, first. Once it returns, every arrival is answered as closed. Call
// it before http.Server.Shutdown: waiters are answered 503 at once instead
// of holding the server's shutdown for up to QueueTimeout. The Backend's
// Close runs to its end first: redisqueue's, with releases to give back to
// a Redis that does not answer, can take up to its LeaseTTL.
func (q *Queue) Shutdown(ctx context.Context) error {
	if err := q.Close(); err != nil {
		return err
	}
	return q.backend.Drain(ctx)
}
