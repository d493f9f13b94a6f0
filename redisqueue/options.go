package redisqueue

import (
	"fmt"
	"strings"
	"time"
)

// Policy is what a Backend does while it cannot reach Redis: from when
// Options.FailureThreshold calls in a row failed or took longer than
// Options.CallTimeout (Redis is then marked down) until a probe gets an
// answer.
type Policy uint8

const (
	// FailOpen keeps admitting while Redis is marked down. In Shares mode a
	// replica admits within the share it holds until the lease on it runs
	// out, then answers as under FailClosed. In GlobalQueue mode it admits
	// within an allowance of slots (Options.GlobalQueue.LocalLimit, or a
	// part of the fleet's limit such that the replicas' allowances add up
	// to at most the limit). docs/fleet.md says how. It is the zero value
	// and the default.
	FailOpen Policy = iota

	// FailClosed stops admitting when Redis cannot be reached: requests get
	// an error that wraps ErrUnavailable and backend.ErrQueueFull (the
	// Queue answers 503 with Retry-After) until Redis answers again. In
	// Shares mode a replica first goes on admitting within its share, and
	// stops a tenth of a lease before the lease on it runs out, so that the
	// requests running then can end before Redis gives their slots to
	// others. In GlobalQueue mode a request that cannot reach Redis gets the
	// error at once.
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

// Mode is how the replicas of a Name share its limit. docs/fleet.md says
// when to pick which.
type Mode uint8

const (
	// Shares splits the limit into shares that replicas lease from Redis:
	// each admits and queues in memory, within its share, with every
	// feature of the in-memory Backend, and Redis moves the shares toward
	// the replicas whose requests wait. It is the zero value and the
	// default.
	Shares Mode = iota

	// GlobalQueue keeps the slots and one queue for the whole fleet in
	// Redis: one order across replicas, at the cost of a Redis round trip
	// or more per request.
	GlobalQueue
)

// String returns "shares" or "global-queue".
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
	// DefaultLeaseTTL is the default Options.LeaseTTL.
	DefaultLeaseTTL = 15 * time.Second
	// DefaultCallTimeout is the default Options.CallTimeout.
	DefaultCallTimeout = 150 * time.Millisecond
	// DefaultTickInterval is the default Options.GlobalQueue.TickInterval
	// (LeaseTTL/3 if that is shorter).
	DefaultTickInterval = 500 * time.Millisecond
	// DefaultSharePeriod is the default Options.Shares.Period (LeaseTTL/4
	// if that is shorter).
	DefaultSharePeriod = 50 * time.Millisecond
	// DefaultRebalancePeriod is the default Options.Shares.RebalancePeriod
	// (at least 4 × Shares.Period, at most LeaseTTL).
	DefaultRebalancePeriod = time.Second

	// DefaultFailureThreshold is the default Options.FailureThreshold.
	DefaultFailureThreshold = 3
)

