// Package redisqueue is a ginqueue.Backend on Redis: every replica of a
// service that builds a Backend with the same Options.Name and the same Redis
// shares one MaxConcurrent, one MaxQueue and one global order of grants
// (higher Arrival.Priority first, then arrival order).
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	b, err := redisqueue.New(rdb, redisqueue.Options{Name: "api"})
//	...
//	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 20,
//		QueueTimeout: 2 * time.Second, Backend: b})
//
// Each acquire and each release is one atomic Lua script on Redis. A request
// that must wait learns of its grant from a push: the script that frees a
// slot pushes a notice onto a list of the waiter's replica, which one
// goroutine per Backend pops with BLPOP on a connection of its own. Every
// replica syncs each Options.TickInterval (the heartbeat, which also catches
// a lost notice); a replica that dies loses its slots and queue places
// within three ticks and one more. SetLimit moves the limit of the whole
// fleet at run time. See the README for failure behaviour.
package redisqueue

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/redis/go-redis/v9"
)

// ErrUnavailable is wrapped by the error Acquire returns under FailClosed
// while Redis cannot be reached. That error also wraps ginqueue.ErrQueueFull,
// so a Queue answers it as queue full (503 with Retry-After).
var ErrUnavailable = errors.New("redisqueue: redis unavailable")

// ErrConflict is wrapped by the error that Start (and so ginqueue.NewQueue)
// returns when a live replica of the same Name declared other limits; Acquire
// returns it too, wrapping ginqueue.ErrQueueFull, when the conflict is found
// only after Redis came back.
var ErrConflict = errors.New("redisqueue: limits disagree with another replica")

// errEvicted is what a waiter gets when an arrival of higher priority took
// its place in the full global queue: a Queue answers it as queue full.
var errEvicted = fmt.Errorf("redisqueue: an arrival of higher priority took this place in the full queue: %w", ginqueue.ErrQueueFull)

// unavailableError is what FailClosed answers: ErrUnavailable, queue full,
// and the cause.
type unavailableError struct{ cause error }

func (e *unavailableError) Error() string {
	return "redisqueue: redis unavailable, answered as queue full: " + e.cause.Error()
}

func (e *unavailableError) Unwrap() []error {
	return []error{ErrUnavailable, ginqueue.ErrQueueFull, e.cause}
}

// localBit marks the ID of a Ticket granted by the local fallback
// (FailOpen); the rest of the ID is a lease id of this replica's, under
// which Redis counts the request once it answers again (see localHold).
// Redis ids never reach it.
const localBit = 1 << 63

// Backend is a ginqueue.Backend whose slots and queue live in Redis and are
// shared by every Backend of the same Name. Build it with New and give it to
// exactly one ginqueue.Config. It is safe for concurrent use.
//
// A Backend runs two goroutines from Start until Close: the grant reader and
// the maintainer (heartbeat, lease refresh, safety-net tick, retries of
// releases and cancels, probing while Redis is down). Close stops the reader
// at once; the maintainer stays until the last running request has released
// its slot, so that its lease is kept, and then flushes pending releases and
// stops.
type Backend struct {
	rdb     redis.UniversalClient
	opts    Options
	keys    []string // the keys of every script, in the order of scripts.go
	keyArgs []any    // len(keys), then keys: the middle of an EVALSHA
	lists   string   // prefix of the notice list keys
	replica string   // 16 hex chars; every lease id starts with it
	list    string   // this replica's notice list

	// Fixed by Start.
	limits ginqueue.Limits
	decl   string // the limits as declared to other replicas
	base   []any  // ARGV[1..5] of every script

	nextID atomic.Uint64
	served atomic.Uint64
	// servedSlots and released count the slots of the grants counted in
	// served and of the Releases, for Stats.
	servedSlots atomic.Uint64
	released    atomic.Uint64
	limit       atomic.Int64 // the fleet's limit as last seen in a reply from Redis
	down        atomic.Bool  // Redis is considered unreachable; see markDown
	fails       atomic.Int32 // consecutive failed calls; see failed
	lastOK      atomic.Int64 // when a call last got an answer (UnixNano)
	resync      atomic.Bool  // the reader saw another server: sync at once
	// listening is set while the reader has a connection to the server
	// (dialled and answered), cleared when a call on it fails; while it is
	// clear, grant notices can sit unread, and the safety net runs faster.
	listening atomic.Bool

	// Redis's state as this replica sees it, for Stats and the hook.
	outages atomic.Uint64 // times Redis was marked down
	hookMu  sync.Mutex    // orders markDown and markUp, and so the OnStateChange calls
	// syncHook, set by tests before Start, runs in each sync between the
	// list and the call, with whether Redis was marked down.
	syncHook func(down bool)

	// stopCtx ends with Close: it cancels an acquire call in flight, whose
	// request Close has answered.
	stopCtx    context.Context
	stopCancel context.CancelFunc

	kick   chan struct{} // wakes the maintainer; capacity 1
	redial chan struct{} // wakes a reader waiting to dial again; capacity 1
	stop   chan struct{} // closed by Close
	readDn chan struct{} // closed when the reader returns
	mainDn chan struct{} // closed when the maintainer returns

	mu sync.Mutex
	// Guarded by mu.
	started  bool
	closed   bool
	closedAt time.Time
	waiters  map[uint64]*waiter // ids sent to Redis whose grant is awaited here
	held     map[uint64]int     // ids holding slots here, not released yet → the slots granted
	slots    int                // the sum of held's slots
	// pending holds the ids to release or cancel, retried until Redis
	// answers, each with the slots it holds or asked for: above 1, the
	// script looks its cost up in Redis (see leaseArg).
	pending  map[uint64]int
	flushing bool          // a leave call for pending ids is in flight; see flushPending
	downCh   chan struct{} // closed when Redis goes down; replaced when it is back
	idle     chan struct{} // closed when held, localHeld and pending are empty; nil unless draining
	replicas int           // live replicas Redis last reported; 0 until it answers
	rank     int           // this replica's rank among them by id; see budgetLocked
	conflict error         // a limits conflict found after Start
	token    string        // the recovery this replica was last asked to sync for; see sync
	// heard is what the last reply from Redis that said told: the slots the
	// fleet held, and how many of them were this replica's then (its own
	// count at that moment). The FailOpen budget starts from them.
	heard struct{ fleet, mine int }

	// The FailOpen fallback: one in-memory Backend for the Backend's life,
	// built at the first outage, admitting while Redis is marked down. Every
	// slot this replica runs on while down is accounted in it: its limit is
	// the outage's budget plus one slot that blocker holds for good (so that
	// a budget of zero needs no limit of zero), the slots of requests
	// running on grants from Redis are reserved in it (fbReserved of them,
	// never more than slots), and the requests it granted hold their own.
	// Close closes it, which answers its waiters.
	fb         fallbackBackend
	fbBudget   int                // the current outage's budget; see budgetLocked
	fbReserved int                // slots of fb held for slots granted by Redis
	downCtx    context.Context    // ends when Redis is marked up: fb's waiters turn back to Redis
	downCancel context.CancelFunc // ends downCtx
	// localHeld is the requests running on the fallback's slots, by lease
	// id. Each sync lists them with the holders, so that the sync that finds
	// Redis back counts them there (as far as they fit) before any new
	// request is granted by Redis: the fleet does not run over its limit
	// while they end.
	localHeld  map[uint64]*localHold
	localSlots int           // the sum of localHeld's slots
	runID      string        // the run id of the server the reader last saw; guarded by mu
	reader     *redis.Client // the reader's own connection; nil when not dialled
}

