package redisqueue

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/redis/go-redis/v9"
)

// delayAcquire is a go-redis hook that holds the acquire script's call back
// for d, as a slow network would.
type delayAcquire struct {
	sha string
	d   time.Duration
}

func (h delayAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h delayAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[1] == h.sha {
			time.Sleep(h.d)
		}
		return next(ctx, cmd)
	}
}

func (h delayAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Close while an acquire is on its way to Redis: the acquire reaches Redis
// after Close gave its id back, and is granted (or queued). The replica
// gives that back once the reply comes, so nothing is left in Redis for the
// lease to expire; with a cost, all of its slots.
func TestCloseRacingAnAcquireInFlightLeavesNothing(t *testing.T) {
	for _, cost := range []int{1, 4} {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			t.Skip("no Redis at 127.0.0.1:6379")
		}
		rdb.AddHook(delayAcquire{sha: acquireScript.sha, d: 300 * time.Millisecond})
		name := "close-inflight-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		b, err := New(rdb, Options{Name: name, LeaseTTL: 3 * time.Second, CallTimeout: 700 * time.Millisecond, Mode: GlobalQueue})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(backend.Limits{MaxConcurrent: 4, MaxQueue: 4, Weighted: true}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			tk, err := b.Acquire(context.Background(), backend.Arrival{Cost: cost})
			if err == nil {
				b.Release(tk)
			}
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		_ = b.Close()
		<-done
		drain, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = b.Drain(drain)
		cancel()
		ctx := context.Background()
		deadline := time.Now().Add(time.Second)
		for {
			h := b.rdb.ZCard(ctx, b.keys[keyH]).Val()
			q := b.rdb.ZCard(ctx, b.keys[keyQ]).Val()
			if h == 0 && q == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cost %d: a second after Close, Redis holds %d holder(s) and %d waiter(s) nobody will give back; only the lease would free them", cost, h, q)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
