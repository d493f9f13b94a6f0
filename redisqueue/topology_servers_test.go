package redisqueue_test

import (
	"context"
	"fmt"
	"net"
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

// This file starts the Redis Cluster and the Sentinel set of the topology
// tests: redis-server processes on free loopback ports, each in a process
// group of its own, killed by the test that started them.

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

// clusterPort returns a free port whose cluster bus port (port + 10000) is
// free too.
func clusterPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		p := freePort(t)
		if p+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p
	}
	t.Fatal("no free port pair for a cluster node")
	return 0
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

// testCluster is a Redis Cluster of 3 masters and 3 replicas, with
// cluster-node-timeout 1 s.
type testCluster struct {
	t     testing.TB
	nodes []*proc
	ctl   map[string]*redis.Client // by address
}

func startCluster(t testing.TB) *testCluster {
	t.Helper()
	needRedisServer(t)
	c := &testCluster{t: t, ctl: map[string]*redis.Client{}}
	var addrs []string
	for range 6 {
		port := clusterPort(t)
		p := startProc(t, port, func(dir string) []string {
			return append(dataArgs(port, dir), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "1000")
		})
		c.nodes = append(c.nodes, p)
		c.ctl[p.addr()] = ctlClient(t, p.addr())
		addrs = append(addrs, p.addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitHealthy()
	return c
}

func (c *testCluster) addrs() []string {
	var a []string
	for _, p := range c.nodes {
		a = append(a, p.addr())
	}
	return a
}

func (c *testCluster) proc(addr string) *proc {
	for _, p := range c.nodes {
		if p.addr() == addr {
			return p
		}
	}
	c.t.Fatalf("no node %s", addr)
	return nil
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, master string // master: the id of a replica's master, "-" for a master
	flags            string
	slots            []string
}

func (n clusterNode) isMaster() bool { return strings.Contains(n.flags, "master") }

// nodes is CLUSTER NODES as addr sees it.
func (c *testCluster) nodesSeenBy(addr string) ([]clusterNode, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s, err := c.ctl[addr].ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		a, _, _ := strings.Cut(f[1], "@")
		out = append(out, clusterNode{id: f[0], addr: a, flags: f[2], master: f[3], slots: f[8:]})
	}
	return out, nil
}

// owner returns the master that owns key's slot, as addr sees it, and that
// master's replica ("" if none).
func (c *testCluster) owner(addr, key string) (master, replica string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	slot, err := c.ctl[addr].ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", "", err
	}
	nodes, err := c.nodesSeenBy(addr)
	if err != nil {
		return "", "", err
	}
	var mid string
	for _, n := range nodes {
		if !n.isMaster() || strings.Contains(n.flags, "fail") {
			continue
		}
		for _, r := range n.slots {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			l, err1 := strconv.ParseInt(lo, 10, 64)
			h, err2 := strconv.ParseInt(hi, 10, 64)
			if err1 == nil && err2 == nil && l <= slot && slot <= h {
				master, mid = n.addr, n.id
			}
		}
	}
	if master == "" {
		return "", "", fmt.Errorf("no master owns slot %d", slot)
	}
	for _, n := range nodes {
		if n.master == mid && !strings.Contains(n.flags, "fail") {
			replica = n.addr
		}
	}
	return master, replica, nil
}

// waitHealthy waits until every node says cluster_state:ok, knows the 6
// nodes with no failure flag, and there are 3 masters, each with a replica
// whose link is up.
func (c *testCluster) waitHealthy() {
	c.t.Helper()
	ctx := context.Background()
	eventually(c.t, 20*time.Second, "the cluster did not become healthy", func() bool {
		masters := 0
		for _, p := range c.nodes {
			cl := c.ctl[p.addr()]
			if infoField(ctx, cl, "cluster", "cluster_enabled") != "1" {
				return false
			}
			s, err := cl.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(s, "cluster_state:ok") || !strings.Contains(s, "cluster_known_nodes:6") {
				return false
			}
			nodes, err := c.nodesSeenBy(p.addr())
			if err != nil || len(nodes) != 6 {
				return false
			}
			for _, n := range nodes {
				if strings.Contains(n.flags, "fail") || strings.Contains(n.flags, "noaddr") {
					return false
				}
			}
			switch role(ctx, cl) {
			case "master":
				if infoField(ctx, cl, "replication", "connected_slaves") != "1" {
					return false
				}
				masters++
			case "slave":
				if infoField(ctx, cl, "replication", "master_link_status") != "up" ||
					infoField(ctx, cl, "replication", "master_sync_in_progress") != "0" {
					return false
				}
			default:
				return false
			}
		}
		return masters == 3
	})
}

