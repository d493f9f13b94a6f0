//go:build race

package redisqueue_test

// raceEnabled: under the race detector, hundreds of replicas in one process
// are too slow for the figures some scale tests measure.
const raceEnabled = true
