package redisqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/internal/inmem"
	"github.com/redis/go-redis/v9"
)

// Backend is a backend.Backend whose limit is shared, through Redis, by
// every Backend of the same Name on the same Redis. In Shares mode (the
// default) it admits in memory within a share of the limit that it leases
// from Redis; in GlobalQueue mode its slots and queue are in Redis
// (Options.Mode). Build it with New (the zero value is not usable) and give
// it to exactly one ginqueue.Config. It is safe for concurrent use.
//
// From Start until Close a Backend runs two goroutines: one waits, on a
// Redis connection of its own, for the notices Redis sends this replica
// (a share moved, a grant, an eviction); the other keeps the replica in step
// with Redis: in Shares mode it renews the lease and moves the share, in
// GlobalQueue mode it refreshes the leases every
// Options.GlobalQueue.TickInterval, retries releases that failed and finds
// grants whose notice was lost; in both it probes Redis while it is marked
// down. With Options.Shares.Parts above 1, a third goroutine takes turns at
// moving the limit between the parts. In GlobalQueue mode a request that
// arrives while Redis is marked down may start a probe of its own, on a
// goroutine that lasts one short call. Close says when they stop.
type Backend struct {
	connection
	healthState
	lifecycle
	queueState
	fallbackState

	sh *shares // Shares mode; nil in GlobalQueue mode
	sp *split  // a Name split into parts (Options.Shares.Parts above 1); else nil
}

// connection is how a Backend reaches its keys, and what it declared.
type connection struct {
	rdb     redis.UniversalClient
	opts    settings
	keys    []string // the keys of every script, in the order of scripts.go
	keyArgs []any    // len(keys), then keys: the middle of an EVALSHA
	lists   string   // prefix of the notice list keys
	replica string   // 16 hex chars; every lease id starts with it
	list    string   // this replica's notice list

	// Fixed by Start.
	limits backend.Limits
	decl   string // the limits as declared to other replicas
	base   []any  // ARGV[1..5] of every script

	limit atomic.Int64 // the fleet's limit as last seen in a reply from Redis
}

// healthState is whether Redis answers, as this replica sees it.
type healthState struct {
	down     atomic.Bool  // Redis is considered unreachable; see markDown
	fails    atomic.Int32 // consecutive failed calls; see failed
	failedAt atomic.Int64 // when the last failure that counted was seen, in ns since born; see failed
	born     time.Time    // when New made it: failedAt counts from here, on the monotonic clock
	lastOK   atomic.Int64 // when a call last got an answer (UnixNano)
	// clientClosed is set once a call through rdb found it closed (its
	// owner closed it without closing this Backend): it never answers
	// again, and no probe dials a connection of its own from its settings.
	clientClosed atomic.Bool
	outages      atomic.Uint64 // times Redis was marked down
	hookMu       sync.Mutex    // orders markDown and markUp, and so the OnStateChange calls

	probes  sync.WaitGroup // the probes requests started while Redis was marked down; Close waits for them
	givenUp sync.WaitGroup // the maintainer's probes of a Redis marked down; see probeDown

	// Guarded by mu.
	downCh chan struct{} // closed when Redis goes down; replaced when it is back
	// probing is set while a probe that a request started is in flight,
	// probedAt is when the last one began; see probeLocked.
	probing  bool
	probedAt time.Time
	// stopProbe ends the maintainer's wait for its probe of a Redis marked
	// down; nil when none is in flight. See probeDown.
	stopProbe context.CancelFunc
}

// lifecycle is the Backend's goroutines, its lock, and Start and Close.
type lifecycle struct {
	// stopCtx ends with Close: it cancels an acquire call in flight, whose
	// request Close has answered.
	stopCtx    context.Context
	stopCancel context.CancelFunc

	kick   chan struct{} // wakes the maintainer; capacity 1
	redial chan struct{} // wakes a reader waiting to dial again; capacity 1
	stop   chan struct{} // closed by Close
	readDn chan struct{} // closed when the reader returns
	mainDn chan struct{} // closed when the maintainer returns

	resync atomic.Bool // the reader saw another server: sync at once
	// listening is set while the reader has a connection to the server
	// (dialled and answered), cleared when a call on it fails; while it is
	// clear, grant notices can sit unread, and the safety net runs faster.
	listening atomic.Bool

	mu sync.Mutex
	// Guarded by mu.
	started  bool
	closed   bool
	closedAt time.Time
	runID    string        // the run id of the server the reader last saw
	reader   *redis.Client // the reader's own connection; nil when not dialled

	// syncHook, set by tests before Start, runs in each sync between the
	// list and the call, with whether Redis was marked down.
	syncHook func(down bool)
}

