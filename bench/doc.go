// Package bench measures ginqueue side by side with its peers on the same
// work, in one run, and renders the result as BENCHMARKS.md and an SVG
// timeline.
//
// Every variant guards the same gin route with the same MaxConcurrent, queue
// bound, queue timeout and handler:
//
//   - bare: the route with no throttle, the floor;
//   - ginqueue: this repository's middleware;
//   - chi: go-chi/chi v5 middleware.ThrottleWithOpts wrapping the gin engine;
//   - x/sync: a gin middleware on golang.org/x/sync/semaphore with an atomic
//     count of waiters and a per-request context timeout;
//   - seed: a Go port of the seed lesson's queueThrottle (see seed.go).
//
// Two more sections measure ginqueue against itself and its Redis backend:
// features.go runs the harnesses of metrics 1, 2 and 7 on ginqueue with
// Priority + FlowKey, ServerTiming + a scraped promqueue Collector, or an
// adaptive limit, against plain ginqueue (section 10); redis.go measures the
// redisqueue backend against the Redis at REDIS_ADDR, or says plainly that
// none answered (section 11).
//
// The metrics are described on their functions in metrics.go; Run runs them
// all, alternating the variants within each round, and WriteMarkdown and
// WriteTimelineSVG render the result. The module is separate from ginqueue so
// that ginqueue's users never download the peers.
//
// Go benchmarks for the per-operation metrics are in bench_test.go, for
// comparing two runs with benchstat:
//
//	go test -run '^$' -bench . -count 10 . > old.txt
package bench
