package redisqueue

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkSharesSyncCost runs the Shares sync script for n replicas of one
// Name on a Redis of its own, round robin, each with its own record, and
// reports the time Redis spent per call (INFO commandstats) beside the
// round trip: what a sync costs Redis at 4 replicas and at 1,024. Each
// replica runs 1 request of a demand of 2, on a limit of n/2; with turns,
// every other round it runs none, waiting for a turn.
func BenchmarkSharesSyncCost(b *testing.B) {
	for _, c := range []struct {
		n     int
		turns bool
	}{{4, false}, {1024, false}, {1024, true}} {
		n := c.n
		name := fmt.Sprintf("replicas=%d", n)
		if c.turns {
			name += ",turns"
		}
		b.Run(name, func(b *testing.B) {
			srv := startRedisServer(b)
			rdb := redis.NewClient(&redis.Options{Addr: srv, ContextTimeoutEnabled: true})
			defer rdb.Close()
			reps := make([]*Backend, n)
			name := "cost" + strconv.Itoa(n)
			for i := range reps {
				be, err := New(rdb, Options{Name: name, Mode: Shares})
				if err != nil {
					b.Fatal(err)
				}
				be.base = []any{n / 2, be.opts.LeaseTTL.Milliseconds(), be.lists, be.replica}
				reps[i] = be
			}
			seq := make([]int64, n)
			sync := func(i int) {
				seq[i]++
				be := reps[i]
				held := 1
				if c.turns {
					held = int(seq[i] % 2)
				}
				if _, err := be.call(sharesScript, "sync", held, 2, "0:2", 1, "", n, 0, 7500, 500, 1, seq[i], 100); err != nil {
					b.Fatal(err)
				}
			}
			for i := range reps { // every replica has a record
				sync(i)
			}
			if err := rdb.ConfigResetStat(context.Background()).Err(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sync(i % n)
			}
			b.StopTimer()
			info, _ := rdb.Info(context.Background(), "commandstats").Result()
			for line := range strings.SplitSeq(info, "\n") {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
					for kv := range strings.SplitSeq(rest, ",") {
						if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
							f, _ := strconv.ParseFloat(v, 64)
							b.ReportMetric(f, "redis-µs/call")
						}
					}
				}
			}
		})
	}
}

// startRedisServer starts a redis-server of its own on a free loopback
// port for b, stopped at its end, and returns its address.
func startRedisServer(b *testing.B) string {
	b.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		b.Skip("redis-server not found")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", b.TempDir())
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i > 100 {
			b.Fatal("redis-server did not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr
}
