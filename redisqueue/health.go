package redisqueue

import (
	"context"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// failed counts a failed call, err, that started at start.
// Options.FailureThreshold failures in a row, with no successful call between
// them, mark Redis down; before that, a probe is made at once, so that a Redis
// that is really gone is marked down within FailureThreshold call timeouts
// even with no other traffic, and one slow call under a burst does not turn
// the whole replica to OnRedisDown. Calls in flight together fail together
// when Redis stalls once: a failure counts only if its call started after
// the last counted failure was seen, so one stall counts once however many
// calls it caught.
func (b *Backend) failed(err error, start time.Time) {
	if c, ok := b.rdb.(*redis.ClusterClient); ok {
		// A dead master sends no MOVED: without a reload the client would
		// keep dialing it until its periodic refresh, a minute later.
		c.ReloadState(context.Background())
	}
	started := int64(start.Sub(b.born)) // monotonic: a step of the wall clock moves neither
	for {
		last := b.failedAt.Load()
		if started < last {
			return // caught in a stall already counted, which woke the maintainer
		}
		if b.failedAt.CompareAndSwap(last, int64(time.Since(b.born))) {
			break
		}
	}
	if int(b.fails.Add(1)) >= b.opts.FailureThreshold {
		b.markDown(err)
		return
	}
	b.wake()
}

// markDown records that Redis did not answer: new arrivals and waiters turn
// to OnRedisDown until the maintainer's probe gets an answer. Under FailOpen
// the fallback opens with this outage's allowance, and the slots of the
// requests running here on grants from Redis are reserved in it.
func (b *Backend) markDown(cause error) {
	b.hookMu.Lock()
	defer b.hookMu.Unlock()
	// Under mu, with the fallback opened: a request that sees down under mu
	// goes to the fallback, which must be there.
	b.mu.Lock()
	if b.down.Swap(true) {
		b.mu.Unlock()
		return
	}
	b.outages.Add(1)
	close(b.downCh)
	if b.opts.OnRedisDown == FailOpen && !b.closed && b.sh == nil {
		b.openFallbackLocked()
	}
	b.mu.Unlock()
	b.wake()
	if h := b.opts.OnStateChange; h != nil {
		h(true, cause)
	}
}

// markUp records that Redis answered again. The fallback's waiters turn back
// to Redis, and its reservations are given back: Redis counts those slots.
func (b *Backend) markUp() {
	if !b.down.Load() {
		return
	}
	b.hookMu.Lock()
	defer b.hookMu.Unlock()
	if !b.down.Load() {
		return
	}
	b.mu.Lock()
	b.downCh = make(chan struct{})
	b.down.Store(false)
	if b.downCancel != nil {
		b.downCancel() // before the reservations go, so that no waiter takes them
		b.downCancel = nil
	}
	free := b.fbReserved
	b.fbReserved = 0
	fb := b.fb
	b.mu.Unlock()
	for range free {
		fb.Release(backend.Ticket{})
	}
	if h := b.opts.OnStateChange; h != nil {
		h(false, nil)
	}
}

// probeLocked starts a probe of Redis for a request that found it marked
// down, unless one is in flight or began less than demandGap ago. The
// maintainer's probe alone would leave the first request after Redis
// answers again waiting: it comes every downProbe, and one sent while
// Redis could not be reached may never be answered (a partition swallowed
// it), holding the next back for the rest of its CallTimeout. This one is
// bounded by downProbe instead, so that under traffic a swallowed probe
// costs at most that; when it gets an answer, the maintainer stops waiting
// for its own and syncs at once, which marks Redis up. A Redis slower than
// that is still found by the maintainer's probe. A failure counts as any
// call's (see failed), except running out of this shorter time. Requires
// b.mu, with b.closed unset (Close waits for the probe).
func (b *Backend) probeLocked() {
	if b.probing || time.Since(b.probedAt) < demandGap {
		return
	}
	b.probing, b.probedAt = true, time.Now()
	b.probes.Add(1)
	go func() {
		defer b.probes.Done()
		ctx, cancel := context.WithTimeout(b.stopCtx, min(b.opts.CallTimeout, downProbe))
		defer cancel()
		_, err := b.callIn(ctx, probeScript)
		b.mu.Lock()
		b.probing = false
		stop := b.stopProbe
		b.mu.Unlock()
		if err != nil {
			return
		}
		if stop != nil {
			stop() // the maintainer's probe: its answer is not needed
		} else {
			b.resync.Store(true) // the maintainer waits for its next probe: sync now
			b.wake()
		}
	}()
}

// demandGap is the least time between two probes that requests start
// while Redis is marked down: a server that refuses at once is not dialled
// for every request.
const demandGap = 5 * time.Millisecond

// answering reports whether Redis answers: no failed call since the last
// answer and, if that answer is older than CallTimeout (the server may have
// frozen since, with no call made to notice), a probe answers now. At most
// one CallTimeout.
func (b *Backend) answering() bool {
	if b.fails.Load() > 0 || b.down.Load() {
		return false
	}
	if time.Since(time.Unix(0, b.lastOK.Load())) <= b.opts.CallTimeout {
		return true
	}
	_, err := b.call(probeScript)
	return err == nil
}

// answersFresh reports whether the master of the Name's keys answers a
// PING within wait on a connection of its own, dialled for this call: a probe while
// Redis is marked down. Through the Backend's client, the failed dials of
// an outage would open go-redis's dial breaker, which lets that client dial
// again only a second after the server is back; a fresh connection keeps
// the client's dials for when Redis answers.
func (b *Backend) answersFresh(wait time.Duration) bool {
	if b.clientClosed.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var src *redis.Client
	switch c := b.rdb.(type) {
	case *redis.Client:
		src = c
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, b.list)
		if err != nil {
			return false
		}
		src = node
	default:
		return false
	}
	opt := *src.Options()
	opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.MaxActiveConns = 1, 0, 0, 1
	opt.DialerRetries = 1
	opt.MaxRetries = -1
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	c := redis.NewClient(&opt)
	defer c.Close()
	return c.Ping(ctx).Err() == nil
}
