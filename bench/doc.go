// Package bench holds the Go benchmarks of ginqueue and its peers, for
// benchstat (see BenchmarkUncontended). The variants, harnesses, runner and
// report are in internal/suite; cmd/report runs the suite (make bench) and
// cmd/adaptivechart draws docs/adaptive.svg (make adaptive-chart). The
// module is apart from ginqueue so that its users never download the peers.
package bench
