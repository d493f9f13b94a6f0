package redisqueue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// randBands splits need over up to three random bands, or none.
func randBands(rng *rand.Rand, need int64) string {
	if need == 0 || rng.IntN(6) == 0 {
		if rng.IntN(3) == 0 && need > 0 {
			return strconv.Itoa(noBand) + ":" + strconv.FormatInt(need, 10)
		}
		return "-"
	}
	return splitNeed(rng, need, []int{5, 2, 1, 0, -1, -3, noBand}, 0)
}

// Random schedules of every call, held-back syncs, lost keys and leases
// that run out keep the totals equal to the sums over the records, and
// leave no key without an expiry.
func TestRandomSchedulesKeepTheTotals(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			randomSchedule(t, seed)
		})
	}
}

// randomSchedule runs one schedule drawn from seed, checking after each
// step.
func randomSchedule(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	n := 2 + rng.IntN(5)
	limit := 1 + rng.IntN(8)
	rdb, rs := rawFleet(t, n, limit)
	ctx := context.Background()
	for _, r := range rs {
		r.b.base[1] = int64(60 + rng.IntN(3)*40)
	}
	past := make([][]rawArgs, n) // syncs each replica made, to replay
	var log []string
	lastSync := time.Now()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: %s\nschedule:\n%s", seed, fmt.Sprintf(format, args...), strings.Join(log, "\n"))
	}
	check := func() {
		t.Helper()
		if e := invariantErr(t, rdb, rs[0]); e != "" {
			fail("%s", e)
		}
		if k := keyWithoutExpiry(t, rdb, rs[0]); k != "" {
			fail("key %s has no expiry", k)
		}
	}
	steps := 40 + rng.IntN(40)
	for step := range steps {
		i := rng.IntN(n)
		r := rs[i]
		op := rng.IntN(100)
		if time.Since(lastSync) > 400*time.Millisecond && op >= 60 {
			op = 0
		}
		switch {
		case op < 45: // fresh sync
			need := rng.Int64N(7)
			held := rng.Int64N(7)
			a := rawArgs{held: held, need: need, bands: randBands(rng, need), queued: rng.Int64N(5), least: 1 + rng.Int64N(3)}
			if rng.IntN(8) == 0 {
				a.gap = 1 + rng.Int64N(40)
			}
			r.seq++
			a.seq = r.seq
			past[i] = append(past[i], a)
			res, err := r.syncRaw(a)
			log = append(log, fmt.Sprintf("%d: r%d sync %+v -> %v %v", step, i, a, res, err))
			if err != nil {
				fail("sync: %v", err)
			}
			if x, ok := res.([]any); ok && len(x) == 14 {
				lastSync = time.Now()
			}
		case op < 55: // replay an older sync (held back)
			if len(past[i]) == 0 {
				continue
			}
			a := past[i][rng.IntN(len(past[i]))]
			res, err := r.syncRaw(a)
			log = append(log, fmt.Sprintf("%d: r%d replay %+v -> %v %v", step, i, a, res, err))
			if err != nil {
				fail("replay: %v", err)
			}
			if x, ok := res.([]any); ok && len(x) == 14 {
				lastSync = time.Now()
			}
		case op < 62: // bye
			res, err := r.b.call(sharesScript, "bye")
			log = append(log, fmt.Sprintf("%d: r%d bye -> %v %v", step, i, res, err))
		case op < 67: // limit
			l := rng.IntN(9)
			res, err := r.b.call(sharesScript, "limit", l)
			log = append(log, fmt.Sprintf("%d: r%d limit %d -> %v %v", step, i, l, res, err))
		case op < 70: // part
			l := rng.IntN(10) - 1
			res, err := r.b.call(sharesScript, "part", step+1, l)
			log = append(log, fmt.Sprintf("%d: r%d part %d -> %v %v", step, i, l, res, err))
		case op < 74: // declared changes (conflict or takeover)
			old := r.b.base[0]
			r.b.base[0] = 1 + rng.IntN(8)
			need := rng.Int64N(5)
			r.seq++
			a := rawArgs{held: rng.Int64N(5), need: need, bands: randBands(rng, need), seq: r.seq}
			res, err := r.syncRaw(a)
			log = append(log, fmt.Sprintf("%d: r%d declares %v (was %v) sync %+v -> %v %v", step, i, r.b.base[0], old, a, res, err))
			if err != nil {
				fail("sync: %v", err)
			}
			if x, ok := res.([]any); ok && len(x) == 14 {
				lastSync = time.Now()
			}
		case op < 76: // epoch loss: the Name's keys are deleted
			keys := make([]string, 0, len(r.b.keys))
			for _, k := range r.b.keys {
				if !strings.Contains(k, ":sg:") {
					keys = append(keys, k)
				}
			}
			rdb.Del(ctx, keys...)
			log = append(log, fmt.Sprintf("%d: keys deleted", step))
		default: // time passes
			d := time.Duration(10+rng.IntN(150)) * time.Millisecond
			time.Sleep(d)
			log = append(log, fmt.Sprintf("%d: sleep %v", step, d))
		}
		check()
	}
}

// Many leases that ran out, the caller's among them, are swept a few at a
// time, and the swept replicas come back (late, stale, leaving twice)
// without a drift of the totals.
func TestSweepsOfManyExpiredKeepTheTotals(t *testing.T) {
	rdb, rs := rawFleet(t, 11, 20)
	for _, r := range rs {
		r.b.base[1] = int64(100)
	}
	bands := []string{"3:1,1:1", "0:2", "-", "-1000001:2", "2:1,-1:1"}
	for i, r := range rs {
		r.syncBands(i%3, 2, bands[i%len(bands)])
		checkInvariant(t, rdb, r, fmt.Sprintf("r%d first", i))
	}
	time.Sleep(250 * time.Millisecond) // every lease runs out
	me := rs[5]
	for k := range 6 {
		rep := me.syncBands(1+k%2, 2, bands[k%len(bands)])
		checkInvariant(t, rdb, me, fmt.Sprintf("caller sync %d -> %+v", k, rep))
		time.Sleep(150 * time.Millisecond) // the caller's own lease runs out again
	}
	n := rdb.HLen(context.Background(), me.b.keys[skS]).Val()
	if n != 1 {
		t.Fatalf("%d records left", n)
	}
	// the swept come back with late syncs, some stale (old seq)
	for i, r := range rs {
		if i == 5 {
			continue
		}
		if i%2 == 0 {
			r.seq = 0 // a held-back sync of seq 1
		}
		r.syncBands(2, 2, bands[(i+1)%len(bands)])
		checkInvariant(t, rdb, r, fmt.Sprintf("r%d late", i))
		_, _ = r.b.call(sharesScript, "bye")
		checkInvariant(t, rdb, r, fmt.Sprintf("r%d bye", i))
		_, _ = r.b.call(sharesScript, "bye")
		checkInvariant(t, rdb, r, fmt.Sprintf("r%d bye twice", i))
		r.syncBands(1, 2, "5:2")
		checkInvariant(t, rdb, r, fmt.Sprintf("r%d after bye", i))
	}
}