// fallbackBackend is what the FailOpen fallback needs of the in-memory
// Backend.
type fallbackBackend interface {
	ginqueue.FastBackend
	ginqueue.LimitSetter
}

// localHold is a request running on the FailOpen fallback's slots.
type localHold struct {
	slots   int  // how many
	inRedis bool // a sync counted it in Redis: its release leaves there too
}

// waiter is one lease id waiting in the Redis queue for a grant.
type waiter struct {
	id   uint64
	prio int // its Arrival's, for Stats
	cost int // the slots it asks for, at least 1
	// granted is the slots granted (its cost clamped to the limit), set
	// before ready is closed with state granted; zero means one.
	granted int
	since   time.Time     // when it arrived, for Stats
	ready   chan struct{} // closed when state leaves waiting
	state   waitState     // guarded by Backend.mu until ready is closed
	// queued is set, under Backend.mu, once Redis answered that the id is
	// queued. Only then may the safety net call it lost: before, the
	// acquire call may still be on its way.
	queued bool
}

type waitState uint8

const (
	waiting    waitState = iota
	granted              // a slot is held under this id; it is in Backend.held
	lost                 // Redis no longer knows the id: enqueue again
	closedOut            // Close answered it
	evictedOut           // an arrival of higher priority took its place in Redis
	abandoned            // its request left; a leave is under way
)

