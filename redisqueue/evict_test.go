package redisqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// outcome is what one Acquire of a test ended with.
type outcome struct {
	i   int // index of the arrival
	err error
}

func TestFullQueueEvictsLowestNewestAcrossReplicas(t *testing.T) {
	needRedis(t)
	t.Parallel()
	tests := []struct {
		name     string
		queue    [][2]int // {replica, priority}, queued in this order, filling the queue
		arrival  [2]int
		evicted  int   // index into queue of the waiter that gets queue full; -1: the arrival does
		grants   []int // indexes (len(queue) is the arrival) in grant order
		maxQueue int
	}{
		{"higher evicts the newest of the lowest", [][2]int{{1, 0}, {1, 0}, {0, 3}}, [2]int{0, 5}, 1, []int{3, 2, 0}, 3},
		{"the lowest priority, not a nearer lower one", [][2]int{{1, 1}, {1, 0}, {0, 1}}, [2]int{0, 2}, 1, []int{3, 0, 2}, 3},
		{"same as the lowest: refused", [][2]int{{1, 0}, {0, 2}}, [2]int{0, 0}, -1, []int{1, 0}, 2},
		{"lower than all: refused", [][2]int{{1, 0}, {0, 2}}, [2]int{1, -4}, -1, []int{1, 0}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bs := startBackends(t, 2, ginqueue.Limits{MaxConcurrent: 1, MaxQueue: tt.maxQueue, QueueTimeout: 10 * time.Second}, redisqueue.Options{})
			release := holdAll(t, bs[0], 1)
			n := len(tt.queue)
			out := make(chan outcome, n+1) // refusals
			order := make(chan int, n+1)   // grants, sent before the release
			acquire := func(b *redisqueue.Backend, i, prio int) {
				tk, err := b.Acquire(context.Background(), ginqueue.Arrival{Priority: prio})
				if err != nil {
					out <- outcome{i, err}
					return
				}
				order <- i
				b.Release(tk)
			}
			for i, a := range tt.queue {
				go acquire(bs[a[0]], i, a[1])
				waitQueued(t, bs[0], i+1)
			}
			go acquire(bs[tt.arrival[0]], n, tt.arrival[1])
			want := tt.evicted
			if want < 0 {
				want = n
			}
			select {
			case o := <-out:
				if o.i != want || !errors.Is(o.err, ginqueue.ErrQueueFull) {
					t.Fatalf("arrival %d got %v; want arrival %d to get queue full", o.i, o.err, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("nobody got queue full")
			}
			waitQueued(t, bs[0], n)
			release()
			for k, w := range tt.grants {
				select {
				case got := <-order:
					if got != w {
						t.Fatalf("grant %d went to arrival %d, want %d", k, got, w)
					}
				case o := <-out:
					t.Fatalf("arrival %d got %v", o.i, o.err)
				case <-time.After(5 * time.Second):
					t.Fatalf("grant %d never came", k)
				}
			}
			eventually(t, 2*time.Second, "slots or places left in Redis", func() bool { return globalIdle(bs[0]) })
		})
	}
}

// TestLostEvictionNoticeIsCaughtByTheSafetyNet evicts a waiter in Redis as
// the acquire script does, but pushes no notice: the safety-net tick must
// answer it queue full, not enqueue it again.
func TestLostEvictionNoticeIsCaughtByTheSafetyNet(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const tick = 100 * time.Millisecond
	o := redisqueue.Options{Name: newName(t), TickInterval: tick}
	bs := startBackends(t, 2, ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: 10 * time.Second}, o)
	defer holdAll(t, bs[0], 1)()
	errc := make(chan error, 1)
	go func() {
		tk, err := bs[1].Acquire(context.Background(), ginqueue.Arrival{})
		if err == nil {
			bs[1].Release(tk)
		}
		errc <- err
	}()
	waitQueued(t, bs[0], 1)

	ctx := context.Background()
	c := newClient(t, redisAddr)
	prefix := "ginqueue:{" + o.Name + "}:"
	w, err := c.HGetAll(ctx, prefix+"w").Result()
	if err != nil || len(w) != 1 {
		t.Fatalf("waiters in Redis: %v, %v", w, err)
	}
	for id, m := range w {
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.ZRem(ctx, prefix+"q", m)
			p.HDel(ctx, prefix+"w", id)
			p.ZRem(ctx, prefix+"we", id)
			p.ZAdd(ctx, prefix+"ev", redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: id})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	select {
	case err := <-errc:
		if !errors.Is(err, ginqueue.ErrQueueFull) {
			t.Fatalf("evicted waiter got %v, want queue full", err)
		}
		if d := time.Since(start); d > 3*tick+redisqueue.DefaultCallTimeout {
			t.Fatalf("answered after %v, want within about one tick (%v)", d, tick)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the evicted waiter was never answered")
	}
	waitQueued(t, bs[0], 0)
}
