// Package ginqueue is queue-based throttling for Gin: at most
// Config.MaxConcurrent requests run at once, the excess waits its turn in a
// bounded FIFO queue, a request that waits longer than Config.QueueTimeout
// is answered 408 and one that finds the queue full is answered 503.
//
//	router.Use(ginqueue.New(ginqueue.DefaultConfig()))
//
// Each request has exactly one Outcome. A waiting request parks on a small
// waiter struct in its own goroutine; slots are handed on in arrival order the
// moment they free, and timeouts fire from one timer at the deadline. Nothing
// polls.
package ginqueue

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"

	"github.com/gin-gonic/gin"
)

// StatusClientClosedRequest is the status recorded (never sent) for a
// request whose client hung up while it waited, so access logs can tell it
// apart. It is nginx's 499.
const StatusClientClosedRequest = 499

// Outcome is what became of one request that passed through a Queue.
type Outcome uint8

// The outcomes. Each has its own counter in Stats and its own default
// response.
const (
	// OutcomeServed: the request got a slot and ran the rest of the chain.
	OutcomeServed Outcome = iota
	// OutcomeQueueFull: no free slot and no waiting place; 503.
	OutcomeQueueFull
	// OutcomeQueueTimeout: waited QueueTimeout without a slot; 408.
	OutcomeQueueTimeout
	// OutcomeCanceled: the client hung up while waiting; nothing is written,
	// 499 is recorded.
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

// Stats is a snapshot of a Queue. Counters only grow, from the Queue's
// creation.
type Stats struct {
	Running int // requests holding a slot now
	Queued  int // requests waiting now
	Limit   int // slots in all
	// QueuedByPriority splits Queued by priority, highest first; nil when
	// nobody waits.
	QueuedByPriority []PriorityCount

	Served       uint64 // requests that got a slot
	QueueFull    uint64 // requests answered queue full
	QueueTimeout uint64 // requests answered queue timeout
	Canceled     uint64 // requests whose client hung up while waiting
	Closed       uint64 // requests answered because the Queue was closed
}

// Queue is one throttle: a set of slots and the queue in front of them. Its
// Handler may guard several route groups, which then share one limit. A
// Queue is safe for concurrent use. Build it with NewQueue.
type Queue struct {
	backend    Backend
	fast       *dispatcher // backend, when it is the in-memory one
	skip       func(*gin.Context) bool
	priority   func(*gin.Context) int
	flowKey    func(*gin.Context) string
	onFull     gin.HandlerFunc
	onTimeout  gin.HandlerFunc
	onClosed   gin.HandlerFunc
	retryAfter string
	handler    gin.HandlerFunc

	// counts of the rejections, by Outcome; the Backend counts Served, so
	// that a request that runs writes nothing here.
	counts [OutcomeClosed + 1]atomic.Uint64
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
		backend:    b,
		skip:       cfg.Skip,
		priority:   cfg.Priority,
		flowKey:    cfg.FlowKey,
		onFull:     cfg.OnQueueFull,
		onTimeout:  cfg.OnQueueTimeout,
		onClosed:   cfg.OnClosed,
		retryAfter: retryAfterHeader(cfg.RetryAfter),
	}
	q.fast, _ = b.(*dispatcher)
	q.handler = q.serve
	return q, nil
}

// Handler returns the Queue's middleware. Every call returns the same
// throttle: route groups that use it share the Queue's slots and queue.
func (q *Queue) Handler() gin.HandlerFunc { return q.handler }

// serve is the middleware. It waits in the request's own goroutine and runs
// the rest of the chain there, so the pooled gin.Context never leaves it.
func (q *Queue) serve(c *gin.Context) {
	if q.skip != nil && q.skip(c) {
		c.Next()
		return
	}
	t, err := q.acquire(c)
	if err != nil {
		q.reject(c, err)
		return
	}
	// A deferred release gives the slot back even when a handler panics and
	// gin.Recovery catches it further up.
	defer q.backend.Release(t)
	c.Next()
}

// acquire gets a slot for c from the Backend. Only a request that may have
// to wait pays for its priority and flow key.
func (q *Queue) acquire(c *gin.Context) (Ticket, error) {
	if q.fast == nil {
		return q.backend.Acquire(c.Request.Context(), q.arrival(c))
	}
	if q.fast.tryFast() {
		return Ticket{}, nil
	}
	return q.fast.acquireSlow(c.Request.Context(), q.arrival(c))
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

// reject answers a request that got no slot.
func (q *Queue) reject(c *gin.Context, err error) {
	o := outcomeOf(err)
	q.counts[o].Add(1)
	c.Abort()
	switch o {
	case OutcomeCanceled:
		// Nobody is listening: record the status for access logs only.
		c.Status(StatusClientClosedRequest)
	case OutcomeQueueTimeout:
		respond(c, q.onTimeout, http.StatusRequestTimeout, "")
	case OutcomeClosed:
		respond(c, q.onClosed, http.StatusServiceUnavailable, q.retryAfter)
	default:
		respond(c, q.onFull, http.StatusServiceUnavailable, q.retryAfter)
	}
}

// respond runs hook, or writes status with an optional Retry-After header.
func respond(c *gin.Context, hook gin.HandlerFunc, status int, retryAfter string) {
	if hook != nil {
		hook(c)
		return
	}
	if c.Writer.Written() {
		return
	}
	if retryAfter != "" {
		c.Header("Retry-After", retryAfter)
	}
	c.AbortWithStatus(status)
}

// outcomeOf maps an Acquire error to its outcome.
func outcomeOf(err error) Outcome {
	switch {
	case errors.Is(err, ErrQueueTimeout):
		return OutcomeQueueTimeout
	case errors.Is(err, ErrClosed):
		return OutcomeClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return OutcomeCanceled
	}
	return OutcomeQueueFull
}

// Stats returns a snapshot of the Queue's slots, queue and counters.
func (q *Queue) Stats() Stats {
	b := q.backend.Stats()
	return Stats{
		Running:          b.Running,
		Queued:           b.Queued,
		Limit:            b.Limit,
		QueuedByPriority: b.QueuedByPriority,
		Served:           b.Served,
		QueueFull:        q.counts[OutcomeQueueFull].Load(),
		QueueTimeout:     q.counts[OutcomeQueueTimeout].Load(),
		Canceled:         q.counts[OutcomeCanceled].Load(),
		Closed:           q.counts[OutcomeClosed].Load(),
	}
}

// Close stops admitting: new arrivals and every waiting request are answered
// as closed (503) at once. Requests already running finish normally. It
// returns the Backend's error, if any, and may be called more than once.
func (q *Queue) Close() error { return q.backend.Close() }

// Shutdown closes the Queue, then waits until every request running on it
// has finished, or until ctx ends, when it returns ctx.Err().
func (q *Queue) Shutdown(ctx context.Context) error {
	if err := q.Close(); err != nil {
		return err
	}
	return q.backend.Drain(ctx)
}