// New returns a Backend that keeps its slots and queue in Redis through rdb,
// under opts.Name. rdb must be a *redis.Client (a failover client is one) or
// a *redis.ClusterClient, built with ContextTimeoutEnabled: true, so that
// Options.CallTimeout can bound every call. The Backend does not close rdb.
// New does not talk to Redis; Start (called by ginqueue.NewQueue) does. New
// returns an error naming the bad option or client setting.
func New(rdb redis.UniversalClient, opts Options) (*Backend, error) {
	o, err := opts.compile()
	if err != nil {
		return nil, err
	}
	switch c := rdb.(type) {
	case nil:
		return nil, errors.New("redisqueue: New needs a Redis client, got nil")
	case *redis.Client:
		if !c.Options().ContextTimeoutEnabled {
			built := "redis.Options (or redis.UniversalOptions)"
			if c.Options().Addr == "FailoverClient" { // how go-redis names a Sentinel client
				built = "redis.FailoverOptions (or redis.UniversalOptions with a MasterName)"
			}
			return nil, fmt.Errorf("redisqueue: the client needs ContextTimeoutEnabled: true in the %s it was built from, "+
				"or Options.CallTimeout could not bound its calls", built)
		}
	case *redis.ClusterClient:
		if !c.Options().ContextTimeoutEnabled {
			return nil, errors.New("redisqueue: the client needs ContextTimeoutEnabled: true in the redis.ClusterOptions " +
				"(or the redis.UniversalOptions or redis.FailoverOptions) it was built from, or Options.CallTimeout could not bound its calls")
		}
	default:
		return nil, fmt.Errorf("redisqueue: New supports *redis.Client and *redis.ClusterClient, got %T", rdb)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	b := &Backend{
		rdb:       rdb,
		opts:      o,
		replica:   hex.EncodeToString(rnd[:]),
		kick:      make(chan struct{}, 1),
		redial:    make(chan struct{}, 1),
		stop:      make(chan struct{}),
		readDn:    make(chan struct{}),
		mainDn:    make(chan struct{}),
		waiters:   map[uint64]*waiter{},
		held:      map[uint64]int{},
		localHeld: map[uint64]*localHold{},
		pending:   map[uint64]int{},
		downCh:    make(chan struct{}),
	}
	b.stopCtx, b.stopCancel = context.WithCancel(context.Background())
	prefix := o.KeyPrefix + ":{" + o.Name + "}:"
	b.lists = prefix + "g:"
	b.list = b.lists + b.replica
	for _, k := range []string{"h", "q", "w", "we", "seq", "r", "d", "ev"} {
		b.keys = append(b.keys, prefix+k)
	}
	b.keys = append(b.keys, b.list, prefix+"l", prefix+"u", prefix+"f")
	b.keyArgs = append(b.keyArgs, len(b.keys))
	for _, k := range b.keys {
		b.keyArgs = append(b.keyArgs, k)
	}
	return b, nil
}

var _ ginqueue.Backend = (*Backend)(nil)

// errCoDel refuses Config.CoDel. Its budget hangs on when the queue last
// emptied, and the queue here is the fleet's, while each replica times out
// only its own waiters: each would apply a rule of its own.
var errCoDel = errors.New("redisqueue: Config.CoDel is not supported: its budget depends on when the queue " +
	"shared by every replica last emptied, which no replica knows; leave Config.CoDel nil with this Backend")

// errPerFlow refuses Config.MaxQueuePerFlow. The fleet's queue is ordered by
// priority and arrival only (flows do not take turns in it), and it keeps no
// count of places per flow, so no replica could answer an arrival at its
// flow's cap as queue full.
var errPerFlow = errors.New("redisqueue: Config.MaxQueuePerFlow is not supported: the queue shared by every replica " +
	"keeps no count of places per flow; leave it zero with this Backend (MaxQueue still bounds the queue)")

// Start implements ginqueue.Backend. It declares l to the other replicas of
// the Name and returns an error wrapping ErrConflict if a live one declared
// other MaxConcurrent or MaxQueue. If Redis does not answer, Start succeeds
// and OnRedisDown applies until it does; the declaration is then checked
// when Redis answers. Start may be called once. It refuses l.CoDel
// (Config.CoDel) and l.MaxQueuePerFlow: see errCoDel and errPerFlow. With l.Weighted (ginqueue.Config.Cost) the
// scripts count each request's Arrival.Cost in slots, across the fleet.
func (b *Backend) Start(l ginqueue.Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if l.CoDel != nil {
		return errCoDel
	}
	if l.MaxQueuePerFlow > 0 {
		return errPerFlow
	}
	b.mu.Lock()
	if b.started || b.closed {
		b.mu.Unlock()
		return errors.New("redisqueue: Start called twice, or after Close; a Backend serves one Queue")
	}
	b.started = true
	b.limits = l
	b.decl = fmt.Sprintf("MaxConcurrent=%d MaxQueue=%d", l.MaxConcurrent, l.MaxQueue)
	b.base = []any{l.MaxConcurrent, b.opts.LeaseTTL.Milliseconds(), b.lists,
		b.opts.liveTTL().Milliseconds(), b.opts.TickInterval.Milliseconds()}
	b.limit.Store(int64(l.MaxConcurrent))
	b.mu.Unlock()

	err := b.sync(true)
	if errors.Is(err, ErrConflict) {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		b.stopCancel()
		close(b.stop)
		close(b.readDn)
		close(b.mainDn)
		return err
	}
	go b.read()
	go b.maintain()
	return nil
}

// leaseID is the Redis member of id: the replica, then id in base 36.
func (b *Backend) leaseID(id uint64) string {
	return b.replica + strconv.FormatUint(id, 36)
}

// leaseArg is the script argument of id when it holds or asks for slots:
// its lease id, with "*" and slots when they are above 1, so that the
// scripts look up the cost of such an id alone.
func (b *Backend) leaseArg(id uint64, slots int) string {
	if slots > 1 {
		return b.leaseID(id) + "*" + strconv.Itoa(slots)
	}
	return b.leaseID(id)
}

// prioKey orders priorities as strings: higher priority, smaller key.
func prioKey(p int) string {
	u := uint64(int64(p)) ^ (1 << 63)
	return fmt.Sprintf("%016x", ^u)
}

// call runs one script, bounded by CallTimeout and not by the request: a
// request that leaves mid-call learns the outcome and undoes it. The command
// is built as one slice (no per-key conversions, as Script.Run would do).
func (b *Backend) call(s *script, args ...any) (any, error) {
	return b.callIn(context.Background(), s, args...)
}

// callIn is call within parent: a call that parent ended is not a failure
// of Redis.
func (b *Backend) callIn(parent context.Context, s *script, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(parent, b.opts.CallTimeout)
	defer cancel()
	argv := make([]any, 0, 2+len(b.keyArgs)+len(b.base)+len(args))
	argv = append(argv, "evalsha", s.sha)
	argv = append(argv, b.keyArgs...)
	argv = append(append(argv, b.base...), args...)
	res, err := b.rdb.Do(ctx, argv...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		argv[0], argv[1] = "eval", s.src
		res, err = b.rdb.Do(ctx, argv...).Result()
	}
	switch {
	case err == nil:
		b.lastOK.Store(time.Now().UnixNano())
		b.fails.Store(0)
	case parent.Err() == nil:
		b.failed(err)
	}
	return res, err
}

// Acquire implements ginqueue.Backend. It returns ginqueue.ErrQueueFull
// (for a waiter whose place in the full global queue an arrival of higher
// priority took, an error wrapping it), ginqueue.ErrQueueTimeout (after
// Limits.QueueTimeout, measured here), ginqueue.ErrClosed, ctx.Err() when
// ctx ends first, or while Redis is down what OnRedisDown says: a local
// grant (FailOpen) or an error wrapping ErrUnavailable and
// ginqueue.ErrQueueFull (FailClosed). A request never waits longer than
// QueueTimeout plus one CallTimeout.
//
// With Limits.Weighted the request asks for a.Cost slots (below 1, one);
// Redis grants them, clamped to the fleet's limit at that moment, once they
// are free and no waiter ahead of it in the global order waits, and the
// Ticket's Cost says how many it got.
func (b *Backend) Acquire(ctx context.Context, a ginqueue.Arrival) (ginqueue.Ticket, error) {
	var deadline time.Time
	if b.limits.QueueTimeout > 0 {
		deadline = time.Now().Add(b.limits.QueueTimeout)
	}
	if err := ctx.Err(); err != nil {
		return ginqueue.Ticket{}, err
	}
	prio := prioKey(a.Priority)
	cost := 1
	if b.limits.Weighted {
		cost = min(max(a.Cost, 1), ginqueue.MaxLimit)
	}
	for {
		b.mu.Lock()
		switch {
		case b.closed || !b.started:
			b.mu.Unlock()
			return ginqueue.Ticket{}, ginqueue.ErrClosed
		case b.conflict != nil:
			err := b.conflict
			b.mu.Unlock()
			return ginqueue.Ticket{}, fmt.Errorf("%w (%w)", err, ginqueue.ErrQueueFull)
		case b.down.Load():
			b.mu.Unlock()
			t, err, again := b.fallback(ctx, a, deadline, errors.New("earlier calls failed"))
			if again {
				continue
			}
			return t, err
		}
		// Register before the call: the grant notice can beat the reply.
		w := &waiter{id: b.nextID.Add(1), prio: a.Priority, cost: cost, since: time.Now(), ready: make(chan struct{})}
		b.waiters[w.id] = w
		downCh := b.downCh
		b.mu.Unlock()

		res, err := b.callIn(b.stopCtx, acquireScript, b.limits.MaxQueue, b.leaseID(w.id), prio, cost)
		var outcome, slots, fleet int64
		if err == nil {
			outcome, slots, fleet, err = b.acquireReply(res)
		}
		if err != nil {
			// The script may have run: undo it in the background.
			b.abandon(w)
			b.mu.Lock()
			closed := b.closed
			b.mu.Unlock()
			if closed {
				// Close answered it, and ended the call.
				return ginqueue.Ticket{}, ginqueue.ErrClosed
			}
			// This request gets OnRedisDown now; the replica turns to it
			// only after Options.FailureThreshold failures in a row.
			t, err, again := b.fallback(ctx, a, deadline, err)
			if again {
				continue
			}
			return t, err
		}
		// Close may have answered it while the call was on its way, and
		// given its id back before the script ran: then what the script
		// granted or queued is given back now. (Not any other state: a
		// grant notice can beat the reply.)
		closed := false
		b.mu.Lock()
		switch outcome {
		case 0:
			w.queued = true
			closed = w.state == closedOut
		case 1:
			if w.state == waiting {
				w.granted = int(slots)
				b.grantLocked(w)
			}
			closed = w.state == closedOut
		case -1:
			if w.state == waiting {
				w.state = abandoned
				delete(b.waiters, w.id)
			}
		}
		// What the fleet held after the script, this grant included.
		b.heard.fleet, b.heard.mine = int(fleet), b.slots+b.localSlots
		b.mu.Unlock()
		if outcome == -1 {
			return ginqueue.Ticket{}, ginqueue.ErrQueueFull
		}
		if closed {
			b.leave(w.id, w.cost)
		}
		t, err, again := b.wait(ctx, w, deadline, downCh)
		if !again {
			if err == nil {
				b.served.Add(1)
				b.servedSlots.Add(uint64(t.Cost))
			}
			return t, err
		}
		if err != nil {
			t, err, again := b.fallback(ctx, a, deadline, err)
			if again {
				continue
			}
			return t, err
		}
		// Lost by Redis (restarted, flushed): enqueue again with a new id.
	}
}

// acquireReply reads the acquire script's reply, {outcome, limit, slots
// granted, slots held in the fleet}, and notes the limit.
func (b *Backend) acquireReply(res any) (outcome, slots, fleet int64, err error) {
	r, _ := res.([]any)
	if len(r) == 4 {
		outcome, ok1 := r[0].(int64)
		limit, ok2 := r[1].(int64)
		slots, ok3 := r[2].(int64)
		fleet, ok4 := r[3].(int64)
		if ok1 && ok2 && ok3 && ok4 {
			b.limit.Store(limit)
			return outcome, slots, fleet, nil
		}
	}
	return 0, 0, 0, fmt.Errorf("redisqueue: unexpected acquire reply %v", res)
}

// wait waits for w's grant. again reports that Acquire must go on: with
// err == nil to enqueue again, with err != nil to apply OnRedisDown.
func (b *Backend) wait(ctx context.Context, w *waiter, deadline time.Time, downCh <-chan struct{}) (t ginqueue.Ticket, err error, again bool) {
	var expired <-chan time.Time
	if !deadline.IsZero() {
		tm := time.NewTimer(time.Until(deadline))
		defer tm.Stop()
		expired = tm.C
	}
	select {
	case <-w.ready:
	case <-ctx.Done():
		if !b.abandon(w) {
			// Granted in the same instant as the hang-up: nobody will run on
			// the slot, so give it back (it was never counted as served).
			b.release(ginqueue.Ticket{ID: w.id})
		}
		return ginqueue.Ticket{}, ctx.Err(), false
	case <-expired:
		if !b.abandon(w) {
			// Granted in the same instant as the deadline: serve it.
			return b.ticket(w), nil, false
		}
		if b.opts.OnRedisDown == FailClosed && !b.answering() {
			// Redis stopped answering while it waited (a pause, a failover
			// not yet marked down): that, not the queue, is why no grant
			// came. FailClosed answers it as unavailable.
			return ginqueue.Ticket{}, &unavailableError{cause: errors.New("no answer from Redis while the request waited")}, false
		}
		return ginqueue.Ticket{}, ginqueue.ErrQueueTimeout, false
	case <-downCh:
		if !b.abandon(w) {
			return b.ticket(w), nil, false
		}
		return ginqueue.Ticket{}, errors.New("safety-net call failed"), true
	}
	// ready is closed, so w.state is final and safe to read.
	switch w.state {
	case granted:
		return b.ticket(w), nil, false
	case lost:
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return ginqueue.Ticket{}, ginqueue.ErrQueueTimeout, false
		}
		return ginqueue.Ticket{}, nil, true
	case evictedOut:
		return ginqueue.Ticket{}, errEvicted, false
	}
	return ginqueue.Ticket{}, ginqueue.ErrClosed, false
}

