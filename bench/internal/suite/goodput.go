package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

// Section 12 offers a server more than it can serve, over real HTTP on
// loopback, and counts what its clients got in time. The scenario is the
// same for every variant: GoodputSlots slots, handlers that sleep
// GoodputWork, a generous queue (GoodputLimits, whose 10 s QueueTimeout is
// longer than any client waits: a common misconfiguration), and open-loop
// clients that send on a schedule whatever the answers and give up after
// GoodputPatience, closing the connection so that the server sees it.
const (
	GoodputSlots    = 8
	GoodputWork     = 10 * time.Millisecond
	GoodputPatience = time.Second
	// GoodputCapacity is what the slots can serve, in requests per second:
	// the unit of the offered loads and of the goodput.
	GoodputCapacity = GoodputSlots * int(time.Second/GoodputWork)
	// GoodputIdleConns bounds the clients' idle connections; it is above the
	// most requests in flight at once (5 × 800/s for 1 s), so that every
	// connection a response leaves idle is kept for the next request.
	GoodputIdleConns = 1 << 14
)

// GoodputLimits are the throttle settings of section 12.
var GoodputLimits = Limits{MaxConcurrent: GoodputSlots, MaxQueue: 10_000, QueueTimeout: 10 * time.Second}

// GoodputLoads are the offered loads of section 12, in multiples of
// GoodputCapacity.
var GoodputLoads = []int{1, 2, 5}

// Names of the goodput variants that are not in the main table.
const (
	GoodFIFO        = "ginqueue FIFO"
	GoodRejectEarly = "FIFO + RejectEarly"
	GoodCoDel       = "CoDel"
	GoodCoDelLIFO   = "CoDel + LIFO"
)

// GoodputVariants returns the columns of section 12, in column order: four
// configurations of ginqueue, then chi's ThrottleBacklog and the x/sync
// middleware with the same limit, backlog and timeout.
func GoodputVariants() []Variant {
	return []Variant{
		{Name: GoodFIFO, ID: "fifo", Throttles: true, New: newFeature(nil)},
		{Name: GoodRejectEarly, ID: "rejectearly", Throttles: true, New: newFeature(func(c *ginqueue.Config) { c.RejectEarly = true })},
		{Name: GoodCoDel, ID: "codel", Throttles: true, New: newCoDel(false)},
		{Name: GoodCoDelLIFO, ID: "codel-lifo", Throttles: true, New: newCoDel(true)},
		{Name: Chi, ID: "chi", Peer: true, Throttles: true, New: newChi},
		{Name: XSync, ID: "xsync", Peer: true, Throttles: true, New: newXSync},
	}
}

// newCoDel is ginqueue with Config.CoDel at its defaults (Target 5 ms,
// Interval 100 ms) and its LIFO switch set to lifo. Its drops are queue
// timeouts, answered 408.
func newCoDel(lifo bool) func(Limits, gin.HandlerFunc) (http.Handler, func()) {
	return newFeature(func(c *ginqueue.Config) { c.CoDel = &ginqueue.CoDel{LIFO: lifo} })
}

// GoodputWarmUp is how long a point of plan offers load before its window
// opens. It is plan.GoodputWarmUp, and with plan.GoodputFill at least the
// time a FIFO queue takes to fill with requests older than the clients'
// patience, plus a quarter of a second: before then a FIFO queue still
// serves requests in time, and the window would measure how it collapses
// rather than where it ends up.
func GoodputWarmUp(plan Plan, load int) time.Duration {
	w := plan.GoodputWarmUp
	if plan.GoodputFill && load > 1 {
		w = max(w, fillTime(load)+250*time.Millisecond)
	}
	return w
}

// fillTime is when a FIFO queue offered load × its capacity first serves a
// request that has waited GoodputPatience. The request served at t arrived
// at t/load, so it waited t(1 − 1/load).
func fillTime(load int) time.Duration {
	return GoodputPatience * time.Duration(load) / time.Duration(load-1)
}

// goodputHandler is the route of section 12: GoodputWork of waiting on
// something else (a database, say), then a short body. It adds the time it
// took to busy, and counts itself in runs: a sleep overruns on a loaded
// machine, and the slots' ceiling comes from what the handlers really took.
func goodputHandler(busy, runs *atomic.Int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		t := time.Now()
		time.Sleep(GoodputWork)
		c.String(http.StatusOK, "ok")
		busy.Add(int64(time.Since(t)))
		runs.Add(1)
	}
}

// goodputCounts is what the clients of one point (or of the same point over
// several rounds) saw, counted by when each request ended.
type goodputCounts struct {
	window    time.Duration // the time over which requests were counted
	offered   int           // requests scheduled in the window
	delivered int           // 200s received in full before their client gave up
	refused   int           // other statuses received in full before then
	gaveUp    int           // requests whose client gave up first
	errs      int           // requests that failed otherwise
	firstErr  error
	busy      time.Duration   // the time the window's handlers took, in all
	runs      int             // handlers that ended in the window
	latencies []time.Duration // of the delivered, from their scheduled send
}

