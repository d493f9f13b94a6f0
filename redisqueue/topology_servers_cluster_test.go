package redisqueue_test

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
