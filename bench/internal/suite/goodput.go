package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
)

// GoodputCapacity is what section 12's slots can serve, in requests per
// second: the unit of the offered loads and of the goodput.
func (p Plan) GoodputCapacity() int {
	return p.GoodputLimits.MaxConcurrent * int(time.Second/p.GoodputWork)
}

// GoodputWarmUpAt is the load before a point's window: with GoodputFill,
// until a FIFO queue holds requests older than the patience, plus 250 ms.
func (p Plan) GoodputWarmUpAt(load int) time.Duration {
	if !p.GoodputFill || load <= 1 {
		return p.GoodputWarmUp
	}
	return max(p.GoodputWarmUp, p.GoodputPatience*time.Duration(load)/time.Duration(load-1)+250*time.Millisecond)
}

// How a goodput request ended, then the other kinds of figures a point
// returns: latencies (ns), window and handler time (s), runs, offered.
const (
	delivered = iota // 200, received in full before the client gave up
	refused          // any other status received in time
	gaveUp           // the client gave up first
	failed           // failed otherwise
	gLatency
	gWindow
	gBusy
	gRuns
	gOffered
)

// sendOnce is one open-loop request, given up at deadline; with a patience
// header it sends there the seconds it will still wait. It returns how it
// ended, when, and the error of a failed one.
func sendOnce(base context.Context, c *http.Client, url, patience string, deadline time.Time) (int, time.Time, error) {
	ctx, cancel := context.WithDeadline(base, deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return failed, time.Now(), err
	}
	if patience != "" {
		req.Header.Set(patience, strconv.FormatFloat(max(time.Until(deadline).Seconds(), 0), 'f', 6, 64))
	}
	resp, err := c.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	end := time.Now()
	switch {
	// A dial can fail on the deadline before the context's timer has
	// fired: net.Dialer sets it on the socket.
	case !end.Before(deadline), err != nil && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)):
		return gaveUp, end, nil
	case err != nil:
		return failed, end, err
	case resp.StatusCode == http.StatusOK:
		return delivered, end, nil
	}
	return refused, end, nil
}

// openConns opens n connections for the Transport to take before it
// dials: a busy service's clients have them open when a surge begins.
func openConns(addr string, n int) (chan net.Conn, error) {
	conns := make(chan net.Conn, n)
	var wg sync.WaitGroup
	var first atomic.Value
	for range n {
		wg.Go(func() {
			if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err != nil {
				first.CompareAndSwap(nil, err)
			} else {
				conns <- c
			}
		})
	}
	wg.Wait()
	close(conns)
	if err, _ := first.Load().(error); err != nil {
		for c := range conns {
			c.Close()
		}
		return nil, err
	}
	return conns, nil
}

// goodputPoint offers v load × capacity, then counts the requests that end
// in the window; latency and deadline run from when a request was due.
func (p Plan) goodputPoint(v Variant, load int) ([][]float64, error) {
	runtime.GC() // the previous point's garbage is collected on its own time
	var busy, runs, inflight atomic.Int64
	h, stop := v.New(p.GoodputLimits, func(c *gin.Context) {
		t := time.Now()
		time.Sleep(p.GoodputWork) // waiting on something else: a database, say
		c.String(http.StatusOK, "ok")
		busy.Add(int64(time.Since(t))) // a sleep overruns on a loaded machine
		runs.Add(1)
	})
	defer stop()
	addr, closeSrv, err := listen(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inflight.Add(1)
		defer inflight.Add(-1)
		h.ServeHTTP(w, r)
	}))
	if err != nil {
		return nil, err
	}
	defer closeSrv()
	rate := int64(load * p.GoodputCapacity())
	warm, err := openConns(addr, int(rate/10))
	if err != nil {
		return nil, err
	}
	defer func() {
		for c := range warm {
			c.Close()
		}
	}()
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{MaxIdleConnsPerHost: p.GoodputIdleConns, DisableCompression: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if c, ok := <-warm; ok {
				return c, nil
			}
			return dialer.DialContext(ctx, network, addr)
		}}
	defer tr.CloseIdleConnections()
	client, url := &http.Client{Transport: tr}, "http://"+addr+"/"

	var mu sync.Mutex
	s := make([][]float64, gOffered+1)
	var counts [failed + 1]int
	var firstErr error
	start := time.Now()
	from, to := start.Add(p.GoodputWarmUpAt(load)), start.Add(p.GoodputWarmUpAt(load)+p.GoodputWindow)
	base, cancelAll := context.WithCancel(context.Background())
	var clients sync.WaitGroup
	var busy0, runs0 int64
	offered := 0
	for i := int64(0); ; i++ {
		at := start.Add(time.Duration(i * int64(time.Second) / rate))
		if !at.Before(to) {
			break
		}
		if !at.Before(from) {
			if offered == 0 {
				busy0, runs0 = busy.Load(), runs.Load()
			}
			offered++
		}
		time.Sleep(time.Until(at))
		clients.Go(func() {
			o, end, err := sendOnce(base, client, url, v.PatienceHeader, at.Add(p.GoodputPatience))
			if end.Before(from) || !end.Before(to) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if counts[o]++; o == delivered {
				s[gLatency] = append(s[gLatency], float64(end.Sub(at)))
			} else if o == failed && firstErr == nil {
				firstErr = err
			}
		})
	}
	time.Sleep(time.Until(to))
	// Everything still waiting ends now and is not counted: the clients'
	// connections close, and with them the server's request contexts.
	b, n := time.Duration(busy.Load()-busy0), runs.Load()-runs0
	cancelAll()
	closeSrv()
	stop()
	clients.Wait()
	if !waitFor(10*time.Second, func() bool { return inflight.Load() == 0 }) {
		return nil, fmt.Errorf("%d handlers still running 10 s after the clients left", inflight.Load())
	}
	for o, c := range counts {
		s[o] = []float64{float64(c)}
	}
	s[gWindow], s[gBusy], s[gRuns], s[gOffered] = []float64{p.GoodputWindow.Seconds()}, []float64{b.Seconds()}, []float64{float64(n)}, []float64{float64(offered)}
	if counts[failed] > 0 {
		return s, fmt.Errorf("%d of %d requests failed other than by giving up, first: %v", counts[failed], offered, firstErr)
	}
	return s, nil
}