// ticket is the Ticket of w, granted.
func (b *Backend) ticket(w *waiter) ginqueue.Ticket {
	return ginqueue.Ticket{ID: w.id, Cost: max(w.granted, 1)}
}

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

// grantLocked hands w its w.granted slots (zero: one). Requires b.mu and
// w.state == waiting.
func (b *Backend) grantLocked(w *waiter) {
	w.granted = max(w.granted, 1)
	w.state = granted
	delete(b.waiters, w.id)
	b.held[w.id] = w.granted
	b.slots += w.granted
	if b.down.Load() && b.fb != nil {
		b.reserveLocked() // a grant that came as Redis was marked down
	}
	close(w.ready)
}

// finishLocked ends w's wait with st, which holds nothing in Redis. Requires
// b.mu and w.state == waiting.
func (b *Backend) finishLocked(w *waiter, st waitState) {
	w.state = st
	delete(b.waiters, w.id)
	close(w.ready)
}

// abandon takes w out of the local books and has its place or slot given
// back in Redis, since the script may have queued or granted it. It reports false
// if w had been granted and Close had not run: the caller holds the slot then,
// and nothing was given back.
func (b *Backend) abandon(w *waiter) bool {
	b.mu.Lock()
	switch w.state {
	case waiting:
		w.state = abandoned
		delete(b.waiters, w.id)
	case granted:
		b.mu.Unlock()
		return false
	}
	b.mu.Unlock()
	// In the background, so that a 408 or a 499 is answered at once; the
	// maintainer sends it within microseconds, batched with others.
	b.mu.Lock()
	b.pending[w.id] = w.cost
	b.mu.Unlock()
	b.wake()
	return true
}

