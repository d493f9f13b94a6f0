package ginqueue

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue/backend"
)

// Queue is one throttle: a set of slots and the queue in front of them. Its
// Handler may guard several route groups, which then share one limit. A
// Queue is safe for concurrent use. Build it with NewQueue.
type Queue struct {
	backend      backend.Backend
	fast         backend.FastBackend // backend, when it has a fast path
	minTimeLeft  time.Duration       // Config.MinTimeLeft; applies only with deadline
	retryAfter   string              // before any request has finished
	serverTiming bool
	noWait       []string // {"queue;dur=0"}, the Server-Timing of a request that did not wait
	rejectEarly  bool
	timeout      time.Duration
	timeoutCode  int // the status of the default queue-timeout response
	handler      gin.HandlerFunc

	configFuncs
	meters

	// closed is set by Close before the Backend closes, so that an arrival
	// after Close is closed whatever RejectEarly would say of it.
	closed atomic.Bool
}

// configFuncs are the functions of a Config that a Queue calls.
type configFuncs struct {
	skip       func(*gin.Context) bool
	cost       func(*gin.Context) int       // nil: every request holds one slot
	deadline   func(*gin.Context) time.Time // nil: no client deadlines
	priority   func(*gin.Context) int
	flowKey    func(*gin.Context) string
	onFull     gin.HandlerFunc
	onTimeout  gin.HandlerFunc
	onClosed   gin.HandlerFunc
	onOutcome  func(*gin.Context, Outcome, time.Duration)
	onDecision func(*gin.Context, Decision)
}

// meters are what a Queue measures and counts of the requests it serves.
type meters struct {
	waits   waitRecorder
	drain   drainMeter
	service serviceMeter
	// handlerTime is the handler time MinTimeLeft's default starts from;
	// sampled only with Config.Deadline.
	handlerTime handlerMeter
	adaptive    *limiter // nil unless Config.Adaptive

	// finished counts the requests that released their slot, for a Backend
	// that is not a FastBackend (a FastBackend counts them itself).
	finished atomic.Uint64

	// counts of the rejections, by Outcome; the Backend counts Served, so
	// that a request that runs writes nothing here.
	counts [numOutcomes]atomic.Uint64

	// abandoned counts the served requests whose request context, as the
	// Queue passed it on, had ended by the time the handler chain returned
	// (Stats.Abandoned).
	abandoned atomic.Uint64
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
		b = newMemoryBackend()
	}
	if err := b.Start(cfg.limits()); err != nil {
		return nil, err
	}
	q := &Queue{
		backend:      b,
		minTimeLeft:  cfg.MinTimeLeft,
		retryAfter:   retryAfterHeader(cfg.RetryAfter),
		serverTiming: cfg.ServerTiming,
		noWait:       []string{serverTiming(0)},
		rejectEarly:  cfg.RejectEarly,
		timeout:      cfg.QueueTimeout,
		timeoutCode:  cmp.Or(cfg.QueueTimeoutStatus, http.StatusRequestTimeout),
		configFuncs: configFuncs{skip: cfg.Skip, cost: cfg.Cost, deadline: cfg.Deadline, priority: cfg.Priority,
			flowKey: cfg.FlowKey, onFull: cfg.OnQueueFull, onTimeout: cfg.OnQueueTimeout, onClosed: cfg.OnClosed,
			onOutcome: cfg.OnOutcome, onDecision: cfg.OnDecision},
	}
	if p, ok := b.(backend.FastPather); ok {
		q.fast = p.FastPath()
	}
	now := time.Now()
	q.drain.rate(now, 0) // the base of the first drain rate
	q.waits.start(now)
	if cfg.Adaptive != nil {
		ls, ok := b.(backend.LimitSetter)
		if !ok {
			_ = b.Close()
			return nil, fmt.Errorf("ginqueue: Config.Adaptive needs a Backend that implements backend.LimitSetter; %T does not", b)
		}
		// The demand on the limit: the slots in use and the requests waiting
		// for one. Running alone, read at the instant a window ends, can be
		// low while a queue waits (the handlers that just ended have released
		// and the next ones are not yet granted), and would hold the limit.
		q.adaptive = newLimiter(*cfg.Adaptive, cfg.MaxConcurrent, ls, func() int {
			l := q.load()
			return l.Running + l.Queued
		})
	}
	q.handler = q.serve
	return q, nil
}

// Handler returns the Queue's middleware. Every call returns the same
// throttle: route groups that use it share the Queue's slots and queue.
func (q *Queue) Handler() gin.HandlerFunc { return q.handler }

