// Package promqueue exports the state of ginqueue Queues as Prometheus
// metrics. A Collector reads each Queue's Stats and WaitHistogram when it is
// scraped and at no other time, so it adds nothing to the request path.
//
//	c := promqueue.NewCollector()
//	if err := c.Add("api", q); err != nil { … }
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(c)
//	router.GET("/metrics", gin.WrapH(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
//
// Every series carries the label queue, the name given to Add. The metrics:
//
//	ginqueue_running{queue}                   gauge: slots held (one per request, or its Config.Cost)
//	ginqueue_limit{queue}                     gauge: slots in all
//	ginqueue_queued{queue}                    gauge: requests waiting
//	ginqueue_queued_by_priority{queue,priority}
//	                                          gauge: requests waiting, by priority
//	ginqueue_oldest_wait_seconds{queue}       gauge: how long the oldest waiter has waited
//	ginqueue_drain_rate_per_second{queue}     gauge: requests finished per second, last ~10 s
//	ginqueue_no_load_latency_seconds{queue}   gauge: the adaptive limit's no-load handler time
//	ginqueue_requests_total{queue,outcome}    counter: requests by outcome (served,
//	                                          queue_full, queue_timeout, canceled, closed, panic)
//	ginqueue_abandoned_total{queue}           counter: served requests whose client had gone
//	                                          by the time the handler returned
//	ginqueue_queue_wait_seconds{queue}        histogram: queue waits of served requests,
//	                                          buckets ginqueue.WaitBuckets()
//	ginqueue_backend_unavailable{queue}       gauge: 1 while the Backend cannot reach its shared
//	                                          store (redisqueue: Redis marked down), else 0
//	ginqueue_backend_outages_total{queue}     counter: times the Backend turned unavailable
//
// ginqueue_queued is the sum of ginqueue_queued_by_priority over priority;
// it is a metric of its own because it also reads 0 when nobody waits, and a
// metric name cannot carry both a priority label and a total without it.
// A priority has a series from the first scrape that finds it waiting, and
// keeps it (at 0 when it has none, so graphs do not break); one whose
// waiters all came and went between two scrapes has none. Keep the set of
// priorities small. Both come
// from one Stats, so the split adds up to the total of the same scrape.
package promqueue

import (
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ginqueue/ginqueue"
)

// descs are the descriptors of a Collector's metrics: the same for every
// Queue, and never changed once built.
type descs struct {
	running, limit, queued, queuedByPriority, oldestWait, drainRate, noLoadLatency, requests, abandoned, wait *prometheus.Desc
	// From the Backend: whether it reaches the store it shares with other
	// replicas.
	unavailable, outages *prometheus.Desc
}

func newDescs() descs {
	queue := []string{"queue"}
	return descs{
		running: prometheus.NewDesc("ginqueue_running",
			"Slots of the queue held now: one per running request, or its Config.Cost.", queue, nil),
		limit: prometheus.NewDesc("ginqueue_limit",
			"Slots of the queue: how many requests of cost 1 may run at once.", queue, nil),
		queued: prometheus.NewDesc("ginqueue_queued",
			"Requests waiting for a slot now.", queue, nil),
		queuedByPriority: prometheus.NewDesc("ginqueue_queued_by_priority",
			"Requests waiting for a slot now, by priority; 0 for a priority seen before that has no waiter.",
			[]string{"queue", "priority"}, nil),
		oldestWait: prometheus.NewDesc("ginqueue_oldest_wait_seconds",
			"How long the oldest waiting request has waited so far; 0 when nobody waits.", queue, nil),
		drainRate: prometheus.NewDesc("ginqueue_drain_rate_per_second",
			"Requests finished per second over about the last ten seconds, as used for Retry-After.", queue, nil),
		noLoadLatency: prometheus.NewDesc("ginqueue_no_load_latency_seconds",
			"Handler time the adaptive limit measured with few requests in flight; 0 without Config.Adaptive or until measured.",
			queue, nil),
		requests: prometheus.NewDesc("ginqueue_requests_total",
			"Requests that passed the queue, by outcome: served, queue_full, queue_timeout, canceled, closed or panic.",
			[]string{"queue", "outcome"}, nil),
		abandoned: prometheus.NewDesc("ginqueue_abandoned_total",
			"Served requests whose client had gone by the time the handler returned: work nobody received. Part of the served outcome.",
			queue, nil),
		wait: prometheus.NewDesc("ginqueue_queue_wait_seconds",
			"Time served requests waited in the queue for a slot; those that ran at once count as 0.", queue, nil),
		unavailable: prometheus.NewDesc("ginqueue_backend_unavailable",
			"Whether the queue's Backend cannot reach the store it shares with other replicas and applies its fallback policy: 1 while so, else 0.",
			queue, nil),
		outages: prometheus.NewDesc("ginqueue_backend_outages_total",
			"Times the queue's Backend turned unavailable since it started; always 0 for the in-memory Backend.", queue, nil),
	}
}

