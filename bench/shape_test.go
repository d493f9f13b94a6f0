package bench

// BenchmarkDispatchShape is the experiment behind the dispatcher's design,
// kept so it can be re-run: two shapes of the same FIFO semaphore on the
// saturated hand-off (32 goroutines over 4 slots, ~2 µs of work): grants made
// by the releasing goroutine under the lock (ginqueue's shape), or by one
// dispatcher goroutine that a release signals (the other shape considered).
//
//	cd bench && go test -run '^$' -bench DispatchShape .

import (
	"sync"
	"testing"
	"time"
)

type shapeWaiter struct {
	next  *shapeWaiter
	ready chan struct{}
}

type shapeSem struct {
	mu         sync.Mutex
	running    int
	limit      int
	head, tail *shapeWaiter
	kick       chan struct{}
	viaDisp    bool
}

func (s *shapeSem) acquire() {
	s.mu.Lock()
	if s.running < s.limit && s.head == nil {
		s.running++
		s.mu.Unlock()
		return
	}
	w := &shapeWaiter{ready: make(chan struct{})}
	if s.tail == nil {
		s.head = w
	} else {
		s.tail.next = w
	}
	s.tail = w
	s.mu.Unlock()
	<-w.ready
}

func (s *shapeSem) grantLocked() {
	for s.running < s.limit && s.head != nil {
		w := s.head
		s.head = w.next
		if s.head == nil {
			s.tail = nil
		}
		s.running++
		close(w.ready)
	}
}

func (s *shapeSem) release() {
	s.mu.Lock()
	s.running--
	if s.viaDisp {
		s.mu.Unlock()
		select {
		case s.kick <- struct{}{}:
		default:
		}
		return
	}
	s.grantLocked()
	s.mu.Unlock()
}

func (s *shapeSem) dispatcher(stop chan struct{}) {
	for {
		select {
		case <-s.kick:
			s.mu.Lock()
			s.grantLocked()
			s.mu.Unlock()
		case <-stop:
			return
		}
	}
}

func shapeWork() {
	t := time.Now()
	for time.Since(t) < 2*time.Microsecond {
	}
}

func runShape(b *testing.B, viaDisp bool) {
	s := &shapeSem{limit: 4, kick: make(chan struct{}, 1), viaDisp: viaDisp}
	stop := make(chan struct{})
	if viaDisp {
		go s.dispatcher(stop)
	}
	b.SetParallelism(16) // 32 goroutines on 2 cores
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.acquire()
			shapeWork()
			s.release()
		}
	})
	close(stop)
}

func BenchmarkDispatchShape(b *testing.B) {
	for i := 0; i < 3; i++ {
		b.Run("direct", func(b *testing.B) { runShape(b, false) })
		b.Run("dispatcher-goroutine", func(b *testing.B) { runShape(b, true) })
	}
}
