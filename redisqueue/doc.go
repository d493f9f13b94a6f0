// Package redisqueue is a backend.Backend on Redis: every replica of a
// service that builds a Backend with the same Options.Name and the same Redis
// shares one MaxConcurrent, one MaxQueue and one global order of grants
// (higher Arrival.Priority first, then arrival order).
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	b, err := redisqueue.New(rdb, redisqueue.Options{Name: "api"})
//	...
//	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 20,
//		QueueTimeout: 2 * time.Second, Backend: b})
//
// Each acquire and each release is one atomic Lua script on Redis. A request
// that must wait learns of its grant from a push: the script that frees a
// slot pushes a notice onto a list of the waiter's replica, which one
// goroutine per Backend pops with BLPOP on a connection of its own. Every
// replica syncs each Options.TickInterval (the heartbeat, which also catches
// a lost notice); a replica that dies loses its slots and queue places
// within three ticks and one more. SetLimit moves the limit of the whole
// fleet at run time. See the README for failure behaviour.
package redisqueue