func (c *goodputCounts) merge(o goodputCounts) {
	c.window += o.window
	c.offered += o.offered
	c.delivered += o.delivered
	c.refused += o.refused
	c.gaveUp += o.gaveUp
	c.errs += o.errs
	c.busy += o.busy
	c.runs += o.runs
	if c.firstErr == nil {
		c.firstErr = o.firstErr
	}
	c.latencies = append(c.latencies, o.latencies...)
}

// ceiling is the most the slots could have served, as a share of
// GoodputCapacity: GoodputSlots over the handlers' mean time. It is below 1
// when the handlers' sleeps overrun; NaN when no handler ended.
func (c *goodputCounts) ceiling() float64 {
	if c.runs == 0 {
		return math.NaN()
	}
	mean := c.busy.Seconds() / float64(c.runs)
	return GoodputSlots / mean / float64(GoodputCapacity)
}

// ended is how many requests ended in the window, however they ended. It
// is near offered, not equal to it: a request is counted by when it ended,
// and some that end in the window were sent before it.
func (c *goodputCounts) ended() int {
	return c.delivered + c.refused + c.gaveUp + c.errs
}

// share is the goodput as a share of GoodputCapacity.
func (c *goodputCounts) share() float64 {
	return float64(c.delivered) / c.window.Seconds() / float64(GoodputCapacity)
}

// outcome is how one request of a goodput client ended.
type outcome uint8

const (
	delivered outcome = iota
	refused
	gaveUp
	failed
)

// goodputPoint offers v load × GoodputCapacity requests per second over
// loopback for warmUp, then counts for window every request that ends in
// it. Arrivals are evenly spaced; a client that falls behind its schedule
// sends at once, and its latency and deadline still run from the scheduled
// time, so a slow client does not flatter the server.
func goodputPoint(v Variant, load int, warmUp, window time.Duration) (goodputCounts, error) {
	runtime.GC() // the previous point's garbage is collected on its own time, not this one's
	var busy, runs atomic.Int64
	h, stop := v.New(GoodputLimits, goodputHandler(&busy, &runs))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stop()
		return goodputCounts{}, err
	}
	var inflight atomic.Int64
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inflight.Add(1)
		defer inflight.Add(-1)
		h.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	rate := int64(load * GoodputCapacity)
	warm, err := openConns(ln.Addr().String(), int(rate/10))
	if err != nil {
		_ = srv.Close()
		stop()
		return goodputCounts{}, err
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			select {
			case c := <-warm:
				return c, nil
			default:
				return dialer.DialContext(ctx, network, addr)
			}
		},
		MaxIdleConnsPerHost: GoodputIdleConns,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: tr}
	url := "http://" + ln.Addr().String() + "/"

	var (
		mu  sync.Mutex
		got = goodputCounts{window: window}
	)
	start := time.Now()
	from, to := start.Add(warmUp), start.Add(warmUp+window)
	record := func(o outcome, end time.Time, latency time.Duration, err error) {
		if end.Before(from) || !end.Before(to) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch o {
		case delivered:
			got.delivered++
			got.latencies = append(got.latencies, latency)
		case refused:
			got.refused++
		case gaveUp:
			got.gaveUp++
		default:
			got.errs++
			if got.firstErr == nil {
				got.firstErr = err
			}
		}
	}
	base, cancelAll := context.WithCancel(context.Background())
	var clients sync.WaitGroup
	var busy0, runs0 int64
	for i := int64(0); ; i++ {
		at := start.Add(time.Duration(i * int64(time.Second) / rate))
		if !at.Before(to) {
			break
		}
		if !at.Before(from) {
			if got.offered == 0 {
				busy0, runs0 = busy.Load(), runs.Load()
			}
			got.offered++
		}
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		clients.Go(func() { record(sendOnce(base, client, url, at, at.Add(GoodputPatience))) })
	}
	time.Sleep(time.Until(to))
	// Everything still waiting ends now and is not counted: the clients'
	// connections close, and with them the server's request contexts.
	got.busy, got.runs = time.Duration(busy.Load()-busy0), int(runs.Load()-runs0)
	cancelAll()
	_ = srv.Close()
	stop()
	clients.Wait()
	drained := waitFor(10*time.Second, func() bool { return inflight.Load() == 0 })
	tr.CloseIdleConnections()
	close(warm)
	for c := range warm {
		c.Close()
	}
	if !drained {
		return got, fmt.Errorf("%s: %d handlers still running 10 s after the clients left", v.Name, inflight.Load())
	}
	return got, nil
}

