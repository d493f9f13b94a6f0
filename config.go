package ginqueue

import (
	"fmt"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue/backend"
)

// Config describes one throttle. The zero value is not usable (MaxConcurrent
// must be at least 1); start from DefaultConfig and change what you need.
// New and NewQueue copy it: changing it afterwards does not affect the Queue.
// Its functions are called on the request's goroutine, for many at once.
// docs/configuration.md lists every field, its default and how to choose it.
type Config struct {
	// MaxConcurrent is the limit the Queue starts with: how many slots, so
	// how many requests of cost 1 run at once. It must be in [1, 2^30].
	MaxConcurrent int
	// MaxQueue is how many requests may wait for slots, in [0, 2^30]. Zero
	// means none: a request that finds no free slot gets 503 at once.
	MaxQueue int
	// QueueTimeout is the longest a request waits before it is answered as
	// queue timeout. Zero means no timeout; negative is refused.
	QueueTimeout time.Duration
	// QueueTimeoutStatus is the status of the default queue-timeout response:
	// zero means 408, anything else must be in [400, 599]. Chromium resends
	// some requests answered 408 (docs/configuration.md, Browsers): use 503
	// for routes that browsers call.
	QueueTimeoutStatus int

	// Deadline returns when the client of a request stops waiting (see
	// DeadlineHeader); nil or a zero Time means none. The earlier of it and
	// the request context's deadline ends the wait as a queue timeout, and
	// the handler chain runs with c.Request's context ending then.
	Deadline func(*gin.Context) time.Time
	// MinTimeLeft, with Deadline, is the least time a waiter must have left
	// before its deadline when its slots come free, or it is answered as
	// queue timeout. Zero means the measured handler time plus a tenth of the
	// time it had left on arrival; negative turns the check off.
	MinTimeLeft time.Duration

	// OnQueueFull writes the response for a request answered as queue full.
	// The request is aborted and holds no slot; status 503 and Retry-After
	// are preset, so a hook that writes nothing sends them, and Retry-After
	// stays unless the hook deletes it. Nil means the default response.
	OnQueueFull gin.HandlerFunc
	// OnQueueTimeout is OnQueueFull for a queue timeout, with status
	// QueueTimeoutStatus. It also runs when a deadline passes in the queue.
	OnQueueTimeout gin.HandlerFunc
	// OnClosed is OnQueueFull for a request that arrives after Close or
	// Shutdown, or is waiting when they are called.
	OnClosed gin.HandlerFunc
	// Skip exempts a request when it returns true: the request runs at once,
	// takes no slot and is not counted. Nil exempts nobody.
	Skip func(*gin.Context) bool
	// RetryAfter is the Retry-After of the default responses until a request
	// has finished; zero means one second, negative is refused. From then on
	// the header is how long the queue takes to drain, at least one second
	// and at most QueueTimeout.
	RetryAfter time.Duration

	// Priority ranks a request: a higher priority is granted first, and a
	// full queue gives the place of its newest lowest-priority waiter,
	// answered as queue full, to a higher arrival. Nil means 0 for all. It
	// is asked only of a request that may have to wait, as is FlowKey.
	Priority func(*gin.Context) int
	// FlowKey names the flow of a request (a client, a tenant, a route):
	// within a priority, flows with waiters take turns, one grant each. Nil
	// means one flow. See ByClientIP, ByHeader and ByRoute.
	FlowKey func(*gin.Context) string
	// MaxQueuePerFlow caps the places one flow may hold at one priority: an
	// arrival beyond it is answered as queue full. Zero means no cap. It
	// needs FlowKey and must not exceed MaxQueue.
	MaxQueuePerFlow int
	// Cost returns how many slots a request holds while it runs: below 1
	// counts as 1, above the limit as the whole limit. A head waiter whose
	// slots are not all free holds up the waiters of its priority behind it.
	// Nil means one slot each.
	Cost func(*gin.Context) int

	// OnOutcome is called once per request that Skip does not exempt, with
	// its outcome and wait: after its slots are given back or its rejection
	// is written, or as the panic unwinds for OutcomePanic. Nil means no hook.
	OnOutcome func(c *gin.Context, o Outcome, wait time.Duration)
	// OnDecision is called once per request that Skip does not exempt, when
	// its outcome is decided: for a served request once it holds its slots,
	// before the chain runs; for others before their response. It is not
	// called for OutcomePanic. Nil means no hook. See otelqueue.
	OnDecision func(c *gin.Context, d Decision)
	// ServerTiming adds "Server-Timing: queue;dur=<ms>" to served responses
	// before the handler runs. The header's value slice may be shared between
	// responses: Add to it or Set it, but do not write into its elements.
	ServerTiming bool

	// RejectEarly answers queue full (503) at once to an arrival whose
	// expected wait exceeds QueueTimeout, or with Deadline its time left if
	// that is less. Nobody is refused before a handler time is measured. It
	// needs QueueTimeout and MaxQueue above zero.
	RejectEarly bool
	// Adaptive, when set, moves the limit with the measured handler latency,
	// starting from MaxConcurrent; see AdaptiveConfig. Nil leaves the limit
	// to SetLimit. NewQueue fails if the Backend is not a LimitSetter.
	Adaptive *AdaptiveConfig
	// CoDel, when set, shortens the wait allowed once the queue stops
	// emptying; see CoDel. Nil means every waiter may wait QueueTimeout.
	CoDel *CoDel
	// Backend decides which requests run and in what order, for one Queue.
	// Nil means a new in-memory Backend, for one process; the redisqueue
	// module shares a limit across processes. NewQueue returns its error if
	// it cannot honour a field, such as Cost, MaxQueuePerFlow or CoDel.
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
