package redisqueue

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ginqueue/ginqueue/backend"
)

func TestProportionalGivesExactlyN(t *testing.T) {
	cases := []struct {
		name string
		n    int64
		w    []int64
		want []int64
	}{
		{"even", 8, []int64{1, 1, 1, 1}, []int64{2, 2, 2, 2}},
		{"largest remainder", 10, []int64{1, 2, 3}, []int64{2, 3, 5}},
		{"ties to the lower index", 1, []int64{1, 1}, []int64{1, 0}},
		{"all zero weights", 5, []int64{0, 0}, []int64{3, 2}},
		{"negative weights count as zero", 4, []int64{-7, 1}, []int64{0, 4}},
		{"nothing to give", 0, []int64{3, 1}, []int64{0, 0}},
		{"no parts", 3, nil, []int64{}},
		{"huge", backend.MaxLimit, []int64{math.MaxInt32, math.MaxInt32, 1}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.w)
			got := proportional(c.n, c.w)
			if !slices.Equal(c.w, in) {
				t.Errorf("the weights changed: %v, were %v", c.w, in)
			}
			var sum int64
			for _, x := range got {
				if x < 0 {
					t.Fatalf("negative part: %v", got)
				}
				sum += x
			}
			if len(c.w) > 0 && sum != max(c.n, 0) {
				t.Errorf("proportional(%d, %v) = %v, sums to %d", c.n, c.w, got, sum)
			}
			if c.want != nil && !slices.Equal(got, c.want) {
				t.Errorf("proportional(%d, %v) = %v, want %v", c.n, c.w, got, c.want)
			}
		})
	}
}

func TestAllotServesTheHighestBandFirst(t *testing.T) {
	ps := func(replicas int64, bands map[int64]int64) partState {
		return partState{replicas: replicas, bands: bands}
	}
	cases := []struct {
		name  string
		total int64
		st    []partState
		want  []int64
	}{
		{"idle: by replicas", 12, []partState{ps(1, nil), ps(2, nil), ps(3, nil)}, []int64{2, 4, 6}},
		{"demand fits, the rest by replicas", 10, []partState{ps(1, map[int64]int64{0: 4}), ps(1, nil)}, []int64{7, 3}},
		{"one band, too much: by demand", 6, []partState{ps(1, map[int64]int64{0: 10}), ps(1, map[int64]int64{0: 20})},
			[]int64{2, 4}},
		{"a higher band first", 4, []partState{ps(5, map[int64]int64{0: 100}), ps(1, map[int64]int64{5: 3})},
			[]int64{1, 3}},
		{"a higher band takes all", 4, []partState{ps(5, map[int64]int64{0: 100, 10: 2}), ps(1, map[int64]int64{5: 6})},
			[]int64{2, 2}},
		{"running without waiters counts", 4, []partState{ps(1, map[int64]int64{noBand: 3}), ps(1, map[int64]int64{0: 3})},
			[]int64{1, 3}},
		{"zero limit", 0, []partState{ps(1, map[int64]int64{0: 3})}, []int64{0}},
		{"negative limit", -3, []partState{ps(1, map[int64]int64{0: 3})}, []int64{0}},
		{"no replicas, no demand: evenly", 3, []partState{ps(0, nil), ps(0, nil)}, []int64{2, 1}},
		{"huge demand", backend.MaxLimit, []partState{ps(1, map[int64]int64{0: math.MaxInt32}), ps(1, map[int64]int64{0: math.MaxInt32})},
			[]int64{backend.MaxLimit / 2, backend.MaxLimit / 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := allot(c.total, c.st); !slices.Equal(got, c.want) {
				t.Errorf("allot(%d) = %v, want %v", c.total, got, c.want)
			}
		})
	}
}

