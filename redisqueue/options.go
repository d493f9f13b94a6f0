package redisqueue

import (
	"fmt"
	"strings"
	"time"
)

// Policy is what a Backend does while Redis cannot be reached: when a call
// fails or takes longer than Options.CallTimeout, and until a probe answers
// again.
type Policy uint8

const (
	// FailOpen admits requests inside this process while Redis is marked
	// down, within an allowance of slots: Options.LocalLimit, or when that
	// is zero a part of the fleet's limit worked out from what Redis last
	// told this replica, so that the allowances of the fleet add up to at
	// most its limit (the README's "When Redis is slow, paused or down"
	// says how). Requests still running on slots granted by Redis count
	// against it. A replica with no allowance, and a request whose cost
	// exceeds it, is answered as under FailClosed. It is the zero value and
	// the default.
	FailOpen Policy = iota

	// FailClosed answers every request that needs Redis with an error that
	// wraps ErrUnavailable and backend.ErrQueueFull, so the Queue answers
	// 503 with Retry-After, until Redis answers again.
	FailClosed
)

// String returns "fail-open" or "fail-closed".
func (p Policy) String() string {
	switch p {
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// Mode is how the replicas of a Name share its limit.
type Mode uint8

const (
	// GlobalQueue keeps the slots and one queue for the whole fleet in
	// Redis: one order across replicas (FIFO within a priority, evictions
	// fleet-wide), a Redis round trip or more per request. It is the zero
	// value and the default.
	GlobalQueue Mode = iota

	// Shares splits the limit into shares that replicas lease from Redis:
	// each admits and queues on its own, in memory, within the share it
	// holds, with every feature of the in-memory Backend; Redis only moves
	// shares, toward the replicas whose requests wait (higher priorities
	// first, wherever they wait), as demand moves. The slots held across the fleet
	// never exceed the limit. The README's "Leased shares" says how, and
	// what it costs.
	Shares
)

// String returns "global-queue" or "shares".
func (m Mode) String() string {
	switch m {
	case GlobalQueue:
		return "global-queue"
	case Shares:
		return "shares"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Defaults used for zero Options fields.
const (
	DefaultLeaseTTL     = 15 * time.Second
	DefaultCallTimeout  = 150 * time.Millisecond
	DefaultTickInterval = 500 * time.Millisecond
	DefaultSharePeriod  = 50 * time.Millisecond
	// DefaultRebalancePeriod is the default Options.RebalancePeriod.
	DefaultRebalancePeriod = time.Second

	DefaultFailureThreshold = 3
)

// Options configure a Backend. Only Name is required; every other zero field
// takes the default its comment names. Options are copied by New: changing
// them afterwards has no effect.
type Options struct {
	// Name identifies the shared limit: every replica that uses the same
	// Redis and the same Name shares one MaxConcurrent, one MaxQueue and one
	// order. It is required, and must not contain '{', '}' or ':' (it
	// becomes the hash tag of every key, so all keys live in one Redis
	// Cluster slot).
	Name string

	// KeyPrefix starts every Redis key. Empty means "ginqueue". It must not
	// contain '{' or '}'.
	KeyPrefix string

	// LeaseTTL is how long a slot stays held in Redis for a request whose
	// replica can no longer refresh it while the fleet cannot tell whether
	// that replica is dead (Redis itself was unreachable); it also bounds
	// how long the keys of a Name outlive its last replica (10 lease TTLs).
	// A replica that stops syncing while others go on is taken for dead
	// sooner: its slots and queue places go back to the fleet within the
	// liveness lease (3 × TickInterval, see TickInterval) and a tick. Zero
	// means DefaultLeaseTTL (15 s). It must be at least 4 call timeouts.
	LeaseTTL time.Duration

	// CallTimeout bounds every Redis call that a request waits for. A call
	// that fails or takes longer counts as a failure: the request that made
	// it gets OnRedisDown at once, a release or cancel is retried in the
	// background, and FailureThreshold failures in a row mark Redis down for
	// the whole replica. Zero means DefaultCallTimeout (150 ms). Negative is
	// refused.
	CallTimeout time.Duration

	// FailureThreshold is how many calls in a row must fail, with no call
	// succeeding between them, before this replica marks Redis down and
	// turns every request to OnRedisDown until a probe answers; calls that
	// were in flight together when one failed count as that one failure
	// (the README's "When Redis is slow, paused or down" says why). The
	// request whose call failed gets OnRedisDown either way. Zero means
	// DefaultFailureThreshold (3); 1 marks Redis down at the first failure.
	// Negative is refused, and so is a FailureThreshold × CallTimeout of
	// LeaseTTL or more: the replica must find Redis down within its lease. A Redis that does not answer at Start is marked
	// down at once.
	FailureThreshold int

	// TickInterval is the period of the heartbeat: every replica syncs
	// with Redis this often, refreshing its slots and queue places and
	// catching a lost grant notice (grants arrive by push, not by this
	// tick). A replica whose heartbeat is missing for the liveness lease (3
	// ticks, but at least a tick and 4 call timeouts, at most LeaseTTL; 1.5
	// s with the defaults) while the others' go on is taken for dead (the
	// README's "How the global queue works" says what then). While Redis
	// is marked down, this replica probes it every 20 ms (or every tick if
	// shorter), and at once when a request arrives (one such probe at a
	// time, given at most 20 ms, or CallTimeout if shorter): the first
	// request after Redis answers again goes to Redis within a few tens of
	// milliseconds, not a tick. Zero means DefaultTickInterval (500 ms), or
	// LeaseTTL/3 if that is shorter. It must be at least 10 ms and at most
	// LeaseTTL/3. In Shares mode SharePeriod paces the syncs instead.
	TickInterval time.Duration

	// OnRedisDown is the policy while Redis cannot be reached. The zero
	// value is FailOpen.
	OnRedisDown Policy

	// LocalLimit overrides the FailOpen allowance with a fixed number of
	// slots (requests running on slots from Redis count against it). Zero
	// means the allowance FailOpen describes, which keeps the fleet's limit;
	// a fixed one does not. Negative is refused. Ignored with FailClosed.
	LocalLimit int

	// LocalQueue overrides the FailOpen local queue bound. Zero means
	// MaxQueue divided by the live replicas seen at the first outage,
	// rounded up. Negative is refused. Ignored with FailClosed.
	LocalQueue int

	// Mode is how the replicas share the limit: GlobalQueue (the zero
	// value) or Shares. Every replica of a Name must use the same Mode: a
	// replica refuses to Start (ErrConflict) while replicas of the other
	// mode are live.
	Mode Mode

	// SharePeriod is, in Shares mode, how quickly shares follow demand. A
	// replica whose share matches its demand renews its lease every
	// SharePeriod in a small fleet, 4 ms per replica in a large one, and at
	// most LeaseTTL/4 apart (with jitter); one whose requests start to wait
	// while slots may be free, or whose demand grows by a quarter, syncs at
	// once, but at most every SharePeriod/8, and one whose demand stays a
	// quarter lower for a SharePeriod syncs then; Redis tells the
	// replicas a move concerns. A replica told that a slot is free for it
	// must claim it within 4 × SharePeriod (and at least 2 × CallTimeout), or
	// the next replica waiting gets it. Zero means DefaultSharePeriod (50
	// ms). It must be at least 5 ms and at most LeaseTTL/4. Ignored in
	// GlobalQueue mode.
	SharePeriod time.Duration

	// Parts splits the Name, in Shares mode, into this many parts, so that
	// more replicas share one limit than one Redis can coordinate. Each part
	// is a Shares fleet of its own, with its own keys (on a Redis Cluster,
	// each part's keys hash to a slot of their own, so the parts spread over
	// the shards) and a part of the limit. A replica joins the part its
	// random id falls in. Every RebalancePeriod one replica moves the limit
	// between the parts by their demand, the highest priority first, and
	// the slots the parts may hold in all never exceed the Name's limit.
	// Zero or 1 means one part (no split). Every replica of a Name must use
	// the same Parts (Start refuses otherwise, ErrConflict). Negative, above
	// MaxParts, or above 1 in GlobalQueue mode is refused.
	Parts int

	// RebalancePeriod is, with Parts above 1, how often the limit moves
	// between the parts. Demand that moves from one part to another is
	// followed within a few periods. Zero means DefaultRebalancePeriod (1
	// s, or 4 × SharePeriod if longer, LeaseTTL if shorter). It must be at
	// least 4 × SharePeriod and at most LeaseTTL.
	RebalancePeriod time.Duration

	// OnStateChange, when set, is called each time this replica marks Redis
	// down (down true, with the error of the call that tipped it) and each
	// time it finds Redis answering again (down false, err nil), in the
	// order of the changes. It runs on the goroutine that saw the change (a
	// request's or the Backend's own) and must return quickly without
	// calling the Backend. Nil: nothing is called. Stats reports the same
	// (ginqueue.BackendStats.Unavailable and Outages).
	OnStateChange func(down bool, err error)
}

// minSharePeriod is the shortest SharePeriod.
const minSharePeriod = 5 * time.Millisecond

// minTick is the shortest TickInterval.
const minTick = 10 * time.Millisecond

// liveTTL is the liveness lease: how long a replica's heartbeat and its
// queue places last in Redis without a sync. Every replica syncs every
// TickInterval, so it is three of them, but at least a tick and four call
// timeouts (a slow sync still lands in time), and at most LeaseTTL.
func (o Options) liveTTL() time.Duration {
	return min(o.LeaseTTL, max(3*o.TickInterval, o.TickInterval+4*o.CallTimeout))
}

// compile checks o and returns a copy with defaults filled in.
func (o Options) compile() (Options, error) {
	if err := o.checkName(); err != nil {
		return o, err
	}
	if err := o.checkRanges(); err != nil {
		return o, err
	}
	if err := o.checkModeFields(); err != nil {
		return o, err
	}
	o = o.withDefaults()
	if err := o.checkParts(); err != nil {
		return o, err
	}
	if o.Parts > 1 && o.RebalancePeriod == 0 {
		o.RebalancePeriod = max(min(DefaultRebalancePeriod, o.LeaseTTL), 4*o.SharePeriod)
	}
	if err := o.checkTimings(); err != nil {
		return o, err
	}
	return o, nil
}

// checkName checks Name and KeyPrefix, which make up every Redis key.
func (o Options) checkName() error {
	switch {
	case o.Name == "":
		return fmt.Errorf("redisqueue: Options.Name is required")
	case strings.ContainsAny(o.Name, "{}:"):
		return fmt.Errorf("redisqueue: Options.Name %q must not contain '{', '}' or ':'", o.Name)
	case strings.ContainsAny(o.KeyPrefix, "{}"):
		return fmt.Errorf("redisqueue: Options.KeyPrefix %q must not contain '{' or '}'", o.KeyPrefix)
	}
	return nil
}

// checkRanges refuses negative numbers and durations, and a Policy or Mode
// that does not exist.
func (o Options) checkRanges() error {
	switch {
	case o.LeaseTTL < 0:
		return fmt.Errorf("redisqueue: Options.LeaseTTL must not be negative, got %v", o.LeaseTTL)
	case o.CallTimeout < 0:
		return fmt.Errorf("redisqueue: Options.CallTimeout must not be negative, got %v", o.CallTimeout)
	case o.TickInterval < 0:
		return fmt.Errorf("redisqueue: Options.TickInterval must not be negative, got %v", o.TickInterval)
	case o.OnRedisDown > FailClosed:
		return fmt.Errorf("redisqueue: Options.OnRedisDown must be FailOpen or FailClosed, got %v", o.OnRedisDown)
	case o.LocalLimit < 0:
		return fmt.Errorf("redisqueue: Options.LocalLimit must not be negative, got %d", o.LocalLimit)
	case o.FailureThreshold < 0:
		return fmt.Errorf("redisqueue: Options.FailureThreshold must not be negative, got %d", o.FailureThreshold)
	case o.LocalQueue < 0:
		return fmt.Errorf("redisqueue: Options.LocalQueue must not be negative, got %d", o.LocalQueue)
	case o.Mode > Shares:
		return fmt.Errorf("redisqueue: Options.Mode must be GlobalQueue or Shares, got %v", o.Mode)
	case o.SharePeriod < 0:
		return fmt.Errorf("redisqueue: Options.SharePeriod must not be negative, got %v", o.SharePeriod)
	}
	return nil
}

// checkModeFields refuses LocalLimit and LocalQueue in Shares mode, where
// they have no use.
func (o Options) checkModeFields() error {
	switch {
	case o.Mode == Shares && o.LocalLimit != 0:
		return fmt.Errorf("redisqueue: Options.LocalLimit is for GlobalQueue mode; in Shares mode FailOpen keeps the share a replica holds, got %d", o.LocalLimit)
	case o.Mode == Shares && o.LocalQueue != 0:
		return fmt.Errorf("redisqueue: Options.LocalQueue is for GlobalQueue mode; in Shares mode every replica queues locally up to MaxQueue, got %d", o.LocalQueue)
	}
	return nil
}

// withDefaults returns o with its zero fields set to their defaults, all
// but RebalancePeriod, which waits until Parts is checked.
func (o Options) withDefaults() Options {
	if o.KeyPrefix == "" {
		o.KeyPrefix = "ginqueue"
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.FailureThreshold == 0 {
		o.FailureThreshold = DefaultFailureThreshold
	}
	if o.TickInterval == 0 {
		o.TickInterval = min(DefaultTickInterval, o.LeaseTTL/3)
	}
	if o.SharePeriod == 0 {
		o.SharePeriod = min(DefaultSharePeriod, o.LeaseTTL/4)
	}
	return o
}

// checkTimings checks the durations against each other, once every default
// is filled in.
func (o Options) checkTimings() error {
	switch {
	case o.Mode == Shares && o.SharePeriod < minSharePeriod:
		return fmt.Errorf("redisqueue: Options.SharePeriod %v must be at least %v", o.SharePeriod, minSharePeriod)
	case o.Mode == Shares && o.SharePeriod > o.LeaseTTL/4:
		return fmt.Errorf("redisqueue: Options.SharePeriod %v must not exceed Options.LeaseTTL/4 (%v)", o.SharePeriod, o.LeaseTTL/4)
	case o.LeaseTTL < 4*o.CallTimeout:
		return fmt.Errorf("redisqueue: Options.LeaseTTL %v must be at least 4 × Options.CallTimeout (%v)", o.LeaseTTL, o.CallTimeout)
	case o.LeaseTTL < 100*time.Millisecond:
		return fmt.Errorf("redisqueue: Options.LeaseTTL %v must be at least 100ms", o.LeaseTTL)
	case o.TickInterval < minTick:
		return fmt.Errorf("redisqueue: Options.TickInterval %v must be at least %v: every replica syncs with Redis each tick", o.TickInterval, minTick)
	case o.TickInterval > o.LeaseTTL/3:
		return fmt.Errorf("redisqueue: Options.TickInterval %v must not exceed Options.LeaseTTL/3 (%v)", o.TickInterval, o.LeaseTTL/3)
	case time.Duration(o.FailureThreshold) >= (o.LeaseTTL+o.CallTimeout-1)/o.CallTimeout:
		// FailureThreshold calls that each wait CallTimeout must mark Redis
		// down before the lease runs out, so that the replica applies
		// OnRedisDown while its lease still holds.
		return fmt.Errorf("redisqueue: Options.FailureThreshold × Options.CallTimeout (%d × %v = %v) must be below Options.LeaseTTL (%v)",
			o.FailureThreshold, o.CallTimeout, time.Duration(o.FailureThreshold)*o.CallTimeout, o.LeaseTTL)
	}
	return nil
}

// MaxParts is the most parts Options.Parts may split a Name into: a
// rebalance calls each part up to three times, one after another.
const MaxParts = 64

// checkParts checks Parts and RebalancePeriod, once SharePeriod has its
// default.
func (o Options) checkParts() error {
	switch {
	case o.Parts < 0 || o.Parts > MaxParts:
		return fmt.Errorf("redisqueue: Options.Parts must be between 0 and %d, got %d", MaxParts, o.Parts)
	case o.Parts > 1 && o.Mode != Shares:
		return fmt.Errorf("redisqueue: Options.Parts is for Shares mode, got %d in %v mode", o.Parts, o.Mode)
	case o.RebalancePeriod < 0:
		return fmt.Errorf("redisqueue: Options.RebalancePeriod must not be negative, got %v", o.RebalancePeriod)
	case o.RebalancePeriod > 0 && o.Parts <= 1:
		return fmt.Errorf("redisqueue: Options.RebalancePeriod is for a Name split into Parts, got %v with Parts %d", o.RebalancePeriod, o.Parts)
	case o.RebalancePeriod > 0 && o.RebalancePeriod < 4*o.SharePeriod:
		return fmt.Errorf("redisqueue: Options.RebalancePeriod %v must be at least 4 × Options.SharePeriod (%v)", o.RebalancePeriod, 4*o.SharePeriod)
	case o.RebalancePeriod > o.LeaseTTL:
		return fmt.Errorf("redisqueue: Options.RebalancePeriod %v must not exceed Options.LeaseTTL (%v)", o.RebalancePeriod, o.LeaseTTL)
	}
	return nil
}
