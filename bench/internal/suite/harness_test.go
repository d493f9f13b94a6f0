package suite

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func newBareWith(s *seedQueue) (http.Handler, func()) {
	r := engine(s.Handler)
	r.GET("/", noContent)
	return r, s.Close
}

func serveOnce(h http.Handler) int {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	return w.Code
}

// TestVariantsServe: every variant serves a lone request with the handler's
// status.
func TestVariantsServe(t *testing.T) {
	for _, v := range Variants() {
		t.Run(v.ID, func(t *testing.T) {
			h, stop := v.New(UncontendedLimits, noContent)
			defer stop()
			if code := serveOnce(h); code != http.StatusNoContent {
				t.Errorf("status %d, want 204", code)
			}
		})
	}
}

// TestHarnesses runs each measurement on tiny sizes for the variants that
// do not wait for a tick, and checks that the figures are plausible.
func TestHarnesses(t *testing.T) {
	for _, v := range throttling(Variants()) {
		if v.Slow {
			continue
		}
		t.Run(v.ID, func(t *testing.T) {
			if e, err := scheduleEfficiency(v, 16); err != nil || e <= 0 || e > 1.05 {
				t.Errorf("scheduleEfficiency = %v, %v", e, err)
			}
			if s, err := grantLatency(v, 3); err != nil || len(s) != 3 {
				t.Errorf("grantLatency = %v, %v", s, err)
			}
			if s, err := timeoutLateness(v, 3); err != nil || len(s) != 3 || slicesMin(s) < -time.Millisecond {
				t.Errorf("timeoutLateness = %v, %v", s, err)
			}
			if heap, stack, err := memoryPerWaiter(v, 50); err != nil || math.IsNaN(heap+stack) {
				t.Errorf("memoryPerWaiter = %v, %v, %v", heap, stack, err)
			}
			if c, err := growthCost(v, 10, 20*time.Millisecond); err != nil || c <= 0 {
				t.Errorf("growthCost = %v, %v", c, err)
			}
			if x, err := loopbackRate(v, 1, 20*time.Millisecond); err != nil || x <= 0 {
				t.Errorf("loopbackRate = %v, %v", x, err)
			}
		})
	}
	if b, err := backendHeapPerWaiter(50); err != nil || math.IsNaN(b) {
		t.Errorf("backendHeapPerWaiter = %v, %v", b, err)
	}
}

// TestFeatureVariants: every feature variant serves a lone request, the
// metrics variant with its Server-Timing header, and the feature variants
// go through the growth harness with their flows and priorities.
func TestFeatureVariants(t *testing.T) {
	for _, spread := range []bool{true, false} {
		for _, v := range FeatureVariants(10, spread) {
			t.Run(fmt.Sprintf("%s/spread=%v", v.ID, spread), func(t *testing.T) {
				h, stop := v.New(HandoffLimits, noContent)
				defer stop()
				w := httptest.NewRecorder()
				h.ServeHTTP(w, v.request(3, 4))
				if w.Code != http.StatusNoContent {
					t.Errorf("status %d, want 204", w.Code)
				}
				if st := w.Header().Get("Server-Timing"); (v.Name == Observed) != (st != "") {
					t.Errorf("Server-Timing %q", st)
				}
				if c, err := growthCost(v, 10, 20*time.Millisecond); err != nil || c <= 0 {
					t.Errorf("growthCost = %v, %v", c, err)
				}
			})
		}
	}
}

// TestFeatureRequest: client c is flow c mod flows, and its requests cycle
// through the priorities.
func TestFeatureRequest(t *testing.T) {
	v := FeatureVariants(10, true)[1]
	rs := v.requests(13)
	if len(rs) != priorityClasses {
		t.Fatalf("%d requests, want %d", len(rs), priorityClasses)
	}
	for i, r := range rs {
		if f, p := r.Header.Get(headerFlow), r.Header.Get(headerPriority); f != "3" || p != fmt.Sprint(i) {
			t.Errorf("request %d: flow %q priority %q, want 3 and %d", i, f, p, i)
		}
	}
	if n := len(Variants()[1].requests(0)); n != 1 {
		t.Errorf("a table variant cycles through %d requests, want 1", n)
	}
}

func slicesMin(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = min(m, d)
	}
	return m
}
