package redisqueue_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// The FailOpen fallback is one in-memory Backend for the Backend's life:
// every slot this replica runs on while Redis is down is accounted in it,
// and Close and Drain walk it like the rest.

// pause makes the test's own Redis answer nothing for d.
func pause(t *testing.T, srv *redisServer, d time.Duration) {
	t.Helper()
	ctl := newClient(t, srv.addr())
	if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
}

// outage marks Redis down on b (a request's call fails), and returns once b
// has found it back, after the pause of d.
func outage(t *testing.T, srv *redisServer, b *redisqueue.Backend, d time.Duration) {
	t.Helper()
	pause(t, srv, d)
	eventually(t, d, "Redis not marked down", func() bool {
		if !b.Stats().Unavailable {
			c, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			if tk, err := b.Acquire(c, ginqueue.Arrival{}); err == nil {
				b.Release(tk)
			}
			cancel()
		}
		return b.Stats().Unavailable
	})
	eventually(t, d+2*time.Second, "Redis not marked up again", func() bool { return !b.Stats().Unavailable })
}

func fallbackOptions(t *testing.T) redisqueue.Options {
	return redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 2 * time.Second,
		TickInterval: 100 * time.Millisecond, FailureThreshold: 1}
}

// A request granted by Redis that runs through two outages: once it ends,
// the Backend is idle (a second outage's fallback once kept a slot of the
// first that was never given back).
func TestDrainAfterTwoOutages(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4}, fallbackOptions(t))
	tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
	if err != nil || redisqueue.GrantedLocally(tk) {
		t.Fatalf("before the outages: %v", err)
	}
	outage(t, srv, b, 300*time.Millisecond)
	outage(t, srv, b, 300*time.Millisecond)
	if got := b.Stats().Outages; got != 2 {
		t.Fatalf("Outages %d, want 2", got)
	}
	b.Release(tk)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	if err := b.Drain(ctx); err != nil {
		t.Fatalf("Drain after the only request ended: %v after %v", err, time.Since(start))
	}
	if s := b.Stats(); s.Running != 0 || s.Queued != 0 {
		t.Fatalf("after Drain: %+v", s)
	}
}

// Close answers the fallback's waiters at once, as closed; they never run.
func TestCloseAnswersTheFallbacksWaiters(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.LocalLimit = 2
	b, err := redisqueue.New(newClient(t, srv.addr()), o)
	if err != nil {
		t.Fatal(err)
	}
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 8, QueueTimeout: 10 * time.Second, Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	release := make(chan struct{})
	var ran sync.WaitGroup
	e := gin.New()
	e.GET("/", q.Handler(), func(c *gin.Context) {
		ran.Done()
		<-release
	})
	srv.stop()
	codes := make(chan int, 4)
	serve := func() {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		codes <- w.Code
	}
	ran.Add(2)
	for range 2 {
		go serve()
	}
	ran.Wait() // two run on the fallback's slots
	for range 2 {
		go serve()
	}
	eventually(t, 2*time.Second, "the two others did not wait in the fallback", func() bool { return q.Stats().Queued == 2 })
	closed := time.Now()
	go func() { _ = q.Close() }()
	for range 2 {
		select {
		case c := <-codes:
			if c != http.StatusServiceUnavailable {
				t.Errorf("a waiter answered %d at Close, want 503 (closed)", c)
			}
		case <-time.After(time.Second):
			t.Fatal("a waiter of the fallback was not answered within 1 s of Close")
		}
	}
	if d := time.Since(closed); d > 200*time.Millisecond {
		t.Errorf("the waiters were answered %v after Close", d)
	}
	if s := q.Stats(); s.Closed != 2 {
		t.Errorf("Stats.Closed %d, want 2", s.Closed)
	}
	close(release)
	for range 2 {
		if c := <-codes; c != http.StatusOK {
			t.Errorf("a running request answered %d", c)
		}
	}
}

