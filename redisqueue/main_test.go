package redisqueue_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// redisAddr is the shared Redis of the tests; noRedis is set by TestMain
// when it does not answer (and CI is unset): the tests that need it skip.
var (
	redisAddr = "127.0.0.1:6379"
	noRedis   bool
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if os.Getenv(doomedEnv) != "" {
		os.Exit(doomedMain())
	}
	if os.Getenv(fleetEnv) != "" {
		gin.SetMode(gin.ReleaseMode)
		os.Exit(fleetMain())
	}
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		redisAddr = a
	}
	c := redis.NewClient(&redis.Options{Addr: redisAddr, DialTimeout: 500 * time.Millisecond})
	err := c.Ping(context.Background()).Err()
	_ = c.Close()
	if err != nil {
		if os.Getenv("CI") != "" {
			fmt.Printf("redisqueue: no Redis at %s and CI is set: failing (%v)\n", redisAddr, err)
			os.Exit(1)
		}
		fmt.Printf("redisqueue: no Redis at %s (set REDIS_ADDR, or run redis-server --port 6379 --save ''); skipping the tests that need it\n", redisAddr)
		noRedis = true
		// An example cannot skip itself, and every example needs Redis.
		_ = flag.Set("test.skip", "^Example")
	}
	gin.SetMode(gin.ReleaseMode)
	redis.SetLogger(quiet{}) // dial failures are expected in the fault tests
	goleak.VerifyTestMain(m, goRedisProbe)
}

// goRedisProbe ignores go-redis's probe of a server it failed to dial: a
// goroutine of its own that notices its pool was closed only after a 1 s
// sleep, so an earlier test's probe can outlive it. Every goleak check of
// the package passes it.
var goRedisProbe = goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")

// long skips t under -short: the suites of several redis-servers (Cluster,
// Sentinel, failovers) and of several OS processes under load run with
// `make test-long`, not `make test`.
func long(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("long: run by make test-long")
	}
}

// needRedis skips t when no Redis answers.
func needRedis(t testing.TB) {
	t.Helper()
	if noRedis {
		t.Skip("no Redis")
	}
}

// newClient returns a client of addr that the test closes at its end.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           200 * time.Millisecond,
		MaxRetries:            -1,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newName returns a Name no other test uses.
func newName(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "test-" + hex.EncodeToString(b[:])
}

// freePort returns a TCP port nobody listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// redisServer is a redis-server of the test's own.
type redisServer struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
}

// startRedis starts a redis-server on a free port; it is killed at the end
// of the test. Without a redis-server binary the test skips (fails on CI).
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not found and CI is set")
		}
		t.Skip("redis-server not found")
	}
	s := &redisServer{t: t, port: freePort(t)}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *redisServer) start() {
	s.t.Helper()
	dir := s.t.TempDir()
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log"))
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	eventually(s.t, 5*time.Second, "redis-server did not answer", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
}

func (s *redisServer) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// pause makes the test's own Redis answer nothing for d.
func pause(t *testing.T, srv *redisServer, d time.Duration) {
	t.Helper()
	ctl := newClient(t, srv.addr())
	if err := ctl.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
}

// outage marks Redis down on b (a request's call fails), and returns once b
// has found it back, after the pause of d.
func outage(t *testing.T, srv *redisServer, b *redisqueue.Backend, d time.Duration) {
	t.Helper()
	pause(t, srv, d)
	eventually(t, d, "Redis not marked down", func() bool {
		if !b.Stats().Unavailable {
			c, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			if tk, err := b.Acquire(c, backend.Arrival{}); err == nil {
				b.Release(tk)
			}
			cancel()
		}
		return b.Stats().Unavailable
	})
	eventually(t, d+2*time.Second, "Redis not marked up again", func() bool { return !b.Stats().Unavailable })
}

// quiet drops go-redis's internal log lines.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