// testSentinel is a master, its replica and 3 sentinels that monitor it
// under name, quorum 2, down-after-milliseconds 1000.
type testSentinel struct {
	t         testing.TB
	name      string
	data      []*proc
	sentinels []*proc
	ctl       map[string]*redis.Client
}

func startSentinel(t testing.TB) *testSentinel {
	t.Helper()
	needRedisServer(t)
	s := &testSentinel{t: t, name: "mq", ctl: map[string]*redis.Client{}}
	mport := freePort(t)
	master := startProc(t, mport, func(dir string) []string { return dataArgs(mport, dir) })
	rport := freePort(t)
	replica := startProc(t, rport, func(dir string) []string {
		return append(dataArgs(rport, dir), "--replicaof", "127.0.0.1", strconv.Itoa(mport))
	})
	s.data = []*proc{master, replica}
	for range 3 {
		port := freePort(t)
		p := startProc(t, port, func(dir string) []string {
			conf := filepath.Join(dir, "sentinel.conf")
			if _, err := os.Stat(conf); err != nil { // a restart keeps what the sentinel learnt
				n := s.name
				text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n", port, dir, filepath.Join(dir, "log")) +
					fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n", n, mport) +
					fmt.Sprintf("sentinel down-after-milliseconds %s 1000\n", n) +
					fmt.Sprintf("sentinel failover-timeout %s 3000\n", n) +
					fmt.Sprintf("sentinel parallel-syncs %s 1\n", n)
				if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			return []string{conf, "--sentinel"}
		})
		s.sentinels = append(s.sentinels, p)
	}
	for _, p := range append(append([]*proc{}, s.data...), s.sentinels...) {
		s.ctl[p.addr()] = ctlClient(t, p.addr())
	}
	s.waitHealthy()
	return s
}

func (s *testSentinel) sentinelAddrs() []string {
	var a []string
	for _, p := range s.sentinels {
		a = append(a, p.addr())
	}
	return a
}

func (s *testSentinel) proc(addr string) *proc {
	for _, p := range s.data {
		if p.addr() == addr {
			return p
		}
	}
	s.t.Fatalf("no data node %s", addr)
	return nil
}

// other is the data node that is not addr.
func (s *testSentinel) other(addr string) string {
	if s.data[0].addr() == addr {
		return s.data[1].addr()
	}
	return s.data[0].addr()
}

// masterSeenBy is SENTINEL get-master-addr-by-name on the sentinel at addr.
func (s *testSentinel) masterSeenBy(addr string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	v, err := s.ctl[addr].Do(ctx, "SENTINEL", "get-master-addr-by-name", s.name).StringSlice()
	if err != nil || len(v) != 2 {
		return ""
	}
	return v[0] + ":" + v[1]
}

// waitHealthy waits until the 3 sentinels agree on a master that says it
// is one and has its replica online, and each sentinel knows the replica
// (not down) and the 2 other sentinels.
func (s *testSentinel) waitHealthy() {
	s.t.Helper()
	ctx := context.Background()
	eventually(s.t, 30*time.Second, "the sentinel set did not become healthy", func() bool {
		m := s.masterSeenBy(s.sentinels[0].addr())
		if m == "" || s.ctl[m] == nil || role(ctx, s.ctl[m]) != "master" {
			return false
		}
		if infoField(ctx, s.ctl[m], "replication", "connected_slaves") != "1" {
			return false
		}
		r := s.ctl[s.other(m)]
		if infoField(ctx, r, "replication", "master_link_status") != "up" ||
			infoField(ctx, r, "replication", "master_port") != strings.Split(m, ":")[1] {
			return false
		}
		for _, p := range s.sentinels {
			if s.masterSeenBy(p.addr()) != m {
				return false
			}
			c := s.ctl[p.addr()]
			reps, err := c.Do(ctx, "SENTINEL", "replicas", s.name).Slice()
			if err != nil || len(reps) != 1 || !strings.Contains(fmt.Sprint(reps[0]), "flags slave ") {
				return false
			}
			sens, err := c.Do(ctx, "SENTINEL", "sentinels", s.name).Slice()
			if err != nil || len(sens) != 2 {
				return false
			}
			mi, err := c.Do(ctx, "SENTINEL", "master", s.name).Slice()
			if err != nil || !strings.Contains(fmt.Sprint(mi), "flags master ") {
				return false
			}
		}
		return true
	})
}
