package otelqueue

import (
	"sync"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ginqueue/ginqueue"
)

// The names of the span events SpanEvents adds.
const (
	// GrantedEvent marks the grant of a served request, before its handler
	// runs.
	GrantedEvent = "ginqueue.granted"
	// RejectedEvent marks the refusal of a request the Queue did not serve,
	// before its response is written.
	RejectedEvent = "ginqueue.rejected"
)

// SpanEvents returns a hook for ginqueue.Config.OnDecision that records the
// Queue's decision on the request's span: the span in c.Request.Context(),
// started by a tracing middleware that runs before the Queue. It adds the
// event GrantedEvent or RejectedEvent, with the queue (named queue), the
// outcome, the wait, the priority, the requests waiting on arrival and the
// cost, and sets the queue, the outcome and the wait as attributes of the
// span. Without a span, or with one that is not recording (not sampled, or
// already ended), it does nothing and allocates nothing.
//
// It panics if queue is empty. The hook is safe for concurrent use. It
// replaces OnDecision: to keep a hook of your own, call both:
//
//	events := otelqueue.SpanEvents("api")
//	cfg.OnDecision = func(c *gin.Context, d ginqueue.Decision) {
//		events(c, d)
//		mine(c, d)
//	}
func SpanEvents(queue string) func(*gin.Context, ginqueue.Decision) {
	if queue == "" {
		panic("otelqueue: SpanEvents: queue name must not be empty")
	}
	h := &spanEvents{queue: QueueKey.String(queue)}
	for o := ginqueue.Outcome(0); o.String() != "unknown"; o++ {
		h.outcomes = append(h.outcomes, OutcomeKey.String(o.String()))
	}
	h.pool.New = func() any {
		s := new(scratch)
		s.opts[0] = trace.WithAttributes(s.event[:]...)
		return s
	}
	return h.record
}

// spanEvents is the state of one SpanEvents hook: what it computed once.
type spanEvents struct {
	queue    attribute.KeyValue   // immutable
	outcomes []attribute.KeyValue // by Outcome; immutable
	// pool holds scratch space for the attributes of one call. A span
	// copies what it is given (the SDK appends the event's attributes to a
	// slice of its own, and the span's), so the space is reused.
	pool sync.Pool
}

// scratch is the space one call fills: the event's attributes, the option
// that wraps them (built once, as it points at event) and the span's
// attributes.
type scratch struct {
	event [6]attribute.KeyValue
	opts  [1]trace.EventOption
	span  [3]attribute.KeyValue
}

// record is the hook.
func (h *spanEvents) record(c *gin.Context, d ginqueue.Decision) {
	span := trace.SpanFromContext(c.Request.Context())
	if !span.IsRecording() {
		return
	}
	outcome := h.outcome(d.Outcome)
	wait := WaitKey.Float64(d.Wait.Seconds())
	s := h.pool.Get().(*scratch)
	s.event = [...]attribute.KeyValue{h.queue, outcome, wait,
		PriorityKey.Int(d.Priority), ArrivalQueuedKey.Int(d.Queued), CostKey.Int(d.Cost)}
	s.span = [...]attribute.KeyValue{h.queue, outcome, wait}
	name := RejectedEvent
	if d.Outcome == ginqueue.OutcomeServed {
		name = GrantedEvent
	}
	span.AddEvent(name, s.opts[:]...)
	span.SetAttributes(s.span[:]...)
	h.pool.Put(s)
}

// outcome is the attribute of o, computed once for the outcomes known
// when the hook was built.
func (h *spanEvents) outcome(o ginqueue.Outcome) attribute.KeyValue {
	if int(o) < len(h.outcomes) {
		return h.outcomes[o]
	}
	return OutcomeKey.String(o.String())
}