// leave releases or cancels id, which holds or asked for slots, in Redis. When no leave call is in flight,
// it makes one now, carrying every pending id with its own; otherwise id
// joins the pending ids and leave returns at once: the call in flight has
// them sent as soon as it returns. Under concurrent releases, one call
// thus gives back many slots. Ids whose call fails stay pending and are
// retried in the background.
func (b *Backend) leave(id uint64, slots int) {
	b.mu.Lock()
	b.pending[id] = slots
	if b.flushing || b.down.Load() {
		b.mu.Unlock()
		return
	}
	b.flushing = true
	b.mu.Unlock()
	b.flushPending()
}

// wake nudges the maintainer without blocking.
func (b *Backend) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// failed counts a failed call, err. Options.FailureThreshold failures in a
// row, with no successful call between them, mark Redis down; before that, a
// probe is made at once, so that a Redis that is really gone is marked down
// within FailureThreshold call timeouts even with no other traffic, and one
// slow call under a burst does not turn the whole replica to OnRedisDown.
func (b *Backend) failed(err error) {
	if c, ok := b.rdb.(*redis.ClusterClient); ok {
		// A dead master sends no MOVED: without a reload the client would
		// keep dialing it until its periodic refresh, a minute later.
		c.ReloadState(context.Background())
	}
	if int(b.fails.Add(1)) >= b.opts.FailureThreshold {
		b.markDown(err)
		return
	}
	b.wake()
}

