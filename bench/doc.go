// Package bench holds the Go benchmarks of ginqueue and its peers, for
// comparing two versions of ginqueue with benchstat:
//
//	go test -run '^$' -bench 'Uncontended|Handoff|Feature' -count 10 . > old.txt
//
// The variants, harnesses and runner are in internal/suite, the rendering of
// BENCHMARKS.md and its charts (the seed burst, goodput under overload) in
// internal/render; cmd/report runs the whole suite (make bench) and
// cmd/adaptivechart draws docs/adaptive.svg from a root-package test (make
// adaptive-chart). The module is separate from ginqueue so that ginqueue's
// users never download the peers.
package bench
