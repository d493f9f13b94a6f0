// MinTimeLeft's handler time estimate.

package ginqueue

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// handlerMeter, MinTimeLeft's handler time: the first sample is the
// estimate; a slower one moves it a quarter of the way, a faster one a
// sixteenth; an idle period between samples changes nothing, and after a
// slowdown a few requests bring it most of the way.
func TestHandlerMeter(t *testing.T) {
	var m handlerMeter
	_, ok := m.get()
	assert.False(t, ok, "nothing measured")
	m.sample(100 * time.Millisecond)
	got, ok := m.get()
	assert.True(t, ok)
	assert.Equal(t, 100*time.Millisecond, got)
	m.sample(500 * time.Millisecond)
	got, _ = m.get()
	assert.Equal(t, 200*time.Millisecond, got, "a quarter of the way up")
	m.sample(40 * time.Millisecond)
	got, _ = m.get()
	assert.Equal(t, 190*time.Millisecond, got, "a sixteenth of the way down")
	m.sample(-time.Second) // a clock step: counts as 0
	got, _ = m.get()
	assert.Equal(t, 190*time.Millisecond-190*time.Millisecond/16, got)

	// Idle gaps then bursts: many fast requests, a long idle, then 1 s
	// handlers. The estimate passes 90% of the new time within 8 of them.
	var b handlerMeter
	for range 1000 {
		b.sample(10 * time.Millisecond)
	}
	// An idle period is no sample: nothing decays meanwhile.
	for i := range 8 {
		b.sample(time.Second)
		if got, _ := b.get(); i == 7 {
			assert.Greater(t, got, 900*time.Millisecond, "after 8 slow requests")
		}
	}
	// Back to fast: it comes down, slowly (an overestimate only moves
	// grants to waiters with more time left).
	for range 16 {
		b.sample(10 * time.Millisecond)
	}
	got, _ = b.get()
	assert.Greater(t, got, 300*time.Millisecond)
	assert.Less(t, got, 500*time.Millisecond)
}
