package suite

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// DefaultRedisAddr is the Redis section 11 measures when REDIS_ADDR is unset.
const DefaultRedisAddr = "127.0.0.1:6379"

// redisCol heads the figures of section 11.
const redisCol = "redisqueue"

// newRedisClient honours context deadlines (redisqueue needs
// ContextTimeoutEnabled), never retries, and notices a missing Redis at once.
func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
}

// sharedRedis is the Redis at REDIS_ADDR, which other clients may use too:
// a control client, a prefix made fresh for the Names of this run, and
// what closes the backends started so far.
type sharedRedis struct {
	addr, prefix string
	ctl          *redis.Client
	closers      []func()
}

// openRedis opens the Redis at REDIS_ADDR and reads its version, or says
// why no Redis answered. Close sh.ctl either way.
func openRedis(ctx context.Context) (sh *sharedRedis, version, why string) {
	addr := cmp.Or(os.Getenv("REDIS_ADDR"), DefaultRedisAddr)
	sh = &sharedRedis{addr: addr, prefix: "bench-" + rand.Text()[:12], ctl: newRedisClient(addr)}
	info, err := sh.ctl.Info(ctx, "server").Result()
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), addr, "REDIS_ADDR")
		if host, _, _ := net.SplitHostPort(addr); host != "" {
			msg = strings.ReplaceAll(msg, host, "REDIS_ADDR")
		}
		return sh, "", msg
	}
	return sh, infoString(info, "redis_version"), ""
}

// started is a Backend in GlobalQueue mode under the Name prefix+name,
// started with l, on a client of its own as a replica would have; close
// closes both, even after an error.
func (sh *sharedRedis) started(name string, l backend.Limits) (*redisqueue.Backend, error) {
	rdb := newRedisClient(sh.addr)
	sh.closers = append(sh.closers, func() { _ = rdb.Close() })
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: sh.prefix + name, Mode: redisqueue.GlobalQueue})
	if err == nil {
		sh.closers = append(sh.closers, func() { _ = b.Close() })
		err = b.Start(l)
	}
	return b, err
}

func (sh *sharedRedis) close() {
	for i := len(sh.closers) - 1; i >= 0; i-- {
		sh.closers[i]()
	}
	sh.closers = nil
}

// deleteKeys closes the backends and deletes the keys of the run's Names;
// a failure counts against col as metric.
func (r *runner) deleteKeys(ctx context.Context, sh *sharedRedis, col, metric string) {
	sh.close()
	var keys []string
	iter := sh.ctl.Scan(ctx, 0, "ginqueue:{"+sh.prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	err := iter.Err()
	for i := 0; i < len(keys) && err == nil; i += 500 {
		err = sh.ctl.Del(ctx, keys[i:min(i+500, len(keys))]...).Err()
	}
	if err != nil {
		r.fail(col, metric, err)
	}
	r.logf("  deleted the run's %d keys", len(keys))
}

// redisLoad is what a Redis server's INFO cpu and commandstats count: CPU
// seconds (used_cpu_sys + used_cpu_user), and the calls and microseconds
// of each command, by name ("evalsha", "client|setinfo").
type redisLoad struct {
	cpu         float64
	calls, usec map[string]float64
}

// readLoad asks c for INFO cpu and commandstats.
func readLoad(ctx context.Context, c *redis.Client) (redisLoad, error) {
	info, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return redisLoad{}, fmt.Errorf("INFO cpu and commandstats: %w", err)
	}
	return parseLoad(info), nil
}

// parseLoad reads an INFO cpu and commandstats reply.
func parseLoad(info string) redisLoad {
	l := redisLoad{calls: map[string]float64{}, usec: map[string]float64{}}
	for line := range strings.SplitSeq(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			l.cpu += f
		} else if cmd, ok := strings.CutPrefix(k, "cmdstat_"); ok {
			var calls, usec float64
			_, _ = fmt.Sscanf(v, "calls=%g,usec=%g", &calls, &usec)
			l.calls[cmd], l.usec[cmd] = calls, usec
		}
	}
	return l
}

// since is how much each of l's counters grew after then.
func (l redisLoad) since(then redisLoad) redisLoad {
	d := redisLoad{cpu: l.cpu - then.cpu, calls: maps.Clone(l.calls), usec: maps.Clone(l.usec)}
	for c := range d.calls {
		d.calls[c] -= then.calls[c]
		d.usec[c] -= then.usec[c]
	}
	return d
}

// scripts sums the calls and microseconds of the script commands.
func (l redisLoad) scripts() (calls, usec float64) {
	for _, n := range []string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"} {
		calls, usec = calls+l.calls[n], usec+l.usec[n]
	}
	return calls, usec
}

