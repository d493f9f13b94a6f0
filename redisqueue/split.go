package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// split is a Name split into parts (Options.Shares.Parts): this replica runs in
// Shares mode on its part's keys, and takes its turn, now and then, at
// moving the limit between the parts.
type split struct {
	b     *Backend
	parts int
	part  int
	// root is the key count and keys of the Name's own data (script_split.go).
	root []any
	// total is the Name's limit, as the last rebalance or SetLimit saw it.
	total atomic.Int64
	// replicas is the Name's replicas in all parts, as the last rebalance
	// counted them and this replica last heard (0: not counted yet).
	replicas atomic.Int64
	joined   atomic.Bool
	done     chan struct{}
	// prefixes are every part's key prefix, made at the first rebalance.
	prefixes     []string
	prefixesOnce sync.Once
}

// partOf is the part a replica's id falls in.
func partOf(replica string, parts int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(replica))
	return int(h.Sum32() % uint32(parts))
}

// partPrefix is the prefix of part p's keys. Its hash tag falls in the
// middle half of the p-th of Parts equal ranges of a Cluster's 16,384
// slots: on a Cluster whose shards hold equal ranges in order, as
// redis-cli --cluster create makes them, the parts spread evenly over the
// shards, whichever way the ranges were rounded.
func partPrefix(o settings, p int) string {
	lo, hi := p*clusterSlots/o.Parts, (p+1)*clusterSlots/o.Parts
	lo, hi = lo+(hi-lo)/4, hi-(hi-lo)/4
	base := o.Name + ":" + strconv.Itoa(p) + ":"
	tag := base + "0"
	for k := 0; k < 1<<20; k++ {
		t := base + strconv.Itoa(k)
		if s := int(crc16([]byte(t)) % clusterSlots); s >= lo && s < hi {
			tag = t
			break
		}
	}
	return o.KeyPrefix + ":{" + tag + "}:"
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// crc16 is the CRC16 (XMODEM) that Redis Cluster hashes keys with.
func crc16(b []byte) uint16 {
	var c uint16
	for _, x := range b {
		c ^= uint16(x) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
	}
	return c
}

// newSplit builds the state of a split Name for b, whose keys are its part's.
func newSplit(b *Backend) *split {
	o := b.opts
	sp := &split{b: b, parts: o.Parts, part: partOf(b.replica, o.Parts), done: make(chan struct{})}
	prefix := o.KeyPrefix + ":{" + o.Name + "}:"
	sp.root = []any{numSplitKeys, prefix + "pl", prefix + "r", prefix + "d"}
	return sp
}

// declared is the MaxConcurrent this replica declared.
func (sp *split) declared() int {
	sp.b.mu.Lock()
	defer sp.b.mu.Unlock()
	return sp.b.limits.MaxConcurrent
}

// callRoot runs splitScript on the Name's own keys.
func (sp *split) callRoot(ctx context.Context, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, sp.b.opts.CallTimeout)
	defer cancel()
	return evalScript(ctx, sp.b.rdb, splitScript, sp.root, nil, args)
}

// callPart runs sharesScript on part p's keys. Calls to other parts do not
// count for or against this replica's health: on a Cluster they go to
// other shards.
func (sp *split) callPart(ctx context.Context, p int, args ...any) (any, error) {
	o := sp.b.opts
	sp.prefixesOnce.Do(func() {
		sp.prefixes = make([]string, sp.parts)
		for q := range sp.prefixes {
			sp.prefixes[q] = partPrefix(o, q)
		}
	})
	prefix := sp.prefixes[p]
	keys := make([]any, 0, 1+numShareKeys)
	keys = append(keys, numShareKeys)
	for _, k := range shareKeyNames(sp.b.replica) {
		keys = append(keys, prefix+k)
	}
	base := []any{0, o.LeaseTTL.Milliseconds(), prefix + "sg:", sp.b.replica}
	ctx, cancel := context.WithTimeout(ctx, o.CallTimeout)
	defer cancel()
	return evalScript(ctx, sp.b.rdb, sharesScript, keys, base, args)
}

// join declares this replica's MaxConcurrent and parts to the Name. It
// returns an error wrapping ErrConflict if live replicas declared others,
// or run the Name in GlobalQueue mode.
func (sp *split) join(ctx context.Context) error {
	lapse := 10 * sp.period()
	res, err := sp.callRoot(ctx, "join", sp.declared(), sp.parts, lapse.Milliseconds(), sp.entry().Milliseconds())
	if err != nil {
		return err
	}
	r, ok := res.([]any)
	if ok && len(r) == 2 && r[0] == "conflict" {
		why, _ := r[1].(string)
		return &conflictError{name: sp.b.opts.Name, why: why}
	}
	if ok && len(r) == 2 {
		n, _ := r[1].(int64)
		sp.replicas.Store(n)
	}
	sp.joined.Store(true)
	return nil
}