// openConns opens n connections to addr, for the clients' Transport to take
// before it dials any: a busy service's clients have connections open when
// a surge begins. Without them every arrival of the first moments dials, and
// on 2 cores the dialling alone can hold the server back for seconds.
func openConns(addr string, n int) (chan net.Conn, error) {
	conns := make(chan net.Conn, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			conns <- c
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		close(conns)
		for c := range conns {
			c.Close()
		}
		return nil, err
	}
	return conns, nil
}

// sendOnce is one request of an open-loop client, due at at: it gives up at
// deadline, which cancels the request and closes its connection. A response
// counts only once its body is read in full. It returns how the request
// ended, when, the latency of a delivered response, and the error of a
// failed one.
func sendOnce(base context.Context, c *http.Client, url string, at, deadline time.Time) (outcome, time.Time, time.Duration, error) {
	ctx, cancel := context.WithDeadline(base, deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return failed, time.Now(), 0, err
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
		return gaveUp, end, 0, nil
	case err != nil:
		return failed, end, 0, err
	case resp.StatusCode == http.StatusOK:
		return delivered, end, end.Sub(at), nil
	}
	return refused, end, 0, nil
}

// GoodputReport is section 12: goodput under overload.
type GoodputReport struct {
	Variants []Variant // the columns
	Loads    []int     // the offered loads, in multiples of GoodputCapacity
	Rows     []Row
}

// What the rows of section 12 measure, at each load.
const (
	GoodputShare   = "goodput"
	GoodputP50     = "delivered p50"
	GoodputP99     = "delivered p99"
	GoodputRefused = "refused"
	GoodputGaveUp  = "gave up"
	GoodputCeiling = "ceiling, slots ÷ mean handler time"
)

// GoodputMetric is the name of section 12's row of what at load.
func GoodputMetric(load int, what string) string {
	return fmt.Sprintf("12. %d× C: %s", load, what)
}

// goodput measures every goodput variant at every load, the variants
// alternating within each round, and pools each point's counts over the
// rounds.
func (r *runner) goodput() {
	r.logf("12. goodput under overload")
	vs := GoodputVariants()
	rep := &r.res.Goodput
	rep.Variants, rep.Loads = vs, GoodputLoads
	type point struct {
		load    int
		variant string
	}
	pooled := map[point]*goodputCounts{}
	for round := range r.plan.GoodputRounds {
		for _, load := range GoodputLoads {
			for i := range vs {
				v := vs[(i+round)%len(vs)]
				c, err := goodputPoint(v, load, GoodputWarmUp(r.plan, load), r.plan.GoodputWindow)
				if err != nil {
					r.fail(v, GoodputMetric(load, GoodputShare), err)
					continue
				}
				k := point{load, v.Name}
				if pooled[k] == nil {
					pooled[k] = &goodputCounts{}
				}
				pooled[k].merge(c)
				r.logf("  round %d, %d×, %s: goodput %.1f%% of C, p99 %v, refused %d, gave up %d of %d",
					round+1, load, v.Name, 100*c.share(), quantile(c.latencies, 0.99).Round(100*time.Microsecond),
					c.refused, c.gaveUp, c.offered)
			}
		}
	}
	for _, load := range GoodputLoads {
		share := newRow(GoodputMetric(load, GoodputShare), "share of C", true, FormatShare)
		p50 := newRow(GoodputMetric(load, GoodputP50), "", false, FormatDuration)
		p99 := newRow(GoodputMetric(load, GoodputP99), "", false, FormatDuration)
		ref := newRow(GoodputMetric(load, GoodputRefused), "share of ended", false, FormatShare)
		gone := newRow(GoodputMetric(load, GoodputGaveUp), "share of ended", false, FormatShare)
		ceil := newRow(GoodputMetric(load, GoodputCeiling), "share of C", true, FormatShare)
		for _, v := range vs {
			c := pooled[point{load, v.Name}]
			if c == nil {
				continue
			}
			if c.errs > 0 {
				r.res.Errors = append(r.res.Errors, fmt.Sprintf("%s, %s: %d of %d requests failed other than by giving up, first: %v",
					GoodputMetric(load, GoodputShare), v.Name, c.errs, c.offered, c.firstErr))
			}
			share.Values[v.Name] = c.share()
			if x := c.ceiling(); !math.IsNaN(x) {
				ceil.Values[v.Name] = x
			}
			if len(c.latencies) > 0 {
				p50.Values[v.Name] = float64(quantile(c.latencies, 0.5))
				p99.Values[v.Name] = float64(quantile(c.latencies, 0.99))
			}
			if n := c.ended(); n > 0 {
				ref.Values[v.Name] = float64(c.refused) / float64(n)
				gone.Values[v.Name] = float64(c.gaveUp) / float64(n)
			}
		}
		rep.Rows = append(rep.Rows, share, p50, p99, ref, gone, ceil)
	}
}