// Under FailClosed, Close while an acquire call is in flight answers the
// request as closed when the call returns (within CallTimeout), not as
// unavailable.
func TestCloseDuringAnAcquireCallIsClosed(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.CallTimeout, o.OnRedisDown = 500*time.Millisecond, redisqueue.FailClosed
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4}, o)
	if tk, err := b.Acquire(context.Background(), ginqueue.Arrival{}); err != nil { // warm the connection
		t.Fatal(err)
	} else {
		b.Release(tk)
	}
	pause(t, srv, time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(context.Background(), ginqueue.Arrival{})
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // the call is on its way
	closed := time.Now()
	go func() { _ = b.Close() }()
	select {
	case err := <-errc:
		if !errors.Is(err, ginqueue.ErrClosed) || errors.Is(err, ginqueue.ErrQueueFull) {
			t.Errorf("Acquire answered %v at Close, want ErrClosed", err)
		}
		if d := time.Since(closed); d > o.CallTimeout {
			t.Errorf("answered %v after Close, want within CallTimeout %v", d, o.CallTimeout)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Acquire not answered")
	}
}

// A closed replica keeps the lease of a request it admitted on its own,
// once Redis counted it, until the request ends: another replica is not
// granted its slot meanwhile.
func TestClosedReplicaKeepsALocalGrantsLease(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.LeaseTTL = time.Second
	l := ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 4}
	oa := o
	oa.LocalLimit = 1
	a := startBackends2(t, srv.addr(), l, oa)
	other := startBackends2(t, srv.addr(), l, o)
	ctx := context.Background()
	pause(t, srv, 400*time.Millisecond)
	var x ginqueue.Ticket
	eventually(t, time.Second, "no local grant during the pause", func() bool {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		tk, err := a.Acquire(c, ginqueue.Arrival{})
		if err == nil && !redisqueue.GrantedLocally(tk) {
			a.Release(tk)
			return false
		}
		x = tk
		return err == nil
	})
	eventually(t, 3*time.Second, "the local grant was not counted in Redis", func() bool {
		s, err := a.GlobalStats(ctx)
		return err == nil && s.Running == 1 && !a.Stats().Unavailable
	})
	closeDone := make(chan struct{})
	go func() { _ = a.Close(); close(closeDone) }()
	time.Sleep(2 * o.LeaseTTL)
	c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if tk, err := other.Acquire(c, ginqueue.Arrival{}); err == nil {
		t.Fatalf("granted beside the closed replica's running request (locally %v): 2 over a limit of 1",
			redisqueue.GrantedLocally(tk))
	}
	a.Release(x)
	<-closeDone
	tk, err := other.Acquire(ctx, ginqueue.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	other.Release(tk)
}

// A second outage keeps the limit on one replica: requests admitted in
// the first, counted in Redis since and still running, hold their slots
// in the second too.
func TestSecondOutageKeepsTheLimit(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 8}, fallbackOptions(t))
	ctx := context.Background()
	srv.stop()
	var first []ginqueue.Ticket
	for len(first) < 2 {
		tk, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err != nil || !redisqueue.GrantedLocally(tk) {
			t.Fatalf("during the first outage: %v, locally %v", err, redisqueue.GrantedLocally(tk))
		}
		first = append(first, tk)
	}
	srv.start()
	eventually(t, 3*time.Second, "the local grants were not counted in Redis", func() bool {
		s, err := b.GlobalStats(ctx)
		return err == nil && s.Running == 2 && !b.Stats().Unavailable
	})
	srv.stop()
	got := make(chan ginqueue.Ticket, 2)
	for range 2 {
		go func() {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if tk, err := b.Acquire(c, ginqueue.Arrival{}); err == nil {
				got <- tk
			}
		}()
	}
	select {
	case tk := <-got:
		t.Fatalf("granted in the second outage beside the two of the first (locally %v): Stats %+v",
			redisqueue.GrantedLocally(tk), b.Stats())
	case <-time.After(400 * time.Millisecond):
	}
	if s := b.Stats(); s.Running != 2 {
		t.Errorf("Stats.Running %d in the second outage, want 2", s.Running)
	}
	b.Release(first[0])
	select {
	case tk := <-got:
		b.Release(tk)
	case <-time.After(time.Second):
		t.Fatal("a slot freed in the second outage was not handed on")
	}
	b.Release(first[1])
	select {
	case tk := <-got: // the other waiter, granted on that slot
		b.Release(tk)
	case <-time.After(time.Second):
		t.Fatal("the second slot freed was not handed on")
	}
	srv.start()
}