// serve is the middleware. It waits in the request's own goroutine and runs
// the rest of the chain there, so the pooled gin.Context never leaves it.
func (q *Queue) serve(c *gin.Context) {
	if q.skip != nil && ask(q, c, q.skip) {
		c.Next()
		return
	}
	if q.deadline != nil {
		r, cancel, err := q.bindDeadline(c)
		if err != nil {
			q.reject(c, err, waited{})
			return
		}
		if cancel != nil {
			defer unbindDeadline(c, r, cancel) // after the slot is released and OnOutcome has run
		}
	}
	// The request's context as the chain behind the Queue gets it: whether
	// it has ended when the chain returns tells an abandoned request, and
	// the chain may put another on c.Request.
	ctx := c.Request.Context()
	w, n, ok := q.admit(c)
	if ok {
		q.run(c, ctx, w, n)
	}
}

// admit takes the request's slots: on the fast path when its cost is 1 and
// the Backend has one, else through Acquire. It returns what the request
// got and n, the slots the fast path took so far with this one (0 if it did
// not take it). Without ok, the request has been answered.
func (q *Queue) admit(c *gin.Context) (w waited, n uint64, ok bool) {
	cost := 1
	if q.cost != nil {
		cost = max(ask(q, c, q.cost), 1)
	}
	if cost == 1 && q.fast != nil {
		if n = q.fast.TryAcquire(); n != 0 {
			return waited{cost: 1}, n, true
		}
	}
	if q.closed.Load() {
		q.reject(c, backend.ErrClosed, waited{cost: cost})
		return w, 0, false
	}
	a := q.arrival(c, cost) // only a request that may wait pays for its priority and flow
	w, err := q.wait(c, a)
	if err != nil {
		q.reject(c, err, w)
		return w, 0, false
	}
	return w, 0, true
}

// sampled tells whether the handler time of a request is a sample of how
// long a request holds its slots, and how many requests of its path the
// sample counts for. Every request that went through Acquire (n is 0) is a
// sample that counts for one. Of the others, the first and then one in
// serviceEvery are samples that count for serviceEvery each (see
// serviceMeter). Zero means the request is not timed.
func sampled(n uint64) int {
	switch {
	case n == 0:
		return 1
	case n%serviceEvery == 1:
		return serviceEvery
	}
	return 0
}

