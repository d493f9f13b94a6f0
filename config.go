package ginqueue

import (
	"fmt"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue/backend"
)

// Config describes one throttle. The zero value is not usable (MaxConcurrent
// must be at least 1); start from DefaultConfig and change what you need.
// A Config is read once by New or NewQueue and copied: changing it afterwards
// has no effect on the Queue built from it. Every field, with examples, is
// in docs/configuration.md.
type Config struct {
	// MaxConcurrent is the limit the Queue starts with: how many slots there
	// are, so how many requests (of cost 1) may run the rest of the handler
	// chain at once, until SetLimit or Adaptive moves it. It must be in
	// [1, MaxLimit]; zero is refused.
	MaxConcurrent int

	// MaxQueue is how many requests may wait for slots. Zero means no
	// waiting room: a request that finds every slot taken is answered at once
	// as queue full (503). It must be in [0, MaxLimit].
	MaxQueue int

	// QueueTimeout is the longest a request waits in the queue before it is
	// answered as queue timeout (408, or QueueTimeoutStatus). Zero means no
	// timeout: without CoDel, a waiter leaves the queue only when it is
	// granted its slots, when its client hangs up or its deadline passes, or
	// when the Queue is closed. Negative is refused. Keep it shorter than
	// your clients' own timeouts, or they give up before it fires.
	QueueTimeout time.Duration

	// QueueTimeoutStatus is the status of the default queue-timeout
	// response; zero means 408 (Request Timeout). Chromium resends a request
	// answered 408 on a reused keep-alive connection (docs/configuration.md,
	// Browsers), so use 503 (http.StatusServiceUnavailable) for routes that
	// browsers call. Anything but zero or a status in [400, 599] is refused.
	QueueTimeoutStatus int

	// Deadline tells when the client of a request stops waiting for its
	// answer (see DeadlineHeader); a zero Time means it set none. The
	// request's deadline, the earlier of this and its context's, ends its
	// wait as a queue timeout; one already passed on arrival is answered at
	// once; and the handler chain runs with c.Request's context ending then
	// (on a copy of c.Request, put back afterwards). Nil means no client
	// deadlines: a context's deadline still ends a wait, but RejectEarly and
	// arrivals do not look at it. It runs on the request's goroutine, for
	// every request that Skip does not exempt.
	Deadline func(*gin.Context) time.Time

	// MinTimeLeft is, with Deadline, the least time before its deadline a
	// waiting request must have left when its slots come free: one with
	// less is answered as queue timeout at once (408, or
	// QueueTimeoutStatus) and the slots go to the next waiter, rather than
	// start a handler its client will not wait for. Zero means the handler
	// time the Queue measures (whatever the cost) plus a tenth of the time
	// the request had left on arrival (nothing is refused until a request
	// has finished); negative means no such check; a positive value applies
	// from the first request. A request that finds its slots free runs
	// whatever its time left. Without Deadline it does
	// nothing. redisqueue honours it in both modes.
	MinTimeLeft time.Duration

	// OnQueueFull writes the response for a request answered as queue full.
	// The request is already aborted (c.Abort) and holds no slot, and the
	// default response is preset: status 503 and a Retry-After header. A
	// hook that sets its own status or writes a body replaces the status; one
	// that writes nothing answers with the default. The preset Retry-After
	// stays on whatever the hook writes; remove it with
	// c.Writer.Header().Del("Retry-After"). Nil means the default response.
	OnQueueFull gin.HandlerFunc

	// OnQueueTimeout writes the response for a request answered as queue
	// timeout: it waited QueueTimeout (or what CoDel allowed), or its
	// deadline passed while it waited, so it runs even when QueueTimeout is
	// zero. As with OnQueueFull, the request is aborted, holds no slot, and
	// the default response is preset: status QueueTimeoutStatus and a
	// Retry-After header. Nil means the default response.
	OnQueueTimeout gin.HandlerFunc

	// OnClosed writes the response for a request that arrived after Close or
	// Shutdown, or that was waiting when they were called. As with
	// OnQueueFull, the request is aborted, holds no slot, and the default
	// response is preset: status 503 and a Retry-After header. Nil means the
	// default response.
	OnClosed gin.HandlerFunc

	// Skip exempts a request from the throttle: when it returns true the
	// request runs at once, takes no slot and is not counted. Nil means no
	// request is exempt. Use it for health checks and long-lived requests
	// such as websockets. It runs on the request's goroutine.
	Skip func(*gin.Context) bool

	// RetryAfter is the Retry-After of the default queue-full, queue-timeout
	// and closed responses (preset for their hooks too) until a request has
	// finished, rounded up to whole seconds. From then on the header is how
	// long the slots take to serve the queue, at most QueueTimeout and at
	// least one second (docs/sizing.md has the rule). Zero means one second.
	// Negative is refused.
	RetryAfter time.Duration

	// Priority ranks a request: a waiter of a higher priority is granted
	// before any of a lower one, and a full queue gives the place of its
	// newest lowest-priority waiter to an arrival of higher priority (the
	// evicted waiter is answered as queue full). Nil means every request has
	// priority 0. It runs on the request's goroutine, only when the request
	// may have to wait (it found no free slot, or asks for more than one).
	Priority func(*gin.Context) int

	// FlowKey names the flow a request belongs to (a client, a tenant, a
	// route). Within a priority, flows with waiters take turns, one grant
	// each. Nil means one flow. See ByClientIP, ByHeader and ByRoute. It
	// runs on the request's goroutine, only when the request may have to
	// wait (it found no free slot, or asks for more than one). Keys longer than 64 bytes are replaced by a hash. redisqueue does not
	// take turns by flow.
	FlowKey func(*gin.Context) string

	// MaxQueuePerFlow is how many places one flow may hold at one priority;
	// an arrival of a flow at its cap is answered as queue full while other
	// flows are still admitted. Zero means no cap beyond MaxQueue. It needs
	// FlowKey and must not exceed MaxQueue. redisqueue refuses it.
	MaxQueuePerFlow int

	// Cost returns how many slots a request holds while it runs, so that a
	// heavy route (an export, a report) counts as several light ones. A cost
	// below 1 counts as 1, and one above the limit at its grant as the whole
	// limit (the request runs alone); a request keeps the slots it was
	// granted until it finishes. A head waiter whose slots are not all free
	// blocks the waiters behind it: nobody of its priority is granted before
	// it. Nil means every request holds one slot. It runs on the request's
	// goroutine, for every request that Skip does not exempt. A Backend that
	// cannot weigh requests makes NewQueue fail.
	Cost func(*gin.Context) int

	// OnOutcome is called once per request that Skip does not exempt, with
	// its outcome and how long it waited in the queue: for a served request
	// after the handler chain returned and its slots were given back, for
	// a rejected one after its response (or its hook's panic), and for
	// OutcomePanic as the panic leaves the Queue, before gin.Recovery
	// answers. A panic in it cannot keep a slot. Nil means no hook. It runs
	// on the request's goroutine.
	OnOutcome func(c *gin.Context, o Outcome, wait time.Duration)

	// OnDecision is called once per request that Skip does not exempt and
	// whose Config functions did not panic (OutcomePanic), at the moment
	// the Queue decides its fate: for a served request once it
	// holds its slots and before the rest of the chain runs, for the others
	// before their response is written. It is for tracing (the otelqueue
	// module adds span events with it). Nil means no hook, and nothing is
	// computed for it. It runs on the request's goroutine; a panic in it
	// after a grant cannot keep the slots.
	OnDecision func(c *gin.Context, d Decision)

	// ServerTiming adds "Server-Timing: queue;dur=<ms>" to served responses,
	// before the handler writes, after any metric that middleware ahead (an
	// outer Queue too) has set. False means no header. For a request that
	// did not wait, when nothing was set ahead, the header's value slice is
	// shared between responses: Add to it or Set it, but do not write into
	// its elements.
	ServerTiming bool

	// RejectEarly answers queue full (503) at once to an arrival whose
	// expected wait already exceeds QueueTimeout (or, with Deadline, its
	// time left, when that is less), instead of a queue timeout once the
	// time is spent. The expected wait counts the waiters that would be
	// granted before it, at the rate the slots serve; until a handler time is
	// measured nobody is refused (docs/sizing.md has the rule). False means
	// every arrival that finds a place waits. It needs QueueTimeout and
	// MaxQueue above zero.
	RejectEarly bool

	// Adaptive, when set, moves the limit with the measured handler latency
	// between Adaptive.MinLimit and Adaptive.MaxLimit, starting from
	// MaxConcurrent; see AdaptiveConfig. Nil means the limit stays
	// MaxConcurrent (or what SetLimit sets). The Backend must implement
	// LimitSetter.
	Adaptive *AdaptiveConfig

	// CoDel, when set, bounds each wait by how long the queue has gone
	// without emptying, and with CoDel.LIFO grants a standing queue newest
	// first; see CoDel. Nil means every waiter may wait QueueTimeout, in
	// arrival order. A Backend that cannot honour it (redisqueue) makes
	// NewQueue fail.
	CoDel *CoDel

	// Backend decides which requests run and in what order. Nil means the
	// in-memory Backend, which limits one process. A shared Backend (see
	// the redisqueue module) makes the slots and the queue global across
	// every process that uses it with the same name. Package backend says
	// how to write one.
	Backend backend.Backend
}

