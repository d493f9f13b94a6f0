package redisqueue

import "github.com/ginqueue/ginqueue"

// GrantedLocally reports whether t was granted by the FailOpen fallback
// rather than by Redis: the topology tests tell a policy answer from a
// grant with it.
func GrantedLocally(t ginqueue.Ticket) bool { return t.ID&localBit != 0 }
