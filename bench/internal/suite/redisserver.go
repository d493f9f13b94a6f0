package suite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// redisServer is a redis-server this process started on a free loopback
// port. Stop it with stop, on every path.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
	log  *lockedBuffer // what the server printed, for an error message
	done chan struct{} // closed once the server has exited
	// cleanup, if set, runs once the server has exited
	cleanup func()
}

// lockedBuffer is a bytes.Buffer that the server's output goroutine writes
// while an error message may read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// tail is the last few lines the server printed.
func (b *lockedBuffer) tail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(b.buf.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], "\n")
}

// errNoRedisServer says that no redis-server binary is on the PATH.
var errNoRedisServer = errors.New("no redis-server on the PATH")

// startRedisServer starts redis-server without persistence on port (a free
// one if empty) and waits at most 5 s for it to answer PING.
func startRedisServer(ctx context.Context, port string, extra ...string) (*redisServer, error) {
	if port == "" {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errNoRedisServer
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", port), log: &lockedBuffer{}, done: make(chan struct{})}
	args := append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"}, extra...)
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	dieWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx, 5*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// freePort is a loopback port that nobody listened on a moment ago.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("a free port: %w", err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

// waitReady polls PING until the server answers, exits, or d passes.
func (s *redisServer) waitReady(ctx context.Context, d time.Duration) error {
	c := newRedisClient(s.addr)
	defer c.Close()
	end := time.Now().Add(d)
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("redis-server exited at start: %s", s.log.tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(end) {
			return fmt.Errorf("redis-server did not answer within %v: %v", d, err)
		}
	}
}

// stop asks the server to shut down and kills it if it has not within 2 s.
// It returns once the server has exited.
func (s *redisServer) stop() {
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		_ = s.cmd.Process.Kill()
	}
	select {
	case <-s.done:
	case <-time.After(2 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if s.cleanup != nil {
		s.cleanup()
	}
}

// startRedisCluster starts a Cluster of n masters, each with an equal range
// of the slots, and waits for cluster_state:ok. Stop every server it returns.
func startRedisCluster(ctx context.Context, n int) ([]*redisServer, error) {
	dir, err := os.MkdirTemp("", "ginqueue-bench-cluster")
	if err != nil {
		return nil, err
	}
	var srvs []*redisServer
	fail := func(err error) ([]*redisServer, error) {
		for _, s := range srvs {
			s.stop()
		}
		_ = os.RemoveAll(dir)
		return nil, err
	}
	for i := range n {
		port, err := clusterPort()
		if err != nil {
			return fail(err)
		}
		s, err := startRedisServer(ctx, port, "--cluster-enabled", "yes", "--dir", dir,
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i))
		if err != nil {
			return fail(err)
		}
		srvs = append(srvs, s)
	}
	if err := formCluster(ctx, srvs); err != nil {
		return fail(err)
	}
	srvs[0].cleanup = func() { _ = os.RemoveAll(dir) }
	return srvs, nil
}

// clusterPort is a free port whose cluster bus port is free too.
func clusterPort() (string, error) {
	for range 100 {
		p, err := freePort()
		if err != nil {
			return "", err
		}
		n, _ := strconv.Atoi(p)
		if n+10000 > 65535 {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(n+10000)); err == nil {
			_ = l.Close()
			return p, nil
		}
	}
	return "", errors.New("no free port pair for a cluster node")
}

// formCluster gives each server its range of slots, has them meet, and
// waits at most 20 s for cluster_state:ok on each.
func formCluster(ctx context.Context, srvs []*redisServer) error {
	const slots = 16384
	first := srvs[0].addr
	host, port, _ := net.SplitHostPort(first)
	for i, s := range srvs {
		c := newRedisClient(s.addr)
		lo, hi := i*slots/len(srvs), (i+1)*slots/len(srvs)-1
		err := c.Do(ctx, "cluster", "addslotsrange", lo, hi).Err()
		if err == nil && i > 0 {
			err = c.Do(ctx, "cluster", "meet", host, port).Err()
		}
		_ = c.Close()
		if err != nil {
			return fmt.Errorf("forming the cluster at %s: %w", s.addr, err)
		}
	}
	end := time.Now().Add(20 * time.Second)
	for _, s := range srvs {
		c := newRedisClient(s.addr)
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(srvs))) {
				break
			}
			if time.Now().After(end) || ctx.Err() != nil {
				_ = c.Close()
				return fmt.Errorf("the cluster at %s is not ok within 20 s: %v %s", s.addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return nil
}
