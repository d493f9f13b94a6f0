package ginqueue

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue/backend"
)

// Outcomes and the responses they get: the status, the hook and the headers
// of a request that is not served.

// StatusClientClosedRequest is nginx's 499, the status recorded for a
// request whose client hung up while it waited, so access logs can tell it
// apart. No body is written.
const StatusClientClosedRequest = 499

// Outcome is what became of one request that passed through a Queue. Its
// String is the name used in metric labels.
type Outcome uint8

// The outcomes. Each has its own counter in Stats; each rejection has its
// own default response.
const (
	// OutcomeServed: the request was granted its slots and ran the rest of
	// the chain.
	OutcomeServed Outcome = iota
	// OutcomeQueueFull: 503. There was no free slot and no place for it, or
	// it lost its place to a higher priority, or RejectEarly refused it, or
	// the Backend could not answer.
	OutcomeQueueFull
	// OutcomeQueueTimeout: 408, or Config.QueueTimeoutStatus. It waited as
	// long as QueueTimeout or CoDel allows, or its deadline passed (or was
	// nearer than MinTimeLeft) before it was granted its slots.
	OutcomeQueueTimeout
	// OutcomeCanceled: the client hung up while waiting. No body is written
	// and 499 is recorded. Over HTTP/1.x a waiting request with an unread
	// body is not canceled: see docs/configuration.md (Browsers, Uploads).
	OutcomeCanceled
	// OutcomeClosed: 503. The Queue was closed before the request was
	// granted.
	OutcomeClosed
	// OutcomePanic: Skip, Deadline, Cost, Priority or FlowKey panicked. The
	// request held no slot and no place, and no status is written: the panic
	// goes on up the chain, where gin.Recovery answers 500.
	OutcomePanic

	// numOutcomes is the number of outcomes: a new one goes above it.
	numOutcomes
)

// String returns the outcome's name as used in metric labels: "served",
// "queue_full", "queue_timeout", "canceled", "closed" or "panic". Any other
// value, such as one past the last outcome, returns "unknown".
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
	case OutcomePanic:
		return "panic"
	}
	return "unknown"
}

// serverTiming renders a queue wait as a Server-Timing value in ms.
func serverTiming(wait time.Duration) string {
	if wait == 0 {
		return "queue;dur=0"
	}
	return "queue;dur=" + strconv.FormatFloat(float64(wait)/float64(time.Millisecond), 'f', 3, 64)
}

// reject answers a request that got no slot, after waiting w.wait.
func (q *Queue) reject(c *gin.Context, err error, w waited) {
	o := outcomeOf(c.Request.Context(), err)
	q.counts[o].Add(1)
	c.Abort()
	if q.onOutcome != nil {
		// Deferred, so that it reports the outcome even when OnDecision or
		// the rejection hook panics.
		defer q.onOutcome(c, o, w.wait)
	}
	if q.onDecision != nil {
		q.onDecision(c, Decision{Outcome: o, Wait: w.wait, Priority: w.priority, Queued: w.queued, Cost: max(w.cost, 1)})
	}
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
}

// panicked counts a request as OutcomePanic and reports it to OnOutcome.
// It runs while the panic unwinds and does not recover it: gin.Recovery
// answers the request (500). The request held no slot and no place.
func (q *Queue) panicked(c *gin.Context) {
	q.counts[OutcomePanic].Add(1)
	if q.onOutcome != nil {
		q.onOutcome(c, OutcomePanic, 0)
	}
}

// Decision is what a Queue decided for one request, as Config.OnDecision
// receives it. docs/observability.md (OnDecision) describes each field.
type Decision struct {
	// Outcome is the request's outcome: OutcomeServed once it holds its
	// slots.
	Outcome Outcome
	// Wait is how long the Backend took to grant or refuse the request, as
	// OnOutcome reports it. It is zero for a request that ran at once on the
	// fast path, or whose deadline had passed on arrival.
	Wait time.Duration
	// Priority is Config.Priority's value. It is zero when Priority was not
	// asked: without Config.Priority, or for a request the fast path served.
	Priority int
	// Queued is how many requests were waiting when it arrived. It is zero
	// for a request that ran at once or was answered before it looked.
	Queued int
	// Cost is the slots it asked for: Config.Cost's value, at least 1.
	Cost int
}

// respond answers with status and a Retry-After header, or runs hook with
// both preset. A hook that writes nothing then answers with the default,
// since gin writes the preset status once the chain returns, so a rejected
// request never looks served. A hook that sets its own status or writes a
// body wins. A response that an earlier middleware wrote is left alone,
// since a later status would be ignored.
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
// and that is an unavailable Backend (queue full), not a queue timeout. Only
// ErrQueueTimeout or the request's own context makes a queue timeout.
func outcomeOf(ctx context.Context, err error) Outcome {
	switch {
	case errors.Is(err, backend.ErrClosed):
		return OutcomeClosed
	case errors.Is(err, backend.ErrQueueFull):
		return OutcomeQueueFull
	case errors.Is(err, backend.ErrQueueTimeout):
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