// Collector is a prometheus.Collector for any number of named Queues. Build
// it with NewCollector, name each Queue with Add, and register it once. The
// zero value is not usable. A Collector is safe for concurrent use: Queues
// may be added and removed while it is being scraped, and scrapes may
// overlap.
//
// A scrape calls Stats and WaitHistogram on every Queue and nothing else;
// the two are read a moment apart, so under load the histogram's count may
// differ by a request or two from the served counter of the same scrape.
type Collector struct {
	d  descs // immutable
	mu sync.Mutex
	// queues in the order they were added; guarded by mu. Names are unique
	// and non-empty.
	queues []*entry
}

// entry is one named Queue.
type entry struct {
	name string
	q    *ginqueue.Queue
	// seen holds every priority that has had a waiter, so that its series
	// reads 0 rather than vanishing when its waiters are gone. Guarded by
	// Collector.mu.
	seen map[int]struct{}
}

// NewCollector returns a Collector with no Queues.
func NewCollector() *Collector { return &Collector{d: newDescs()} }

// Add exports q under the label queue=name. It returns an error naming name
// if name is empty or already added to this Collector, or if q is nil; then
// nothing changes. Adding after the Collector is registered is fine: the new
// series appear from the next scrape.
func (c *Collector) Add(name string, q *ginqueue.Queue) error {
	if name == "" {
		return fmt.Errorf("promqueue: queue name must not be empty")
	}
	if q == nil {
		return fmt.Errorf("promqueue: queue %q is nil", name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.ContainsFunc(c.queues, func(e *entry) bool { return e.name == name }) {
		return fmt.Errorf("promqueue: queue %q is already added", name)
	}
	c.queues = append(c.queues, &entry{name: name, q: q, seen: map[int]struct{}{}})
	return nil
}

// Remove stops exporting the Queue added as name, and reports whether there
// was one. Its series disappear from the next scrape.
func (c *Collector) Remove(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.queues)
	c.queues = slices.DeleteFunc(c.queues, func(e *entry) bool { return e.name == name })
	return len(c.queues) < n
}

// Describe implements prometheus.Collector. It sends the same twelve
// descriptors whatever Queues are added, which is what lets Add and Remove
// run after registration.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	d := &c.d
	for _, desc := range []*prometheus.Desc{d.running, d.limit, d.queued, d.queuedByPriority,
		d.oldestWait, d.drainRate, d.noLoadLatency, d.requests, d.abandoned, d.wait, d.unavailable, d.outages} {
		ch <- desc
	}
}

// Collect implements prometheus.Collector: it reads every Queue's Stats and
// WaitHistogram now. Neither waits for the Queue's lock.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	var ms []prometheus.Metric
	c.mu.Lock()
	for _, e := range c.queues {
		ms = e.collect(&c.d, ms)
	}
	c.mu.Unlock()
	// Sent outside mu: a slow reader of ch must not hold up Add or another
	// scrape.
	for _, m := range ms {
		ch <- m
	}
}

// collect appends e's metrics to ms. Requires Collector.mu held (for seen).
func (e *entry) collect(d *descs, ms []prometheus.Metric) []prometheus.Metric {
	st := e.q.Stats()
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ms = append(ms, prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, append([]string{e.name}, labels...)...))
	}
	gauge(d.running, float64(st.Running))
	gauge(d.limit, float64(st.Limit))
	gauge(d.queued, float64(st.Queued))
	gauge(d.oldestWait, st.OldestWait.Seconds())
	gauge(d.drainRate, st.DrainRate)
	gauge(d.noLoadLatency, st.NoLoadLatency.Seconds())
	unavailable := 0.0
	if st.Unavailable {
		unavailable = 1
	}
	gauge(d.unavailable, unavailable)
	ms = append(ms, prometheus.MustNewConstMetric(d.outages, prometheus.CounterValue, float64(st.Outages), e.name))

	byPriority := make(map[int]int, len(e.seen)+len(st.QueuedByPriority))
	for p := range e.seen {
		byPriority[p] = 0
	}
	for _, pc := range st.QueuedByPriority {
		byPriority[pc.Priority] += pc.Queued
		e.seen[pc.Priority] = struct{}{}
	}
	for p, n := range byPriority {
		gauge(d.queuedByPriority, float64(n), strconv.Itoa(p))
	}

	for o := ginqueue.Outcome(0); o.String() != "unknown"; o++ {
		ms = append(ms, prometheus.MustNewConstMetric(d.requests, prometheus.CounterValue,
			float64(st.Count(o)), e.name, o.String()))
	}

	ms = append(ms, prometheus.MustNewConstMetric(d.abandoned, prometheus.CounterValue, float64(st.Abandoned), e.name))

	h := e.q.WaitHistogram()
	bounds := ginqueue.WaitBuckets()
	buckets := make(map[float64]uint64, len(bounds))
	for i, le := range bounds {
		buckets[le] = h.Counts[i]
	}
	return append(ms, prometheus.MustNewConstHistogram(d.wait, h.Count, h.Sum, buckets, e.name))
}
