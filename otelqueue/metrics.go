package otelqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
)

// ScopeName is the instrumentation scope of the Meter that Metrics takes
// from its MeterProvider: the module's import path.
const ScopeName = "github.com/ginqueue/ginqueue/otelqueue"

// The attribute keys, on metrics and spans.
const (
	// QueueKey names the Queue: the name given to Metrics.Add or SpanEvents.
	QueueKey = attribute.Key("ginqueue.queue")
	// OutcomeKey is an Outcome's String: served, queue_full, queue_timeout,
	// canceled, closed or panic.
	OutcomeKey = attribute.Key("ginqueue.outcome")
	// PriorityKey is a request's priority (Config.Priority).
	PriorityKey = attribute.Key("ginqueue.priority")
	// PercentileKey is the percentile of ginqueue.wait.percentile: 50, 90
	// or 99.
	PercentileKey = attribute.Key("ginqueue.percentile")
	// UpperBoundKey is the upper bound, in seconds, of a bucket of
	// ginqueue.wait.bucket, as Prometheus writes it ("0.25", "+Inf").
	UpperBoundKey = attribute.Key("ginqueue.wait.upper_bound")
	// WaitKey is how long a request waited in the queue, in seconds.
	WaitKey = attribute.Key("ginqueue.wait.duration")
	// ArrivalQueuedKey is how many requests were waiting when a request
	// arrived (Decision.Queued).
	ArrivalQueuedKey = attribute.Key("ginqueue.arrival.queued")
	// CostKey is the slots a request asked for (Decision.Cost).
	CostKey = attribute.Key("ginqueue.cost")
)

// instruments are a Metrics' instruments, created once by NewMetrics and
// never changed.
type instruments struct {
	usage, limit, queued, queuedByPriority, unavailable metric.Int64ObservableUpDownCounter
	requests, abandoned, bucket, outages                metric.Int64ObservableCounter
	oldestWait, percentile, drainRate, noLoadLatency    metric.Float64ObservableGauge
	waitTime                                            metric.Float64ObservableCounter
}

// Metrics reports any number of named Queues to an OpenTelemetry
// MeterProvider. Build it with NewMetrics, name each Queue with Add, and
// call Unregister when done. The zero value is not usable. A Metrics is safe
// for concurrent use: Queues may be added and removed while the provider
// collects, collections may overlap, and Unregister may run during one.
//
// A collection calls Stats and WaitHistogram on every Queue and nothing
// else; the two are read a moment apart, so under load the +Inf bucket of
// ginqueue.wait.bucket may differ by a request or two from the served
// requests of the same collection.
type Metrics struct {
	inst instruments         // immutable
	reg  metric.Registration // immutable; its Unregister is idempotent
	mu   sync.Mutex          // serializes Add and Remove
	// queues in the order they were added, replaced whole (never changed in
	// place) under mu, so that a collection reads them without a lock.
	// Names are unique and non-empty.
	queues  atomic.Pointer[[]*entry]
	stopped atomic.Bool // set by Unregister; then nothing is reported
}

// entry is one named Queue, with the measurement options it needs, built
// once by Add.
type entry struct {
	name string
	q    *ginqueue.Queue
	// Each option in a slice of its own, passed with ..., so that an
	// observation allocates no slice for its variadic options.
	queue    []metric.ObserveOption    // {ginqueue.queue}
	outcomes [][]metric.ObserveOption  // by Outcome, with ginqueue.outcome
	buckets  [][]metric.ObserveOption  // by bound of WaitBuckets, then +Inf
	pcts     [3][]metric.ObserveOption // p50, p90, p99

	mu sync.Mutex // guards seen; collections may overlap
	// seen holds every priority that has had a waiter, with its option, so
	// that it reads 0 rather than vanishing when its waiters are gone.
	seen map[int][]metric.ObserveOption
}

