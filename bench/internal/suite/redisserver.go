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

// redisServer is a redis-server that this process started for itself on a
// free loopback port, so that the CPU it reports is spent on this run
// alone. Stop it with stop, on every path.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
	log  *lockedBuffer // what the server printed, for an error message
	done chan struct{} // closed once the server has exited
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

// startRedisServer starts redis-server without persistence on a free
// loopback port and waits until it answers PING, at most 5 s. The server
// dies with this process on Linux even if this process is killed.
func startRedisServer(ctx context.Context) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errNoRedisServer
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", port), log: &lockedBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no")
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
}