// queueState is GlobalQueue mode's: the requests of this replica that
// Redis granted or queues.
type queueState struct {
	nextID atomic.Uint64
	served atomic.Uint64
	// servedSlots and released count the slots of the grants counted in
	// served and of the Releases, for Stats.
	servedSlots atomic.Uint64
	released    atomic.Uint64
	// syncedAt is when the last sync that got an answer was sent, in ns
	// since born (monotonic): Redis takes this replica for dead, and drops
	// the slots it was granted, a liveness lease after that.
	syncedAt atomic.Int64

	// Guarded by mu.
	waiters map[uint64]*waiter // ids sent to Redis whose grant is awaited here
	held    map[uint64]int     // ids holding slots here, not released yet → the slots granted
	slots   int                // the sum of held's slots
	// pending holds the ids to release or cancel, retried until Redis
	// answers, each with the slots it holds or asked for: above 1, the
	// script looks its cost up in Redis (see leaseArg).
	pending  map[uint64]int
	flushing bool          // a leave call for pending ids is in flight; see flushPending
	idle     chan struct{} // closed when held, localHeld and pending are empty; nil unless draining
	replicas int           // live replicas Redis last reported; 0 until it answers
	rank     int           // this replica's rank among them by id; see allowanceLocked
	conflict error         // a limits conflict found after Start
	token    string        // the recovery this replica was last asked to sync for; see sync
	// heard is the fleet's count of slots held, and how many of them were
	// this replica's, as of the last reply of the acquire, leave or sync
	// script (each reports it); a grant notice adds to mine. The FailOpen
	// allowance starts from them.
	heard struct{ fleet, mine int }
}

// fallbackState is GlobalQueue mode's FailOpen fallback: one in-memory
// Backend for the Backend's life, built at the first outage, admitting
// while Redis is marked down. Every slot this replica runs on while down is
// accounted in it: its limit is the outage's allowance plus one slot that
// blocker holds for good (so that an allowance of zero needs no limit of
// zero), the slots of requests running on grants from Redis are reserved in
// it (fbReserved of them, never more than slots), and the requests it
// granted hold their own. Close closes it, which answers its waiters. All
// guarded by mu.
type fallbackState struct {
	fb          fallbackBackend
	fbAllowance int                // the current outage's allowance; see allowanceLocked
	fbReserved  int                // slots of fb held for slots granted by Redis
	downCtx     context.Context    // ends when Redis is marked up: fb's waiters turn back to Redis
	downCancel  context.CancelFunc // ends downCtx
	// localHeld is the requests running on the fallback's slots, by lease
	// id. Each sync lists them with the holders, so that the sync that finds
	// Redis back counts them there (as far as they fit) before any new
	// request is granted by Redis: the fleet does not run over its limit
	// while they end.
	localHeld  map[uint64]*localHold
	localSlots int // the sum of localHeld's slots
}

// New returns a Backend that shares one limit, through rdb, with every
// Backend of opts.Name on the same Redis: in Shares mode (the default) by
// leasing a share of it, in GlobalQueue mode with its slots and queue in
// Redis. rdb must be a *redis.Client (a failover client is one) or a
// *redis.ClusterClient, built with ContextTimeoutEnabled: true, so that
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
		connection:    connection{rdb: rdb, opts: o, replica: hex.EncodeToString(rnd[:])},
		healthState:   healthState{born: time.Now(), downCh: make(chan struct{})},
		queueState:    queueState{waiters: map[uint64]*waiter{}, held: map[uint64]int{}, pending: map[uint64]int{}},
		fallbackState: fallbackState{localHeld: map[uint64]*localHold{}},
		lifecycle: lifecycle{kick: make(chan struct{}, 1), redial: make(chan struct{}, 1), stop: make(chan struct{}),
			readDn: make(chan struct{}), mainDn: make(chan struct{})},
	}
	b.stopCtx, b.stopCancel = context.WithCancel(context.Background())
	prefix := o.KeyPrefix + ":{" + o.Name + "}:"
	b.lists = prefix + "g:"
	b.list = b.lists + b.replica
	b.keys = make([]string, numKeys)
	for i, k := range [numKeys]string{keyH: "h", keyQ: "q", keyW: "w", keyWE: "we", keySeq: "seq", keyR: "r",
		keyD: "d", keyEV: "ev", keyG: "g:" + b.replica, keyL: "l", keyU: "u", keyF: "f"} {
		b.keys[i] = prefix + k
	}
	if o.Mode == Shares {
		b.sh = newShares(b)
		if o.Parts > 1 {
			b.sp = newSplit(b)
			prefix = partPrefix(o, b.sp.part)
		}
		b.lists = prefix + "sg:"
		b.list = b.lists + b.replica
		// Start sets the declared limit; GlobalStats may be called before.
		b.base = []any{0, o.LeaseTTL.Milliseconds(), b.lists, b.replica}
		b.keys = make([]string, numShareKeys)
		for i, k := range shareKeyNames(b.replica) {
			b.keys[i] = prefix + k
		}
	}
	b.keyArgs = append(b.keyArgs, len(b.keys))
	for _, k := range b.keys {
		b.keyArgs = append(b.keyArgs, k)
	}
	return b, nil
}