// entry is how long the split fleet's entry in GlobalQueue's keys lasts
// after a replica renewed it: a rebalance is tried every period.
func (sp *split) entry() time.Duration { return 3*sp.period() + sp.b.opts.LeaseTTL }

// period is the time between two rebalances.
func (sp *split) period() time.Duration { return sp.b.opts.RebalancePeriod }

// run takes this replica's turns at rebalancing until the Backend stops.
func (sp *split) run() {
	defer close(sp.done)
	t := time.NewTimer(jitter(sp.period() / 4))
	defer t.Stop()
	for {
		select {
		case <-sp.b.stop:
			return
		case <-t.C:
		}
		sp.tick()
		t.Reset(jitter(sp.period()))
	}
}

// tick joins if Start could not, and rebalances if this replica's lot
// says so.
func (sp *split) tick() {
	ctx := sp.b.stopCtx
	if !sp.joined.Load() {
		if err := sp.join(ctx); err != nil {
			if errors.Is(err, ErrConflict) {
				sp.b.sh.refuse(err)
			}
			return
		}
	}
	if sp.draws() {
		_ = sp.round(ctx)
	}
}

// draws reports whether this replica tries to rebalance now: three in
// the Name's replicas as last counted, so that about three try each
// period whatever its size and however its replicas fall in the parts
// (each replica hears the count at join and at each try: one that joined
// a smaller fleet tries more often until it hears). One whose requests
// wait in a part that has no slot at all always tries.
func (sp *split) draws() bool {
	b := sp.b
	if b.limit.Load() == 0 && b.sh.fast.Counts().Queued+int(b.sh.gatedN.Load()) > 0 {
		return true
	}
	n := float64(max(sp.replicas.Load(), 1))
	return rand.Float64()*n < 3
}

// partState is a part as a rebalance reads it.
type partState struct {
	limit, held, replicas int64
	bands                 map[int64]int64 // priority band → demand (slots)
	// unsure is set while held may be undercounted: Redis lost the part's
	// data, and its replicas have not all said what they run.
	unsure bool
}

// errFenced ends a rebalance that a later one overtook.
var errFenced = errors.New("redisqueue: a later rebalance overtook this one")

// round rebalances the limit between the parts, if no replica did within
// the period. The slots the parts may hold in all, each part's limit or
// what it holds if more, never exceed the Name's limit: first every part
// is read, then the parts whose limit falls are lowered, and only then do
// the others grow, by what the lowered ones no longer hold. The rest comes
// at later rebalances, as their holders give slots back.
func (sp *split) round(ctx context.Context) error {
	g, total, last, err := sp.turn(ctx, sp.period()*9/10)
	if err != nil || g == 0 {
		return err
	}
	sp.total.Store(total)
	st, err := sp.readParts(ctx, g)
	if err != nil {
		return err
	}
	target := allot(total, st)
	if err := sp.lowerParts(ctx, g, st, target); err != nil {
		return err
	}
	if err := sp.growParts(ctx, g, st, target, last, total); err != nil {
		return err
	}
	return sp.writeBounds(ctx, st, last)
}