// NewMetrics creates the instruments on a Meter of provider (scope
// ScopeName) and registers the one callback that reads the Queues. It
// returns an error if provider is nil or the provider refuses an
// instrument or the callback; then nothing is registered. Build one
// Metrics per provider: two on one provider share its instruments, and a
// name added to both is one series whose sums add up the two Queues and
// whose gauges keep one of them.
func NewMetrics(provider metric.MeterProvider) (*Metrics, error) {
	if provider == nil {
		return nil, errors.New("otelqueue: MeterProvider is nil")
	}
	meter := provider.Meter(ScopeName)
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	upDown := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		i, err := meter.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return i
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		i, err := meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return i
	}
	gauge := func(name, unit, desc string) metric.Float64ObservableGauge {
		i, err := meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return i
	}
	var in instruments
	in.usage = upDown("ginqueue.slot.usage", "{slot}",
		"Slots of the queue held now: one per running request, or its Config.Cost.")
	in.limit = upDown("ginqueue.slot.limit", "{slot}",
		"Slots of the queue: how many requests of cost 1 may run at once.")
	in.queued = upDown("ginqueue.request.queued", "{request}",
		"Requests waiting for a slot now.")
	in.queuedByPriority = upDown("ginqueue.request.queued_by_priority", "{request}",
		"Requests waiting for a slot now, by priority; 0 for a priority seen before that has no waiter.")
	in.unavailable = upDown("ginqueue.backend.unavailable", "{backend}",
		"1 while the queue's Backend cannot reach the store it shares with other replicas and applies its fallback policy, else 0.")
	in.requests = counter("ginqueue.requests", "{request}",
		"Requests that passed the queue, by outcome: served, queue_full, queue_timeout, canceled, closed or panic.")
	in.abandoned = counter("ginqueue.abandoned_requests", "{request}",
		"Served requests whose client had gone by the time the handler returned: work nobody received. Part of the served outcome.")
	in.bucket = counter("ginqueue.wait.bucket", "{request}",
		"Served requests that waited in the queue at most ginqueue.wait.upper_bound seconds (cumulative; +Inf counts them all); those that ran at once count as 0.")
	in.outages = counter("ginqueue.backend.outages", "{outage}",
		"Times the queue's Backend turned unavailable since it started; always 0 for the in-memory Backend.")
	in.oldestWait = gauge("ginqueue.wait.oldest", "s",
		"How long the oldest waiting request has waited so far; 0 when nobody waits.")
	in.percentile = gauge("ginqueue.wait.percentile", "s",
		"Percentiles of the queue waits of the requests served in the last minute, those that ran at once counting as 0.")
	in.drainRate = gauge("ginqueue.drain_rate", "{request}/s",
		"Requests finished per second over about the last ten seconds.")
	in.noLoadLatency = gauge("ginqueue.adaptive.no_load_latency", "s",
		"Handler time the adaptive limit measured with few requests in flight; 0 without Config.Adaptive or until measured.")
	var err error
	in.waitTime, err = meter.Float64ObservableCounter("ginqueue.wait.time", metric.WithUnit("s"),
		metric.WithDescription("Time served requests waited in the queue for a slot, added up."))
	check(err)
	if len(errs) > 0 {
		return nil, fmt.Errorf("otelqueue: creating the instruments: %w", errors.Join(errs...))
	}

	m := &Metrics{inst: in}
	m.queues.Store(&[]*entry{})
	m.reg, err = meter.RegisterCallback(m.observe,
		in.usage, in.limit, in.queued, in.queuedByPriority, in.unavailable,
		in.requests, in.abandoned, in.bucket, in.outages,
		in.oldestWait, in.percentile, in.drainRate, in.noLoadLatency, in.waitTime)
	if err != nil {
		if m.reg != nil {
			_ = m.reg.Unregister()
		}
		return nil, fmt.Errorf("otelqueue: registering the callback: %w", err)
	}
	return m, nil
}

