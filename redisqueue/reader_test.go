package redisqueue_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// A grant made while the notice reader is away (the server was gone for
// a while, and the reader's pauses between dials grew to a tick) reaches
// the waiter well before the safety net's next tick: the reader dials again
// as soon as the maintainer's call gets an answer, and while the reader is
// away the safety net runs faster.
func TestGrantReachesWaiterSoonAfterServerReturns(t *testing.T) {
	needRedis(t)
	t.Parallel()
	srv := startRedis(t)
	const tick = time.Second
	o := redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, LeaseTTL: 3 * tick, FailureThreshold: 29, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: tick}} // the most LeaseTTL allows: never down, this is about the reader alone
	l := backend.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second}
	b := startBackends2(t, srv.addr(), l, o)
	ctx := context.Background()
	holder, err := b.Acquire(ctx, backend.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		tk, err := b.Acquire(ctx, backend.Arrival{})
		if err != nil {
			t.Errorf("the waiter got %v", err)
			close(got)
			return
		}
		got <- time.Now()
		b.Release(tk)
	}()
	waitQueued(t, b, 1)
	srv.stop()
	time.Sleep(2 * tick)
	srv.start()
	// The waiter, lost with the server, enqueues again.
	eventually(t, 2*tick, "the waiter did not enqueue again", func() bool {
		s, err := b.GlobalStats(ctx)
		return err == nil && s.Queued == 1
	})
	released := time.Now()
	b.Release(holder)
	select {
	case at, ok := <-got:
		if !ok {
			return
		}
		if d := at.Sub(released); d > tick/4 {
			t.Errorf("the grant reached the waiter %v after the release, want well within the safety net's tick (%v)", d, tick)
		}
	case <-time.After(5 * tick):
		t.Fatal("the waiter was never granted")
	}
	eventually(t, 2*time.Second, "slots or places leaked in Redis", func() bool { return globalIdle(b) })
}

// After a failover to a new master while the old one froze (a hung host),
// the notice reader, blocked on the old master, moves to the new one as
// soon as the Backend's client reaches it, not when its block runs out: a
// reader that stayed would miss every notice for seconds. The client
// follows the new master by its dialer here, as a Sentinel client does.
func TestTheReaderLeavesAFrozenMaster(t *testing.T) {
	needRedis(t)
	old, next := startRedis(t), startRedis(t)
	p := newFreezeProxy(t, old.addr())
	var target atomic.Value
	target.Store(p.addr())
	rdb := redis.NewClient(&redis.Options{Addr: "master", ContextTimeoutEnabled: true, MaxRetries: -1,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, target.Load().(string))
		}})
	t.Cleanup(func() { _ = rdb.Close() })
	up := make(chan struct{}, 1)
	b := startOneSlot(t, rdb, redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, FailureThreshold: 1, OnStateChange: func(down bool, _ error) {
		if !down {
			up <- struct{}{}
		}
	}, Mode: redisqueue.GlobalQueue})
	// A grant notice read: the reader has just begun its next block.
	ctx := context.Background()
	first, err := b.Acquire(ctx, backend.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan backend.Ticket)
	go func() {
		tk, err := b.Acquire(ctx, backend.Arrival{})
		if err != nil {
			t.Error(err)
		}
		granted <- tk
	}()
	eventually(t, 2*time.Second, "the second request never queued", func() bool {
		return b.Stats().Queued > 0
	})
	b.Release(first)
	b.Release(<-granted)
	p.setFrozen(true)
	target.Store(next.addr())
	<-up
	blocked := newClient(t, next.addr())
	eventually(t, 500*time.Millisecond, "the reader still waits on the frozen master", func() bool {
		list, _ := blocked.ClientList(ctx).Result()
		return strings.Contains(list, "cmd=blpop")
	})
}

// An idle replica's reader costs Redis one call per quiet block (the check
// that the client still sends its calls to the reader's server), not three:
// on a thousand replicas those checks were a third of all Redis calls.
func TestAQuietReaderCostsOneCallPerBlock(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	ctl := newClient(t, srv.addr())
	startOneSlot(t, newClient(t, srv.addr()), redisqueue.Options{Name: newName(t)})
	ctx := context.Background()
	if err := ctl.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Two blocks of 2 s each, and part of a third.
	time.Sleep(4500 * time.Millisecond)
	stats, err := ctl.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := func(cmd string) int {
		_, rest, ok := strings.Cut(stats, "cmdstat_"+cmd+":calls=")
		if !ok {
			return 0
		}
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		return n
	}
	if n := calls("role"); n != 0 {
		t.Errorf("the reader sent ROLE %d times while idle, want 0", n)
	}
	if n := calls("info"); n > 3 {
		t.Errorf("INFO ran %d times in 4.5 s of an idle replica, want at most 3 (one a quiet block)", n)
	}
}

