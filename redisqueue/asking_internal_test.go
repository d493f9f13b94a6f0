package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// While band 5 takes turns, a replica of band 5 that waits for its turn,
// with no slot free, asks a holder that holds more than its share to give
// one back. M holds 2 slots for a demand of 1 in band 9 and 1 in band 3:
// its share is 1 (band 3 gets nothing while band 5 is short), so it holds
// one beyond it and may be asked. Nine replicas of band 3 alone hold a slot
// each: turns, never asked. M, with the most slots for its demand, comes
// first among the holders of band 3 and is asked; an order that put the
// nine first (their demand is all in one band) filled the nine places the
// sync looks at, and M was never reached.
func TestATurnWaiterAsksTheHolderAboveItsShare(t *testing.T) {
	const limit = 11
	rdb, rs := rawFleet(t, 1+9+11, limit)
	ctx := context.Background()
	m, singles, waiters := rs[0], rs[1:10], rs[10:]
	c := waiters[0]
	// Set up with a limit of 0, so that no sync is granted anything: each
	// keeps what it reports.
	if _, err := m.b.call(sharesScript, "limit", 0); err != nil {
		t.Fatal(err)
	}
	m.syncBands(2, 2, "9:1,3:1")
	for _, s := range singles {
		s.syncBands(1, 2, "3:2")
	}
	for _, w := range waiters[1:] {
		w.syncBands(0, 1, "5:1")
	}
	if _, err := m.b.call(sharesScript, "limit", limit); err != nil {
		t.Fatal(err)
	}
	checkInvariant(t, rdb, m, "set up")
	if h, _ := rdb.HGet(ctx, m.b.keys[skSM], "H").Int64(); h != limit {
		t.Fatalf("the fleet holds %d slots, want %d", h, limit)
	}
	m.syncBands(2, 2, "9:1,3:1") // M renews: no holder is asked before C syncs
	if n := rdb.ZCard(ctx, m.b.keys[skSV]).Val(); n != 0 {
		t.Fatalf("%d holders still asked before C syncs", n)
	}
	// C, of band 5, waits for a turn: no slot is free.
	rep := c.syncBands(0, 1, "5:1")
	if rep.held != 0 {
		t.Fatalf("C got %d slots with none free", rep.held)
	}
	err := rdb.ZScore(ctx, m.b.keys[skSV], m.b.replica).Err()
	if errors.Is(err, redis.Nil) {
		t.Logf("sx: %v", rdb.ZRangeWithScores(ctx, m.b.keys[skSX], 0, -1).Val())
		t.Fatal("M holds a slot beyond its share while band 5 waits for a turn and none is free, " +
			"but C's sync did not ask it to give back")
	} else if err != nil {
		t.Fatal(err)
	}
}

// A replica that went idle keeps 2 slots as room for arrivals; sixteen
// replicas run a slot each and never had a waiter (their demand is in
// noBand, as bands.report makes it). The fleet holds its whole limit, and a
// replica of band 0 waits: its sync asks the idle holder, whose share is 0,
// to give its slots back (both the loop over holders beyond their demand
// and the want loop look for it). The idle holder, with the most slots for
// its demand, comes first; an order that put the sixteen first (their
// demand is all in noBand) filled both loops' places, and the idle holder
// was never asked.
func TestAWaiterAsksTheIdleHolderPastRunningOnlyHolders(t *testing.T) {
	const running = 16
	const limit = running + 2
	rdb, rs := rawFleet(t, running+2, limit)
	ctx := context.Background()
	idle, runners, w := rs[0], rs[1:running+1], rs[running+1]
	// Set up under a limit of 0: no sync is granted anything, each keeps
	// what it reports.
	if _, err := idle.b.call(sharesScript, "limit", 0); err != nil {
		t.Fatal(err)
	}
	idle.syncBands(2, 0, "-")
	for _, r := range runners {
		r.syncBands(1, 1, strconv.Itoa(noBand)+":1")
	}
	if _, err := idle.b.call(sharesScript, "limit", limit); err != nil {
		t.Fatal(err)
	}
	checkInvariant(t, rdb, idle, "set up")
	if h, _ := rdb.HGet(ctx, idle.b.keys[skSM], "H").Int64(); h != limit {
		t.Fatalf("the fleet holds %d slots, want %d", h, limit)
	}
	// The idle replica renews: it was asked while the limit was 0, and a
	// sync clears that.
	idle.syncBands(2, 0, "-")
	if n := rdb.ZCard(ctx, idle.b.keys[skSV]).Val(); n != 0 {
		t.Fatalf("%d holders still asked before W syncs", n)
	}
	time.Sleep(5 * time.Millisecond)
	w.window = 0 // every holder has been silent long enough to be asked
	if rep := w.syncBands(0, 1, "0:1"); rep.held != 0 {
		t.Fatalf("W got %d slots with none free", rep.held)
	}
	err := rdb.ZScore(ctx, idle.b.keys[skSV], idle.b.replica).Err()
	if errors.Is(err, redis.Nil) {
		t.Logf("sx: %v", rdb.ZRangeWithScores(ctx, idle.b.keys[skSX], 0, -1).Val())
		t.Logf("sv: %v", rdb.ZRange(ctx, idle.b.keys[skSV], 0, -1).Val())
		t.Fatal("an idle replica holds 2 slots beyond its demand while W waits and none is free, " +
			"but W's sync did not ask it to give them back")
	} else if err != nil {
		t.Fatal(err)
	}
}

