package ginqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue/backend"
)

// DeadlineHeader is a Config.Deadline that reads how long the client will
// wait, from when the request reaches the Queue, in the request header
// called name: seconds ("2.5") or a time.ParseDuration value ("2500ms").
// Zero means no time left: the request is answered at once, without running.
// A missing, negative or unreadable value means no deadline. The function is
// safe for concurrent use. docs/configuration.md (Client deadlines) lists
// the values.
func DeadlineHeader(name string) func(*gin.Context) time.Time {
	key := textproto.CanonicalMIMEHeaderKey(name) // once, so a lookup never allocates
	return func(c *gin.Context) time.Time {
		v := c.Request.Header[key]
		if len(v) == 0 {
			return time.Time{}
		}
		d, ok := parseWait(v[0])
		if !ok {
			return time.Time{}
		}
		return time.Now().Add(d)
	}
}

// parseWait reads a header's wait for DeadlineHeader: ok is false for a value
// that is not a usable wait (see DeadlineHeader).
func parseWait(s string) (d time.Duration, ok bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		ns := secs * float64(time.Second)
		// False for NaN, a negative value, an infinity and whatever does
		// not fit a Duration.
		if !(ns >= 0 && ns < math.MaxInt64) {
			return 0, false
		}
		return time.Duration(ns), true
	}
	// Not a number ("1e400", out of float64's range, is not a duration
	// either). ParseDuration refuses what overflows a Duration.
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, false
	}
	return d, true
}

// The errors of a request whose deadline had passed when it arrived: a
// queue timeout, or queue full with RejectEarly, which answers at once what
// would time out.
var (
	errPastDeadline      = fmt.Errorf("%w: the client's deadline had passed on arrival", backend.ErrQueueTimeout)
	errPastDeadlineEarly = fmt.Errorf("%w: the client's deadline had passed on arrival", backend.ErrQueueFull)
)

// bindDeadline gives c the request's deadline before it waits. That is the
// earlier of its request context's deadline and Config.Deadline's. When
// Config.Deadline's is the earlier, c.Request is replaced by a copy whose
// context ends then. bindDeadline then returns the request it replaced and
// the context's cancel func, for unbindDeadline. Otherwise nothing changes
// and both are nil.
//
// If the deadline has already passed, bindDeadline returns the error to
// reject c with instead. That is ErrClosed after Close, the context's error
// if the client has hung up, errPastDeadlineEarly with RejectEarly, and
// errPastDeadline otherwise. Requires q.deadline.
func (q *Queue) bindDeadline(c *gin.Context) (*http.Request, context.CancelFunc, error) {
	ctx := c.Request.Context()
	dl := ask(q, c, q.deadline)
	own, hasOwn := ctx.Deadline()
	mine := !dl.IsZero() && (!hasOwn || dl.Before(own))
	if !mine {
		if !hasOwn {
			return nil, nil, nil
		}
		dl = own
	}
	if !time.Now().Before(dl) {
		switch {
		case q.closed.Load():
			return nil, nil, backend.ErrClosed
		case errors.Is(ctx.Err(), context.Canceled):
			return nil, nil, ctx.Err()
		case q.rejectEarly:
			return nil, nil, errPastDeadlineEarly
		}
		return nil, nil, errPastDeadline
	}
	if !mine {
		return nil, nil, nil // the context already ends at the deadline
	}
	ctx, cancel := context.WithDeadline(ctx, dl)
	r := c.Request
	c.Request = r.WithContext(ctx)
	return r, cancel, nil
}

// unbindDeadline undoes bindDeadline once the Queue's handler is done: the
// chain in front of the Queue gets back the request it passed in (as with
// net/http middleware), not one whose context ends as the throttle returns,
// and the deadline's timer is stopped.
func unbindDeadline(c *gin.Context, r *http.Request, cancel context.CancelFunc) {
	c.Request = r
	cancel()
}

// timeLeft is the longest RejectEarly lets a request wait, from now. That is
// QueueTimeout, or with Config.Deadline the time until the deadline of ctx
// less need, if that is sooner. need is Arrival.MinTimeLeft: a waiter
// granted with less time left is answered as queue timeout. The result is
// zero or less when the time has run out. Without RejectEarly it is
// QueueTimeout, and unused.
func (q *Queue) timeLeft(ctx context.Context, now time.Time, need time.Duration) time.Duration {
	if q.deadline == nil || !q.rejectEarly {
		return q.timeout
	}
	if dl, ok := ctx.Deadline(); ok {
		return min(q.timeout, dl.Sub(now)-max(need, 0)) // RejectEarly needs a QueueTimeout
	}
	return q.timeout
}

// need is the time a request needs before its deadline once granted, when
// Config.MinTimeLeft is zero. It is the measured handler time plus a tenth
// of the time the request has left on arrival, at now. The tenth covers
// what the Queue cannot see: the trip of the request to it and back, and a
// handler that runs longer than its mean. need is zero without a deadline
// on ctx, or before a handler time is measured, so nobody is refused on a
// guess.
func (q *Queue) need(ctx context.Context, now time.Time) time.Duration {
	mean, ok := q.handlerTime.get()
	dl, hasDeadline := ctx.Deadline()
	if !ok || !hasDeadline {
		return 0
	}
	return mean + max(dl.Sub(now), 0)/10
}

// handlerMeter estimates the handler time of a request, whatever its cost,
// for MinTimeLeft's default. Unlike serviceMeter (the slot time, a mean
// that RejectEarly and Retry-After need to be steady), it rises fast and
// falls slowly: a sample above the estimate moves it a quarter of the way
// there, one below a sixteenth. So a slowdown raises the need within a few
// requests, and overestimating, which only moves grants to waiters with
// more time left, is the cheaper error. It counts requests, not seconds:
// an idle period changes nothing. Every request timed for serviceMeter is
// a sample, each of the same weight.
type handlerMeter struct {
	mu   sync.Mutex
	mean time.Duration // guarded by mu
	n    int           // samples so far, up to 1; guarded by mu
}

// sample adds the handler time d of one timed request.
func (m *handlerMeter) sample(d time.Duration) {
	d = max(d, 0)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.n == 0:
		m.mean, m.n = d, 1
	case d > m.mean:
		m.mean += (d - m.mean) / 4
	default:
		m.mean -= (m.mean - d) / 16
	}
}

// get returns the estimate, and false until a timed request has finished.
func (m *handlerMeter) get() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mean, m.n > 0
}
