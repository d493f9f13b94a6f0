package redisqueue_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file and topology_servers_cluster_test.go and
// topology_servers_sentinel_test.go start the Redis Cluster and the Sentinel
// set of the topology tests: redis-server processes on free loopback ports,
// each in a process group of its own, killed by the test that started them.

// needRedisServer skips t, with one line, when redis-server is not
// installed; with CI set it fails instead. Sentinels run as
// `redis-server --sentinel`, which is what the redis-sentinel binary is.
func needRedisServer(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not found and CI is set", bin)
			}
			t.Skipf("%s not found: skipping the topology tests", bin)
		}
	}
}

// proc is one redis-server process. Its directory outlives restarts (a
// cluster node keeps its nodes.conf there) and is removed with the test.
type proc struct {
	t    testing.TB
	port int
	dir  string
	args func() []string // the command line, built at each start

	mu  sync.Mutex
	cmd *exec.Cmd
}

func (p *proc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// startProc starts a redis-server on port with the arguments args returns
// and registers its kill with t.
func startProc(t testing.TB, port int, args func(dir string) []string) *proc {
	t.Helper()
	p := &proc{t: t, port: port, dir: t.TempDir()}
	p.args = func() []string { return args(p.dir) }
	t.Cleanup(p.kill) // runs before the TempDir's removal, registered earlier
	p.start()
	return p
}

// start runs the process and waits until it answers PING.
func (p *proc) start() {
	p.t.Helper()
	cmd := exec.Command("redis-server", p.args()...)
	cmd.Dir = p.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: p.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	eventually(p.t, 5*time.Second, "redis-server on "+p.addr()+" did not answer", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
}

// kill sends SIGKILL to the process group (kill -9) and reaps it.
func (p *proc) kill() {
	p.mu.Lock()
	cmd := p.cmd
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT) // a stopped process dies only once continued
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
}

// signal sends sig to the process group.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// dataArgs are the options every data node of the tests shares: no
// persistence, a log file in the node's directory.
func dataArgs(port int, dir string) []string {
	return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "log")}
}

// ctlClient is a plain client of one node, for the test's own commands.
func ctlClient(t testing.TB, addr string) *redis.Client {
	// RESP2: SENTINEL replies are flat arrays, matched as text below.
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: time.Second, Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// role is the first word of ROLE on addr ("master", "slave", "sentinel"),
// or "" when addr does not answer.
func role(ctx context.Context, c *redis.Client) string {
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	v, err := c.Do(ctx, "ROLE").Slice()
	if err != nil || len(v) == 0 {
		return ""
	}
	s, _ := v[0].(string)
	return s
}

// infoField returns field of INFO section on c, "" if absent.
func infoField(ctx context.Context, c *redis.Client, section, field string) string {
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	s, err := c.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}
