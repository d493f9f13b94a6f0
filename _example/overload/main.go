// Command overload offers a real server five times what it can serve and
// counts what its clients get in time: once with a plain FIFO queue, once
// with CoDel and LIFO.
//
// The server has 8 slots and handlers of 10 ms, so it can serve 800
// requests per second (C). Clients send 4,000 a second on a schedule,
// whatever the answers, and give up after one second, closing the
// connection. The queue is generous: 10,000 places and a 10 s QueueTimeout,
// longer than any client waits. With FIFO, every waiter that reaches a slot
// has waited almost the whole second, so its client is gone by the time the
// answer comes: the server stays busy and delivers next to nothing. With
// CoDel a standing queue holds a waiter for 5 ms only, and LIFO serves the
// newest first, so the slots work for clients that are still there.
//
//	cd _example && go run ./overload
//
// It takes about 12 s. bench/ measures the same at 1×, 2× and 5× against
// other throttles (make bench-goodput).
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

const (
	slots    = 8
	work     = 10 * time.Millisecond
	capacity = slots * int(time.Second/work) // C, requests per second
	load     = 5                             // offered: load × C
	patience = time.Second                   // clients give up after this
	// warmUp covers the time a FIFO queue takes to fill with requests
	// older than patience (patience × load / (load − 1) = 1.25 s).
	warmUp = 1500 * time.Millisecond
	window = 3 * time.Second
)

// result is what the clients saw in the window.
type result struct {
	delivered, refused, gaveUp, failed int
	latencies                          []time.Duration
}

func main() {
	fmt.Printf("%d slots of %v (C = %d/s) offered %d× C for %v; clients give up after %v; counted over the last %v\n",
		slots, work, capacity, load, warmUp+window, patience, window)
	for _, run := range []struct {
		name  string
		codel *ginqueue.CoDel
	}{
		{"FIFO", nil},
		{"CoDel + LIFO", &ginqueue.CoDel{LIFO: true}},
	} {
		res, err := offer(run.codel)
		if err != nil {
			fmt.Fprintln(os.Stderr, "overload:", err)
			os.Exit(1)
		}
		perSecond := float64(res.delivered) / window.Seconds()
		fmt.Printf("%-13s goodput %4.0f/s = %3.0f%% of C; p99 of delivered %v; refused %d, gave up %d, failed %d\n",
			run.name, perSecond, 100*perSecond/float64(capacity), p99(res.latencies).Round(time.Millisecond),
			res.refused, res.gaveUp, res.failed)
	}
}

// offer starts a server on 127.0.0.1 with the given CoDel (nil: FIFO),
// offers it load × C for warmUp + window, and counts the requests that end
// in the window.
func offer(codel *ginqueue.CoDel) (result, error) {
	gin.SetMode(gin.ReleaseMode)
	q, err := ginqueue.NewQueue(ginqueue.Config{
		MaxConcurrent: slots, MaxQueue: 10_000, QueueTimeout: 10 * time.Second, CoDel: codel,
	})
	if err != nil {
		return result{}, err
	}
	defer q.Close()
	r := gin.New()
	r.GET("/ping", func(c *gin.Context) { c.Status(http.StatusNoContent) }) // not throttled
	r.Group("/", q.Handler()).GET("/", func(c *gin.Context) {
		time.Sleep(work) // waiting on something else: a database, say
		c.String(http.StatusOK, "ok")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	// Enough idle connections for every request in flight: a connection
	// that a response leaves idle serves a later request.
	tr := &http.Transport{MaxIdleConnsPerHost: 1 << 14}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	url := "http://" + ln.Addr().String() + "/"
	warm(client, url+"ping", load*capacity/10)

	var (
		mu  sync.Mutex
		res result
		wg  sync.WaitGroup
	)
	start := time.Now()
	from, to := start.Add(warmUp), start.Add(warmUp+window)
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := int64(0); ; i++ {
		// Open loop: request i is due at its time, whatever came back.
		due := start.Add(time.Duration(i * int64(time.Second) / int64(load*capacity)))
		if !due.Before(to) {
			break
		}
		time.Sleep(time.Until(due))
		wg.Go(func() {
			ctx, done := context.WithDeadline(stop, due.Add(patience))
			defer done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			resp, err := client.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body) // delivered means received in full
				resp.Body.Close()
			}
			end := time.Now()
			if end.Before(from) || !end.Before(to) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case ctx.Err() != nil || !end.Before(due.Add(patience)):
				res.gaveUp++ // the client cancelled: its connection is closed
			case err != nil:
				res.failed++
			case resp.StatusCode == http.StatusOK:
				res.delivered++
				res.latencies = append(res.latencies, end.Sub(due))
			default:
				res.refused++ // 503 or, from CoDel, 408: an answer in time
			}
		})
	}
	time.Sleep(time.Until(to))
	cancel() // everyone still waiting gives up now, uncounted
	wg.Wait()
	return res, nil
}

// warm leaves n connections open in client's pool, as a busy service's
// clients have when a surge begins: without them every arrival of the first
// moments dials, and on a small machine the dialling alone can hold the
// server back for seconds.
func warm(client *http.Client, url string, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if resp, err := client.Get(url); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// p99 is the 99th percentile of ds, 0 when there are none.
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[(len(ds)*99+99)/100-1]
}