// run runs the rest of the chain for a request that holds its slots, and
// gives them back when it returns, even when a handler panics and
// gin.Recovery catches it further up.
func (q *Queue) run(c *gin.Context, ctx context.Context, w waited, n uint64) {
	of := sampled(n)
	if q.serverTiming {
		q.addServerTiming(c, w.wait)
	}
	if of == 0 && q.onOutcome == nil && q.adaptive == nil {
		defer q.finish(ctx, w.t)
		if q.onDecision != nil {
			q.onDecision(c, Decision{Outcome: OutcomeServed, Cost: w.cost})
		}
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
	defer q.done(c, ctx, w.t, w.wait, gen, start, of)
	if q.onDecision != nil {
		q.onDecision(c, Decision{Outcome: OutcomeServed, Wait: w.wait, Priority: w.priority, Queued: w.queued, Cost: w.cost})
	}
	c.Next()
}

// addServerTiming adds the queue's wait to c's Server-Timing header, after
// the metrics that middleware ahead (an outer Queue too) has set.
func (q *Queue) addServerTiming(c *gin.Context, wait time.Duration) {
	h := c.Writer.Header()
	switch v := h["Server-Timing"]; {
	case len(v) > 0:
		h["Server-Timing"] = append(v, serverTiming(wait))
	case wait == 0:
		// Preset, so the fast path allocates nothing: len and cap 1, so an
		// Add by a handler copies instead of writing into it.
		h["Server-Timing"] = q.noWait[:1:1]
	default:
		h["Server-Timing"] = []string{serverTiming(wait)}
	}
}

// waited is what a request that went through Acquire got: its Ticket (on a
// grant), how long it waited, and for Decision its priority and the
// requests waiting when it arrived.
type waited struct {
	t        backend.Ticket
	wait     time.Duration
	priority int
	queued   int
	cost     int
}

// done ends a served request that is timed, or has a hook or an adaptive
// limit: the handler time becomes a sample, the slots are released, then
// OnOutcome runs, so a hook that panics cannot keep them.
func (q *Queue) done(c *gin.Context, ctx context.Context, t backend.Ticket, wait time.Duration, gen uint64, start time.Time, of int) {
	if !start.IsZero() {
		took := time.Since(start)
		if q.adaptive != nil {
			q.adaptive.sample(gen, took)
		}
		if of > 0 {
			q.service.sample(took, max(t.Cost, 1), of)
			if q.deadline != nil {
				q.handlerTime.sample(took)
			}
		}
	}
	q.finish(ctx, t)
	if q.onOutcome != nil {
		q.onOutcome(c, OutcomeServed, wait)
	}
}

// finish ends a served request whose handler chain has returned: it counts
// the request as abandoned if its context, as the Queue passed it on, has
// ended by now, and gives t's slots back.
func (q *Queue) finish(ctx context.Context, t backend.Ticket) {
	if ctx.Err() != nil {
		q.abandoned.Add(1)
	}
	q.release(t)
}

// release gives t's slots back, counting the request for a Backend that
// does not.
func (q *Queue) release(t backend.Ticket) {
	if q.fast == nil {
		q.finished.Add(1)
	}
	q.backend.Release(t)
}

// wait gets a's slots for c from the Backend when the fast path could not
// (or, for a cost above 1, was not tried). Only a request that may have to
// wait pays for its clock.
func (q *Queue) wait(c *gin.Context, a backend.Arrival) (waited, error) {
	start := time.Now()
	ctx := c.Request.Context()
	w := waited{priority: a.Priority, cost: a.Cost}
	need := q.minTimeLeft // how long it needs once granted: see Config.MinTimeLeft
	if q.deadline != nil && need >= 0 {
		if need == 0 {
			need = q.need(ctx, start)
		}
		a.MinTimeLeft = need
	}
	left := q.timeLeft(ctx, start, need)
	var err error
	if q.fast != nil {
		n := q.fast.Counts()
		w.queued = n.Queued
		a.MaxAhead = q.maxAhead(n.Limit, left) // applied as the arrival takes its place
		w.t, err = q.fast.Acquire(ctx, a)
	} else {
		var b backend.Stats // read once, for RejectEarly and Decision.Queued
		if q.rejectEarly || q.onDecision != nil {
			b = q.backend.Stats()
			w.queued = b.Queued
		}
		if q.rejectEarly && q.tooFarBack(a, left, b) {
			err = errRejectedEarly
		} else {
			w.t, err = q.backend.Acquire(ctx, a)
		}
	}
	now := time.Now()
	w.wait = now.Sub(start)
	if err == nil {
		q.waits.record(w.wait, now, q.progress().ServedAtOnce)
	}
	return w, err
}

// arrival describes c, asking for cost slots, for the Backend.
func (q *Queue) arrival(c *gin.Context, cost int) backend.Arrival {
	a := backend.Arrival{Cost: cost}
	if q.priority != nil {
		a.Priority = ask(q, c, q.priority)
	}
	if q.flowKey != nil {
		a.Flow = ask(q, c, q.flowKey)
	}
	return a
}

// ask returns f(c), f being a Config function asked before c takes its
// slots (see OutcomePanic). If f panics, c is
// counted as OutcomePanic as the panic goes on up to gin.Recovery: nothing
// is held yet, so nothing needs giving back. Its own function, so that the
// defer costs nothing to a Queue without such functions.
func ask[T any](q *Queue, c *gin.Context, f func(*gin.Context) T) T {
	answered := false
	defer func() {
		if !answered {
			q.panicked(c)
		}
	}()
	v := f(c)
	answered = true
	return v
}

// SetLimit sets the limit to n slots while the Queue runs. Raising it grants
// waiters at once. Lowering it preempts nobody: running requests keep their
// slots. With Config.Adaptive the algorithm goes on from n, within its
// MinLimit and MaxLimit. It fails for an n outside [1, 2^30], or a Backend
// that is not a LimitSetter.
func (q *Queue) SetLimit(n int) error {
	ls, ok := q.backend.(backend.LimitSetter)
	if !ok {
		return fmt.Errorf("ginqueue: SetLimit: the Backend %T cannot change its limit", q.backend)
	}
	if q.adaptive != nil {
		return q.adaptive.set(n)
	}
	return ls.SetLimit(n)
}

// Close stops admitting: new arrivals and every waiting request are answered
// as closed (503) at once. Requests already running finish normally. It
// returns the Backend's error, if any, and may be called more than once.
func (q *Queue) Close() error {
	q.closed.Store(true)
	return q.backend.Close()
}

// Shutdown closes the Queue, then waits until every request running on it
// has finished or ctx ends. It returns Close's error, or else ctx.Err() if
// ctx ended first. Call it before http.Server.Shutdown, so that waiters get
// their 503 at once. The Backend's Close runs to its end before ctx is
// looked at; redisqueue's takes at most about 2 × its CallTimeout.
func (q *Queue) Shutdown(ctx context.Context) error {
	if err := q.Close(); err != nil {
		return err
	}
	return q.backend.Drain(ctx)
}