// refSharesScript is sharesScript whose want loop reads every holder's
// record: mayAsk is never consulted.
var refSharesScript = func() *script {
	src := sharesScript.src
	const from = "if id ~= me and mayAsk(id, tonumber(xs[i + 1])) and not redis.call('ZSCORE', SV, id) then"
	if !strings.Contains(src, from) {
		panic("the want loop moved")
	}
	return newScript(strings.Replace(src, from, "if id ~= me and not redis.call('ZSCORE', SV, id) then", 1))
}()

// cloneName copies every key of src's Name under dstPrefix.
func cloneName(t *testing.T, rdb *redis.Client, src *rawShares, dstPrefix string) {
	t.Helper()
	ctx := context.Background()
	srcPrefix := strings.TrimSuffix(src.b.keys[skS], "s")
	old := rdb.Keys(ctx, dstPrefix+"*").Val()
	if len(old) > 0 {
		rdb.Del(ctx, old...)
	}
	for _, k := range rdb.Keys(ctx, srcPrefix+"*").Val() {
		if err := rdb.Copy(ctx, k, dstPrefix+strings.TrimPrefix(k, srcPrefix), 0, true).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// callAs runs s as replica on the keys under prefix.
func callAs(t *testing.T, rdb *redis.Client, s *script, prefix, replica string, base0 any, ttl int64, args ...any) any {
	t.Helper()
	keys := []any{numShareKeys}
	for _, k := range shareKeyNames(replica) {
		keys = append(keys, prefix+k)
	}
	base := []any{base0, ttl, prefix + "sg:", replica}
	res, err := evalScript(context.Background(), rdb, s, keys, base, args)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// zmembers lists a sorted set's members in order of their names.
func zmembers(rdb *redis.Client, key string) []string {
	m := rdb.ZRange(context.Background(), key, 0, -1).Val()
	slices.Sort(m)
	return m
}

// edgeBands are bands at the edges of what a replica reports.
var edgeBands = []int{maxBand, maxBand - 1, 5, 1, 0, -1, -5, -maxBand + 1, -maxBand, noBand}

// edgeBandsFor splits need over up to three of edgeBands, a band without
// demand now and then, or none.
func edgeBandsFor(rng *rand.Rand, need int64) string {
	if rng.IntN(7) == 0 {
		return "-"
	}
	return splitNeed(rng, need, edgeBands, 10)
}

// splitNeed splits need over up to three of bands, drawn at random and
// listed from the highest; with zeroOneIn above 0, one band in that many
// gets no demand.
func splitNeed(rng *rand.Rand, need int64, bands []int, zeroOneIn int) string {
	cs := slices.Clone(bands)
	rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
	cs = cs[:1+rng.IntN(3)]
	slices.Sort(cs)
	slices.Reverse(cs)
	parts := []string{}
	left := need
	for i, b := range cs {
		d := left
		if i < len(cs)-1 {
			d = rng.Int64N(left + 1)
		}
		left -= d
		if zeroOneIn > 0 && rng.IntN(zeroOneIn) == 0 {
			d = 0 // a band without demand
		}
		parts = append(parts, fmt.Sprintf("%d:%d", b, d))
	}
	return strings.Join(parts, ",")
}

// For random fleets, a sync asks exactly the holders a sync that reads
// every holder's record asks, and answers the same, on copies of the same
// keys: the holders it passes over by their score could not be asked.
func TestHoldersPassedOverByScoreCouldNotBeAsked(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			wantLoopDiff(t, seed)
		})
	}
}

