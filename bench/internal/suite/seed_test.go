package suite

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestSeedBurst runs the seed lesson's 15-request test through every
// variant in a synctest bubble, where the seed port's 100 ms ticker and the
// handlers' sleeps cost no real time, and checks each outcome count. The
// 250 ms handlers keep every handler's end off the ticks, so the order of
// events is fixed.
func TestSeedBurst(t *testing.T) {
	const work, timeout = 250 * time.Millisecond, 5 * time.Second
	tests := []struct {
		variant                 string
		served, full, timedOut  int
		lastAtLeast, lastAtMost time.Duration
	}{
		{Bare, 15, 0, 0, work, work},
		{GinQueue, 13, 2, 0, 5 * work, 5 * work},
		{Chi, 13, 2, 0, 5 * work, 5 * work},
		{XSync, 13, 2, 0, 5 * work, 5 * work},
		// Admits on ticks 100, 400, 700, 1000 ms: 3, 3, 3, 1.
		{Seed, 10, 5, 0, 1250 * time.Millisecond, 1250 * time.Millisecond},
		// Two admissions on the first tick, one more at 400 ms, then the
		// leaked count blocks every slot; the 7 left expire on the first
		// tick past 5 s.
		{SeedAsWritten, 3, 5, 7, 5100 * time.Millisecond, 5100 * time.Millisecond},
	}
	byName := map[string]Variant{}
	for _, v := range timelineVariants() {
		byName[v.Name] = v
	}
	for _, tt := range tests {
		t.Run(byName[tt.variant].ID, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tl := seedBurst(byName[tt.variant], work, timeout)
				got := [3]int{tl.Count(OutcomeServed), tl.Count(OutcomeFull), tl.Count(OutcomeTimeout)}
				if want := [3]int{tt.served, tt.full, tt.timedOut}; got != want {
					t.Errorf("served, refused, timed out = %v, want %v", got, want)
				}
				if last := tl.Last(); last < tt.lastAtLeast || last > tt.lastAtMost {
					t.Errorf("last response at %v, want %v to %v", last, tt.lastAtLeast, tt.lastAtMost)
				}
			})
		})
	}
}

// TestSeedIdleDelay shows the cost the seed port adds at an idle server: a
// lone request waits for the next tick.
func TestSeedIdleDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSeedQueue(Limits{MaxConcurrent: 3, MaxQueue: 10, QueueTimeout: time.Second}, seedInterval, false)
		defer s.Close()
		time.Sleep(30 * time.Millisecond) // arrive between ticks
		h, stop := newBareWith(s)
		defer stop()
		start := time.Now()
		if code := serveOnce(h); code != 204 {
			t.Fatalf("status %d, want 204", code)
		}
		if d := time.Since(start); d != 70*time.Millisecond {
			t.Errorf("a lone request took %v, want 70ms (the wait for the next tick)", d)
		}
	})
}
