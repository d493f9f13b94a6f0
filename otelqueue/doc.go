// Package otelqueue exports the state of ginqueue Queues as OpenTelemetry
// metrics, and records each Queue's decision on the request's span.
//
// # Metrics
//
// Metrics reads every Queue's Stats and WaitHistogram when the
// MeterProvider collects, in one callback, and at no other time: every
// instrument is observable (asynchronous), so nothing is added to the
// request path.
//
//	m, err := otelqueue.NewMetrics(provider) // a metric.MeterProvider
//	if err != nil { … }
//	defer m.Unregister()
//	if err := m.Add("api", q); err != nil { … }
//
// Every measurement carries the attribute ginqueue.queue, the name given to
// Add. The instruments, with their units:
//
//	ginqueue.slot.usage                  UpDownCounter {slot}    slots held (one per running request, or its Config.Cost)
//	ginqueue.slot.limit                  UpDownCounter {slot}    slots in all
//	ginqueue.request.queued              UpDownCounter {request} requests waiting
//	ginqueue.request.queued_by_priority  UpDownCounter {request} requests waiting, by ginqueue.priority
//	ginqueue.requests                    Counter {request}       requests by ginqueue.outcome (served,
//	                                                             queue_full, queue_timeout, canceled, closed, panic)
//	ginqueue.abandoned_requests          Counter {request}       served requests whose client had gone
//	                                                             by the time the handler returned
//	ginqueue.wait.oldest                 Gauge s                 how long the oldest waiter has waited
//	ginqueue.wait.percentile             Gauge s                 percentiles of the waits of the last minute,
//	                                                             by ginqueue.percentile (50, 90, 99)
//	ginqueue.wait.bucket                 Counter {request}       served requests that waited at most
//	                                                             ginqueue.wait.upper_bound seconds
//	ginqueue.wait.time                   Counter s               the waits of served requests, added up
//	ginqueue.drain_rate                  Gauge {request}/s       requests finished per second, last ~10 s
//	ginqueue.adaptive.no_load_latency    Gauge s                 the adaptive limit's no-load handler time
//	ginqueue.backend.unavailable         UpDownCounter {backend} 1 while the Backend cannot reach its
//	                                                             shared store (redisqueue: Redis marked down)
//	ginqueue.backend.outages             Counter {outage}        times the Backend turned unavailable
//
// ginqueue.request.queued is the sum of ginqueue.request.queued_by_priority
// over ginqueue.priority; it is an instrument of its own because it also
// reads 0 when nobody waits. A priority is reported from the first
// collection that finds it waiting, and from then on (at 0 when it has
// none, so graphs do not break); one whose waiters all came and went
// between two collections is not. Keep the set of priorities small. Both
// come from one Stats, so the split adds
// up to the total of the same collection.
//
// # The wait distribution
//
// OpenTelemetry has no asynchronous histogram: a Histogram instrument takes
// one measurement per request, on the request path, which is what this
// package avoids. The Queue already keeps the distribution of its waits
// (Queue.WaitHistogram), so it is exported as what it is, cumulative
// counts: ginqueue.wait.bucket is the number of served requests that waited
// at most ginqueue.wait.upper_bound seconds, one per bound of
// ginqueue.WaitBuckets() and one for "+Inf" (every served request, the
// histogram's count), and ginqueue.wait.time is the sum of their waits. A
// backend that reads Prometheus histograms rebuilds one from them (see
// docs/observability.md); any backend can graph the rate of a bucket.
// ginqueue.wait.percentile adds the Queue's own p50, p90 and p99 of the
// last minute (Stats.WaitP50 and so on), for backends that cannot.
//
// # Spans
//
// SpanEvents returns a hook for ginqueue.Config.OnDecision. At the grant,
// before the handler runs, or at a refusal, before the response is
// written, it adds an event to the request's span (the one in
// c.Request.Context(), started by whatever tracing middleware runs before
// the Queue) and sets attributes a tracing backend can filter on. Without a
// recording span it does nothing, and allocates nothing.
//
//	cfg.OnDecision = otelqueue.SpanEvents("api")
//
// The events are ginqueue.granted (the served outcome) and ginqueue.rejected
// (every other), with the attributes
//
//	ginqueue.queue          string   the name given to SpanEvents
//	ginqueue.outcome        string   served, queue_full, queue_timeout, canceled, closed or panic
//	ginqueue.wait.duration  float64  seconds spent waiting in the queue
//	ginqueue.priority       int      Decision.Priority
//	ginqueue.arrival.queued int      requests waiting when it arrived (Decision.Queued)
//	ginqueue.cost           int      slots asked for (Decision.Cost)
//
// and the span gets ginqueue.queue, ginqueue.outcome and
// ginqueue.wait.duration as attributes of its own.
package otelqueue
