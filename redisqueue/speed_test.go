package redisqueue_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// TestSpeed measures the figures of the README against the Redis at
// REDIS_ADDR. It runs only with REDISQUEUE_SPEED=1, without -race:
//
//	REDISQUEUE_SPEED=1 go test -run TestSpeed -count=1 -v .
func TestSpeed(t *testing.T) {
	if os.Getenv("REDISQUEUE_SPEED") == "" {
		t.Skip("set REDISQUEUE_SPEED=1 to measure")
	}
	needRedis(t)
	ctx := context.Background()
	l := backend.Limits{MaxConcurrent: 1000, MaxQueue: 1000, QueueTimeout: 10 * time.Second}

	t.Run("floor", func(t *testing.T) {
		// What two plain round trips cost on this machine now: the floor
		// under an acquire+release pair (two script calls).
		c := newClient(t, redisAddr)
		d := make([]time.Duration, 5000)
		for i := range d {
			start := time.Now()
			_ = c.Ping(ctx).Err()
			_ = c.Ping(ctx).Err()
			d[i] = time.Since(start)
		}
		t.Logf("two PINGs (the floor of a pair): p50 %v, p99 %v", pct(d, 50), pct(d, 99))
	})

	t.Run("round trip", func(t *testing.T) {
		b := startBackends(t, 1, l, redisqueue.Options{Mode: redisqueue.GlobalQueue})[0]
		pair := func() time.Duration {
			start := time.Now()
			tk, err := b.Acquire(ctx, backend.Arrival{})
			if err != nil {
				t.Fatal(err)
			}
			b.Release(tk)
			return time.Since(start)
		}
		for range 500 {
			pair()
		}
		d := make([]time.Duration, 5000)
		for i := range d {
			d[i] = pair()
		}
		t.Logf("acquire+release round trip: p50 %v, p99 %v (%d pairs, one client)", pct(d, 50), pct(d, 99), len(d))
	})

	t.Run("8 clients", func(t *testing.T) {
		b := startBackends(t, 1, l, redisqueue.Options{Mode: redisqueue.GlobalQueue})[0]
		ctl := newClient(t, redisAddr)
		cpu0, calls0 := redisCPU(t, ctl)
		const dur = 2 * time.Second
		var pairs atomic.Int64
		stop := time.Now().Add(dur)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					tk, err := b.Acquire(ctx, backend.Arrival{})
					if err != nil {
						continue
					}
					b.Release(tk)
					pairs.Add(1)
				}
			})
		}
		wg.Wait()
		cpu1, calls1 := redisCPU(t, ctl)
		n := pairs.Load()
		t.Logf("8 concurrent clients, uncontended: %.0f pairs/s", float64(n)/dur.Seconds())
		t.Logf("Redis CPU: %.1f µs per acquire+release pair (used_cpu_sys+user over the run; includes any other load on this Redis), %.1f µs per script call (commandstats)",
			(cpu1-cpu0)*1e6/float64(n), perCall(calls0, calls1))
	})

	t.Run("hand-off", func(t *testing.T) {
		bs := startBackends(t, 2, backend.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second}, redisqueue.Options{Mode: redisqueue.GlobalQueue})
		d := make([]time.Duration, 0, 500)
		for range cap(d) {
			held, err := bs[0].Acquire(ctx, backend.Arrival{})
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan time.Time, 1)
			go func() {
				tk, err := bs[1].Acquire(ctx, backend.Arrival{})
				got <- time.Now()
				if err == nil {
					bs[1].Release(tk)
				}
			}()
			waitQueued(t, bs[0], 1)
			start := time.Now()
			bs[0].Release(held)
			d = append(d, (<-got).Sub(start))
			waitQueued(t, bs[0], 0)
		}
		t.Logf("hand-off from a release on one backend to a waiter on another: p50 %v, p99 %v (%d)", pct(d, 50), pct(d, 99), len(d))
	})
}

// pct returns the p-th percentile of d.
func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// scriptStat is calls and usec of EVALSHA and EVAL in INFO commandstats.
type scriptStat struct{ calls, usec float64 }

// redisCPU returns Redis's used CPU seconds and its script call stats.
func redisCPU(t *testing.T, c *redis.Client) (float64, scriptStat) {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var cpu float64
	var st scriptStat
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		case "cmdstat_evalsha", "cmdstat_eval":
			for kv := range strings.SplitSeq(v, ",") {
				name, val, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(val, 64)
				switch name {
				case "calls":
					st.calls += f
				case "usec":
					st.usec += f
				}
			}
		}
	}
	return cpu, st
}

func perCall(a, b scriptStat) float64 {
	if b.calls == a.calls {
		return 0
	}
	return (b.usec - a.usec) / (b.calls - a.calls)
}

// BenchmarkAcquireRelease is one acquire+release pair on an uncontended
// limit, from b.N goroutines' worth of parallelism.
func BenchmarkAcquireRelease(b *testing.B) {
	needRedis(b)
	rb, err := redisqueue.New(newClient(b, redisAddr), redisqueue.Options{Name: newName(b), Mode: redisqueue.GlobalQueue})
	if err != nil {
		b.Fatal(err)
	}
	if err := rb.Start(backend.Limits{MaxConcurrent: 10000, MaxQueue: 10}); err != nil {
		b.Fatal(err)
	}
	defer rb.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tk, err := rb.Acquire(ctx, backend.Arrival{})
			if err != nil {
				b.Error(err)
				return
			}
			rb.Release(tk)
		}
	})
}
