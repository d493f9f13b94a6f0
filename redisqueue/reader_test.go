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
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t), CallTimeout: 100 * time.Millisecond, FailureThreshold: 1, OnStateChange: func(down bool, _ error) {
		if !down {
			up <- struct{}{}
		}
	}, Mode: redisqueue.GlobalQueue})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(backend.Limits{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
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
	b, err := redisqueue.New(newClient(t, srv.addr()), redisqueue.Options{Name: newName(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(backend.Limits{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
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
