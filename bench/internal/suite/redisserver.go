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
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server this process started on a free loopback
// port. Stop it with stop, on every path.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
	ctl  *redis.Client // a client of its own, closed at stop
	dir  string        // a Cluster node's directory, removed at stop; "" for a lone server
	out  bytes.Buffer  // what the server printed; read it only once done is closed
	done chan struct{} // closed once the server has exited
}

// errNoRedisServer says that no redis-server binary is on the PATH.
var errNoRedisServer = errors.New("no redis-server on the PATH")

// startRedis starts one redis-server, or a Cluster of parts masters if
// parts is above 1, each with an equal range of the slots. Stop every
// server it returns.
func startRedis(ctx context.Context, parts int) ([]*redisServer, error) {
	var srvs []*redisServer
	var err error
	for range max(parts, 1) {
		var s *redisServer
		if s, err = startRedisServer(ctx, parts > 1); err != nil {
			break
		}
		srvs = append(srvs, s)
	}
	if err == nil && parts > 1 {
		err = formCluster(ctx, srvs)
	}
	if err != nil {
		for _, s := range srvs {
			s.stop()
		}
		return nil, err
	}
	return srvs, nil
}

// startRedisServer starts redis-server without persistence, as a Cluster
// node or not, and waits at most 5 s for it to answer PING.
func startRedisServer(ctx context.Context, node bool) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errNoRedisServer
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", port), done: make(chan struct{})}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"}
	if node {
		if s.dir, err = os.MkdirTemp("", "ginqueue-bench-cluster"); err != nil {
			return nil, err
		}
		args = append(args, "--cluster-enabled", "yes", "--dir", s.dir)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	dieWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	go func() {
		_ = s.cmd.Wait() // it returns once the output is copied
		close(s.done)
	}()
	s.ctl = newRedisClient(s.addr)
	if err := s.waitReady(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// freePort is a loopback port that nobody listened on a moment ago, nor on
// the port 10,000 above, which a Cluster node takes for its bus.
func freePort() (string, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil { // fails above 65,535 too
			_ = bus.Close()
			return strconv.Itoa(port), nil
		}
	}
	return "", errors.New("no free pair of ports for redis-server")
}

// waitReady polls PING until the server answers, exits, or 5 s pass.
func (s *redisServer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		err := s.ctl.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			lines := strings.Split(strings.TrimSpace(s.out.String()), "\n")
			return fmt.Errorf("redis-server exited at start: %s", strings.Join(lines[max(0, len(lines)-5):], "\n"))
		case <-ctx.Done():
			return fmt.Errorf("redis-server did not answer within 5s: %w", err)
		case <-time.After(20 * time.Millisecond):
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
	_ = s.ctl.Close()
	_ = os.RemoveAll(s.dir)
}

// formCluster gives each server its range of the slots, has them meet, and
// waits at most 20 s in all for each to be ok and know them all.
func formCluster(ctx context.Context, srvs []*redisServer) error {
	const slots = 16384
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	host, port, _ := net.SplitHostPort(srvs[0].addr)
	for i, s := range srvs {
		err := s.ctl.Do(ctx, "cluster", "addslotsrange", i*slots/len(srvs), (i+1)*slots/len(srvs)-1).Err()
		if err == nil && i > 0 {
			err = s.ctl.Do(ctx, "cluster", "meet", host, port).Err()
		}
		if err != nil {
			return fmt.Errorf("forming the cluster at %s: %w", s.addr, err)
		}
	}
	for _, s := range srvs {
		for {
			info, err := s.ctl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(srvs))) {
				break
			}
			if !sleepCtx(ctx, 50*time.Millisecond) {
				return fmt.Errorf("the cluster at %s is not ok within 20 s: %v %s", s.addr, err, info)
			}
		}
	}
	return nil
}
