package suite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// DefaultRedisAddr is the Redis section 11 measures when REDIS_ADDR is unset.
const DefaultRedisAddr = "127.0.0.1:6379"

// RedisColumn heads the figures of section 11.
const RedisColumn = "redisqueue"

func redisAddr() string {
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a
	}
	return DefaultRedisAddr
}

// newRedisClient honours context deadlines (redisqueue needs
// ContextTimeoutEnabled), never retries, and notices a missing Redis at once.
func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
}

// newRedisName is a fresh Name prefix for one run's backends; cleanRedis
// deletes their keys.
func newRedisName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "bench-" + hex.EncodeToString(b[:])
}

// redisUncontended are limits that the pairs never reach.
var redisUncontended = ginqueue.Limits{MaxConcurrent: 1000, MaxQueue: 1000, QueueTimeout: 10 * time.Second}

// startRedisBackend starts a redisqueue Backend on its own client, as one
// replica would; closeAll closes both.
func startRedisBackend(addr, name string, l ginqueue.Limits) (b *redisqueue.Backend, closeAll func(), err error) {
	rdb := newRedisClient(addr)
	if b, err = redisqueue.New(rdb, redisqueue.Options{Name: name}); err == nil {
		err = b.Start(l)
	}
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return b, func() { _ = b.Close(); _ = rdb.Close() }, nil
}

// timed times n calls of f after n/10 to warm up, in ns.
func timed(n int, f func() error) ([]float64, error) {
	d := make([]float64, n)
	for i := -max(n/10, 1); i < n; i++ {
		start := time.Now()
		if err := f(); err != nil {
			return nil, err
		}
		if i >= 0 {
			d[i] = float64(time.Since(start))
		}
	}
	return d, nil
}

// redisRoundTrip is 11a: one client, one acquire+release pair at a time.
func (p Plan) redisRoundTrip(ctx context.Context, addr, name string) ([]float64, error) {
	b, closeAll, err := startRedisBackend(addr, name, redisUncontended)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	return timed(p.RedisPairs, func() error {
		t, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err == nil {
			b.Release(t)
		}
		return err
	})
}

// redisLoad reads what Redis has spent: its CPU seconds (used_cpu_sys +
// used_cpu_user), and the calls and microseconds of its script commands.
func redisLoad(ctx context.Context, c *redis.Client) (cpu, calls, usec float64, err error) {
	info, err := c.Info(ctx, "cpu", "commandstats").Result()
	cpu, calls, usec = parseRedisLoad(info)
	return cpu, calls, usec, err
}

func parseRedisLoad(info string) (cpu, calls, usec float64) {
	for line := range strings.SplitSeq(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro", "cmdstat_fcall":
			for kv := range strings.SplitSeq(v, ",") {
				name, val, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(val, 64)
				if name == "calls" {
					calls += f
				} else if name == "usec" {
					usec += f
				}
			}
		}
	}
	return cpu, calls, usec
}

// redisPairs is 11b: RedisClients on one backend doing pairs for
// RedisWindow, RedisWindows times: the rate of each window, the pairs in all.
func (p Plan) redisPairs(ctx context.Context, addr, name string) (rates []float64, pairs int64, err error) {
	b, closeAll, err := startRedisBackend(addr, name, redisUncontended)
	if err != nil {
		return nil, 0, err
	}
	defer closeAll()
	var failed atomic.Int64
	var firstErr atomic.Value
	for range p.RedisWindows {
		var n atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for range p.RedisClients {
			wg.Go(func() {
				for time.Since(start) < p.RedisWindow {
					t, err := b.Acquire(ctx, ginqueue.Arrival{})
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err)
						continue
					}
					b.Release(t)
					n.Add(1)
				}
			})
		}
		wg.Wait()
		rates = append(rates, float64(n.Load())/time.Since(start).Seconds())
		pairs += n.Load()
	}
	if f := failed.Load(); f > 0 {
		return rates, pairs, fmt.Errorf("%d acquires failed, the first: %v", f, firstErr.Load())
	}
	return rates, pairs, nil
}