var _ backend.Backend = (*Backend)(nil)

// Start implements backend.Backend: it declares l to the other replicas of
// the Name and starts the Backend's goroutines. It may be called once. It
// returns an error wrapping ErrConflict if a live replica declared another
// MaxConcurrent (or, in GlobalQueue mode, another MaxQueue), runs in the
// other Mode, or splits the Name into other Parts.
//
// If Redis does not answer, Start still succeeds, and the declaration is
// checked once Redis answers. Meanwhile, in Shares mode, the replica holds
// no share: its requests wait, and once Redis is marked down and a probe
// that waited a second (or a CallTimeout, if longer) for its answer finds
// it still down (about 2.5 s after Start with the default CallTimeout)
// they get an error wrapping ErrUnavailable under either OnRedisDown; in
// GlobalQueue mode OnRedisDown applies.
//
// In Shares mode every Limits field works, on each replica, but a Name
// split into parts refuses l.Weighted. In GlobalQueue mode Start refuses
// CoDel (Config.CoDel) and l.MaxQueuePerFlow, which no replica can honour
// for the fleet (docs/fleet.md says why). With l.Weighted each request
// holds its Arrival.Cost in slots of the fleet's limit.
func (b *Backend) Start(l backend.Limits) error {
	if err := inmem.Check(l); err != nil {
		return err
	}
	if b.sh != nil {
		return b.sh.start(l)
	}
	if l.CoDelTarget != 0 || l.CoDelInterval != 0 || l.CoDelLIFO {
		return errCoDel
	}
	if l.MaxQueuePerFlow > 0 {
		return errPerFlow
	}
	if err := b.declare(l); err != nil {
		return err
	}
	err := b.sync(true)
	if errors.Is(err, ErrConflict) {
		b.refuseStart()
		return err
	}
	go b.read()
	go b.maintain()
	return nil
}

// declare records the limits Start was given, once.
func (b *Backend) declare(l backend.Limits) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.closed {
		return errors.New("redisqueue: Start called twice, or after Close; a Backend serves one Queue")
	}
	b.started = true
	b.limits = l
	b.decl = fmt.Sprintf("MaxConcurrent=%d MaxQueue=%d", l.MaxConcurrent, l.MaxQueue)
	b.base = []any{l.MaxConcurrent, b.opts.LeaseTTL.Milliseconds(), b.lists,
		b.opts.liveTTL().Milliseconds(), b.opts.TickInterval.Milliseconds()}
	b.limit.Store(int64(l.MaxConcurrent))
	return nil
}

// refuseStart closes a Backend whose Start found a conflict, before any of
// its goroutines started.
func (b *Backend) refuseStart() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.stopCancel()
	close(b.stop)
	close(b.readDn)
	close(b.mainDn)
}

// Drain implements backend.Backend: it returns nil once every request
// admitted here has released its slots, or ctx.Err() if ctx ends first. In
// GlobalQueue mode that includes the requests the FailOpen fallback
// admitted, and Drain also waits until every release has reached Redis (or
// was given up after Close).
func (b *Backend) Drain(ctx context.Context) error {
	if b.sh != nil {
		return b.sh.mem.Drain(ctx)
	}
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

// Close implements backend.Backend: waiters and new arrivals get
// backend.ErrClosed, and running requests keep their slots (and leases)
// until they Release. Close does not close the Redis client. It may be
// called more than once.
//
// Close stops waiting for notices at once. Once nothing runs here, the
// replica tells Redis it leaves, which frees its share (Shares mode) or
// its entry (GlobalQueue mode) at once: if nothing runs when Close is
// called, Close waits for that call for at most 2 × CallTimeout, after the
// notice reader stopped (up to one CallTimeout more while Redis does not
// answer); otherwise the call follows the last Release. In Shares mode a
// call that gets no answer is tried again every 100 ms in the background,
// until Redis answers, the client is closed, or the Name's keys have
// expired (10 × LeaseTTL).
//
// In GlobalQueue mode the waiters' places in Redis are given back, the
// FailOpen fallback's waiters get backend.ErrClosed too, a request whose
// acquire call is on its way gets it when the call returns (within
// CallTimeout), and Close also waits for a request's probe of a Redis
// marked down, if one is in flight (at most 20 ms).
func (b *Backend) Close() error {
	if b.sh != nil {
		return b.sh.close()
	}
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
	b.stopCancel()  // an acquire call in flight: its request is answered
	b.probes.Wait() // none starts once closed is set
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
		// The leave call (bye): at once if Redis answers; else, with
		// releases pending, the maintainer tries again in the background
		// until it does or LeaseTTL has passed, and Drain waits for it.
		b.awaitLeave()
	}
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

// wake nudges the maintainer without blocking.
func (b *Backend) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}
