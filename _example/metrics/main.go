// Command metrics serves a throttled API on 127.0.0.1 with /metrics
// (Prometheus, through promqueue) and /debug/queue (Queue.StatusHandler)
// outside the throttle, and drives it with a built-in load client: a few
// interactive users at priority 1, then a burst from a batch client at
// priority 0 that fills the queue (503) and outwaits the queue timeout
// (408). OnOutcome logs every outcome with log/slog at debug level, and a
// sample of them at info. During the burst it prints /debug/queue, at the
// end the ginqueue_ lines of /metrics, and exits.
//
//	cd _example && go run ./metrics          # add -v for every outcome
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/promqueue"
)

const (
	slots   = 4
	work    = 40 * time.Millisecond // each API request; 4 slots drain 100/s
	warmup  = 500 * time.Millisecond
	burst   = 2 * time.Second
	calm    = 500 * time.Millisecond
	users   = 4  // interactive clients, priority 1, one flow each
	batch   = 64 // connections of the batch client, priority 0, one flow
	backoff = 20 * time.Millisecond
)

func main() {
	verbose := flag.Bool("v", false, "log every outcome (debug level)")
	flag.Parse()
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := run(log); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	gin.SetMode(gin.ReleaseMode)
	var sampled sync.Map // Outcome -> *atomic.Uint64: a new outcome needs no change here
	q, err := ginqueue.NewQueue(ginqueue.Config{
		MaxConcurrent:   slots,
		MaxQueue:        32,
		MaxQueuePerFlow: 24, // the batch client cannot take every place
		QueueTimeout:    250 * time.Millisecond,
		Priority: func(c *gin.Context) int {
			p, _ := strconv.Atoi(c.GetHeader("X-Priority"))
			return p
		},
		FlowKey:      ginqueue.ByHeader("X-Client"),
		ServerTiming: true,
		OnOutcome: func(c *gin.Context, o ginqueue.Outcome, wait time.Duration) {
			attrs := []any{"outcome", o, "client", c.GetHeader("X-Client"), "wait", wait.Round(time.Microsecond)}
			log.Debug("ginqueue", attrs...)
			// A sampled info line: the first of each outcome, then every 500th.
			n, ok := sampled.Load(o)
			if !ok { // the first of this outcome: allocate its counter once
				n, _ = sampled.LoadOrStore(o, new(atomic.Uint64))
			}
			if n := n.(*atomic.Uint64).Add(1); n == 1 || n%500 == 0 {
				log.Info("ginqueue (sampled)", append(attrs, "nth", n)...)
			}
		},
	})
	if err != nil {
		return err
	}
	c := promqueue.NewCollector()
	if err := c.Add("api", q); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	r := gin.New()
	r.Use(gin.Recovery())
	// The ops routes stay outside the throttle: a scrape must never wait
	// behind, or be turned away with, the traffic it reports on.
	r.GET("/metrics", gin.WrapH(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	r.GET("/debug/queue", q.StatusHandler())
	api := r.Group("/api", q.Handler())
	api.GET("/work", func(c *gin.Context) {
		time.Sleep(work)
		c.String(http.StatusOK, "done")
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	fmt.Printf("serving %s/metrics and %s/debug/queue; %d slots, 32 places, 250ms queue timeout, %v handlers\n",
		base, base, slots, work)

	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: users + batch},
		Timeout:   5 * time.Second,
	}
	load := newLoad(client, base+"/api/work")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range users {
		wg.Go(func() { load.loop(stop, "user-"+strconv.Itoa(i), 1, 10*time.Millisecond) })
	}
	time.Sleep(warmup)
	fmt.Printf("\nburst: %d batch connections at priority 0 for %v\n\n", batch, burst)
	stopBatch := make(chan struct{})
	var bwg sync.WaitGroup
	for range batch {
		bwg.Go(func() { load.loop(stopBatch, "batch", 0, 0) })
	}
	time.Sleep(burst / 2)
	if err := show(client, base+"/metrics", "the gauges", func(line string) bool {
		return strings.HasPrefix(line, "ginqueue_") && !strings.Contains(line, "_total") &&
			!strings.HasPrefix(line, "ginqueue_queue_wait_seconds")
	}); err != nil {
		return err
	}
	if err := show(client, base+"/debug/queue", "", nil); err != nil {
		return err
	}
	time.Sleep(burst / 2)
	close(stopBatch)
	bwg.Wait()
	time.Sleep(calm)
	close(stop)
	wg.Wait()

	fmt.Printf("client saw: %s\n", load.summary())
	fmt.Printf("the served response that waited longest had Server-Timing: %s\n", load.longestTiming())

	fmt.Print("\nafter the burst:\n\n")
	if err := show(client, base+"/metrics", "the ginqueue_ lines", func(line string) bool {
		return strings.HasPrefix(line, "ginqueue_")
	}); err != nil {
		return err
	}
	if err := show(client, base+"/debug/queue", "", nil); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(q.Shutdown(ctx), srv.Shutdown(ctx))
}

// load is the built-in load client: it counts the statuses it sees.
type load struct {
	client *http.Client
	url    string

	mu       sync.Mutex
	statuses map[int]int // guarded by mu
	// the Server-Timing header of the served response that waited longest,
	// and that wait; guarded by mu
	longest     string
	longestWait time.Duration
}

func newLoad(client *http.Client, url string) *load {
	return &load{client: client, url: url, statuses: map[int]int{}}
}

// loop sends requests as client at priority prio until stop is closed,
// pausing pause after a served request and a short backoff after a refusal.
func (l *load) loop(stop <-chan struct{}, client string, prio int, pause time.Duration) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, l.url, nil)
		req.Header.Set("X-Client", client)
		req.Header.Set("X-Priority", strconv.Itoa(prio))
		resp, err := l.client.Do(req)
		if err != nil {
			l.count(0, "")
			time.Sleep(backoff)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		l.count(resp.StatusCode, resp.Header.Get("Server-Timing"))
		if resp.StatusCode != http.StatusOK {
			time.Sleep(backoff) // a real client would honour Retry-After
		} else if pause > 0 {
			time.Sleep(pause)
		}
	}
}

