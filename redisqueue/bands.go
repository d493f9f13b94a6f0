package redisqueue

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ginqueue/ginqueue/backend"
)

// maxBands is how many priority bands a replica reports: lower ones are
// counted in the lowest of them.
const maxBands = 8

// bands splits a Shares replica's demand by priority band, so that Redis
// allots the fleet's limit to the highest priorities first wherever their
// requests wait. Waiting requests are counted at their own priority;
// running ones at the priorities their grants had, as a share of the
// grants made since the previous report (a request admitted on the fast
// path has no priority yet: it counts like the last waiter seen).
type bands struct {
	mu     sync.Mutex
	grants map[int]int // slots granted through Acquire since the last report, by band
	split  map[int]int // the grants of the last report that had some
	last   int         // the top band of the waiters at the last report that had some
	came   map[int]int // the slots of the requests that came since the last take, by band
}

func newBands() *bands { return &bands{grants: map[int]int{}, last: noBand, came: map[int]int{}} }

// arrived counts cost slots of a request of priority p that came, before
// it waits, and runs notePeak with them: a report takes the peak and the
// requests that came together (see take), so that none gets one without
// the other.
func (b *bands) arrived(p, cost int, notePeak func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.came[clampBand(p)] += cost
	notePeak()
}

// take returns the peak takePeak takes and the requests that came since
// the last take, by band.
func (b *bands) take(takePeak func() int) (peak int, came map[int]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	came, b.came = b.came, map[int]int{}
	return takePeak(), came
}

// clampBand is p within the bands a replica reports.
func clampBand(p int) int { return min(max(p, -maxBand), maxBand) }

// granted counts cost slots granted through Acquire to a request of
// priority p.
func (b *bands) granted(p, cost int) {
	b.mu.Lock()
	b.grants[clampBand(p)] += cost
	b.mu.Unlock()
}

// report returns need split into bands, "band:slots,..." from the highest
// ("-" for none), for a replica that runs running slots and whose waiters
// ask for waiting slots, split by priority as byPrio.
func (b *bands) report(running, waiting, need int, byPrio []backend.PriorityCount, came map[int]int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := map[int]int{}
	counted := 0
	for _, pc := range byPrio {
		m[clampBand(pc.Priority)] += pc.Queued
		counted += pc.Queued
	}
	if len(byPrio) > 0 {
		b.last = clampBand(byPrio[0].Priority)
	}
	// Costs: the slots beyond one per waiter, at the top band.
	if waiting > counted && len(byPrio) > 0 {
		m[b.last] += waiting - counted
	}
	if len(b.grants) > 0 {
		b.split, b.grants = b.grants, map[int]int{}
	}
	weights := b.split
	if len(weights) == 0 {
		weights = map[int]int{b.last: 1}
	}
	spread(m, running, weights)
	// A peak above what runs and waits now: split as the requests that
	// came since the last report, or with none, as what runs and waits. A
	// request that came just before a sync may not wait yet: split as what
	// runs, a request of priority 9 beside one of priority 0 would count in
	// band 0, and on a replica that never had a waiter, in the band below
	// every band, where its demand waits for a turn behind every replica's.
	if rest := need - running - max(waiting, counted); rest > 0 {
		switch {
		case len(came) > 0:
			spread(m, rest, came)
		case len(m) == 0:
			m[b.last] += rest
		default:
			spread(m, rest, maps.Clone(m))
		}
	}
	return formatBands(m)
}

// spread adds n slots to m in proportion to weights, the remainders to the
// largest weights first (then the higher band).
func spread(m map[int]int, n int, weights map[int]int) {
	if n <= 0 {
		return
	}
	sum := 0
	for _, w := range weights {
		sum += w
	}
	keys := slices.SortedFunc(maps.Keys(weights), func(a, b int) int {
		return cmp.Or(cmp.Compare(weights[b], weights[a]), cmp.Compare(b, a))
	})
	given := 0
	for _, k := range keys {
		x := n * weights[k] / sum
		m[k] += x
		given += x
	}
	for i := 0; given < n; i++ {
		m[keys[i%len(keys)]]++
		given++
	}
}

// formatBands writes m as the script reads it, dropping empty bands and
// counting those below the maxBands highest in the lowest kept.
func formatBands(m map[int]int) string {
	keys := slices.Sorted(maps.Keys(m))
	slices.Reverse(keys)
	keys = slices.DeleteFunc(keys, func(k int) bool { return m[k] <= 0 })
	if len(keys) == 0 {
		return "-"
	}
	if len(keys) > maxBands {
		for _, k := range keys[maxBands:] {
			m[keys[maxBands-1]] += m[k]
		}
		keys = keys[:maxBands]
	}
	var sb strings.Builder
	for i, k := range keys {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(k))
		sb.WriteByte(':')
		sb.WriteString(strconv.Itoa(m[k]))
	}
	return sb.String()
}
