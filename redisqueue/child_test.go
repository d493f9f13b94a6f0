package redisqueue_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// childEnv makes the test binary a child replica: "addr name requests".
const childEnv = "REDISQUEUE_TEST_CHILD"

const childLimit = 3

func itoa(n int) string { return strconv.Itoa(n) }

// childMain is one OS process of TestThreeProcessesShareOneLimit. It counts
// the requests running in the whole fleet with a Redis counter and prints
// the highest count it saw and its outcomes.
func childMain() int {
	f := strings.Fields(os.Getenv(childEnv))
	addr, name := f[0], f[1]
	n, _ := strconv.Atoi(f[2])
	gin.SetMode(gin.ReleaseMode)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: name, CallTimeout: 2 * time.Second, LeaseTTL: 10 * time.Second})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: childLimit, MaxQueue: 100, QueueTimeout: 20 * time.Second, Backend: b})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer q.Close()
	counter := "ginqueue-test:{" + name + "}:running"
	var peak atomic.Int64
	e := gin.New()
	e.GET("/", q.Handler(), func(c *gin.Context) {
		ctx := context.Background()
		v, _ := rdb.Incr(ctx, counter).Result()
		for p := peak.Load(); v > p && !peak.CompareAndSwap(p, v); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		rdb.Decr(ctx, counter)
	})
	r := &replica{e: e}
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := i; j < n; j += 8 {
				if r.get() == 200 {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("peak=%d served=%d\n", peak.Load(), ok.Load())
	return 0
}

func TestThreeProcessesShareOneLimit(t *testing.T) {
	needRedis(t)
	t.Parallel()
	const procs, requests = 3, 60
	name := newName(t)
	type result struct {
		out []byte
		err error
	}
	results := make(chan result, procs)
	for range procs {
		go func() {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", childEnv, redisAddr, name, requests))
			out, err := cmd.CombinedOutput()
			results <- result{out, err}
		}()
	}
	for range procs {
		r := <-results
		if r.err != nil {
			t.Fatalf("child: %v\n%s", r.err, r.out)
		}
		var peak, served int
		sc := bufio.NewScanner(bytes.NewReader(r.out))
		for sc.Scan() {
			if _, err := fmt.Sscanf(sc.Text(), "peak=%d served=%d", &peak, &served); err == nil {
				break
			}
		}
		t.Logf("child: peak %d, served %d", peak, served)
		if peak > childLimit {
			t.Fatalf("%d requests ran at once across the processes, limit %d", peak, childLimit)
		}
		if served != requests {
			t.Fatalf("a child served %d of %d\n%s", served, requests, r.out)
		}
	}
}