// DefaultConfig returns a Config with 100 concurrent requests, 1000 waiting
// places, a 10 second queue timeout and the default responses.
func DefaultConfig() Config {
	return Config{
		MaxConcurrent: 100,
		MaxQueue:      1000,
		QueueTimeout:  10 * time.Second,
	}
}

// Validate reports the first field of c that cannot work, naming the field
// and its value. It returns nil for a usable Config.
func (c Config) Validate() error {
	// CoDel as given, so that an error can tell a default from a value.
	if err := checkLimits(c.limits(), c.CoDel, "Config"); err != nil {
		return err
	}
	switch {
	case c.QueueTimeoutStatus != 0 && (c.QueueTimeoutStatus < 400 || c.QueueTimeoutStatus > 599):
		return fmt.Errorf("ginqueue: Config.QueueTimeoutStatus must be 0 or in [400, 599], got %d", c.QueueTimeoutStatus)
	case c.RetryAfter < 0:
		return fmt.Errorf("ginqueue: Config.RetryAfter must not be negative, got %v", c.RetryAfter)
	case c.MaxQueuePerFlow > 0 && c.FlowKey == nil:
		return fmt.Errorf("ginqueue: Config.MaxQueuePerFlow %d needs Config.FlowKey to tell flows apart", c.MaxQueuePerFlow)
	case c.RejectEarly && (c.QueueTimeout == 0 || c.MaxQueue == 0):
		return fmt.Errorf("ginqueue: Config.RejectEarly needs QueueTimeout and MaxQueue above zero, got %v and %d",
			c.QueueTimeout, c.MaxQueue)
	case c.Adaptive != nil && c.Adaptive.validate() != nil:
		return c.Adaptive.validate()
	}
	return nil
}

