package redisqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/redis/go-redis/v9"
)

// internalBackend starts a Backend of a fresh Name on the test Redis, or
// skips when none answers.
func internalBackend(t *testing.T, l backend.Limits) (*Backend, *redis.Client) {
	t.Helper()
	rdb := testRedis(t)
	b, err := New(rdb, Options{Name: freshName("internal-"), Mode: GlobalQueue})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, rdb
}

// ownRedis starts a redis-server of the test's own on a free port and
// returns its address; it is killed at the end of the test.
func ownRedis(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not found and CI is set")
		}
		t.Skip("redis-server not found")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for end := time.Now().Add(5 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(end) {
			t.Fatal("redis-server did not answer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return addr
}

// testRedis is a client of the Redis of make test (REDIS_ADDR, or
// 127.0.0.1:6379), closed at the end of the test; the test is skipped
// without one, and fails without one under CI.
func testRedis(t *testing.T) *redis.Client {
	t.Helper()
	addr := "127.0.0.1:6379"
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		addr = a
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no Redis at %s: %v", addr, err)
		}
		t.Skipf("no Redis at %s", addr)
	}
	return rdb
}

// freshName is prefix and random hex: a Name no other test uses.
func freshName(prefix string) string {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	return prefix + hex.EncodeToString(rnd[:])
}