// Add reports q with the attribute ginqueue.queue=name. It returns an error
// naming name if name is empty or already added to this Metrics, if q is
// nil, or after Unregister; then nothing changes. The Queue is reported
// from the next collection. Its counters start from the Queue's own: do not
// add a new Queue under the name of one removed, or its counters would go
// down.
func (m *Metrics) Add(name string, q *ginqueue.Queue) error {
	if name == "" {
		return errors.New("otelqueue: queue name must not be empty")
	}
	if q == nil {
		return fmt.Errorf("otelqueue: queue %q is nil", name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped.Load() {
		return fmt.Errorf("otelqueue: queue %q not added: Unregister was called", name)
	}
	old := *m.queues.Load()
	if slices.ContainsFunc(old, func(e *entry) bool { return e.name == name }) {
		return fmt.Errorf("otelqueue: queue %q is already added", name)
	}
	queues := append(slices.Clip(old), newEntry(name, q))
	m.queues.Store(&queues)
	return nil
}

// Remove stops reporting the Queue added as name, and reports whether there
// was one. It is not reported from the next collection on.
func (m *Metrics) Remove(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.queues.Load()
	queues := slices.DeleteFunc(slices.Clone(old), func(e *entry) bool { return e.name == name })
	if len(queues) == len(old) {
		return false
	}
	m.queues.Store(&queues)
	return true
}

// Unregister removes the callback from the MeterProvider: from then on
// nothing is reported, and Add refuses. A collection running meanwhile may
// still report; Unregister waits for it where the provider does (the SDK
// does). Calling it again does nothing and returns nil. Its error is the
// provider's.
func (m *Metrics) Unregister() error {
	if m.stopped.Swap(true) {
		return nil
	}
	if err := m.reg.Unregister(); err != nil {
		return fmt.Errorf("otelqueue: unregistering the callback: %w", err)
	}
	return nil
}

// newEntry builds the entry of q, named name, with its options.
func newEntry(name string, q *ginqueue.Queue) *entry {
	queue := QueueKey.String(name)
	e := &entry{
		name:  name,
		q:     q,
		queue: opts(attribute.NewSet(queue)),
		seen:  map[int][]metric.ObserveOption{},
	}
	for o := ginqueue.Outcome(0); o.String() != "unknown"; o++ {
		e.outcomes = append(e.outcomes, opts(attribute.NewSet(queue, OutcomeKey.String(o.String()))))
	}
	for _, le := range ginqueue.WaitBuckets() {
		e.buckets = append(e.buckets, opts(attribute.NewSet(queue,
			UpperBoundKey.String(strconv.FormatFloat(le, 'g', -1, 64)))))
	}
	e.buckets = append(e.buckets, opts(attribute.NewSet(queue, UpperBoundKey.String("+Inf"))))
	for i, p := range [...]int64{50, 90, 99} {
		e.pcts[i] = opts(attribute.NewSet(queue, PercentileKey.Int64(p)))
	}
	return e
}

// observe is the callback: it reads every Queue now. Neither Stats nor
// WaitHistogram waits behind the Queue's waiters, and the list of Queues is
// read without a lock, so Add, Remove and Unregister never wait for it nor
// it for them.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	if m.stopped.Load() {
		return nil
	}
	for _, e := range *m.queues.Load() {
		e.observe(&m.inst, o)
	}
	return nil
}

// observe reports e's Queue to o.
func (e *entry) observe(in *instruments, o metric.Observer) {
	st := e.q.Stats()
	o.ObserveInt64(in.usage, int64(st.Running), e.queue...)
	o.ObserveInt64(in.limit, int64(st.Limit), e.queue...)
	o.ObserveInt64(in.queued, int64(st.Queued), e.queue...)
	unavailable := int64(0)
	if st.Unavailable {
		unavailable = 1
	}
	o.ObserveInt64(in.unavailable, unavailable, e.queue...)
	o.ObserveInt64(in.outages, count(st.Outages), e.queue...)
	o.ObserveInt64(in.abandoned, count(st.Abandoned), e.queue...)
	o.ObserveFloat64(in.oldestWait, st.OldestWait.Seconds(), e.queue...)
	o.ObserveFloat64(in.drainRate, st.DrainRate, e.queue...)
	o.ObserveFloat64(in.noLoadLatency, st.NoLoadLatency.Seconds(), e.queue...)
	for i, p := range [...]float64{st.WaitP50.Seconds(), st.WaitP90.Seconds(), st.WaitP99.Seconds()} {
		o.ObserveFloat64(in.percentile, p, e.pcts[i]...)
	}

	for i, opts := range e.outcomes {
		o.ObserveInt64(in.requests, count(st.Count(ginqueue.Outcome(i))), opts...)
	}

	e.observePriorities(in, o, st.QueuedByPriority)

	h := e.q.WaitHistogram()
	for i, n := range h.Counts {
		o.ObserveInt64(in.bucket, count(n), e.buckets[i]...)
	}
	o.ObserveInt64(in.bucket, count(h.Count), e.buckets[len(h.Counts)]...)
	o.ObserveFloat64(in.waitTime, h.Sum, e.queue...)
}

// observePriorities reports the waiters of every priority seen so far, 0
// for those that have none now.
func (e *entry) observePriorities(in *instruments, o metric.Observer, split []backend.PriorityCount) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, pc := range split {
		if _, ok := e.seen[pc.Priority]; !ok {
			e.seen[pc.Priority] = opts(attribute.NewSet(QueueKey.String(e.name), PriorityKey.Int(pc.Priority)))
		}
	}
	for p, opt := range e.seen {
		n := 0
		for _, pc := range split {
			if pc.Priority == p {
				n += pc.Queued
			}
		}
		o.ObserveInt64(in.queuedByPriority, int64(n), opt...)
	}
}

// opts is the observe options of one attribute set.
func opts(set attribute.Set) []metric.ObserveOption {
	return []metric.ObserveOption{metric.WithAttributeSet(set)}
}

// count converts a counter to what an Int64 instrument takes; no Queue
// lives to count past math.MaxInt64.
func count(n uint64) int64 { return int64(min(n, math.MaxInt64)) }