// markDown records that Redis did not answer: new arrivals and waiters turn
// to OnRedisDown until the maintainer's probe gets an answer. Under FailOpen
// the fallback opens with this outage's budget, and the slots of the
// requests running here on grants from Redis are reserved in it.
func (b *Backend) markDown(cause error) {
	b.hookMu.Lock()
	defer b.hookMu.Unlock()
	if b.down.Swap(true) {
		return
	}
	b.outages.Add(1)
	b.mu.Lock()
	close(b.downCh)
	if b.opts.OnRedisDown == FailOpen && !b.closed {
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
		fb.Release(ginqueue.Ticket{})
	}
	if h := b.opts.OnStateChange; h != nil {
		h(false, nil)
	}
}

// split is this replica's part of n slots among the live replicas last
// reported: n/r, and one more for the first n%r by id, so that the parts add
// up to n. Requires b.mu.
func (b *Backend) splitLocked(n int) int {
	r := max(b.replicas, 1)
	p := n / r
	if b.rank%r < n%r {
		p++
	}
	return p
}

// budgetLocked is the slots this replica may run while Redis is down, those
// of its requests still running on grants from Redis included: the slots it
// held when Redis last told it how many the fleet held, plus its part of the
// slots free then; but no more than its share of the fleet's limit (the
// limit split among the live replicas). Options.LocalLimit, when set, is the
// budget. If what each replica last heard is still true (each hears it at
// least every tick), the budgets add up to at most the fleet's limit: every
// slot held then stays with the replica that held it (up to its share),
// every free one goes to one replica. The share bounds what a replica that
// heard too late, or that is cut off from Redis alone while the others take
// its slots back, runs beyond the limit. Requires b.mu.
func (b *Backend) budgetLocked() int {
	if b.opts.LocalLimit > 0 {
		return b.opts.LocalLimit
	}
	fleet := int(b.limit.Load())
	if b.replicas == 0 {
		return fleet // Redis never answered
	}
	return min(b.splitLocked(fleet), b.heard.mine+b.splitLocked(max(0, fleet-b.heard.fleet)))
}

// openFallbackLocked opens the FailOpen fallback for an outage: it builds it
// at the first, sets its limit to the outage's budget (plus the blocker's
// slot) and reserves in it the slots of the requests running on grants from
// Redis. Requires b.mu.
func (b *Backend) openFallbackLocked() {
	if b.fb == nil {
		n := max(b.replicas, 1)
		queue := b.opts.LocalQueue
		if queue == 0 {
			queue = (b.limits.MaxQueue + n - 1) / n
		}
		fb := ginqueue.NewMemoryBackend().(fallbackBackend)
		// Deadlines are enforced by fallback, so that the whole wait, Redis
		// part included, stays within QueueTimeout.
		_ = fb.Start(ginqueue.Limits{MaxConcurrent: 1, MaxQueue: queue, Weighted: b.limits.Weighted})
		fb.TryAcquire() // the blocker, for good
		b.fb = fb
	}
	b.fbBudget = b.budgetLocked()
	_ = b.fb.SetLimit(min(b.fbBudget, ginqueue.MaxLimit-1) + 1)
	b.downCtx, b.downCancel = context.WithCancel(context.Background())
	b.reserveLocked()
}

// reserveLocked reserves in the fallback, while Redis is down, the slots
// granted by Redis that are not reserved yet, as far as they fit. Requires
// b.mu.
func (b *Backend) reserveLocked() {
	for b.fbReserved < b.slots && b.fb.TryAcquire() != 0 {
		b.fbReserved++
	}
}

// errRetry is fallback's answer when the request is to go through Redis
// again: Redis answers again, or was not marked down yet.
var errRetry = errors.New("redisqueue: try Redis again")

