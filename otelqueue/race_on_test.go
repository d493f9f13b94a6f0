//go:build race

package otelqueue_test

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// allocation counts of a recording span are only meaningful without it.
const raceEnabled = true
