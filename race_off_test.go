//go:build !race

package ginqueue_test

const raceEnabled = false