// goodputMetric names section 12's row of what at load.
func goodputMetric(load int, what string) string { return fmt.Sprintf("12. %d× C: %s", load, what) }

// goodput is section 12: every variant at every load, the variants
// alternating within each round, each point's counts pooled over the rounds.
func (r *runner) goodput() {
	vs := GoodputVariants()
	t := &r.res.Goodput
	t.Cols = names(vs)
	c := float64(r.GoodputCapacity())
	total := func(k int) func([][]float64) float64 { return func(s [][]float64) float64 { return sum(s[k]) } }
	ended := func(s [][]float64) float64 {
		return sum(s[delivered]) + sum(s[refused]) + sum(s[gaveUp]) + sum(s[failed])
	}
	share := func(k int) func([][]float64) float64 {
		return func(s [][]float64) float64 { return total(k)(s) / ended(s) }
	}
	pooled := map[int]map[string][][]float64{}
	for round := range r.GoodputRounds { // the loads within a round, as the variants
		for _, load := range r.GoodputLoads {
			if pooled[load] == nil {
				pooled[load] = map[string][][]float64{}
			}
			r.round(pooled[load], goodputMetric(load, "goodput"), vs, round, func(round int, v Variant) ([][]float64, error) {
				s, err := r.goodputPoint(v, load)
				if err != nil && s != nil { // counted all the same
					r.fail(v.Name, goodputMetric(load, "goodput"), err)
					err = nil
				}
				if err == nil {
					r.logf("  round %d, %d×, %s: goodput %.1f%% of C, p99 %.1f ms, refused %.0f, gave up %.0f of %.0f", round+1, load, v.Name,
						100*s[delivered][0]/s[gWindow][0]/c, pct(gLatency, 0.99)(s)/1e6, s[refused][0], s[gaveUp][0], s[gOffered][0])
				}
				return s, err
			})
		}
	}
	for _, load := range r.GoodputLoads {
		addRows(t, []stat{
			{goodputMetric(load, "goodput"), "share of C", FormatShare, true, func(s [][]float64) float64 { return total(delivered)(s) / total(gWindow)(s) / c }},
			{goodputMetric(load, "delivered p50"), "", FormatDuration, false, pct(gLatency, 0.5)},
			{goodputMetric(load, "delivered p99"), "", FormatDuration, false, pct(gLatency, 0.99)},
			{goodputMetric(load, "refused"), "share of ended", FormatShare, false, share(refused)},
			{goodputMetric(load, "gave up"), "share of ended", FormatShare, false, share(gaveUp)},
			{goodputMetric(load, "ceiling, slots ÷ mean handler time"), "share of C", FormatShare, true, func(s [][]float64) float64 {
				return float64(r.GoodputLimits.MaxConcurrent) / (total(gBusy)(s) / total(gRuns)(s)) / c
			}},
		}, pooled[load])
	}
}
