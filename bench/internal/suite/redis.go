package suite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// DefaultRedisAddr is the Redis the suite measures when REDIS_ADDR is unset.
const DefaultRedisAddr = "127.0.0.1:6379"

// RedisColumn is the key of the figures in RedisReport.Rows.
const RedisColumn = "redisqueue"

// RedisClients is the number of concurrent clients of the pairs/s figure.
const RedisClients = 8

// Metric names of the Redis section.
const (
	MRedisRoundTripP50 = "11a. acquire+release round trip p50"
	MRedisRoundTripP99 = "11a. acquire+release round trip p99"
	MRedisFloorP50     = "11a. two PINGs, the floor of a pair, p50"
	MRedisFloorP99     = "11a. two PINGs, the floor of a pair, p99"
	MRedisPairs        = "11b. acquire+release pairs, 8 clients, uncontended"
	MRedisHandoffP50   = "11c. hand-off across backends p50"
	MRedisHandoffP99   = "11c. hand-off across backends p99"
	MRedisCPU          = "11d. Redis CPU per acquire+release pair (INFO cpu)"
	MRedisScriptTime   = "11d. Redis script time per pair (commandstats)"
	MRedisScriptCalls  = "11d. script calls per pair (commandstats)"
)

// RedisReport is section 11: the redisqueue backend against a real Redis.
type RedisReport struct {
	// Measured is false when no Redis answered; Why then says so.
	Measured bool
	Why      string
	Version  string // redis_version of INFO server
	Rows     []Row  // one figure each, under RedisColumn
}

// redisAddr is REDIS_ADDR, or DefaultRedisAddr; fromEnv says which.
func redisAddr() (addr string, fromEnv bool) {
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a, true
	}
	return DefaultRedisAddr, false
}

// newRedisClient is a go-redis client for the backends: context deadlines
// honoured (redisqueue needs ContextTimeoutEnabled), no retries, a short
// dial timeout so that a missing Redis is noticed at once.
func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           500 * time.Millisecond,
		MaxRetries:            -1,
	})
}

// newRedisName returns a fresh backend Name prefix for one run: its backends
// are named prefix-rt, prefix-pairs and so on, and cleanRedis removes their
// keys.
func newRedisName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "bench-" + hex.EncodeToString(b[:])
}

// startRedisBackend builds and starts a redisqueue Backend on its own
// client, as one replica would. close closes both.
func startRedisBackend(addr, name string, l ginqueue.Limits) (b *redisqueue.Backend, closeAll func(), err error) {
	rdb := newRedisClient(addr)
	b, err = redisqueue.New(rdb, redisqueue.Options{Name: name})
	if err == nil {
		err = b.Start(l)
	}
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return b, func() { _ = b.Close(); _ = rdb.Close() }, nil
}

// redisFloor times n pairs of PINGs: what two plain round trips cost, the
// floor under an acquire+release pair (two script calls).
func redisFloor(ctx context.Context, c *redis.Client, n int) ([]time.Duration, error) {
	d := make([]time.Duration, n)
	for i := range d {
		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		if err := c.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		d[i] = time.Since(start)
	}
	return d, nil
}

// redisUncontended are limits that n acquire+release pairs never reach.
var redisUncontended = ginqueue.Limits{MaxConcurrent: 1000, MaxQueue: 1000, QueueTimeout: 10 * time.Second}

// redisRoundTrip is metric 11a: one client, one acquire+release pair at a
// time on an uncontended limit; n timed pairs after n/10 to warm up.
func redisRoundTrip(ctx context.Context, addr, name string, n int) ([]time.Duration, error) {
	b, closeAll, err := startRedisBackend(addr, name, redisUncontended)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	pair := func() (time.Duration, error) {
		start := time.Now()
		t, err := b.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			return 0, err
		}
		b.Release(t)
		return time.Since(start), nil
	}
	for range max(n/10, 1) {
		if _, err := pair(); err != nil {
			return nil, err
		}
	}
	d := make([]time.Duration, n)
	for i := range d {
		if d[i], err = pair(); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// redisLoad is what Redis reported before and after a run: its CPU seconds
// (used_cpu_sys + used_cpu_user) and the calls and microseconds of its
// script commands (EVALSHA, EVAL).
type redisLoad struct {
	CPU         float64
	ScriptCalls float64
	ScriptUsec  float64
}

// readRedisLoad reads INFO cpu and commandstats.
func readRedisLoad(ctx context.Context, c *redis.Client) (redisLoad, error) {
	info, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return redisLoad{}, err
	}
	return parseRedisLoad(info), nil
}

