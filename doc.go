// Package ginqueue is throttling middleware for Gin with a bounded wait queue.
// At most Config.MaxConcurrent requests run the rest of the handler chain at
// once, and up to Config.MaxQueue more wait their turn. A request that finds
// the queue full is answered 503 at once, and one that waits longer than
// Config.QueueTimeout is answered 408. Both answers carry Retry-After.
//
// To throttle every route with the defaults (100 running, 1000 waiting, 10 s):
//
//	router.Use(ginqueue.New(ginqueue.DefaultConfig()))
//
// To share one limit between route groups, read Stats or shut down cleanly,
// build a Queue and use its Handler:
//
//	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 8, MaxQueue: 64, QueueTimeout: time.Second})
//	if err != nil {
//		log.Fatal(err) // names the bad field
//	}
//	router.GET("/debug/queue", q.StatusHandler())
//	api := router.Group("/api", q.Handler())
//	...
//	q.Shutdown(ctx) // waiters and new arrivals get 503; waits for running requests
//
// # Outcomes
//
// Every request that Config.Skip does not exempt has exactly one Outcome. Each
// outcome has its own default response, Stats counter and Config.OnOutcome
// report, and only a served request runs the handler:
//
//   - OutcomeServed: it got a slot, at once or after waiting its turn.
//   - OutcomeQueueFull: 503 at once. Every slot and place was taken, its flow
//     was at Config.MaxQueuePerFlow, a higher Config.Priority took its place,
//     or Config.RejectEarly expected it to wait past QueueTimeout or its
//     client's deadline.
//   - OutcomeQueueTimeout: 408 (or Config.QueueTimeoutStatus) at the deadline.
//     It waited QueueTimeout, or its request context's deadline or its
//     client's (Config.Deadline) passed.
//   - OutcomeCanceled: its client hung up while it waited. No body is written,
//     and 499 is recorded for access logs.
//   - OutcomeClosed: 503 at once, after Queue.Close or Queue.Shutdown.
//
// Config.OnQueueFull, Config.OnQueueTimeout and Config.OnClosed replace the
// default responses. A waiting request parks in its own goroutine, and nothing
// polls: a freed slot goes straight to the next waiter, and one timer answers
// timeouts at their deadline. A handler that panics still gives its slot back.
//
// # More
//
// Config.Priority and Config.FlowKey order the queue by importance and make
// clients take turns. Config.Cost weighs heavy requests as several slots.
// Config.Adaptive moves the limit with the measured
// handler latency. The promqueue module exports Stats to Prometheus, and the
// redisqueue module is a Backend that gives a whole fleet one limit. The
// repository's README and docs folder cover sizing, every Config field and
// each feature: https://github.com/ginqueue/ginqueue.
package ginqueue
