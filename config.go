package ginqueue

import (
	"fmt"
	"time"

	"github.com/gin-gonic/gin"
)

// Config describes one throttle. The zero value is not usable (MaxConcurrent
// must be at least 1); start from DefaultConfig and change what you need.
// A Config is read once by New or NewQueue and copied: changing it afterwards
// has no effect on the Queue built from it.
type Config struct {
	// MaxConcurrent is how many requests may run the rest of the handler
	// chain at once. It must be at least 1; zero is refused.
	MaxConcurrent int

	// MaxQueue is how many requests may wait for a slot. Zero means no
	// waiting room: a request that finds every slot taken is answered at once
	// as queue full (503). Negative is refused.
	MaxQueue int

	// QueueTimeout is the longest a request waits in the queue before it is
	// answered as queue timeout (408, or QueueTimeoutStatus). Zero means no
	// time limit: a waiter
	// leaves the queue only when it is granted a slot, when its client hangs
	// up or when the Queue is closed. Negative is refused. Keep it shorter
	// than your clients' own timeouts, or they give up before it fires.
	QueueTimeout time.Duration

	// QueueTimeoutStatus is the status of the default queue-timeout
	// response; zero means 408 (Request Timeout). Chromium resends a request
	// answered 408 on a reused keep-alive connection, so one fetch() can wait
	// QueueTimeout several times over and still end in a 408, while a 503
	// (http.StatusServiceUnavailable) reaches the page at once: use 503 for
	// routes that browsers call. Anything but zero or a status in [400, 599]
	// is refused.
	QueueTimeoutStatus int

	// Deadline tells when the client of a request stops waiting for its
	// answer, such as from a header it sends (see DeadlineHeader); a zero
	// Time means it set none. The request's deadline is the earlier of this
	// and its request context's own. It never waits in the queue past it:
	// it is then answered as queue timeout (408, or QueueTimeoutStatus;
	// OnQueueTimeout), while a client that hangs up first is still canceled.
	// With RejectEarly, an arrival whose expected wait exceeds the time it
	// has left, when that is less than QueueTimeout, gets 503 at once. The
	// handler chain runs with c.Request's context ending at the deadline, so
	// the calls it makes give up when the client does; c.Request is a copy
	// for that, and the original is put back when the Queue's handler
	// returns. A request whose deadline has passed when it arrives does not
	// run, even if a slot is free: it is answered at once as queue timeout,
	// or with RejectEarly as queue full (503). Nil means no client deadlines:
	// the Queue works as it did without this field, where a request
	// context's deadline ends a wait (a queue timeout) but RejectEarly and
	// arrivals do not look at it. It runs on the request's goroutine, for
	// every request that Skip does not exempt.
	Deadline func(*gin.Context) time.Time

	// OnQueueFull writes the response for a request that found the queue
	// full. The request is already aborted (c.Abort) when it is called and
	// holds no slot, and the default response is preset: status 503 and a
	// Retry-After header (see RetryAfter). A hook that sets its own status or
	// writes a body replaces the status; one that writes nothing answers with
	// the default, so a rejected request never looks served. The preset
	// Retry-After stays on whatever the hook writes; remove it with
	// c.Writer.Header().Del("Retry-After"). Nil means the default response.
	OnQueueFull gin.HandlerFunc

	// OnQueueTimeout writes the response for a request that waited
	// QueueTimeout (or the shorter time CoDel allowed) without getting a
	// slot, or whose request context's deadline (a timeout middleware in
	// front, say) or client's deadline (Deadline) passed while it waited,
	// so it can run even when
	// QueueTimeout is zero. As with OnQueueFull, the
	// request is already aborted, holds no slot, and the default response is
	// preset: status QueueTimeoutStatus (408 unless set) and a Retry-After
	// header. Nil means the default response.
	OnQueueTimeout gin.HandlerFunc

	// OnClosed writes the response for a request that arrived after Close or
	// Shutdown, or that was waiting when they were called. As with
	// OnQueueFull, the request is already aborted, holds no slot, and the
	// default response is preset: status 503 and a Retry-After header. Nil
	// means the default response.
	OnClosed gin.HandlerFunc

	// Skip exempts a request from the throttle: when it returns true the
	// request runs at once, takes no slot and is not counted. Nil means no
	// request is exempt. Use it for health checks and long-lived requests
	// such as websockets. It runs on the request's goroutine.
	Skip func(*gin.Context) bool

	// RetryAfter is the value of the Retry-After header on the default
	// queue-full, queue-timeout and closed responses (preset for their
	// hooks too) until a request has finished, rounded up to whole seconds.
	// From then on the header is how long the slots need to serve everyone
	// queued, (queued + 1) × the measured mean slot time ÷ the limit (the
	// slot time of a request is its handler time × the slots it held, see
	// Cost; idle periods do not change that mean), rounded up to whole
	// seconds and capped at QueueTimeout rounded down to whole seconds, by
	// when every current waiter has left; never below 1, the header's
	// smallest value, so a QueueTimeout under a second still answers 1. Zero
	// means one second. Negative is refused.
	RetryAfter time.Duration

	// Priority ranks a request: when a slot frees, a waiter of a higher
	// priority is served before any of a lower one, and a full queue gives
	// the place of its newest lowest-priority waiter to an arrival of higher
	// priority (the evicted waiter is answered as queue full). Nil means every
	// request has priority 0. It runs on the request's goroutine, only when
	// the request has to wait.
	Priority func(*gin.Context) int

	// FlowKey names the flow a request belongs to (a client, a tenant, a
	// route). Within a priority, flows with waiters take turns, one grant
	// each, so a client with many waiters delays another's first waiter by
	// at most one turn. Nil means one flow. See ByClientIP, ByHeader and
	// ByRoute. It runs only when the request has to wait. Keys longer than
	// 64 bytes are replaced by a hash. redisqueue's queue, shared by a
	// fleet, does not take turns by flow.
	FlowKey func(*gin.Context) string

	// MaxQueuePerFlow is how many waiting places one flow may hold at one
	// priority; an arrival of a flow at its cap is answered as queue full
	// while other flows are still admitted. Zero means no cap beyond
	// MaxQueue. It needs FlowKey and must not exceed MaxQueue. The
	// in-memory Backend honours it; redisqueue refuses it.
	MaxQueuePerFlow int

	// Cost weighs a request: it returns how many slots the request holds
	// while it runs, so that a heavy route (an export, a report) counts as
	// several light ones against MaxConcurrent and the limit. A cost below
	// 1 counts as 1; one above the limit at the moment of the grant counts
	// as the whole limit (the request runs alone), and keeps the slots it
	// was granted until it finishes, whatever the limit does meanwhile. A
	// waiter at the head of the queue whose slots are not all free holds
	// the line: nobody of its priority is served before it, and nobody
	// takes a slot without queueing while it waits, so heavy requests are
	// never starved by light ones. Running, Limit and the metrics count
	// slots; Served and the other counters count requests. Nil means every
	// request holds one slot. It runs on the request's goroutine, on every
	// request that passes Skip. The in-memory Backend honours it; a Backend
	// that cannot (see Limits.Weighted) makes NewQueue fail.
	Cost func(*gin.Context) int

	// OnOutcome is called once per request that passed Skip, with its
	// outcome and how long it waited in the queue: for a served request
	// after the handler chain returned and its slot was given back, for the
	// others after their response. A panic in it cannot keep a slot. Nil
	// means no hook. It runs on the request's goroutine.
	OnOutcome func(c *gin.Context, o Outcome, wait time.Duration)

	// ServerTiming adds "Server-Timing: queue;dur=<ms>" to served responses,
	// before the handler writes, so browsers' developer tools show the time
	// spent queued. False means no header. For a request that did not wait
	// the header's value slice is shared between responses, to save an
	// allocation: Add to it or Set it, but do not write into its elements.
	ServerTiming bool

	// RejectEarly answers 503 at once to an arrival whose expected wait
	// already exceeds QueueTimeout (or, with Deadline, the time its client
	// has left, when that is less), instead of a 408 once the time is spent.
	// The expected wait counts only the waiters that would be served before
	// the arrival (higher priorities, and the turns of other flows), at the
	// rate the slots serve (the limit over the measured mean slot time, as
	// for RetryAfter; with Cost, the waiters count as requests of the mix
	// served so far, whatever each costs); until a handler time is measured
	// nobody is refused. False means every arrival that finds a place waits.
	// It needs QueueTimeout and MaxQueue above zero.
	RejectEarly bool

	// Adaptive, when set, moves the limit with the measured handler latency
	// between Adaptive.MinLimit and Adaptive.MaxLimit, starting from
	// MaxConcurrent; see AdaptiveConfig. Nil means the limit stays
	// MaxConcurrent (or what SetLimit sets). The Backend must implement
	// LimitSetter.
	Adaptive *AdaptiveConfig

	// CoDel, when set, bounds each wait by how long the queue has stood
	// instead of by QueueTimeout alone, and with CoDel.LIFO serves the
	// newest waiters first while the queue stands; see CoDel. Nil means
	// every waiter may wait QueueTimeout, in arrival order. The Queue copies
	// it, with its defaults filled in, into the Limits it gives the Backend;
	// the in-memory Backend honours it, and a Backend that cannot (the
	// redisqueue module's) makes NewQueue fail.
	CoDel *CoDel

	// Backend decides which requests run and in what order. Nil means the
	// in-memory Backend of this package (NewMemoryBackend), which limits one
	// process. A shared backend (see the redisqueue module) makes the limits
	// global across every process that uses it with the same name.
	Backend Backend
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
	l := c.limits()
	l.CoDel = c.CoDel // as given, so that an error can tell a default from a value
	if err := l.check("Config"); err != nil {
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
func (c Config) limits() Limits {
	l := Limits{MaxConcurrent: c.MaxConcurrent, MaxQueue: c.MaxQueue, QueueTimeout: c.QueueTimeout,
		MaxQueuePerFlow: c.MaxQueuePerFlow, Weighted: c.Cost != nil}
	if c.CoDel != nil {
		cd := c.CoDel.withDefaults() // a copy: the Config's can change afterwards
		l.CoDel = &cd
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
