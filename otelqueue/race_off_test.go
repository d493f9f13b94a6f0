//go:build !race

package otelqueue_test

const raceEnabled = false