// infoString is the field name of an INFO reply, or "".
func infoString(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// infoInt is the integer field name of an INFO reply, or -1.
func infoInt(info, name string) int {
	if n, err := strconv.Atoi(infoString(info, name)); err == nil {
		return n
	}
	return -1
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

// pair is one acquire+release on b.
func pair(ctx context.Context, b *redisqueue.Backend) error {
	t, err := b.Acquire(ctx, backend.Arrival{})
	if err == nil {
		b.Release(t)
	}
	return err
}

// redisPairs is 11b: RedisClients on one backend doing pairs for
// RedisWindow, RedisWindows times: the rate of each window, the pairs in all.
func (p Plan) redisPairs(ctx context.Context, b *redisqueue.Backend) (rates []float64, pairs int64, err error) {
	var failed atomic.Int64
	var first atomic.Value
	for range p.RedisWindows {
		var n atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range p.RedisClients {
			wg.Go(func() {
				for time.Since(start) < p.RedisWindow {
					if err := pair(ctx, b); err != nil {
						failed.Add(1)
						first.CompareAndSwap(nil, err)
					} else {
						n.Add(1)
					}
				}
			})
		}
		wg.Wait()
		rates, pairs = append(rates, float64(n.Load())/time.Since(start).Seconds()), pairs+n.Load()
	}
	if failed.Load() > 0 {
		err = fmt.Errorf("%d acquires failed, the first: %v", failed.Load(), first.Load())
	}
	return rates, pairs, err
}

// redisHandoff is 11c: from a's Release to the Acquire waiting on b
// returning, a and b sharing a limit of 1.
func (p Plan) redisHandoff(ctx context.Context, a, b *redisqueue.Backend) ([]float64, error) {
	globally := func(queued, running int) error { // as Redis counts
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
			if s, err := a.GlobalStats(ctx); err == nil && s.Queued == queued && (running < 0 || s.Running == running) {
				return nil
			}
		}
		return errors.New("redisqueue: the waiter did not show in Redis within 2s")
	}
	d := make([]float64, 0, p.RedisHandoffs)
	for range p.RedisHandoffs {
		held, err := a.Acquire(ctx, backend.Arrival{})
		if err != nil {
			return nil, err
		}
		got := make(chan error, 1)
		var at time.Time // written before got is sent
		go func() {
			t, err := b.Acquire(ctx, backend.Arrival{})
			if at = time.Now(); err == nil {
				b.Release(t)
			}
			got <- err
		}()
		if err := globally(1, -1); err != nil {
			a.Release(held)
			return nil, errors.Join(err, <-got)
		}
		start := time.Now()
		a.Release(held)
		if err := <-got; err != nil {
			return nil, err
		}
		if d = append(d, float64(at.Sub(start))); globally(0, 0) != nil {
			return nil, errors.New("redisqueue: the slot was not free again within 2s")
		}
	}
	return d, nil
}

// redis is section 11, or says why it could not run. Its backends' keys
// (ginqueue:{Name}:…) are deleted at the end.
func (r *runner) redis() {
	t, ctx := &r.res.Redis, context.Background()
	t.Cols = []string{redisCol}
	sh, version, why := openRedis(ctx)
	defer sh.ctl.Close()
	if why != "" {
		r.res.RedisWhy = fmt.Sprintf("No Redis answered at REDIS_ADDR (default %s), so the Redis figures were not measured in this run (%s).", DefaultRedisAddr, why)
		r.logf("  %s", r.res.RedisWhy)
		return
	}
	r.res.RedisVersion = version
	defer r.deleteKeys(ctx, sh, redisCol, "11. deleting the run's keys")
	add := func(metric string, f Format, higher bool, x float64) {
		t.Rows = append(t.Rows, Row{Metric: metric, Format: f, Higher: higher, Values: map[string]float64{redisCol: x}})
	}
	quantiles := func(metric string, d []float64, err error) {
		if err != nil {
			r.fail(redisCol, metric, err)
			return
		}
		add(metric+" p50", FormatDuration, false, pct(0, 0.5)([][]float64{d}))
		add(metric+" p99", FormatDuration, false, pct(0, 0.99)([][]float64{d}))
	}
	uncontended := backend.Limits{MaxConcurrent: 1000, MaxQueue: 1000, QueueTimeout: 10 * time.Second}
	rt, err := sh.started("-rt", uncontended)
	d := []float64(nil)
	if err == nil {
		d, err = timed(r.RedisPairs, func() error { return pair(ctx, rt) })
	}
	quantiles("11a. acquire+release round trip", d, err)
	sh.close() // each measurement's backends are closed before the next starts
	d, err = timed(r.RedisPairs, func() error { return errors.Join(sh.ctl.Ping(ctx).Err(), sh.ctl.Ping(ctx).Err()) })
	quantiles("11a. two PINGs, the floor of a pair,", d, err)
	pairs := fmt.Sprintf("11b. acquire+release pairs, %d clients, uncontended", r.RedisClients)
	before, err0 := readLoad(ctx, sh.ctl) // 11d counts the backend's start and close too
	b, err := sh.started("-pairs", uncontended)
	var rates []float64
	var n int64
	if err == nil {
		rates, n, err = r.redisPairs(ctx, b)
	}
	sh.close()
	after, err1 := readLoad(ctx, sh.ctl)
	if err != nil {
		r.fail(redisCol, pairs, err)
	}
	if len(rates) > 0 {
		add(pairs, FormatRate, true, med(0)([][]float64{rates}))
	}
	one := backend.Limits{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: 10 * time.Second}
	a, errA := sh.started("-handoff", one)
	b, errB := sh.started("-handoff", one)
	if err := errors.Join(errA, errB); err != nil {
		r.fail(redisCol, "11c. hand-off", err)
	} else {
		d, err := r.redisHandoff(ctx, a, b)
		quantiles("11c. hand-off across backends", d, err)
	}
	if err := errors.Join(err0, err1); err != nil {
		r.fail(redisCol, "11d. INFO cpu and commandstats", err)
	} else if n > 0 {
		l := after.since(before)
		calls, usec := l.scripts()
		add("11d. Redis CPU per acquire+release pair (INFO cpu)", FormatDuration, false, l.cpu*1e9/float64(n))
		add("11d. Redis script time per pair (commandstats)", FormatDuration, false, usec*1e3/float64(n))
		add("11d. script calls per pair (commandstats)", FormatRatio, false, calls/float64(n))
	}
}
