package redisqueue

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// read is the notice reader: one goroutine per Backend, blocked in BLPOP on
// this replica's notice list over a connection of its own, so that it never
// takes one from the pool that requests use. It hands each notice to the
// local waiter. Close closes the connection, which ends the blocked pop.
//
// A popped notice is gone from Redis: if the connection breaks between the
// pop and its reply, the notice is lost, and the safety-net tick finds the
// grant or the eviction instead.
func (b *Backend) read() {
	defer close(b.readDn)
	pause := time.Duration(0)
	for {
		c, err := b.readerClient()
		if err == nil {
			pause = 0
			if b.popNotice(c) {
				continue
			}
		}
		b.listening.Store(false)
		select {
		case <-b.stop:
			return
		default:
		}
		b.readerLost(c)
		// Dial again soon: grants made meanwhile wait unread in the list
		// (the safety net finds them, but only at its next tick). Quickly
		// at first, then at the safety net's pace while the server stays
		// away; at once when the maintainer's call gets an answer again.
		pause = min(max(2*pause, readerPause), b.opts.TickInterval)
		select {
		case <-b.stop:
			return
		case <-b.redial:
		case <-time.After(pause):
		}
	}
}

// popNotice pops one notice from the list over c, blocking up to
// readerBlock, and hands it to its waiter. It reports whether the reader
// may pop again over c; false means c broke or no longer talks to a master.
func (b *Backend) popNotice(c *redis.Client) bool {
	// Bounded: go-redis would wait the block time plus 10 s on a
	// server that froze (a hung host, a partition), far past a
	// failover.
	ctx, cancel := context.WithTimeout(context.Background(), readerBlock+b.opts.CallTimeout)
	res, err := c.BLPop(ctx, readerBlock, b.list).Result()
	cancel()
	if err == nil || errors.Is(err, redis.Nil) {
		b.listening.Store(true)
	}
	if err == nil {
		if len(res) == 2 && b.notice(res[1]) {
			// Let the waiter just woken run on this P before the
			// next BLPOP's write and read: that saves a hop to
			// another P (tens of µs) on the hand-off path.
			runtime.Gosched()
		}
		return true
	}
	if errors.Is(err, redis.Nil) {
		// The block timed out: a quiet list may mean that the client
		// moved to another master while this one answers on. Redis ends
		// a blocked pop with an error when a master turns replica; a
		// replica that takes the next pop (replica-read-only no) is
		// caught here too, as the client has moved.
		b.mu.Lock()
		known := b.runID != ""
		b.mu.Unlock()
		if !known {
			// The INFO sent as the reader dialled did not answer (Redis
			// was busy): without the run id, checkReader cannot compare.
			b.noteServer(c)
		}
		b.checkReader()
		return true
	}
	return false
}

// readerLost handles a reader without a connection: it asks for a sync in
// Shares mode, drops c, has a cluster client reload its slot map, and
// wakes the maintainer.
func (b *Backend) readerLost(c *redis.Client) {
	if b.sh != nil {
		// The connection broke: Redis may have restarted or failed
		// over, and lost what this replica holds. Tell it soon.
		b.resync.Store(true)
		b.wake()
	}
	b.dropReader(c)
	if cc, ok := b.rdb.(*redis.ClusterClient); ok {
		// The master may have moved: the next dial asks the slot map.
		cc.ReloadState(context.Background())
	}
	b.wake() // the maintainer's safety net runs faster while the reader is away
}

const (
	// readerPause is the reader's first pause before it dials again.
	readerPause = 10 * time.Millisecond
	// readerBlock is how long one BLPOP blocks.
	readerBlock = 2 * time.Second
)

// wakeReader has a reader that waits to dial again dial now.
func (b *Backend) wakeReader() {
	select {
	case b.redial <- struct{}{}:
	default:
	}
}

// readerClient returns the reader's own one-connection client, dialling it
// from the settings of the Backend's client if needed.
func (b *Backend) readerClient() (*redis.Client, error) {
	b.mu.Lock()
	if b.closed || b.clientClosed.Load() {
		b.mu.Unlock()
		return nil, errors.New("closed")
	}
	if b.reader != nil {
		c := b.reader
		b.mu.Unlock()
		return c, nil
	}
	b.mu.Unlock()

	var src *redis.Client
	switch c := b.rdb.(type) {
	case *redis.Client:
		src = c
	case *redis.ClusterClient:
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
		node, err := c.MasterForKey(ctx, b.list)
		cancel()
		if err != nil {
			return nil, err
		}
		src = node
	}
	opt := *src.Options()
	opt.PoolSize = 1
	opt.MinIdleConns = 0
	opt.MaxIdleConns = 1
	opt.MaxActiveConns = 1
	opt.DialerRetries = 1 // one attempt per dial: read paces its own
	// Not shared with src, whose connections write to it as they start
	// (a data race); and off: a reader that only blocks in BLPOP has no
	// use for maintenance notifications.
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	c := redis.NewClient(&opt)

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		_ = c.Close()
		return nil, errors.New("closed")
	}
	b.reader = c
	b.mu.Unlock()
	if b.noteServer(c) { // a new connection may reach a new master
		b.listening.Store(true)
	}
	return c, nil
}

// checkReader drops the reader if its server is not the one the Backend's
// client now sends its calls to. After a Sentinel failover the old master
// can go on answering as a master for seconds, while the client has moved
// to the new one: the reader, blocked on the old, would miss every grant
// notice. It runs with the safety net, while requests wait here, and when
// the reader's list has been quiet for its block time.
func (b *Backend) checkReader() {
	b.mu.Lock()
	r, seen := b.reader, b.runID
	b.mu.Unlock()
	c, ok := b.rdb.(*redis.Client)
	if !ok {
		// A cluster client: the reader must be on the master its slot map
		// names for the list (it moves there on MOVED or a reload, while a
		// frozen old master would hold the reader for the whole block).
		cc := b.rdb.(*redis.ClusterClient)
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
		defer cancel()
		if r == nil {
			return
		}
		if m, err := cc.MasterForKey(ctx, b.list); err == nil && m.Options().Addr != r.Options().Addr {
			b.dropReader(r)
			b.resync.Store(true)
			b.wake()
		}
		return
	}
	if r == nil || seen == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return
	}
	if id := runID(info); id != "" && id != seen {
		b.dropReader(r) // the reader dials again, and finds the client's server
		b.resync.Store(true)
		b.wake()
	}
}

// runID is the run_id field of an INFO server reply, or "".
func runID(info string) string {
	_, rest, ok := strings.Cut(info, "run_id:")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "\r\n")
	return id
}

// noteServer records the run id of c's server and asks for a sync when it
// changed since the last one seen. It reports whether the server answered.
func (b *Backend) noteServer(c *redis.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.CallTimeout)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return false
	}
	id := runID(info)
	if id == "" {
		return true
	}
	b.mu.Lock()
	changed := b.runID != "" && b.runID != id
	b.runID = id
	b.mu.Unlock()
	if changed {
		b.resync.Store(true)
		b.wake()
	}
	return true
}

// dropReader closes c if it is still the reader's client.
func (b *Backend) dropReader(c *redis.Client) {
	if c == nil {
		return
	}
	b.mu.Lock()
	if b.reader == c {
		b.reader = nil
	}
	b.mu.Unlock()
	_ = c.Close()
}
