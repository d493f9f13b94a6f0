package redisqueue

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// shareRecord is one record of s, parsed as the script parses it.
type shareRecord struct {
	held, need, queued, v, least, seq, short, lst int64
	bands                                         [][2]int64
}

func (r shareRecord) top() int64 {
	if len(r.bands) > 0 {
		return r.bands[0][0]
	}
	return noBand
}

func parseShareRecord(t *testing.T, id, s string) shareRecord {
	t.Helper()
	f := strings.Fields(s)
	if len(f) != 9 {
		t.Fatalf("record of %s is unparsable: %q", id, s)
	}
	var n [8]int64
	for i := range n {
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || x < 0 {
			t.Fatalf("record of %s is unparsable (field %d): %q", id, i, s)
		}
		n[i] = x
	}
	r := shareRecord{held: n[0], need: n[1], queued: n[2], v: n[3], least: n[4], seq: n[5], short: n[6], lst: n[7]}
	if f[8] != "-" {
		for _, p := range strings.Split(f[8], ",") {
			bs, ds, ok := strings.Cut(p, ":")
			b, err1 := strconv.ParseInt(bs, 10, 64)
			d, err2 := strconv.ParseInt(ds, 10, 64)
			if !ok || err1 != nil || err2 != nil {
				t.Fatalf("record of %s: bad bands %q", id, f[8])
			}
			r.bands = append(r.bands, [2]int64{b, d})
		}
	}
	return r
}

// readBandHash reads a band → slots hash, dropping zero entries.
func readBandHash(t *testing.T, rdb *redis.Client, key string) map[int64]int64 {
	t.Helper()
	m := map[int64]int64{}
	for k, v := range rdb.HGetAll(context.Background(), key).Val() {
		b, err := strconv.ParseInt(k, 10, 64)
		if err != nil {
			t.Fatalf("%s has a band field %q", key, k)
		}
		x, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s[%s] = %q", key, k, v)
		}
		if x != 0 {
			m[b] = x
		}
	}
	return m
}

func fmtBands(m map[int64]int64) string {
	ks := make([]int64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] > ks[j] })
	var sb strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&sb, "%d:%d ", k, m[k])
	}
	return sb.String()
}

// invariantErr returns what drifted between sm's totals (and sb, sl, sk)
// and the records of s, or "" if nothing did. r names the Name.
func invariantErr(t *testing.T, rdb *redis.Client, r *rawShares) string {
	t.Helper()
	ctx := context.Background()
	keys := r.b.keys
	recs := rdb.HGetAll(ctx, keys[skS]).Val()
	var H, Q, R, K, E int64
	sb, sl, sk := map[int64]int64{}, map[int64]int64{}, map[int64]int64{}
	var bad []string
	for id, s := range recs {
		x := parseShareRecord(t, id, s)
		H += x.held
		Q += x.queued
		R++
		K += x.short
		E += max(0, x.held-x.need)
		for _, bd := range x.bands {
			sb[bd[0]] += bd[1]
		}
		sl[x.top()] += x.lst
		sk[x.top()] += x.short
		if err := rdb.ZScore(ctx, keys[skSE], id).Err(); err != nil {
			bad = append(bad, fmt.Sprintf("record %s has no lease in se (%v)", id, err))
		}
	}
	for k, v := range sb {
		if v == 0 {
			delete(sb, k)
		}
	}
	for k, v := range sl {
		if v == 0 {
			delete(sl, k)
		}
	}
	for k, v := range sk {
		if v == 0 {
			delete(sk, k)
		}
	}
	meta := rdb.HMGet(ctx, keys[skSM], "H", "Q", "R", "K", "E").Val()
	get := func(i int) int64 {
		if meta[i] == nil {
			return 0
		}
		x, _ := strconv.ParseInt(meta[i].(string), 10, 64)
		return x
	}
	for i, c := range []struct {
		name string
		want int64
	}{{"H", H}, {"Q", Q}, {"R", R}, {"K", K}, {"E", E}} {
		if got := get(i); got != c.want {
			bad = append(bad, fmt.Sprintf("sm %s=%d, records sum %d", c.name, got, c.want))
		}
	}
	for _, c := range []struct {
		name string
		key  string
		want map[int64]int64
	}{{"sb", keys[skSB], sb}, {"sl", keys[skSL], sl}, {"sk", keys[skSK], sk}} {
		got := readBandHash(t, rdb, c.key)
		if fmtBands(got) != fmtBands(c.want) {
			bad = append(bad, fmt.Sprintf("%s = {%s}, records {%s}", c.name, fmtBands(got), fmtBands(c.want)))
		}
	}
	if len(bad) == 0 {
		return ""
	}
	return strings.Join(bad, "; ") + fmt.Sprintf(" (records: %v)", recs)
}

// checkInvariant fails the test if sm's totals drifted from the records.
func checkInvariant(t *testing.T, rdb *redis.Client, r *rawShares, step string) {
	t.Helper()
	if e := invariantErr(t, rdb, r); e != "" {
		t.Fatalf("after %s: %s", step, e)
	}
}

// rawArgs are the arguments of a sync, every one chosen.
type rawArgs struct {
	held, need   int64
	bands        string
	queued       int64
	epoch        string
	seenN, seenV int64
	gap, freeze  int64
	least, seq   int64
	window       int64
}

func (r *rawShares) syncRaw(a rawArgs) (any, error) {
	r.t.Helper()
	if a.seq == 0 {
		r.seq++
		a.seq = r.seq
	}
	if a.bands == "" {
		a.bands = "-"
	}
	if a.gap == 0 {
		a.gap = 10_000
	}
	if a.least == 0 {
		a.least = 1
	}
	if a.window == 0 {
		a.window = r.window
	}
	return r.b.call(sharesScript, "sync", a.held, a.need, a.bands, a.queued, a.epoch, a.seenN, a.seenV,
		a.gap, a.freeze, a.least, a.seq, a.window)
}

// The calls that are not syncs (a rebalancer's, every period, on a part
// whose replicas all crashed; SetLimit) renew the expiry of every key of
// the Name, not only that of its totals: the totals used to outlive the
// records they sum, and a replica that joined later found the slots of the
// crashed ones still counted, for good.
func TestCallsWithoutSyncsKeepTheRecordsWithTheirTotals(t *testing.T) {
	for _, op := range []string{"part", "limit"} {
		t.Run(op, func(t *testing.T) {
			rdb, rs := rawFleet(t, 2, 4)
			a, b := rs[0], rs[1]
			const leaseMs = 100 // keys live 10 leases: 1 s
			a.b.base[1], b.b.base[1] = int64(leaseMs), int64(leaseMs)
			if rep := a.sync(0, 4); rep.held != 4 {
				t.Fatalf("A got %d slots, want 4", rep.held)
			}
			checkInvariant(t, rdb, a, "A took 4")
			// A crashes; calls of another kind go on for 1.5 s, longer
			// than the keys live without them.
			for g := 1; g <= 15; g++ {
				args := []any{op, g, -1}
				if op == "limit" {
					args = []any{op, 4}
				}
				if _, err := b.b.call(sharesScript, args...); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			rep := b.sync(0, 4)
			for range 5 {
				time.Sleep(50 * time.Millisecond)
				rep = b.sync(int(rep.held), 4)
			}
			checkInvariant(t, rdb, b, "B synced after the crash")
			if rep.held != 4 {
				t.Fatalf("B, alone under a limit of 4, holds %d slots: the crashed A's 4 are still counted", rep.held)
			}
		})
	}
}