// fallback applies OnRedisDown to a request that Redis could not serve.
// again reports that the request is to go to Redis again instead: it was
// waiting in the fallback when Redis was marked up, or the call failed
// without Redis being marked down (then after a pause: the maintainer's
// probe tells within a call timeout).
func (b *Backend) fallback(ctx context.Context, a ginqueue.Arrival, deadline time.Time, cause error) (_ ginqueue.Ticket, _ error, again bool) {
	if b.opts.OnRedisDown == FailClosed {
		return ginqueue.Ticket{}, &unavailableError{cause: cause}, false
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ginqueue.Ticket{}, ginqueue.ErrClosed, false
	}
	if !b.down.Load() {
		// One failed call: until the replica marks Redis down (or finds
		// it answering), nothing is admitted on its own.
		b.mu.Unlock()
		t := time.NewTimer(retryPause)
		defer t.Stop()
		var expired <-chan time.Time
		if !deadline.IsZero() {
			d := time.NewTimer(time.Until(deadline))
			defer d.Stop()
			expired = d.C
		}
		select {
		case <-ctx.Done():
			return ginqueue.Ticket{}, ctx.Err(), false
		case <-expired:
			return ginqueue.Ticket{}, ginqueue.ErrQueueTimeout, false
		case <-t.C:
			return ginqueue.Ticket{}, errRetry, true
		}
	}
	fb, dctx, budget := b.fb, b.downCtx, b.fbBudget
	b.mu.Unlock()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopUp := context.AfterFunc(dctx, cancel)
	defer stopUp()
	if !deadline.IsZero() {
		var cancelD context.CancelFunc
		lctx, cancelD = context.WithDeadline(lctx, deadline)
		defer cancelD()
	}
	if cost := min(max(a.Cost, 1), int(b.limit.Load())); budget < 1 || b.limits.Weighted && cost > budget {
		// It could never run within this replica's budget: say so now
		// rather than at its QueueTimeout.
		return ginqueue.Ticket{}, &unavailableError{cause: fmt.Errorf(
			"a request of %d slots while this replica may run %d on its own until Redis answers", cost, budget)}, false
	}
	t, err := fb.Acquire(lctx, a)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return ginqueue.Ticket{}, ctx.Err(), false
		case dctx.Err() != nil && (deadline.IsZero() || time.Now().Before(deadline)) && !errors.Is(err, ginqueue.ErrClosed):
			return ginqueue.Ticket{}, errRetry, true // Redis is back
		case lctx.Err() != nil:
			return ginqueue.Ticket{}, ginqueue.ErrQueueTimeout, false
		}
		return ginqueue.Ticket{}, err, false
	}
	slots := max(t.Cost, 1)
	id := b.nextID.Add(1)
	b.mu.Lock()
	if dctx.Err() != nil {
		// Granted as Redis was marked up: the sync that counts this
		// replica's own grants may have gone, so this one goes to Redis.
		b.mu.Unlock()
		fb.Release(t)
		return ginqueue.Ticket{}, errRetry, true
	}
	b.localHeld[id] = &localHold{slots: slots}
	b.localSlots += slots
	b.mu.Unlock()
	b.served.Add(1)
	b.servedSlots.Add(uint64(slots))
	return ginqueue.Ticket{ID: localBit | id, Cost: t.Cost}, nil, false
}

// retryPause is how long a request whose call failed waits before it tries
// Redis again, while Redis is not marked down.
const retryPause = 10 * time.Millisecond

// Release implements ginqueue.Backend. It gives the slots back in Redis with
// one call bounded by CallTimeout, or, when another release's call is in
// flight, returns at once and the slot goes back with the next call, which
// carries every release that came meanwhile. If the call fails, or Redis is
// known to be down, the release is retried in the background until Redis
// answers (or, after Close, until LeaseTTL has passed: the lease has expired
// by then).
func (b *Backend) Release(t ginqueue.Ticket) {
	b.released.Add(uint64(max(t.Cost, 1)))
	b.release(t)
}

// release gives the slots of t back; Release, and a grant taken back. The
// slots given back in Redis are those Redis granted, whatever the limit is
// now: the script looks them up.
func (b *Backend) release(t ginqueue.Ticket) {
	if t.ID&localBit != 0 {
		id := t.ID &^ localBit
		b.mu.Lock()
		h := b.localHeld[id]
		delete(b.localHeld, id)
		b.localSlots -= h.slots
		fb := b.fb
		b.idleCheckLocked()
		closed := b.closed
		b.mu.Unlock()
		fb.Release(ginqueue.Ticket{Cost: t.Cost})
		if h.inRedis {
			b.leave(id, h.slots)
		}
		if closed {
			b.wake() // the maintainer may stop once nothing is held
		}
		return
	}
	b.mu.Lock()
	slots, ok := b.held[t.ID]
	if !ok {
		slots = max(t.Cost, 1)
	} else {
		delete(b.held, t.ID)
		b.slots -= slots
	}
	free := 0
	for b.fbReserved > b.slots {
		// Reserved in the fallback for slots from Redis: free there now.
		b.fbReserved--
		free++
	}
	fb := b.fb
	b.mu.Unlock()
	for range free {
		fb.Release(ginqueue.Ticket{})
	}
	b.leave(t.ID, slots)
	b.mu.Lock()
	b.idleCheckLocked()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		b.wake() // the maintainer may stop once nothing is held
	}
}

// idleCheckLocked tells a drainer when nothing is held or pending. Requires
// b.mu.
func (b *Backend) idleCheckLocked() {
	if b.idle != nil && len(b.held) == 0 && len(b.localHeld) == 0 && len(b.pending) == 0 {
		close(b.idle)
		b.idle = nil
	}
}