// splitFleet starts n Backends of one split Name on the Redis of the
// tests, each on its own client, and more until every part has one; it
// closes them at the end.
func splitFleet(t *testing.T, n, parts, limit int) []*Backend {
	t.Helper()
	name := freshName("split-")
	var bs []*Backend
	in := map[int]bool{}
	// n replicas, and more if a part has none yet
	for len(bs) < n || len(in) < parts && len(bs) < 64*parts {
		b, err := New(testRedis(t), Options{Name: name, Mode: Shares, Shares: SharesOptions{Parts: parts, RebalancePeriod: DefaultLeaseTTL}})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(backend.Limits{MaxConcurrent: limit, MaxQueue: 100}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		bs = append(bs, b)
		in[b.sp.part] = true
	}
	return bs
}

// A rebalancer that stalled and comes back with an older generation
// changes no part: a later one wrote them since.
func TestAStaleRebalanceIsFenced(t *testing.T) {
	bs := splitFleet(t, 1, 2, 8)
	sp, ctx := bs[0].sp, context.Background()
	if _, err := sp.setPart(ctx, 0, 1000, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.setPart(ctx, 0, 999, 8); !errors.Is(err, errFenced) {
		t.Fatalf("an older generation: %v, want errFenced", err)
	}
	ps, err := sp.setPart(ctx, 0, 1000, -1)
	if err != nil || ps.limit != 3 {
		t.Fatalf("part 0: limit %d (%v), want 3", ps.limit, err)
	}
	// The next turn starts above what the part saw, even if the Name's keys
	// were lost.
	if err := sp.b.rdb.Del(ctx, sp.root[1].(string)).Err(); err != nil {
		t.Fatal(err)
	}
	_, _ = sp.setPart(ctx, 0, 1, -1)
	g, _, _, err := sp.turn(ctx, 0)
	if err != nil || g <= 1000 {
		t.Fatalf("the next generation is %d (%v), want above 1000", g, err)
	}
}

// A part that no rebalance gave slots to admits nothing, however many
// replicas of the Name it holds.
func TestAPartWithoutSlotsAdmitsNothing(t *testing.T) {
	bs := splitFleet(t, 4, 2, 8)
	for _, b := range bs {
		if err := b.sh.sync(false, true); err != nil {
			t.Fatal(err)
		}
		if l := b.limit.Load(); l != 0 {
			t.Fatalf("part %d: limit %d before any rebalance, want 0", b.sp.part, l)
		}
		if c := b.sh.fast.Counts(); c.Limit != 0 {
			t.Fatalf("part %d: share %d before any rebalance, want 0", b.sp.part, c.Limit)
		}
	}
}

// The parts never may hold more than the Name's limit in all: a part whose
// limit falls while it holds slots keeps counting them, and the others grow
// only into what is free.
func TestARebalanceGrowsOnlyIntoFreeSlots(t *testing.T) {
	bs := splitFleet(t, 8, 2, 8)
	var in [2][]*Backend
	for _, b := range bs {
		in[b.sp.part] = append(in[b.sp.part], b)
	}
	ctx := context.Background()
	sp := in[0][0].sp
	// Part 0 gets the whole limit, and holds 6 of it.
	if _, err := sp.setPart(ctx, 0, 1, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.setPart(ctx, 1, 1, 0); err != nil {
		t.Fatal(err)
	}
	a := in[0][0]
	if err := a.sh.sync(false, true); err != nil {
		t.Fatal(err)
	}
	var held []backend.Ticket
	for range 6 {
		tk, err := a.Acquire(ctx, backend.Arrival{Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, tk)
	}
	if err := a.sh.sync(false, true); err != nil {
		t.Fatal(err)
	}
	// Both parts are past the freeze of new keys, when a part cannot tell
	// new keys from lost ones and the rebalancer grows it not.
	eventually(t, func() bool {
		p0, err0 := sp.setPart(ctx, 0, 1, -1)
		p1, err1 := sp.setPart(ctx, 1, 1, -1)
		return err0 == nil && err1 == nil && !p0.unsure && !p1.unsure
	})
	// Demand moves to part 1: 10 waiting there.
	_, err := sp.callPart(ctx, 1, "sync", 0, 10, "0:10", 10, "", 0, 0, 1000, 0, 1, 1, 200)
	if err != nil {
		t.Fatal(err)
	}
	// Band 0: 6 running in part 0, 10 waiting in part 1: targets 3 and 5.
	// Part 1 grows only as part 0's holders give back: first the idle room
	// of part 0's other replicas, then a's 6 slots.
	steps := []func(){
		func() {},
		func() {
			// twice: a reply lowers a share, the next sync reports it
			for range 2 {
				for _, b := range in[0] {
					_ = b.sh.sync(false, true)
				}
			}
		},
		func() {
			for _, tk := range held {
				a.Release(tk)
			}
			_ = a.sh.sync(true, true)
		},
	}
	for i, step := range steps {
		step()
		if err := sp.b.rdb.HDel(ctx, sp.root[1].(string), "t").Err(); err != nil {
			t.Fatal(err)
		}
		if err := sp.round(ctx); err != nil {
			t.Fatal(err)
		}
		p0, p1 := readPart(t, sp, 0), readPart(t, sp, 1)
		t.Logf("step %d: part 0: limit %d, held %d; part 1: limit %d held %d", i, p0.limit, p0.held, p1.limit, p1.held)
		// What the parts may hold never exceeds the limit (holders only
		// give back after the round, so what they hold now is at most what
		// the round saw).
		if max(p0.limit, p0.held)+max(p1.limit, p1.held) > 8 {
			t.Fatalf("step %d: the parts may hold %d + %d, limit 8", i, max(p0.limit, p0.held), max(p1.limit, p1.held))
		}
		switch i {
		case 0: // a runs 6 in part 0: part 1 gets at most the 2 others
			if p0.limit != 3 || p1.limit > 2 {
				t.Fatalf("step 0: part limits %d and %d, want 3 and at most 2", p0.limit, p1.limit)
			}
		case 1: // part 0's idle replicas gave back: part 1 gets the 2 free slots
			if p0.limit != 3 || p0.held != 6 || p1.limit != 2 {
				t.Fatalf("step 1: part 0: limit %d, held %d; part 1: limit %d, want 3, 6 and 2", p0.limit, p0.held, p1.limit)
			}
		case 2: // part 0's demand went: part 1 grows into what it gave back
			if p0.limit != 0 || p1.limit <= 2 {
				t.Fatalf("step 2: part limits %d and %d, want 0 and above 2", p0.limit, p1.limit)
			}
		}
	}
}

// readPart reads part p's limit and the slots it holds.
func readPart(t *testing.T, sp *split, p int) partState {
	t.Helper()
	res, err := sp.callPart(context.Background(), p, "stats")
	if err != nil {
		t.Fatal(err)
	}
	r := res.([]any)
	return partState{held: r[0].(int64), replicas: r[2].(int64), limit: r[3].(int64)}
}

// Each part's keys hash to a slot in its own range of the Cluster's slots,
// as Redis computes them.
func TestPartsTakeSlotRangesInOrder(t *testing.T) {
	// The check value of CRC16/XMODEM, which the Redis Cluster spec gives.
	if c := crc16([]byte("123456789")); c != 0x31c3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", c)
	}
	for _, parts := range []int{2, 3, 16, MaxParts, 1024} {
		o := settings{Name: "orders", KeyPrefix: "ginqueue", Parts: parts}
		for _, p := range []int{0, parts / 2, parts - 1} {
			key := partPrefix(o, p) + "sm"
			s := int(crc16([]byte(key[strings.Index(key, "{")+1:strings.Index(key, "}")])) % clusterSlots)
			if lo, hi := p*clusterSlots/parts, (p+1)*clusterSlots/parts; s < lo || s >= hi || parts <= 16 && (s < lo+(hi-lo)/4 || s >= hi-(hi-lo)/4) {
				t.Errorf("parts %d: part %d's key %s hashes to slot %d, want [%d, %d)", parts, p, key, s, lo, hi)
			}
		}
	}
}

// A part whose data Redis lost (a failover to a replica it had not
// reached, a restart) counts what it was known to hold until its replicas
// have said what they run: its records are gone, and the slots they run
// would otherwise be given to the other parts.
func TestARebalanceAfterAPartLostItsData(t *testing.T) {
	bs := splitFleet(t, 8, 2, 8)
	var a *Backend
	for _, b := range bs {
		if b.sp.part == 0 {
			a = b
		}
	}
	sp, ctx := a.sp, context.Background()
	eventually(t, func() bool {
		p0, err0 := sp.setPart(ctx, 0, 1, -1)
		p1, err1 := sp.setPart(ctx, 1, 1, -1)
		return err0 == nil && err1 == nil && !p0.unsure && !p1.unsure
	})
	// Part 0 runs 6 of the 8.
	if _, err := sp.setPart(ctx, 0, 1, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.setPart(ctx, 1, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.sh.sync(false, true); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		tk, err := a.Acquire(ctx, backend.Arrival{Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Release(tk)
	}
	if err := a.sh.sync(false, true); err != nil {
		t.Fatal(err)
	}
	round := func() {
		t.Helper()
		if err := sp.b.rdb.HDel(ctx, sp.root[1].(string), "t").Err(); err != nil {
			t.Fatal(err)
		}
		if err := sp.round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	round() // the root learns what part 0 may hold
	// Redis loses part 0's keys; 10 requests wait in part 1.
	keys, err := sp.b.rdb.Keys(ctx, partPrefix(sp.b.opts, 0)+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("part 0's keys: %v (%v)", keys, err)
	}
	if err := sp.b.rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.callPart(ctx, 1, "sync", 0, 10, "0:10", 10, "", 0, 0, 1000, 0, 1, 1, 200); err != nil {
		t.Fatal(err)
	}
	round()
	if p1 := readPart(t, sp, 1); p1.limit+6 > 8 {
		t.Fatalf("part 1 got %d slots while part 0 runs 6 of 8 on data Redis lost", p1.limit)
	}
}
