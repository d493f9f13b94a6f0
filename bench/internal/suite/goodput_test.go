package suite

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestFillTimeAndWarmUp(t *testing.T) {
	full, smoke := FullPlan(), SmokePlan()
	for _, tt := range []struct {
		plan Plan
		load int
		want time.Duration
	}{
		{full, 1, full.GoodputWarmUp},
		{full, 2, 2250 * time.Millisecond}, // fills at 2 s
		{full, 5, 1500 * time.Millisecond}, // fills at 1.25 s
		{smoke, 5, smoke.GoodputWarmUp},
	} {
		if got := GoodputWarmUp(tt.plan, tt.load); got != tt.want {
			t.Errorf("GoodputWarmUp(smoke=%v, %d) = %v, want %v", tt.plan.Smoke, tt.load, got, tt.want)
		}
	}
}

// TestSendOnce: each way a request can end, against a real server on
// loopback, and the hang-up reaches the server's request context.
func TestSendOnce(t *testing.T) {
	hungUp := make(chan time.Duration, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write([]byte("ok"))
		case "/full":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/hang":
			t0 := time.Now()
			select {
			case <-r.Context().Done():
				hungUp <- time.Since(t0)
			case <-time.After(5 * time.Second):
				hungUp <- -1
			}
		}
	}))
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{}}
	const patience = 100 * time.Millisecond
	for _, tt := range []struct {
		path string
		want outcome
	}{
		{"/ok", delivered},
		{"/full", refused},
		{"/hang", gaveUp},
	} {
		t.Run(tt.path[1:], func(t *testing.T) {
			at := time.Now()
			o, end, latency, err := sendOnce(context.Background(), c, srv.URL+tt.path, at, at.Add(patience))
			if o != tt.want || err != nil {
				t.Fatalf("outcome %d, %v; want %d", o, err, tt.want)
			}
			if o == delivered && (latency <= 0 || latency != end.Sub(at)) {
				t.Errorf("latency %v, end %v after the send", latency, end.Sub(at))
			}
			if o == gaveUp && end.Sub(at) < patience {
				t.Errorf("gave up after %v, before its deadline", end.Sub(at))
			}
		})
	}
	if d := <-hungUp; d < 0 || d > time.Second {
		t.Errorf("the server saw the hang-up after %v", d)
	}
	if o, _, _, err := sendOnce(context.Background(), c, "http://127.0.0.1:1/", time.Now(), time.Now().Add(patience)); o != failed || err == nil {
		t.Errorf("nobody listening: outcome %d, %v; want failed", o, err)
	}
}

// TestGoodputPoint: a short point at 1× through each variant delivers most of what it is offered, and counts every
// outcome.
func TestGoodputPoint(t *testing.T) {
	for _, v := range GoodputVariants() {
		t.Run(v.ID, func(t *testing.T) {
			c, err := goodputPoint(v, 1, 50*time.Millisecond, 150*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if c.offered != 120 || c.delivered == 0 || c.errs > 0 || c.runs == 0 || len(c.latencies) != c.delivered {
				t.Errorf("offered %d, delivered %d, refused %d, gave up %d, failed %d (%v), handlers %d",
					c.offered, c.delivered, c.refused, c.gaveUp, c.errs, c.firstErr, c.runs)
			}
			if s := c.share(); s <= 0 || s > 1.1 {
				t.Errorf("goodput %.2f of C", s)
			}
		})
	}
}
