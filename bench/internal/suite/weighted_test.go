package suite

import (
	"net/http"
	"testing"
	"time"
)

// TestWeightedRun: a short run of section 13 serves every request of both
// classes, its handlers never hold more slots than the limit, and every
// wait runs from the arrival to the handler's start.
func TestWeightedRun(t *testing.T) {
	c, err := weightedRun(20*time.Millisecond, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if c.maxRunning < 1 || c.maxRunning > WeightedSlots {
		t.Errorf("most slots running %d, want 1 to %d", c.maxRunning, WeightedSlots)
	}
	var light, heavy int
	for _, s := range c.samples {
		if s.status != http.StatusOK {
			t.Fatalf("a request of cost %d got %d", s.cost(), s.status)
		}
		if s.start.Before(s.arrive) || s.end.Sub(s.start) < WeightedWork {
			t.Fatalf("arrived %v, started %v, ended %v", s.arrive, s.start, s.end)
		}
		if s.heavy {
			heavy++
		} else {
			light++
		}
	}
	if light == 0 || heavy == 0 {
		t.Errorf("%d light and %d heavy requests in the window, want some of each", light, heavy)
	}
}
