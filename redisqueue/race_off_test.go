//go:build !race

package redisqueue_test

const raceEnabled = false