// count records one response's status (0: no response) and Server-Timing.
func (l *load) count(status int, timing string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.statuses[status]++
	if d, ok := queueDur(timing); ok && d >= l.longestWait {
		l.longest, l.longestWait = timing, d
	}
}

// queueDur parses "queue;dur=<ms>".
func queueDur(timing string) (time.Duration, bool) {
	ms, ok := strings.CutPrefix(timing, "queue;dur=")
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(ms, 64)
	return time.Duration(f * float64(time.Millisecond)), err == nil
}

// longestTiming is the Server-Timing header of the served response that
// waited longest.
func (l *load) longestTiming() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.longest
}

// summary is the statuses seen, as "n × status".
func (l *load) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var parts []string
	for _, s := range []int{http.StatusOK, http.StatusServiceUnavailable, http.StatusRequestTimeout, 0} {
		if n := l.statuses[s]; n > 0 {
			name := strconv.Itoa(s)
			if s == 0 {
				name = "error"
			}
			parts = append(parts, fmt.Sprintf("%d × %s", n, name))
		}
	}
	return strings.Join(parts, ", ")
}

// show prints the lines of the body of a GET of url that keep accepts, or
// all of it when keep is nil, under a heading.
func show(client *http.Client, url, what string, keep func(line string) bool) error {
	body, err := get(client, url)
	if err != nil {
		return err
	}
	path := url[strings.Index(url[len("http://"):], "/")+len("http://"):]
	if what != "" {
		path += " (" + what + ")"
	}
	fmt.Printf("GET %s:\n", path)
	for line := range strings.Lines(strings.TrimRight(body, "\n") + "\n") {
		if keep == nil || keep(line) {
			fmt.Print(line)
		}
	}
	fmt.Println()
	return nil
}

// get returns the body of a GET of url.
func get(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}
