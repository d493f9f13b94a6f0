// Command demo replays a burst against a real server: 3 slots,
// 10 waiting places, a 5 second queue timeout and 15 requests of 200 ms sent
// together, in a known order, over HTTP on 127.0.0.1. It prints a timeline
// of each request (waiting, running, status) and the outcome counts, and
// exits 1 if the outcomes are not the 13 served and 2 queue full the
// scenario promises.
//
//	make demo
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

const (
	requests = 15
	work     = 200 * time.Millisecond
	tick     = 50 * time.Millisecond // one character of the timeline
)

type row struct {
	id             int
	status         int
	sent, finished time.Duration // since the burst began, seen by the client
	waited         time.Duration // in the queue, measured by the server
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	gin.SetMode(gin.ReleaseMode)
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 3, MaxQueue: 10, QueueTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	r := gin.New()
	r.Use(func(c *gin.Context) { c.Set("arrived", time.Now()); c.Next() }, q.Handler())
	r.GET("/work", func(c *gin.Context) {
		waited := time.Since(c.MustGet("arrived").(time.Time))
		time.Sleep(work)
		c.Header("X-Queue-Wait-Us", strconv.FormatInt(waited.Microseconds(), 10))
		c.String(http.StatusOK, "done")
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/work"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: requests, MaxConnsPerHost: requests}}

	fmt.Printf("ginqueue demo on %s: MaxConcurrent 3, MaxQueue 10, QueueTimeout 5s, %d requests of %v\n\n",
		ln.Addr(), requests, work)
	rows := make([]row, requests)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rows[i] = call(client, url, i+1, start)
		}()
		time.Sleep(2 * time.Millisecond) // a known arrival order
	}
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := q.Shutdown(ctx); err != nil {
		return err
	}
	if err := srv.Shutdown(ctx); err != nil {
		return err
	}
	return report(rows, q.Stats())
}

func call(client *http.Client, url string, id int, start time.Time) row {
	rw := row{id: id, sent: time.Since(start)}
	resp, err := client.Get(fmt.Sprintf("%s?id=%d", url, id))
	rw.finished = time.Since(start)
	if err != nil {
		rw.status = -1
		return rw
	}
	resp.Body.Close()
	rw.status = resp.StatusCode
	if us, err := strconv.ParseInt(resp.Header.Get("X-Queue-Wait-Us"), 10, 64); err == nil {
		rw.waited = time.Duration(us) * time.Microsecond
	}
	return rw
}

func report(rows []row, st ginqueue.Stats) error {
	fmt.Printf("req  status  waited   done at  timeline (one char = %v; . waiting, # running, x refused)\n", tick)
	counts := map[int]int{}
	for _, rw := range rows {
		counts[rw.status]++
		bar := strings.Repeat(" ", int(rw.sent/tick))
		switch rw.status {
		case http.StatusOK:
			bar += strings.Repeat(".", int((rw.waited+tick/2)/tick)) + strings.Repeat("#", int(work/tick))
		default:
			bar += strings.Repeat(".", int((rw.finished-rw.sent)/tick)) + "x"
		}
		waited := "-"
		if rw.status == http.StatusOK {
			waited = fmt.Sprintf("%dms", rw.waited.Milliseconds())
		}
		fmt.Printf("%3d  %6d  %8s  %6dms  %s\n", rw.id, rw.status, waited, rw.finished.Milliseconds(), bar)
	}
	fmt.Printf("\noutcomes seen by clients: %d served (200), %d queue full (503), %d queue timeout (408), %d other\n",
		counts[200], counts[503], counts[408], requests-counts[200]-counts[503]-counts[408])
	fmt.Printf("queue stats: served %d, queue full %d, queue timeout %d, canceled %d, closed %d\n",
		st.Served, st.QueueFull, st.QueueTimeout, st.Canceled, st.Closed)
	if counts[200] != 13 || counts[503] != 2 || st.Served != 13 || st.QueueFull != 2 {
		return fmt.Errorf("expected 13 served and 2 queue full, got %v", counts)
	}
	return nil
}
