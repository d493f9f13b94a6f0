package redisqueue

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
)

// ownRedis starts a redis-server of the test's own on a free port and
// returns its address; it is killed at the end of the test.
func ownRedis(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not found and CI is set")
		}
		t.Skip("redis-server not found")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for end := time.Now().Add(5 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(end) {
			t.Fatal("redis-server did not answer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return addr
}

// A request admitted on this replica's own after its probe listed what it
// runs, and before the probe's answer marks Redis up, is counted before
// Redis grants anybody: the probe does not count as this replica's full
// list, the sync right after it does.
func TestALocalGrantAfterTheProbesListIsCounted(t *testing.T) {
	addr := ownRedis(t)
	o := Options{Name: "late", CallTimeout: 50 * time.Millisecond, LeaseTTL: 3 * time.Second,
		TickInterval: 200 * time.Millisecond, FailureThreshold: 1} // a liveness lease of 600 ms
	l := ginqueue.Limits{MaxConcurrent: 2, MaxQueue: 4}
	start := func(o Options, hook func(bool)) *Backend {
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		b, err := New(rdb, o)
		if err != nil {
			t.Fatal(err)
		}
		b.syncHook = hook
		if err := b.Start(l); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	var a *Backend
	var late atomic.Pointer[ginqueue.Ticket]
	var paused, delayed atomic.Bool
	window := make(chan struct{})
	a = start(o, func(down bool) {
		switch {
		case down && paused.Load() && late.Load() == nil:
			// The probe that will find Redis back: its list is taken, and
			// a request is admitted on a's own before it is sent.
			c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if tk, err := a.Acquire(c, ginqueue.Arrival{}); err == nil {
				late.Store(&tk)
			}
		case !down && late.Load() != nil && !delayed.Swap(true):
			// The sync with the full list comes late.
			close(window)
			time.Sleep(200 * time.Millisecond) // well within the liveness lease
		}
	})
	ob := o
	ob.FailureThreshold = 1000 // never marked down: it syncs with a full list at once
	other := start(ob, nil)
	ctl := redis.NewClient(&redis.Options{Addr: addr})
	defer ctl.Close()
	ctx := context.Background()
	for s, _ := a.GlobalStats(ctx); s.Replicas != 2; s, _ = a.GlobalStats(ctx) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := ctl.Do(ctx, "CLIENT", "PAUSE", 500, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	paused.Store(true)
	c, cancel := context.WithTimeout(ctx, 60*time.Millisecond)
	if tk, err := a.Acquire(c, ginqueue.Arrival{}); err == nil { // its call fails: Redis is marked down on a
		a.Release(tk) // admitted on its own
	}
	cancel()
	select {
	case <-window:
	case <-time.After(3 * time.Second):
		t.Fatalf("no late local grant, or Redis not marked up on a: %+v", a.Stats())
	}
	// While a's full list is on its way: two requests on the other replica.
	got := make(chan ginqueue.Ticket, 2)
	for range 2 {
		go func() {
			c, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if tk, err := other.Acquire(c, ginqueue.Arrival{}); err == nil {
				got <- tk
			}
		}()
	}
	var tks []ginqueue.Ticket
	timeout := time.After(1200 * time.Millisecond)
	for len(tks) < 2 {
		select {
		case tk := <-got:
			tks = append(tks, tk)
			continue
		case <-timeout:
		}
		break
	}
	if len(tks) > 1 {
		t.Fatalf("both granted beside a's request admitted on its own: 3 over a limit of 2")
	}
	a.Release(*late.Load())
	for _, tk := range tks {
		other.Release(tk)
	}
	if len(tks) == 1 {
		// the other one gets the slot a's request gave back, or timed out
		select {
		case tk := <-got:
			other.Release(tk)
		case <-time.After(time.Second):
		}
	}
}
