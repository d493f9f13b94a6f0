// Package ginqueue is throttling middleware for Gin with a bounded wait queue.
// A request runs the rest of the handler chain only while it holds a slot.
// There are Config.MaxConcurrent slots (the limit), and up to Config.MaxQueue
// more requests wait their turn for one. A request that finds the queue full
// is answered 503 at once, and one that waits longer than Config.QueueTimeout
// is answered 408. Both answers carry Retry-After.
//
// To throttle every route with the defaults (100 running, 1000 waiting, 10 s):
//
//	router.Use(ginqueue.New(ginqueue.DefaultConfig()))
//
// To share one limit between route groups, read Stats or shut down cleanly,
// build a Queue and use its Handler:
//
//	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 8, MaxQueue: 64,
//		QueueTimeout: time.Second})
//	if err != nil {
//		log.Fatal(err) // names the bad field
//	}
//	router.GET("/debug/queue", q.StatusHandler())
//	api := router.Group("/api", q.Handler())
//	...
//	// Waiters and new arrivals get 503; Shutdown waits for running requests.
//	q.Shutdown(ctx)
//
// # Outcomes
//
// Every request that Config.Skip does not exempt has exactly one Outcome,
// with its own default response, Stats counter and Config.OnOutcome report.
// Only a served request runs the handler:
//
//   - OutcomeServed: it was granted its slots, at once or after waiting.
//   - OutcomeQueueFull: 503 at once: no free slot and no place for it, or
//     Config.RejectEarly expects it to wait too long.
//   - OutcomeQueueTimeout: 408 (or Config.QueueTimeoutStatus) once it has
//     waited QueueTimeout, or its deadline (Config.Deadline) has passed.
//   - OutcomeCanceled: its client hung up while it waited. No body is written,
//     and 499 is recorded for access logs.
//   - OutcomeClosed: 503 at once, after Queue.Close or Queue.Shutdown.
//   - OutcomePanic: Skip, Deadline, Cost, Priority or FlowKey panicked. The
//     panic goes on to gin.Recovery, which answers 500.
//
// Config.OnQueueFull, Config.OnQueueTimeout and Config.OnClosed replace the
// default responses. A handler that panics still gives its slots back.
//
// # More
//
// Config.Priority, Config.FlowKey, Config.Cost and Config.Adaptive order the
// queue, make clients take turns, weigh heavy requests and move the limit.
// The promqueue and otelqueue modules export Stats, and the redisqueue module
// gives a whole fleet one limit. The docs folder of the repository has the
// words these comments use (slot, place, grant), examples and how to choose
// each value, from docs/configuration.md on:
// https://github.com/ginqueue/ginqueue.
package ginqueue
