package suite

import (
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
)

// seedInterval is the seed lesson's drain interval: setInterval(..., 100).
const seedInterval = 100 * time.Millisecond

// seedQueue is a Go port of the seed lesson's queueThrottle (Express,
// TypeScript), kept faithful where it changes behaviour:
//
//   - Every request is queued, even when slots are free; only the interval
//     admits. An idle server adds up to one interval to every request, and
//     a burst larger than the queue bound is refused even while slots are
//     free (the lesson's own 15-request test refuses 5, not the 2 it
//     promises).
//   - Each tick first drops the requests whose wait exceeds the timeout,
//     compared in whole milliseconds with ">" (Date.now()), answering 408,
//     then admits up to the limit. A timeout is therefore answered 0 to 100
//     ms late, and a request can be admitted after its deadline has passed.
//   - A queued request never notices that its client hung up: the lesson's
//     res.writableEnded check is false for a dropped connection, so the
//     handler still runs. The check and its "continue", which would leak a
//     slot, are therefore never taken and are left out.
//   - With doubleIncrement, currentRequests is incremented twice per
//     admission, as the lesson's code does, and decremented once on finish.
//     Each admission then leaks a slot: at most ⌈limit/2⌉ run at once, the
//     throttle admits exactly limit requests in its lifetime, and every
//     later one waits out the timeout for a 408. Without it the port runs
//     the algorithm the lesson describes, which the table measures.
//   - shift() and splice() move the rest of the array, as they do in
//     JavaScript; the queue is a slice copied on removal.
//
// Close is the harness's addition (the lesson's cleanupThrottler only stops
// the interval): it stops the ticker and answers every queued request 503,
// so a benchmark never waits for a deep queue to drain 4 requests a tick.
type seedQueue struct {
	limit, maxQueue int
	timeoutMS       int64
	doubleIncrement bool
	ticker          *time.Ticker
	done            chan struct{}
	closeOnce       sync.Once

	mu      sync.Mutex
	current int           // currentRequests; guarded by mu
	queue   []*seedWaiter // requestQueue, arrival order; guarded by mu
	closed  bool          // guarded by mu
}

type seedFate uint8

const (
	seedRun seedFate = iota
	seedExpired
	seedClosed
)

type seedWaiter struct {
	timestamp int64         // Date.now() at arrival, in milliseconds
	fate      chan seedFate // buffered; receives exactly one fate
}

// newSeedQueue starts a seedQueue draining every interval. Stop it with
// Close.
func newSeedQueue(l Limits, interval time.Duration, doubleIncrement bool) *seedQueue {
	s := &seedQueue{
		limit:           l.MaxConcurrent,
		maxQueue:        l.MaxQueue,
		timeoutMS:       l.QueueTimeout.Milliseconds(),
		doubleIncrement: doubleIncrement,
		ticker:          time.NewTicker(interval),
		done:            make(chan struct{}),
	}
	go s.loop()
	return s
}

func (s *seedQueue) loop() {
	for {
		select {
		case <-s.ticker.C:
			s.tick()
		case <-s.done:
			return
		}
	}
}

// tick is the body of the lesson's setInterval callback.
func (s *seedQueue) tick() {
	now := time.Now().UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	// First, remove expired requests.
	for i := 0; i < len(s.queue); {
		if now-s.queue[i].timestamp > s.timeoutMS {
			w := s.queue[i]
			s.queue = append(s.queue[:i], s.queue[i+1:]...) // splice(i, 1)
			w.fate <- seedExpired
		} else {
			i++
		}
	}
	// Process eligible requests.
	for s.current < s.limit && len(s.queue) > 0 {
		w := s.queue[0]
		s.queue = append(s.queue[:0], s.queue[1:]...) // shift()
		s.current++
		if s.doubleIncrement {
			s.current++
		}
		w.fate <- seedRun
	}
}

// Handler is the middleware: queueThrottle plus the completion listener the
// lesson registers at admission.
func (s *seedQueue) Handler(c *gin.Context) {
	s.mu.Lock()
	if s.closed || len(s.queue) >= s.maxQueue {
		s.mu.Unlock()
		c.AbortWithStatus(http.StatusServiceUnavailable)
		return
	}
	w := &seedWaiter{timestamp: time.Now().UnixMilli(), fate: make(chan seedFate, 1)}
	s.queue = append(s.queue, w)
	s.mu.Unlock()

	switch <-w.fate {
	case seedExpired:
		c.AbortWithStatus(http.StatusRequestTimeout)
		return
	case seedClosed:
		c.AbortWithStatus(http.StatusServiceUnavailable)
		return
	}
	// res.on('finish'/'close', decrement): once per admitted request.
	defer func() {
		s.mu.Lock()
		s.current--
		s.mu.Unlock()
	}()
	c.Next()
}

// Close stops the interval and answers every queued request 503. It may be
// called more than once.
func (s *seedQueue) Close() {
	s.closeOnce.Do(func() {
		s.ticker.Stop()
		close(s.done)
		s.mu.Lock()
		s.closed = true
		for _, w := range s.queue {
			w.fate <- seedClosed
		}
		s.queue = nil
		s.mu.Unlock()
	})
}