// wantLoopDiff runs one fleet drawn from seed, comparing each sync.
func wantLoopDiff(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	n := 3 + rng.IntN(18)
	limit := 1 + rng.IntN(12)
	rdb, rs := rawFleet(t, n, limit)
	ctx := context.Background()
	const ttl = 60_000
	for _, r := range rs {
		r.b.base[1] = int64(ttl)
	}
	xPrefix := strings.TrimSuffix(rs[0].b.keys[skS], "s")
	yPrefix := strings.Replace(xPrefix, "}:", "-ref}:", 1)
	t.Cleanup(func() {
		if ks := rdb.Keys(ctx, yPrefix+"*").Val(); len(ks) > 0 {
			rdb.Del(ctx, ks...)
		}
	})
	compared, asked := 0, 0
	var log []string
	for step := range 150 {
		i := rng.IntN(n)
		r := rs[i]
		switch op := rng.IntN(100); {
		case op < 8:
			l := rng.IntN(limit + 3)
			if _, err := r.b.call(sharesScript, "limit", l); err != nil {
				t.Fatal(err)
			}
			log = append(log, fmt.Sprintf("%d: limit %d", step, l))
			continue
		case op < 11:
			_, _ = r.b.call(sharesScript, "bye")
			log = append(log, fmt.Sprintf("%d: r%d bye", step, i))
			continue
		}
		need := rng.Int64N(8)
		held := rng.Int64N(8)
		if rng.IntN(3) == 0 {
			held = 0
		}
		bands := "-"
		if need > 0 || rng.IntN(4) == 0 {
			bands = edgeBandsFor(rng, need)
		}
		window := int64(1_000_000_000) // no told replica swept, no idle holder asked
		if rng.IntN(2) == 0 {
			window = 0
			time.Sleep(2 * time.Millisecond)
		}
		r.seq++
		args := []any{"sync", held, need, bands, max(need-held, 0), "", 0, 0, int64(10_000), int64(0),
			1 + rng.Int64N(4), r.seq, window}
		cloneName(t, rdb, r, yPrefix)
		svBefore := zmembers(rdb, r.b.keys[skSV])
		got := callAs(t, rdb, sharesScript, xPrefix, r.b.replica, r.b.base[0], ttl, args...)
		want := callAs(t, rdb, refSharesScript, yPrefix, r.b.replica, r.b.base[0], ttl, args...)
		gs, ws := zmembers(rdb, r.b.keys[skSV]), zmembers(rdb, yPrefix+"sv")
		line := fmt.Sprintf("%d: r%d(%s) sync held=%d need=%d bands=%s least=%v window=%d -> %v; sv %v -> %v (ref %v)",
			step, i, r.b.replica, held, need, bands, args[10], window, got, svBefore, gs, ws)
		log = append(log, line)
		compared++
		if len(ws) > len(svBefore) {
			asked++
		}
		if g, w := got.([]any), want.([]any); len(g) == 14 && len(w) == 14 {
			g[4], w[4] = "", "" // the epoch of new keys names the time
		}
		if fmt.Sprint(gs) != fmt.Sprint(ws) || fmt.Sprint(got) != fmt.Sprint(want) {
			sx := rdb.ZRangeWithScores(ctx, r.b.keys[skSX], 0, -1).Val()
			recs := rdb.HGetAll(ctx, r.b.keys[skS]).Val()
			t.Fatalf("seed %d: the script asked %v, a want loop reading every record asks %v\nreply %v, ref %v\nsx %v\nrecords %v\nschedule:\n%s",
				seed, gs, ws, got, want, sx, recs, strings.Join(log, "\n"))
		}
	}
	t.Logf("seed %d: %d syncs compared, %d asked someone", seed, compared, asked)
}

// A and B each hold a slot of 2 as their share, for a demand of 2; then C
// comes, and band 0 has fewer slots than replicas: it takes turns. A and B
// learn it only at their renewals, seconds away in a large fleet, and keep
// their slots meanwhile, which no turn would end. C, first in the turns
// with no slot free, asks again after the claim window, and then asks a
// holder that has not synced for that long. It used to wait for their
// renewals: under 1,024 replicas its requests waited past their
// QueueTimeout.
func TestTheFirstInTheTurnsAsksAHolderPastItsTurn(t *testing.T) {
	const limit = 2
	rdb, rs := rawFleet(t, 3, limit)
	ctx := context.Background()
	a, b, c := rs[0], rs[1], rs[2]
	// Set up under a limit of 0: no sync is granted anything, each keeps
	// what it reports.
	if _, err := a.b.call(sharesScript, "limit", 0); err != nil {
		t.Fatal(err)
	}
	a.sync(1, 2)
	b.sync(1, 2)
	if _, err := a.b.call(sharesScript, "limit", limit); err != nil {
		t.Fatal(err)
	}
	a.sync(1, 2) // renew: asked while the limit was 0, a sync clears that
	b.sync(1, 2)
	checkInvariant(t, rdb, a, "set up")
	asked := func() int64 { return rdb.ZCard(ctx, a.b.keys[skSV]).Val() }
	rep := c.sync(0, 2)
	if rep.held != 0 {
		t.Fatalf("C got %d slots with none free", rep.held)
	}
	if rep.again <= 0 {
		t.Errorf("C, first in the turns with no slot free, is not told to ask again")
	}
	if n := asked(); n != 0 {
		t.Errorf("%d holders asked that synced just now: they may hold turns", n)
	}
	time.Sleep(5 * time.Millisecond)
	c.window = 1 // A and B have not synced for a claim window
	c.sync(0, 2)
	if n := asked(); n != 1 {
		t.Fatalf("%d holders asked, want 1: A and B hold their slots past any turn while C waits first in the turns", n)
	}
}