// limits returns the part of c that a Backend needs.
func (c Config) limits() backend.Limits {
	l := backend.Limits{MaxConcurrent: c.MaxConcurrent, MaxQueue: c.MaxQueue, QueueTimeout: c.QueueTimeout,
		MaxQueuePerFlow: c.MaxQueuePerFlow, Weighted: c.Cost != nil}
	if c.CoDel != nil {
		cd := c.CoDel.withDefaults()
		l.CoDelTarget, l.CoDelInterval, l.CoDelLIFO = cd.Target, cd.Interval, cd.LIFO
	}
	return l
}

// retryAfterHeader renders d as whole seconds, rounded up, at least one.
func retryAfterHeader(d time.Duration) string {
	secs := int64(d / time.Second)
	if d%time.Second != 0 {
		secs++
	}
	return fmt.Sprint(max(secs, 1))
}

// ByClientIP is a Config.FlowKey that puts each client address in its own
// flow. It uses c.ClientIP, which honours the engine's trusted proxies: set
// them (engine.SetTrustedProxies) or a client can pick its own key through
// X-Forwarded-For.
func ByClientIP() func(*gin.Context) string {
	return func(c *gin.Context) string { return c.ClientIP() }
}

// ByHeader is a Config.FlowKey that keys flows by the value of a request
// header, such as a tenant or API key header. Requests without it share the
// flow of the empty key.
func ByHeader(name string) func(*gin.Context) string {
	return func(c *gin.Context) string { return c.GetHeader(name) }
}

// ByRoute is a Config.FlowKey that gives each route pattern (c.FullPath, such
// as "/users/:id") its own flow, so one slow endpoint cannot fill the queue
// ahead of the others.
func ByRoute() func(*gin.Context) string {
	return func(c *gin.Context) string { return c.FullPath() }
}