// OnStateChange tells each change, in order, and Stats shows it.
func TestOnStateChange(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	type change struct {
		down bool
		err  error
	}
	changes := make(chan change, 8)
	o.OnStateChange = func(down bool, err error) { changes <- change{down, err} }
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4}, o)
	outage(t, srv, b, 300*time.Millisecond)
	if c := <-changes; !c.down || c.err == nil {
		t.Errorf("first change %+v, want down with the error that tipped it", c)
	}
	if c := <-changes; c.down || c.err != nil {
		t.Errorf("second change %+v, want up", c)
	}
	select {
	case c := <-changes:
		t.Errorf("a third change %+v", c)
	default:
	}
	if s := b.Stats(); s.Unavailable || s.Outages != 1 {
		t.Errorf("Stats after the outage: Unavailable %v, Outages %d; want false, 1", s.Unavailable, s.Outages)
	}
}

// A FailClosed fleet admits nothing on its own: after a pause in which a
// replica died, the survivor's grants are not held back for it.
func TestFailClosedFleetIsNotHeldBackForADeadReplica(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), CallTimeout: 50 * time.Millisecond, LeaseTTL: 10 * time.Second,
		TickInterval: 500 * time.Millisecond, FailureThreshold: 1, OnRedisDown: redisqueue.FailClosed}
	l := ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4, QueueTimeout: 5 * time.Second}
	survivor := startBackends2(t, srv.addr(), l, o)
	doomedClient := newClient(t, srv.addr())
	doomed, err := redisqueue.New(doomedClient, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := doomed.Start(l); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eventually(t, 2*time.Second, "the replicas did not see each other", func() bool {
		s, err := survivor.GlobalStats(ctx)
		return err == nil && s.Replicas == 2
	})
	pause(t, srv, 600*time.Millisecond)
	_ = doomedClient.Close() // it dies during the pause, without a goodbye
	_ = doomed.Close()
	time.Sleep(700 * time.Millisecond) // the pause ends
	start := time.Now()
	var tk ginqueue.Ticket
	eventually(t, 3*time.Second, "no grant after the pause", func() bool {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		tk, err = survivor.Acquire(c, ginqueue.Arrival{})
		return err == nil
	})
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Errorf("the first grant came %v after the pause ended, want well within the liveness lease (1.5 s)", d)
	}
	survivor.Release(tk)
}

// A cost that cannot run within the replica's budget while Redis is down is
// refused at once, as unavailable: it does not run on fewer slots than its
// cost.
func TestWeightedAboveTheBudgetIsRefusedWhileDown(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.LocalLimit = 1
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 4, MaxQueue: 4, Weighted: true}, o)
	srv.stop()
	ctx := context.Background()
	var err error
	for range 5 { // until Redis is marked down
		var tk ginqueue.Ticket
		if tk, err = b.Acquire(ctx, ginqueue.Arrival{Cost: 3}); err == nil {
			b.Release(tk)
			t.Fatalf("a request of cost 3 granted %d slots while this replica may run 1 on its own", tk.Cost)
		}
		if b.Stats().Unavailable {
			break
		}
	}
	start := time.Now()
	_, err = b.Acquire(ctx, ginqueue.Arrival{Cost: 3})
	if !errors.Is(err, redisqueue.ErrUnavailable) || !errors.Is(err, ginqueue.ErrQueueFull) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("cost 3 above a budget of 1: %v after %v, want ErrUnavailable and ErrQueueFull at once", err, time.Since(start))
	}
	tk, err := b.Acquire(ctx, ginqueue.Arrival{Cost: 1})
	if err != nil || !redisqueue.GrantedLocally(tk) {
		t.Fatalf("cost 1 within the budget: %v", err)
	}
	b.Release(tk)
	srv.start()
}

// SetLimit reaches every replica at once, not at its next tick.
func TestSetLimitReachesTheFleetAtOnce(t *testing.T) {
	needRedis(t)
	t.Parallel()
	o := redisqueue.Options{Name: newName(t), TickInterval: time.Second, LeaseTTL: 10 * time.Second}
	bs := startBackends(t, 2, ginqueue.Limits{MaxConcurrent: 4, MaxQueue: 4}, o)
	time.Sleep(50 * time.Millisecond) // both readers listen
	if err := bs[0].SetLimit(1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually(t, 2*time.Second, "the other replica did not learn the limit", func() bool { return bs[1].Stats().Limit == 1 })
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("the other replica learnt the limit %v after SetLimit, want at once (its tick is %v)", d, o.TickInterval)
	}
}

