package redisqueue

import "github.com/ginqueue/ginqueue/backend"

// GrantedLocally reports whether t was granted by the FailOpen fallback
// rather than by Redis: the topology tests tell a policy answer from a
// grant with it.
func GrantedLocally(t backend.Ticket) bool { return t.ID&localBit != 0 }

// Rank is b's rank among the live replicas by id, as of its last sync: the
// replica of rank i%n has the i-th share of a limit split n ways.
func Rank(b *Backend) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rank
}

// Stopped is closed once b's maintainer (Shares: its coordinator) has
// returned.
func Stopped(b *Backend) <-chan struct{} { return b.mainDn }

// ReplicaID is b's replica id, as Redis knows it.
func ReplicaID(b *Backend) string { return b.replica }

// PartOf is the part of a split Name that b runs in.
func PartOf(b *Backend) int { return b.sp.part }

// Rebalance has b rebalance a split Name's parts now, unless a replica did
// within the last period.
func Rebalance(b *Backend) error { return b.sp.round(b.stopCtx) }

// PartKey is the name of the key k of part p of o's Name.
func PartKey(o Options, p int, k string) string {
	s, _ := o.compile()
	return partPrefix(s, p) + k
}

// ServerRunID is the run id of the server b's notice reader last saw, ""
// if none.
func ServerRunID(b *Backend) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runID
}
