package redisqueue

import (
	"math/bits"
	"slices"
)

// How a rebalance divides the limit between the parts of a split Name.

// byShortfall lists the parts whose target is above their limit, the most
// short first.
func byShortfall(target []int64, st []partState) []int {
	var ps []int
	for p := range st {
		if target[p] > st[p].limit {
			ps = append(ps, p)
		}
	}
	slices.SortStableFunc(ps, func(a, b int) int {
		da, db := target[a]-st[a].limit, target[b]-st[b].limit
		return int(min(max(db-da, -1), 1))
	})
	return ps
}

// allot divides total slots between the parts: the demand of the highest
// priority band first, in proportion to each part's demand there when it
// does not all fit, then each band below from what is left; what no demand
// takes goes to the parts in proportion to their replicas, as room for
// arrivals.
func allot(total int64, st []partState) []int64 {
	out := make([]int64, len(st))
	left := max(total, 0)
	var bands []int64
	for _, ps := range st {
		for b := range ps.bands {
			if !slices.Contains(bands, b) {
				bands = append(bands, b)
			}
		}
	}
	slices.Sort(bands)
	slices.Reverse(bands)
	want := make([]int64, len(st))
	for _, band := range bands {
		if left == 0 {
			break
		}
		var sum int64
		for p, ps := range st {
			want[p] = max(ps.bands[band], 0)
			sum += want[p]
		}
		give := want
		if sum > left {
			give = proportional(left, want)
			sum = left
		}
		for p := range out {
			out[p] += give[p]
		}
		left -= sum
	}
	if left > 0 {
		for p, ps := range st {
			want[p] = max(ps.replicas, 0)
		}
		for p, x := range proportional(left, want) {
			out[p] += x
		}
	}
	return out
}

// proportional divides n in proportion to the weights, by largest
// remainder (ties to the lower index). All weights zero divides it evenly.
func proportional(n int64, w []int64) []int64 {
	out := make([]int64, len(w))
	if len(w) == 0 || n <= 0 {
		return out
	}
	var sum uint64
	for _, x := range w {
		sum += uint64(max(x, 0))
	}
	if sum == 0 {
		w = slices.Repeat([]int64{1}, len(w))
		sum = uint64(len(w))
	}
	rem := make([]uint64, len(w))
	var given int64
	for p, x := range w {
		hi, lo := bits.Mul64(uint64(n), uint64(max(x, 0)))
		q, r := bits.Div64(hi, lo, sum)
		out[p], rem[p] = int64(q), r
		given += int64(q)
	}
	order := make([]int, len(w))
	for p := range order {
		order[p] = p
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case rem[a] > rem[b]:
			return -1
		case rem[a] < rem[b]:
			return 1
		}
		return 0
	})
	for _, p := range order[:n-given] {
		out[p]++
	}
	return out
}
