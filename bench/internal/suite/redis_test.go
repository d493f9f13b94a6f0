package suite

import (
	"context"
	"testing"
	"time"
)

func TestParseRedisLoad(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.0\r\n" +
		"# Commandstats\r\ncmdstat_evalsha:calls=10,usec=150,usec_per_call=15.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=2,usec=40,usec_per_call=20.00\r\ncmdstat_ping:calls=99,usec=99\r\n"
	got := parseRedisLoad(info)
	if want := (redisLoad{CPU: 3.75, ScriptCalls: 12, ScriptUsec: 190}); got != want {
		t.Errorf("parseRedisLoad = %+v, want %+v", got, want)
	}
}

// TestRedisHarnesses runs the Redis measurements on tiny sizes against the
// Redis at REDIS_ADDR, and skips when none answers.
func TestRedisHarnesses(t *testing.T) {
	addr, _ := redisAddr()
	ctx := context.Background()
	c := newRedisClient(addr)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Skipf("no Redis at REDIS_ADDR: %v", err)
	}
	prefix := newRedisName()
	defer func() {
		if _, err := cleanRedis(ctx, c, prefix); err != nil {
			t.Error(err)
		}
		if n, err := cleanRedis(ctx, c, prefix); err != nil || n != 0 {
			t.Errorf("after cleaning, %d keys left (%v)", n, err)
		}
	}()
	if d, err := redisFloor(ctx, c, 3); err != nil || len(d) != 3 {
		t.Errorf("redisFloor = %v, %v", d, err)
	}
	if d, err := redisRoundTrip(ctx, addr, prefix+"-rt", 5); err != nil || len(d) != 5 {
		t.Errorf("redisRoundTrip = %v, %v", d, err)
	}
	if rates, n, err := redisPairs(ctx, addr, prefix+"-pairs", 20*time.Millisecond, 1); err != nil || len(rates) != 1 || n == 0 {
		t.Errorf("RedisPairs = %v, %d, %v", rates, n, err)
	}
	if d, err := redisHandoff(ctx, addr, prefix+"-handoff", 2); err != nil || len(d) != 2 {
		t.Errorf("redisHandoff = %v, %v", d, err)
	}
	if l, err := readRedisLoad(ctx, c); err != nil || l.CPU <= 0 {
		t.Errorf("readRedisLoad = %+v, %v", l, err)
	}
}
