package suite

import (
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
)

// seedInterval is the tutorial's drain interval: setInterval(..., 100).
const seedInterval = 100 * time.Millisecond

// seedQueue is a Go port of the queueThrottle of a published tutorial
// (Express), faithful where it changes behaviour: every request is queued
// and only the 100 ms tick admits; each tick first drops the requests older
// than the timeout (408), then admits up to the limit; a queued request
// never notices its client hung up. doubleIncrement keeps the tutorial's
// bug: each admission leaks a slot. Close, the harness's addition, answers
// every queued request 503.
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

// seedWaiter is a queued request; fate receives exactly one status: 0 to
// run, or the status to answer.
type seedWaiter struct {
	timestamp int64 // Date.now() at arrival, in milliseconds
	fate      chan int
}

func newSeedQueue(l Limits, doubleIncrement bool) *seedQueue {
	s := &seedQueue{limit: l.MaxConcurrent, maxQueue: l.MaxQueue, timeoutMS: l.QueueTimeout.Milliseconds(),
		doubleIncrement: doubleIncrement, ticker: time.NewTicker(seedInterval), done: make(chan struct{})}
	go func() {
		for {
			select {
			case <-s.ticker.C:
				s.tick()
			case <-s.done:
				return
			}
		}
	}()
	return s
}

// tick is the body of the tutorial's setInterval callback.
func (s *seedQueue) tick() {
	now := time.Now().UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < len(s.queue); { // first, remove expired requests
		if w := s.queue[i]; now-w.timestamp > s.timeoutMS {
			s.queue = append(s.queue[:i], s.queue[i+1:]...) // splice(i, 1)
			w.fate <- http.StatusRequestTimeout
		} else {
			i++
		}
	}
	for s.current < s.limit && len(s.queue) > 0 { // process eligible requests
		w := s.queue[0]
		s.queue = append(s.queue[:0], s.queue[1:]...) // shift()
		s.current++
		if s.doubleIncrement {
			s.current++
		}
		w.fate <- 0
	}
}

// Handler is queueThrottle plus the completion listener the tutorial
// registers at admission.
func (s *seedQueue) Handler(c *gin.Context) {
	s.mu.Lock()
	if s.closed || len(s.queue) >= s.maxQueue {
		s.mu.Unlock()
		c.AbortWithStatus(http.StatusServiceUnavailable)
		return
	}
	w := &seedWaiter{timestamp: time.Now().UnixMilli(), fate: make(chan int, 1)}
	s.queue = append(s.queue, w)
	s.mu.Unlock()
	if status := <-w.fate; status != 0 {
		c.AbortWithStatus(status)
		return
	}
	defer func() { // res.on('finish'/'close', decrement)
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
		defer s.mu.Unlock()
		s.closed = true
		for _, w := range s.queue {
			w.fate <- http.StatusServiceUnavailable
		}
		s.queue = nil
	})
}