// Stats implements ginqueue.Backend with this replica's view: Running counts
// the slots held by the requests of this process (local fallback included),
// Queued its waiting requests,
// Limit is the fleet's limit as last seen: MaxConcurrent until SetLimit
// moves it, then the value of the last acquire, sync or SetLimit reply from
// Redis (a change made on another replica shows here at this replica's next
// acquire or sync, within a TickInterval). GlobalStats asks Redis for the
// fleet's.
func (b *Backend) Stats() ginqueue.BackendStats {
	now := time.Now()
	released := b.released.Load() // before servedSlots: never more than it
	byPrio := map[int]int{}
	var oldest time.Time
	b.mu.Lock()
	s := ginqueue.BackendStats{
		Running: b.slots + b.localSlots,
		Queued:  len(b.waiters),
		Limit:   int(b.limit.Load()),
		Served:  b.served.Load(),
	}
	for _, w := range b.waiters {
		byPrio[w.prio]++
		if oldest.IsZero() || w.since.Before(oldest) {
			oldest = w.since
		}
	}
	fb := b.fb
	b.mu.Unlock()
	s.Unavailable = b.down.Load()
	s.Outages = b.outages.Load()
	if !oldest.IsZero() {
		s.OldestWait = now.Sub(oldest)
	}
	if fb != nil {
		ls := fb.Stats()
		s.Queued += ls.Queued
		s.OldestWait = max(s.OldestWait, ls.OldestWait)
		for _, p := range ls.QueuedByPriority {
			byPrio[p.Priority] += p.Queued
		}
	}
	// A grant counts as served once Acquire returns it: until then its slots
	// are held but not yet served, and Running must never exceed the slots
	// of the requests in Served.
	servedSlots := b.servedSlots.Load()
	s.Running = min(s.Running, int(servedSlots-min(servedSlots, released)))
	if s.Queued > 0 {
		s.QueuedByPriority = make([]ginqueue.PriorityCount, 0, len(byPrio))
		for p, n := range byPrio {
			s.QueuedByPriority = append(s.QueuedByPriority, ginqueue.PriorityCount{Priority: p, Queued: n})
		}
		slices.SortFunc(s.QueuedByPriority, func(a, b ginqueue.PriorityCount) int { return cmp.Compare(b.Priority, a.Priority) })
	}
	return s
}

// GlobalStats is the fleet's view of one Name, as Redis holds it.
type GlobalStats struct {
	Running  int // slots held, by every replica (with Config.Cost, a request holds its cost)
	Queued   int // waiters, on every replica
	Replicas int // replicas whose heartbeat is live (a dead one lingers for up to the liveness lease and a tick)
	Limit    int // the fleet's limit: what SetLimit set, or this replica's MaxConcurrent if it was never set
}

// GlobalStats asks Redis for the slots held and the waiters of the whole
// fleet. Leases that expired but were not yet swept still count. It returns
// the Redis error, if any; it is safe for concurrent use.
func (b *Backend) GlobalStats(ctx context.Context) (GlobalStats, error) {
	var h, q, r *redis.IntCmd
	var l *redis.SliceCmd
	_, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		h = p.ZCard(ctx, b.keys[0])
		q = p.ZCard(ctx, b.keys[1])
		r = p.ZCard(ctx, b.keys[5])
		l = p.HMGet(ctx, b.keys[9], "n", "x")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return GlobalStats{}, err
	}
	// The slots held are the holders plus the slots beyond one of those
	// with a cost (see scripts.go).
	limit, extra := b.limits.MaxConcurrent, 0
	if v := l.Val(); len(v) == 2 {
		if s, ok := v[0].(string); ok {
			if n, err := strconv.Atoi(s); err == nil {
				limit = n
			}
		}
		if s, ok := v[1].(string); ok {
			extra, _ = strconv.Atoi(s)
		}
	}
	return GlobalStats{Running: int(h.Val()) + extra, Queued: int(q.Val()), Replicas: int(r.Val()), Limit: limit}, nil
}

// Drain implements ginqueue.Backend: it returns once every slot granted here
// (by Redis or by the FailOpen fallback) was released and every release
// reached Redis (or was given up after Close), or with ctx.Err().
func (b *Backend) Drain(ctx context.Context) error {
	for {
		b.mu.Lock()
		if len(b.held) == 0 && len(b.localHeld) == 0 && len(b.pending) == 0 {
			b.mu.Unlock()
			return nil
		}
		if b.idle == nil {
			b.idle = make(chan struct{})
		}
		idle := b.idle
		b.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close implements ginqueue.Backend. Waiters get ginqueue.ErrClosed and
// their queue places are given back, the FailOpen fallback's waiters too; a
// request whose acquire call is on its way gets it when the call returns
// (within CallTimeout); new arrivals get ginqueue.ErrClosed. Running
// requests, on slots from Redis or from the fallback, keep their slots (and
// leases) until they Release. Close
// returns once the reader has stopped and, if nothing is held here, the
// maintainer too; otherwise the maintainer stops after the last Release.
// Close does not close the Redis client. It may be called more than once.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.closedAt = time.Now()
	if !b.started {
		b.mu.Unlock()
		return nil
	}
	for id, w := range b.waiters {
		w.state = closedOut
		close(w.ready)
		delete(b.waiters, id)
		b.pending[id] = w.cost
	}
	r := b.reader
	b.reader = nil
	fb := b.fb
	b.mu.Unlock()
	b.stopCancel() // an acquire call in flight: its request is answered
	if fb != nil {
		_ = fb.Close() // answers the fallback's waiters
	}
	close(b.stop)
	if r != nil {
		_ = r.Close() // unblocks BLPOP
	}
	<-b.readDn
	b.mu.Lock()
	idle := len(b.held) == 0 && len(b.localHeld) == 0
	b.mu.Unlock()
	if idle {
		<-b.mainDn
	}
	return nil
}