// The reader learns its server's run id at a quiet block when the INFO
// sent as it dialled did not answer in time (Redis was busy as the replica
// started). Without it, the reader could not tell that the client moved to
// a new master while the old one answers on as a master, and stayed on the
// old one: grants came only from the safety net.
func TestTheReaderLeavesTheOldMasterAfterASlowFirstInfo(t *testing.T) {
	t.Parallel()
	needRedis(t)
	old, next := startRedis(t), startRedis(t)
	var target atomic.Value
	target.Store(old.addr())
	var infoDone atomic.Bool // the first INFO's answer takes 150 ms: Redis is busy
	rdb := redis.NewClient(&redis.Options{Addr: "master", ContextTimeoutEnabled: true, MaxRetries: -1,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, target.Load().(string))
			if err != nil {
				return c, err
			}
			return &slowInfo{Conn: c, once: &infoDone}, nil
		}})
	t.Cleanup(func() { _ = rdb.Close() })
	b := startOneSlot(t, rdb, redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, Mode: redisqueue.GlobalQueue})
	ctx := context.Background()
	onOld := newClient(t, old.addr())
	// The reader blocks on the old master (the answer to its INFO took 150 ms,
	// past the CallTimeout).
	eventually(t, 3*time.Second, "the reader never blocked on the old master", func() bool {
		list, _ := onOld.ClientList(ctx).Result()
		return strings.Contains(list, "cmd=blpop")
	})
	eventually(t, 3*time.Second, "Redis never marked up", func() bool { return !b.Stats().Unavailable })
	eventually(t, 3*time.Second, "no run id learned at a quiet block", func() bool { return redisqueue.ServerRunID(b) != "" })
	// The failover: the client's new connections go to next; its pooled
	// ones break (frozen for a moment); the old master answers again after.
	target.Store(next.addr())
	// As a Sentinel client does on +switch-master: the pool's connections
	// to the old master close; the reader's is not the pool's.
	list, _ := onOld.ClientList(ctx).Result()
	for _, line := range strings.Split(list, "\n") {
		if line == "" || strings.Contains(line, "cmd=blpop") || strings.Contains(line, "cmd=client") {
			continue
		}
		id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
		_ = onOld.Do(ctx, "CLIENT", "KILL", "ID", id).Err()
	}
	onNext := newClient(t, next.addr())
	eventually(t, 3*time.Second, "the client never reached the new master", func() bool {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if tk, err := b.Acquire(c, backend.Arrival{}); err == nil {
			b.Release(tk)
		}
		_, err := b.GlobalStats(c)
		return err == nil && !b.Stats().Unavailable
	})
	// Within two quiet blocks and a bit, the reader must be on next.
	eventually(t, 5*time.Second, "the reader still waits on the old master, 5 s after the client moved", func() bool {
		list, _ := onNext.ClientList(ctx).Result()
		return strings.Contains(list, "cmd=blpop")
	})
}

// slowInfo is a connection whose answer to the first INFO of the process
// comes 150 ms late (once, on whichever connection sends it).
type slowInfo struct {
	net.Conn
	once *atomic.Bool
	late bool
}

func (c *slowInfo) Write(p []byte) (int, error) {
	if strings.Contains(strings.ToLower(string(p)), "$4\r\ninfo\r\n") && c.once.CompareAndSwap(false, true) {
		c.late = true
	}
	return c.Conn.Write(p)
}

func (c *slowInfo) Read(p []byte) (int, error) {
	if c.late {
		c.late = false
		time.Sleep(150 * time.Millisecond)
	}
	return c.Conn.Read(p)
}

// startOneSlot starts a Backend on rdb with o, for a limit of one slot and
// four waiting places; it is closed at the end of the test.
func startOneSlot(t *testing.T, rdb redis.UniversalClient, o redisqueue.Options) *redisqueue.Backend {
	t.Helper()
	b, err := redisqueue.New(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(backend.Limits{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