// Options configure a Backend. Only Name is required; a zero field takes
// the default its comment names. New copies them. docs/fleet.md describes
// each option at length.
type Options struct {
	// Name identifies the shared limit: every replica that uses the same
	// Redis and Name shares one limit. It is required and must not contain
	// '{', '}' or ':'.
	Name string

	// KeyPrefix starts every Redis key. Empty means "ginqueue". It must not
	// contain '{' or '}'.
	KeyPrefix string

	// Mode is Shares (the zero value) or GlobalQueue. Every replica of a
	// Name must use the same Mode and the same Parts: Start refuses
	// otherwise (ErrConflict).
	Mode Mode

	// Shares tunes Shares mode; it must be zero in GlobalQueue mode.
	Shares SharesOptions

	// GlobalQueue tunes GlobalQueue mode; it must be zero in Shares mode.
	GlobalQueue GlobalQueueOptions

	// LeaseTTL is how long what Redis gave a replica stays its own without
	// a renewal. In Shares mode it is the lease on the replica's share,
	// renewed by each sync: a replica that cannot reach Redis admits within
	// its share until the lease runs out (see OnRedisDown), and the share of
	// a replica that died or was cut off goes back to the others once its
	// lease runs out in Redis. In GlobalQueue mode it is the lease on each
	// slot granted, renewed every tick; a dead replica's slots usually come
	// back sooner, once its heartbeat runs out (see
	// GlobalQueueOptions.TickInterval). The keys of a Name outlive its last
	// replica by 10 × LeaseTTL. Zero means DefaultLeaseTTL (15 s). It must
	// be at least 4 × CallTimeout and 100 ms.
	LeaseTTL time.Duration

	// CallTimeout bounds every Redis call. A call that fails or takes
	// longer counts as a failure. Zero means DefaultCallTimeout (150 ms).
	CallTimeout time.Duration

	// FailureThreshold is how many failed calls in a row, with no call
	// succeeding between them, mark Redis down for this replica until a
	// probe answers. Zero means DefaultFailureThreshold (3). Times
	// CallTimeout, it must stay below LeaseTTL.
	FailureThreshold int

	// OnRedisDown is what a replica does while Redis is marked down. The
	// zero value is FailOpen.
	OnRedisDown Policy

	// OnStateChange, when set, is called each time this replica marks Redis
	// down (with the error of the call that tipped it) and each time it
	// finds Redis answering again (down false, err nil), in order. It runs
	// on the goroutine that saw the change and must return quickly without
	// calling the Backend.
	OnStateChange func(down bool, err error)
}

// SharesOptions tune Shares mode. The zero value is the default.
type SharesOptions struct {
	// Period is how quickly shares follow demand: a replica renews its
	// lease every Period in a small fleet (less often in a large one, and
	// at least four times per LeaseTTL), and one whose requests start to
	// wait syncs at once, at most every Period/8. Zero means
	// DefaultSharePeriod (50 ms), or LeaseTTL/4 if shorter. It must be at
	// least 5 ms and at most LeaseTTL/4.
	Period time.Duration

	// Parts splits the Name into this many parts, each a Shares fleet with
	// its own keys and a part of the limit, so that more replicas share one
	// limit than one Redis can coordinate. Zero or 1 means one part. At
	// most MaxParts.
	Parts int

	// RebalancePeriod is, with Parts above 1, how often the limit moves
	// between the parts by their demand. Zero means DefaultRebalancePeriod
	// (1 s, or 4 × Period if longer, LeaseTTL if shorter). It must be at
	// least 4 × Period and at most LeaseTTL.
	RebalancePeriod time.Duration
}

// GlobalQueueOptions tune GlobalQueue mode. The zero value is the default.
type GlobalQueueOptions struct {
	// TickInterval is the period of every replica's heartbeat, which
	// refreshes its slots and queue places in Redis; a replica silent for
	// 3 ticks (at least a tick and 4 × CallTimeout, at most LeaseTTL) while
	// the others go on is taken for dead. Zero means
	// DefaultTickInterval (500 ms), or LeaseTTL/3 if shorter. It must be
	// at least 10 ms and at most LeaseTTL/3.
	TickInterval time.Duration

	// LocalLimit replaces the FailOpen allowance, worked out from the
	// fleet's limit, with a fixed number of slots. Zero means the worked
	// out allowance, which keeps the fleet's limit.
	LocalLimit int

	// LocalQueue replaces the FailOpen local queue bound. Zero means
	// MaxQueue divided by the live replicas seen at the first outage,
	// rounded up.
	LocalQueue int
}

// settings are Options flattened, with defaults filled in: what the
// Backend runs with.
type settings struct {
	Name, KeyPrefix       string
	Mode                  Mode
	LeaseTTL, CallTimeout time.Duration
	FailureThreshold      int
	OnRedisDown           Policy
	OnStateChange         func(down bool, err error)
	SharePeriod           time.Duration // Shares.Period
	Parts                 int
	RebalancePeriod       time.Duration
	TickInterval          time.Duration // GlobalQueue.TickInterval; in Shares mode its default, which bounds the reader's pause between dials
	LocalLimit            int
	LocalQueue            int
}