// A write to the limit's hash after Redis lost it (a flush) gives it a TTL
// again.
func TestWeightedWritesKeepTheLimitsTTL(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := redisqueue.Options{Name: newName(t), TickInterval: 3 * time.Second, LeaseTTL: 10 * time.Second}
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 4, MaxQueue: 4, Weighted: true}, o)
	ctl := newClient(t, srv.addr())
	ctx := context.Background()
	if err := ctl.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	tk, err := b.Acquire(ctx, ginqueue.Arrival{Cost: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(tk)
	if keys, err := keysWithoutTTL(ctx, ctl, o.Name); err != nil || len(keys) > 0 {
		t.Errorf("keys without a TTL after a flush and a weighted grant: %v (%v)", keys, err)
	}
}

// A Backend closed while Redis is down says so when Redis answers its
// goodbye.
func TestClosedWhileDownReportsRedisBack(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	ups := make(chan bool, 4)
	o.OnStateChange = func(down bool, _ error) { ups <- down }
	b := startBackends2(t, srv.addr(), ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4}, o)
	tk, err := b.Acquire(context.Background(), ginqueue.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	srv.stop()
	eventually(t, 2*time.Second, "Redis not marked down", func() bool { return b.Stats().Unavailable })
	b.Release(tk) // retried in the background: the goodbye waits for it
	closed := make(chan struct{})
	go func() { _ = b.Close(); close(closed) }()
	srv.start()
	<-closed
	if b.Stats().Unavailable {
		t.Error("Unavailable still set after the goodbye got its answer")
	}
	if d := <-ups; !d {
		t.Fatal("the first change was not down")
	}
	select {
	case d := <-ups:
		if d {
			t.Error("a second down, want up")
		}
	case <-time.After(time.Second):
		t.Error("OnStateChange never said Redis was back")
	}
}

// cutProxy forwards TCP to a server until cut: then it closes every
// connection and refuses new ones (as a partition would), until healed.
type cutProxy struct {
	l     net.Listener
	to    string
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func newCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, to: to}
	t.Cleanup(func() { _ = l.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			cut := p.cut
			p.mu.Unlock()
			if cut {
				_ = c.Close()
				continue
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return p.l.Addr().String() }

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
	}
}

// Redis restarted empty while two FailOpen replicas ran requests on their
// own: the first back is not granted beside what the other still runs
// uncounted, until the other has registered again.
func TestRestartedEmptyWaitsForTheReplicasItLost(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	o := fallbackOptions(t)
	o.LeaseTTL = 3 * time.Second
	l := ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4}
	a := startBackends2(t, srv.addr(), l, o)
	proxy := newCutProxy(t, srv.addr())
	b := startBackends2(t, proxy.addr(), l, o)
	ctx := context.Background()
	eventually(t, 2*time.Second, "the replicas did not see each other", func() bool {
		s, err := a.GlobalStats(ctx)
		return err == nil && s.Replicas == 2
	})
	time.Sleep(3 * o.TickInterval) // each has heard there are 2
	srv.stop()
	local := func(r *redisqueue.Backend) ginqueue.Ticket {
		t.Helper()
		var tk ginqueue.Ticket
		eventually(t, 2*time.Second, "no grant on the replica's own", func() bool {
			c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			var err error
			tk, err = r.Acquire(c, ginqueue.Arrival{})
			if err == nil && !redisqueue.GrantedLocally(tk) {
				t.Fatal("granted by a Redis that is stopped")
			}
			return err == nil
		})
		return tk
	}
	ta, tb := local(a), local(b) // a budget of 1 each
	proxy.setCut(true)
	srv.start() // empty
	eventually(t, 2*time.Second, "a did not find Redis back", func() bool { return !a.Stats().Unavailable })
	c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if tk, err := a.Acquire(c, ginqueue.Arrival{}); err == nil {
		t.Fatalf("granted (locally %v) beside a's and b's requests admitted on their own: 3 over a limit of 2",
			redisqueue.GrantedLocally(tk))
	}
	proxy.setCut(false)
	eventually(t, 3*time.Second, "b did not find Redis back", func() bool { return !b.Stats().Unavailable })
	eventually(t, 2*time.Second, "b's request admitted on its own not counted", func() bool {
		s, err := a.GlobalStats(ctx)
		return err == nil && s.Running == 2
	})
	a.Release(ta)
	b.Release(tb)
	eventually(t, 3*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(a) })
}