// readParts stamps every part with generation g and reads it.
func (sp *split) readParts(ctx context.Context, g int64) ([]partState, error) {
	st := make([]partState, sp.parts)
	for p := range st {
		var err error
		if st[p], err = sp.setPart(ctx, p, g, -1); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// partBound is what part p may hold: its limit, or what it holds if more;
// for a part whose data Redis lost, at least last[p], what it last held.
func partBound(st []partState, last []int64, p int) int64 {
	b := max(st[p].limit, st[p].held)
	if st[p].unsure {
		b = max(b, last[p])
	}
	return b
}

// lowerParts lowers to its target every part whose limit falls, and keeps
// in st what each lowered part reads. Only errFenced ends it.
func (sp *split) lowerParts(ctx context.Context, g int64, st []partState, target []int64) error {
	for p := range st {
		if target[p] < st[p].limit {
			ps, err := sp.setPart(ctx, p, g, target[p])
			switch {
			case errors.Is(err, errFenced):
				return err
			case err == nil:
				st[p] = ps
			}
			// after another error the old limit is the bound: it was higher
		}
	}
	return nil
}

// growParts grows the parts short of their target, most short first, by
// the slots of the Name's limit (total) no part may hold. Only errFenced
// ends it.
func (sp *split) growParts(ctx context.Context, g int64, st []partState, target, last []int64, total int64) error {
	slack := total
	for p := range st {
		slack -= partBound(st, last, p)
	}
	for _, p := range byShortfall(target, st) {
		add := min(target[p]-st[p].limit, slack)
		if add <= 0 || st[p].unsure {
			continue
		}
		slack -= add
		if _, err := sp.setPart(ctx, p, g, st[p].limit+add); errors.Is(err, errFenced) {
			return err
		}
		st[p].limit += add // after another error, the higher bound
	}
	return nil
}

// writeBounds counts the Name's replicas and writes what each part may
// hold now, for the next rounds: the bound of a part whose data Redis loses.
func (sp *split) writeBounds(ctx context.Context, st []partState, last []int64) error {
	var replicas int64
	for _, ps := range st {
		replicas += ps.replicas
	}
	sp.replicas.Store(replicas)
	known := make([]any, 2, 2+len(st))
	known[0], known[1] = "wrote", replicas
	for p := range st {
		k := partBound(st, last, p)
		if st[p].unsure {
			k = -1 // the last bound stays until its replicas have said
		}
		known = append(known, k)
	}
	_, err := sp.callRoot(ctx, known...)
	return err
}

// turn asks for the turn to rebalance: a generation and the Name's limit,
// or a generation of 0 when a replica rebalanced within every.
func (sp *split) turn(ctx context.Context, every time.Duration) (g, total int64, last []int64, err error) {
	res, err := sp.callRoot(ctx, "turn", sp.declared(), sp.parts, every.Milliseconds(), sp.entry().Milliseconds())
	if err != nil {
		return 0, 0, nil, err
	}
	r, ok := res.([]any)
	if !ok || len(r) == 0 {
		return 0, 0, nil, fmt.Errorf("redisqueue: unexpected reply to a rebalance turn: %v", res)
	}
	if len(r) >= 2 {
		n, _ := r[1].(int64)
		sp.replicas.Store(n)
	}
	if g, _ = r[0].(int64); g == 0 {
		return 0, 0, nil, nil
	}
	if len(r) != 3+sp.parts {
		return 0, 0, nil, fmt.Errorf("redisqueue: unexpected reply to a rebalance turn: %v", res)
	}
	total, _ = r[2].(int64)
	last = make([]int64, sp.parts)
	for p := range last {
		last[p], _ = r[3+p].(int64)
	}
	return g, total, last, nil
}

// setPart stamps part p with generation g, sets its limit to n (-1: as
// it is) and reads it.
func (sp *split) setPart(ctx context.Context, p int, g, n int64) (partState, error) {
	res, err := sp.callPart(ctx, p, "part", g, n)
	if err != nil {
		return partState{}, err
	}
	r, ok := res.([]any)
	if !ok || len(r) < 2 {
		return partState{}, fmt.Errorf("redisqueue: unexpected reply to a rebalance of part %d: %v", p, res)
	}
	v := make([]int64, len(r))
	for i := range r {
		v[i], _ = r[i].(int64)
	}
	if v[0] == -1 {
		// Start the next generation above the one seen: a Redis that lost
		// the Name's keys restarted the count.
		_, _ = sp.callRoot(ctx, "gen", v[1])
		return partState{}, errFenced
	}
	if len(v) < 5 || len(v)%2 != 1 {
		return partState{}, fmt.Errorf("redisqueue: unexpected reply to a rebalance of part %d: %v", p, res)
	}
	ps := partState{limit: v[1], held: v[2], replicas: v[3], unsure: v[4] == 1, bands: map[int64]int64{}}
	for i := 5; i+1 < len(v); i += 2 {
		ps.bands[v[i]] += v[i+1]
	}
	return ps, nil
}

// setLimit implements Backend.SetLimit for a split Name: it sets the
// Name's limit, and rebalances the parts to it at once.
func (sp *split) setLimit(n int) error {
	res, err := sp.callRoot(sp.b.stopCtx, "limit", n)
	if err != nil {
		return errorf("redisqueue: SetLimit(%d): %w: %w", n, ErrUnavailable, err)
	}
	l, ok := res.(int64)
	if !ok {
		return fmt.Errorf("redisqueue: SetLimit(%d): unexpected reply %v", n, res)
	}
	sp.total.Store(l)
	_ = sp.round(sp.b.stopCtx)
	return nil
}

// globalStats implements Backend.GlobalStats for a split Name: the sums
// over its parts, and its limit.
func (sp *split) globalStats(ctx context.Context) (GlobalStats, error) {
	var gs GlobalStats
	for p := range sp.parts {
		res, err := sp.callPart(ctx, p, "stats")
		if err != nil {
			return GlobalStats{}, err
		}
		r, ok := res.([]any)
		if !ok || len(r) != 4 {
			return GlobalStats{}, fmt.Errorf("redisqueue: unexpected reply to the stats of part %d: %v", p, res)
		}
		var v [3]int64
		for i := range v {
			v[i], _ = r[i].(int64)
		}
		gs.Running, gs.Queued, gs.Replicas = gs.Running+int(v[0]), gs.Queued+int(v[1]), gs.Replicas+int(v[2])
	}
	res, err := sp.callRoot(ctx, "total")
	if err != nil {
		return GlobalStats{}, err
	}
	l, _ := res.(int64)
	gs.Limit = int(l)
	return gs, nil
}
