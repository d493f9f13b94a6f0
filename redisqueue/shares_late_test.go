package redisqueue_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// syncHoldProxy forwards TCP to a Redis. hold delays the Shares sync calls
// written on the connections open at that moment (one TCP flow whose
// segment is lost and retransmitted after the caller timed out and closed
// it), while everything else, and every connection opened later, passes;
// release delivers them.
type syncHoldProxy struct {
	l    net.Listener
	mu   sync.Mutex
	cond *sync.Cond
	gen  int // the generation of new connections
	held int // connections of a generation below it are held
	seen int // sync calls held so far
}

func newSyncHoldProxy(t *testing.T, to string) *syncHoldProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &syncHoldProxy{l: l}
	p.cond = sync.NewCond(&p.mu)
	t.Cleanup(func() { _ = l.Close(); p.release() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			g := p.gen
			p.mu.Unlock()
			go p.pipe(s, c, g)  // client to Redis: may be held
			go p.pipe(c, s, -1) // Redis to client: never held
		}
	}()
	return p
}

func (p *syncHoldProxy) pipe(dst, src net.Conn, g int) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		if g >= 0 && g < p.held && n > 0 && strings.Contains(string(buf[:n]), "\r\nsync\r\n") {
			p.seen++
			for g < p.held {
				p.cond.Wait()
			}
		}
		p.mu.Unlock()
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *syncHoldProxy) addr() string { return p.l.Addr().String() }

func (p *syncHoldProxy) hold() {
	p.mu.Lock()
	p.gen++
	p.held = p.gen
	p.mu.Unlock()
}

func (p *syncHoldProxy) heldSyncs() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen
}

func (p *syncHoldProxy) release() {
	p.mu.Lock()
	p.held = 0
	p.cond.Broadcast()
	p.mu.Unlock()
}

// A sync that reaches Redis late, after its caller timed out and a later
// sync of the same replica has been applied, sets the replica's held slots
// back to its old, smaller value: Redis then gives the difference to
// another replica while the first still runs on it. No process is frozen,
// no request outlives a lease and Redis answers throughout; the only fault
// is one TCP flow delayed past CallTimeout (a lost segment retransmitted
// after the 200 ms minimum RTO, above the default 150 ms CallTimeout).
func TestSharesALateSyncLowersNoShare(t *testing.T) {
	needRedis(t)
	// The default options: LeaseTTL 15 s, CallTimeout 150 ms, SharePeriod
	// 50 ms.
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares}
	l := backend.Limits{MaxConcurrent: 4, MaxQueue: 100, QueueTimeout: 5 * time.Second}
	p := newSyncHoldProxy(t, redisAddr)
	a, err := redisqueue.New(newClient(t, p.addr()), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b := startBackends(t, 1, l, o)[0]
	eventually(t, 2*time.Second, "shares did not settle at 2 and 2", func() bool {
		return a.Stats().Limit == 2 && b.Stats().Limit == 2
	})

	// A's next sync (reporting its share of 2) is held in the network; it
	// times out and A syncs again on a new connection.
	p.hold()
	eventually(t, time.Second, "no sync of A was held", func() bool { return p.heldSyncs() > 0 })
	heldAt := time.Now()

	// A's demand grows to the whole limit, B is idle: A's share grows to 4
	// through its later syncs, and 4 run on A.
	var running sync.WaitGroup
	var mu sync.Mutex
	var tks []backend.Ticket
	for range 4 {
		running.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			tk, err := a.Acquire(ctx, backend.Arrival{})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			tks = append(tks, tk)
			mu.Unlock()
		})
	}
	running.Wait()
	defer func() {
		for _, tk := range tks {
			a.Release(tk)
		}
	}()
	if len(tks) != 4 {
		t.Fatalf("A runs %d, want 4", len(tks))
	}

	// A request waits at B; then the old sync of A reaches Redis.
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		tk, err := b.Acquire(ctx, backend.Arrival{})
		if err == nil {
			b.Release(tk)
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	late := time.Since(heldAt)
	p.release()
	if err := <-got; err == nil {
		t.Fatalf("B admitted a request while A runs 4 requests of the fleet's limit of 4: 5 run across the fleet "+
			"(A's sync reached Redis %v late)", late.Round(time.Millisecond))
	}
}