// flat returns o as settings, before defaults and checks.
func (o Options) flat() settings {
	return settings{Name: o.Name, KeyPrefix: o.KeyPrefix, Mode: o.Mode, LeaseTTL: o.LeaseTTL, CallTimeout: o.CallTimeout,
		FailureThreshold: o.FailureThreshold, OnRedisDown: o.OnRedisDown, OnStateChange: o.OnStateChange,
		SharePeriod: o.Shares.Period, Parts: o.Shares.Parts, RebalancePeriod: o.Shares.RebalancePeriod,
		TickInterval: o.GlobalQueue.TickInterval, LocalLimit: o.GlobalQueue.LocalLimit, LocalQueue: o.GlobalQueue.LocalQueue}
}

// compile checks o and returns its settings with defaults filled in.
func (o Options) compile() (settings, error) {
	switch {
	case o.Mode == Shares && o.GlobalQueue != (GlobalQueueOptions{}):
		return o.flat(), fmt.Errorf("redisqueue: Options.GlobalQueue is for GlobalQueue mode; leave it zero in Shares mode, got %+v", o.GlobalQueue)
	case o.Mode == GlobalQueue && o.Shares != (SharesOptions{}):
		return o.flat(), fmt.Errorf("redisqueue: Options.Shares is for Shares mode; leave it zero in GlobalQueue mode, got %+v", o.Shares)
	}
	return o.flat().compile()
}

// minSharePeriod is the shortest SharePeriod.
const minSharePeriod = 5 * time.Millisecond

// minTick is the shortest TickInterval.
const minTick = 10 * time.Millisecond

// liveTTL is the liveness lease: how long a replica's heartbeat and its
// queue places last in Redis without a sync. Every replica syncs every
// TickInterval, so it is three of them, but at least a tick and four call
// timeouts (a slow sync still lands in time), and at most LeaseTTL.
func (o settings) liveTTL() time.Duration {
	return min(o.LeaseTTL, max(3*o.TickInterval, o.TickInterval+4*o.CallTimeout))
}