func parseRedisLoad(info string) redisLoad {
	var l redisLoad
	for line := range strings.SplitSeq(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			l.CPU += f
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro", "cmdstat_fcall":
			for kv := range strings.SplitSeq(v, ",") {
				name, val, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(val, 64)
				switch name {
				case "calls":
					l.ScriptCalls += f
				case "usec":
					l.ScriptUsec += f
				}
			}
		}
	}
	return l
}

// redisPairs is metric 11b: 8 clients on one backend, each doing
// acquire+release pairs on an uncontended limit for window, windows times.
// It returns the pairs per second of each window and the pairs in all.
func redisPairs(ctx context.Context, addr, name string, window time.Duration, windows int) (rates []float64, pairs int64, err error) {
	b, closeAll, err := startRedisBackend(addr, name, redisUncontended)
	if err != nil {
		return nil, 0, err
	}
	defer closeAll()
	var failed atomic.Int64
	var firstErr atomic.Value
	for range windows {
		var n atomic.Int64
		start := time.Now()
		stop := start.Add(window)
		var wg sync.WaitGroup
		for range RedisClients {
			wg.Go(func() {
				for time.Now().Before(stop) {
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

// redisHandoff is metric 11c: two backends, each on its own client, share a
// limit of 1. Backend A holds the slot while a request on backend B waits in
// Redis; a sample is the time from the start of A's Release to B's Acquire
// returning. n samples.
func redisHandoff(ctx context.Context, addr, name string, n int) ([]time.Duration, error) {
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
	globally := func(cond func(redisqueue.GlobalStats) bool) error {
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
			if s, err := a.GlobalStats(ctx); err == nil && cond(s) {
				return nil
			}
		}
		return errors.New("redisqueue: the waiter did not show in Redis within 2s")
	}
	type grant struct {
		at  time.Time
		err error
	}
	d := make([]time.Duration, 0, n)
	for range n {
		held, err := a.Acquire(ctx, ginqueue.Arrival{})
		if err != nil {
			return nil, err
		}
		got := make(chan grant, 1)
		go func() {
			t, err := b.Acquire(ctx, ginqueue.Arrival{})
			got <- grant{time.Now(), err}
			if err == nil {
				b.Release(t)
			}
		}()
		if err := globally(func(s redisqueue.GlobalStats) bool { return s.Queued == 1 }); err != nil {
			a.Release(held)
			<-got
			return nil, err
		}
		start := time.Now()
		a.Release(held)
		g := <-got
		if g.err != nil {
			return nil, g.err
		}
		d = append(d, g.at.Sub(start))
		if err := globally(func(s redisqueue.GlobalStats) bool { return s.Queued == 0 && s.Running == 0 }); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// cleanRedis deletes every key of the backends whose Name starts with
// prefix (their keys are ginqueue:{Name}:…) and returns how many it deleted.
func cleanRedis(ctx context.Context, c *redis.Client, prefix string) (int, error) {
	var keys []string
	iter := c.Scan(ctx, 0, "ginqueue:{"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return 0, err
	}
	for i := 0; i < len(keys); i += 500 {
		if err := c.Del(ctx, keys[i:min(i+500, len(keys))]...).Err(); err != nil {
			return 0, err
		}
	}
	return len(keys), nil
}

// redis runs section 11, or records why it could not.
func (r *runner) redis() {
	r.logf("11. redisqueue on Redis")
	rep := &r.res.Redis
	addr, fromEnv := redisAddr()
	where := "REDIS_ADDR (unset: the default, " + DefaultRedisAddr + ")"
	if fromEnv {
		where = "REDIS_ADDR"
	}
	ctx := context.Background()
	ctl := newRedisClient(addr)
	defer ctl.Close()
	info, err := ctl.Info(ctx, "server").Result()
	if err != nil {
		// The report names no host: the error's address becomes REDIS_ADDR.
		msg := strings.ReplaceAll(err.Error(), addr, "REDIS_ADDR")
		if host, _, herr := net.SplitHostPort(addr); herr == nil && host != "" {
			msg = strings.ReplaceAll(msg, host, "REDIS_ADDR")
		}
		rep.Why = fmt.Sprintf("No Redis answered at %s, so the Redis figures were not measured in this run (%s).", where, msg)
		r.logf("  %s", rep.Why)
		return
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			rep.Version = v
		}
	}
	rep.Measured = true
	prefix := newRedisName()
	defer func() {
		n, err := cleanRedis(ctx, ctl, prefix)
		if err != nil {
			r.fail(Variant{Name: RedisColumn}, "11. cleaning up the keys", err)
			return
		}
		r.logf("  deleted the run's %d keys", n)
	}()
	one := func(metric string, f Format, higher bool, x float64) {
		row := newRow(metric, "", higher, f)
		row.Values[RedisColumn] = x
		rep.Rows = append(rep.Rows, row)
	}
	fail := func(metric string, err error) { r.fail(Variant{Name: RedisColumn}, metric, err) }

	if d, err := redisRoundTrip(ctx, addr, prefix+"-rt", r.plan.RedisPairs); err != nil {
		fail("11a. round trip", err)
	} else {
		one(MRedisRoundTripP50, FormatDuration, false, float64(quantile(d, 0.5)))
		one(MRedisRoundTripP99, FormatDuration, false, float64(quantile(d, 0.99)))
	}
	if d, err := redisFloor(ctx, ctl, r.plan.RedisPairs); err != nil {
		fail("11a. two PINGs", err)
	} else {
		one(MRedisFloorP50, FormatDuration, false, float64(quantile(d, 0.5)))
		one(MRedisFloorP99, FormatDuration, false, float64(quantile(d, 0.99)))
	}
	before, err1 := readRedisLoad(ctx, ctl)
	rates, pairs, err := redisPairs(ctx, addr, prefix+"-pairs", r.plan.RedisWindow, r.plan.RedisWindows)
	after, err2 := readRedisLoad(ctx, ctl)
	if err != nil {
		fail(MRedisPairs, err)
	}
	if len(rates) > 0 {
		one(MRedisPairs, FormatRate, true, median(rates))
	}
	if err := errors.Join(err1, err2); err != nil {
		fail("11d. INFO cpu and commandstats", err)
	} else if pairs > 0 {
		n := float64(pairs)
		one(MRedisCPU, FormatDuration, false, (after.CPU-before.CPU)*1e9/n)
		one(MRedisScriptTime, FormatDuration, false, (after.ScriptUsec-before.ScriptUsec)*1e3/n)
		one(MRedisScriptCalls, FormatRatio, false, (after.ScriptCalls-before.ScriptCalls)/n)
	}
	if d, err := redisHandoff(ctx, addr, prefix+"-handoff", r.plan.RedisHandoffs); err != nil {
		fail("11c. hand-off", err)
	} else {
		one(MRedisHandoffP50, FormatDuration, false, float64(quantile(d, 0.5)))
		one(MRedisHandoffP99, FormatDuration, false, float64(quantile(d, 0.99)))
	}
	// In the order of their numbers, not of the runs.
	slices.SortStableFunc(rep.Rows, func(a, b Row) int {
		return strings.Compare(a.Metric[:strings.Index(a.Metric, ".")], b.Metric[:strings.Index(b.Metric, ".")])
	})
}
