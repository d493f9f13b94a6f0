// Package redisqueue is a backend.Backend on Redis: every replica of a
// service that builds a Backend with the same Options.Name on the same Redis
// shares one limit.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	b, err := redisqueue.New(rdb, redisqueue.Options{Name: "api"})
//	...
//	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 20,
//		QueueTimeout: 2 * time.Second, Backend: b})
//
// It has two modes. In Shares mode, the default, each replica leases a
// share of the limit from Redis and admits within it in memory, at the
// speed and with every feature of the in-memory Backend; Redis moves the
// shares to where requests wait. In GlobalQueue mode the slots and one
// queue for the whole fleet live in Redis: one order of grants across
// replicas, at the cost of a Redis round trip or more per request.
// docs/fleet.md says when to pick which, and what each does when Redis is
// slow, paused or down.
package redisqueue