// redisHandoff is 11c: two backends, each on its own client, share a limit
// of 1. A holds the slot while a request on B waits in Redis; a sample is
// the time from the start of A's Release to B's Acquire returning.
func (p Plan) redisHandoff(ctx context.Context, addr, name string) ([]float64, error) {
	l := ginqueue.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second}
	a, closeA, err := startRedisBackend(addr, name, l)
	if err != nil {
		return nil, err
	}
	defer closeA()
	b, closeB, err := startRedisBackend(addr, name, l)
	if err != nil {
		return nil, err
	}
	defer closeB()
	globally := func(queued, running int) error {
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
			if s, err := a.GlobalStats(ctx); err == nil && s.Queued == queued && (running < 0 || s.Running == running) {
				return nil
			}
		}
		return errors.New("redisqueue: the waiter did not show in Redis within 2s")
	}
	d := make([]float64, 0, p.RedisHandoffs)
	for range p.RedisHandoffs {
		held, err := a.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			return nil, err
		}
		got := make(chan error, 1)
		var at time.Time
		go func() {
			t, err := b.Acquire(ctx, ginqueue.Arrival{})
			at = time.Now()
			if err == nil {
				b.Release(t)
			}
			got <- err
		}()
		if err := globally(1, -1); err != nil {
			a.Release(held)
			<-got
			return nil, err
		}
		start := time.Now()
		a.Release(held)
		if err := <-got; err != nil {
			return nil, err
		}
		d = append(d, float64(at.Sub(start)))
		if err := globally(0, 0); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// cleanRedis deletes the keys of the backends whose Name starts with prefix
// (ginqueue:{Name}:…) and returns how many it deleted.
func cleanRedis(ctx context.Context, c *redis.Client, prefix string) (int, error) {
	var keys []string
	iter := c.Scan(ctx, 0, "ginqueue:{"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for i := 0; i < len(keys) && iter.Err() == nil; i += 500 {
		if err := c.Del(ctx, keys[i:min(i+500, len(keys))]...).Err(); err != nil {
			return 0, err
		}
	}
	return len(keys), iter.Err()
}

// redis is section 11, or says why it could not run.
func (r *runner) redis() {
	t, addr, ctx := &r.res.Redis, redisAddr(), context.Background()
	t.Cols = []string{RedisColumn}
	ctl := newRedisClient(addr)
	defer ctl.Close()
	info, err := ctl.Info(ctx, "server").Result()
	if err != nil {
		// The report names no host: the address becomes REDIS_ADDR.
		msg := strings.ReplaceAll(err.Error(), addr, "REDIS_ADDR")
		if host, _, herr := net.SplitHostPort(addr); herr == nil && host != "" {
			msg = strings.ReplaceAll(msg, host, "REDIS_ADDR")
		}
		r.res.RedisWhy = fmt.Sprintf("No Redis answered at REDIS_ADDR (default %s), so the Redis figures were not measured in this run (%s).", DefaultRedisAddr, msg)
		r.logf("  %s", r.res.RedisWhy)
		return
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			r.res.RedisVersion = v
		}
	}
	prefix := newRedisName()
	defer func() {
		n, err := cleanRedis(ctx, ctl, prefix)
		if err != nil {
			r.fail(RedisColumn, "11. cleaning up the keys", err)
		}
		r.logf("  deleted the run's %d keys", n)
	}()
	add := func(metric string, f Format, higher bool, x float64) {
		t.Rows = append(t.Rows, Row{Metric: metric, Format: f, Higher: higher, Values: map[string]float64{RedisColumn: x}})
	}
	quantiles := func(metric string, d []float64, err error) {
		if err != nil {
			r.fail(RedisColumn, metric, err)
			return
		}
		add(metric+" p50", FormatDuration, false, pct(0, 0.5)([][]float64{d}))
		add(metric+" p99", FormatDuration, false, pct(0, 0.99)([][]float64{d}))
	}
	d, err := r.redisRoundTrip(ctx, addr, prefix+"-rt")
	quantiles("11a. acquire+release round trip", d, err)
	d, err = timed(r.RedisPairs, func() error {
		if err := ctl.Ping(ctx).Err(); err != nil {
			return err
		}
		return ctl.Ping(ctx).Err()
	})
	quantiles("11a. two PINGs, the floor of a pair,", d, err)
	cpu0, calls0, usec0, err0 := redisLoad(ctx, ctl)
	rates, pairs, err := r.redisPairs(ctx, addr, prefix+"-pairs")
	cpu1, calls1, usec1, err1 := redisLoad(ctx, ctl)
	if err != nil {
		r.fail(RedisColumn, "11b. pairs", err)
	}
	if len(rates) > 0 {
		add(fmt.Sprintf("11b. acquire+release pairs, %d clients, uncontended", r.RedisClients), FormatRate, true, med(0)([][]float64{rates}))
	}
	d, err = r.redisHandoff(ctx, addr, prefix+"-handoff")
	quantiles("11c. hand-off across backends", d, err)
	if err := errors.Join(err0, err1); err != nil {
		r.fail(RedisColumn, "11d. INFO cpu and commandstats", err)
	} else if n := float64(pairs); n > 0 {
		add("11d. Redis CPU per acquire+release pair (INFO cpu)", FormatDuration, false, (cpu1-cpu0)*1e9/n)
		add("11d. Redis script time per pair (commandstats)", FormatDuration, false, (usec1-usec0)*1e3/n)
		add("11d. script calls per pair (commandstats)", FormatRatio, false, (calls1-calls0)/n)
	}
}
