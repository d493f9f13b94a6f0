package redisqueue_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

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