// compile checks o and returns a copy with defaults filled in.
func (o settings) compile() (settings, error) {
	if err := o.checkName(); err != nil {
		return o, err
	}
	if err := o.checkRanges(); err != nil {
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
func (o settings) checkName() error {
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
func (o settings) checkRanges() error {
	switch {
	case o.LeaseTTL < 0:
		return fmt.Errorf("redisqueue: Options.LeaseTTL must not be negative, got %v", o.LeaseTTL)
	case o.CallTimeout < 0:
		return fmt.Errorf("redisqueue: Options.CallTimeout must not be negative, got %v", o.CallTimeout)
	case o.TickInterval < 0:
		return fmt.Errorf("redisqueue: Options.GlobalQueue.TickInterval must not be negative, got %v", o.TickInterval)
	case o.OnRedisDown > FailClosed:
		return fmt.Errorf("redisqueue: Options.OnRedisDown must be FailOpen or FailClosed, got %v", o.OnRedisDown)
	case o.LocalLimit < 0:
		return fmt.Errorf("redisqueue: Options.GlobalQueue.LocalLimit must not be negative, got %d", o.LocalLimit)
	case o.FailureThreshold < 0:
		return fmt.Errorf("redisqueue: Options.FailureThreshold must not be negative, got %d", o.FailureThreshold)
	case o.LocalQueue < 0:
		return fmt.Errorf("redisqueue: Options.GlobalQueue.LocalQueue must not be negative, got %d", o.LocalQueue)
	case o.Mode > GlobalQueue:
		return fmt.Errorf("redisqueue: Options.Mode must be Shares or GlobalQueue, got %v", o.Mode)
	case o.SharePeriod < 0:
		return fmt.Errorf("redisqueue: Options.Shares.Period must not be negative, got %v", o.SharePeriod)
	}
	return nil
}

// withDefaults returns o with its zero fields set to their defaults, all
// but RebalancePeriod, which waits until Parts is checked.
func (o settings) withDefaults() settings {
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
func (o settings) checkTimings() error {
	switch {
	case o.Mode == Shares && o.SharePeriod < minSharePeriod:
		return fmt.Errorf("redisqueue: Options.Shares.Period %v must be at least %v", o.SharePeriod, minSharePeriod)
	case o.Mode == Shares && o.SharePeriod > o.LeaseTTL/4:
		return fmt.Errorf("redisqueue: Options.Shares.Period %v must not exceed Options.LeaseTTL/4 (%v)", o.SharePeriod, o.LeaseTTL/4)
	case o.LeaseTTL < 4*o.CallTimeout:
		return fmt.Errorf("redisqueue: Options.LeaseTTL %v must be at least 4 × Options.CallTimeout (%v)", o.LeaseTTL, o.CallTimeout)
	case o.LeaseTTL < 100*time.Millisecond:
		return fmt.Errorf("redisqueue: Options.LeaseTTL %v must be at least 100ms", o.LeaseTTL)
	case o.TickInterval < minTick:
		return fmt.Errorf("redisqueue: Options.GlobalQueue.TickInterval %v must be at least %v: every replica syncs with Redis each tick", o.TickInterval, minTick)
	case o.TickInterval > o.LeaseTTL/3:
		return fmt.Errorf("redisqueue: Options.GlobalQueue.TickInterval %v must not exceed Options.LeaseTTL/3 (%v)", o.TickInterval, o.LeaseTTL/3)
	case time.Duration(o.FailureThreshold) >= (o.LeaseTTL+o.CallTimeout-1)/o.CallTimeout:
		// FailureThreshold calls that each wait CallTimeout must mark Redis
		// down before the lease runs out, so that the replica applies
		// OnRedisDown while its lease still holds.
		return fmt.Errorf("redisqueue: Options.FailureThreshold × Options.CallTimeout (%d × %v = %v) must be below Options.LeaseTTL (%v)",
			o.FailureThreshold, o.CallTimeout, time.Duration(o.FailureThreshold)*o.CallTimeout, o.LeaseTTL)
	}
	return nil
}

// MaxParts is the most parts Options.Shares.Parts may split a Name into: a
// rebalance calls each part up to three times, one after another.
const MaxParts = 64

// checkParts checks Parts and RebalancePeriod, once SharePeriod has its
// default.
func (o settings) checkParts() error {
	switch {
	case o.Parts < 0 || o.Parts > MaxParts:
		return fmt.Errorf("redisqueue: Options.Shares.Parts must be between 0 and %d, got %d", MaxParts, o.Parts)
	case o.RebalancePeriod < 0:
		return fmt.Errorf("redisqueue: Options.Shares.RebalancePeriod must not be negative, got %v", o.RebalancePeriod)
	case o.RebalancePeriod > 0 && o.Parts <= 1:
		return fmt.Errorf("redisqueue: Options.Shares.RebalancePeriod is for a Name split into Parts, got %v with Parts %d", o.RebalancePeriod, o.Parts)
	case o.RebalancePeriod > 0 && o.RebalancePeriod < 4*o.SharePeriod:
		return fmt.Errorf("redisqueue: Options.Shares.RebalancePeriod %v must be at least 4 × Options.Shares.Period (%v)", o.RebalancePeriod, 4*o.SharePeriod)
	case o.RebalancePeriod > o.LeaseTTL:
		return fmt.Errorf("redisqueue: Options.Shares.RebalancePeriod %v must not exceed Options.LeaseTTL (%v)", o.RebalancePeriod, o.LeaseTTL)
	}
	return nil
}
