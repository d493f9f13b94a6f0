// Command fairness shows what Config.FlowKey does: a flood client (many
// requests at once) and a polite client (one request at a time) share a
// server with 2 slots. Without flows the polite client waits behind the
// flood's whole queue; with FlowKey the two take turns and its wait drops to
// about one request's time. It prints each client's queue waits, p50 and
// p99, with FlowKey off and on, and exits.
//
//	cd _example && go run ./fairness
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

const (
	slots       = 2
	work        = 5 * time.Millisecond
	floodConns  = 24
	politeConns = 1
	runFor      = 2 * time.Second
)

func main() {
	gin.SetMode(gin.ReleaseMode)
	fmt.Printf("2 slots, %v handlers; flood: %d clients in a loop; polite: %d in a loop; %v per run\n\n",
		work, floodConns, politeConns, runFor)
	fmt.Printf("%-12s %-8s %8s %10s %10s\n", "FlowKey", "client", "served", "wait p50", "wait p99")
	for _, flows := range []bool{false, true} {
		waits, err := run(flows)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fairness:", err)
			os.Exit(1)
		}
		mode := "off"
		if flows {
			mode = "X-Client"
		}
		for _, who := range []string{"flood", "polite"} {
			w := waits[who]
			fmt.Printf("%-12s %-8s %8d %10v %10v\n", mode, who, len(w), pct(w, 50), pct(w, 99))
		}
	}
}

// run serves one round and returns the queue waits each client saw.
func run(flows bool) (map[string][]time.Duration, error) {
	cfg := ginqueue.Config{MaxConcurrent: slots, MaxQueue: 1000, QueueTimeout: 10 * time.Second}
	if flows {
		cfg.FlowKey = ginqueue.ByHeader("X-Client")
	}
	q, err := ginqueue.NewQueue(cfg)
	if err != nil {
		return nil, err
	}
	r := gin.New()
	r.Use(func(c *gin.Context) { c.Set("arrived", time.Now()); c.Next() }, q.Handler())
	r.GET("/", func(c *gin.Context) {
		waited := time.Since(c.MustGet("arrived").(time.Time))
		time.Sleep(work)
		c.Header("X-Queue-Wait-Us", strconv.FormatInt(waited.Microseconds(), 10))
		c.Status(http.StatusOK)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: floodConns + politeConns}}

	var mu sync.Mutex
	waits := map[string][]time.Duration{}
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()
	var wg sync.WaitGroup
	loop := func(who string) {
		defer wg.Done()
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			req.Header.Set("X-Client", who)
			resp, err := client.Do(req)
			if err != nil {
				continue
			}
			resp.Body.Close()
			us, err := strconv.ParseInt(resp.Header.Get("X-Queue-Wait-Us"), 10, 64)
			if err != nil {
				continue
			}
			mu.Lock()
			waits[who] = append(waits[who], time.Duration(us)*time.Microsecond)
			mu.Unlock()
		}
	}
	for range floodConns {
		wg.Add(1)
		go loop("flood")
	}
	time.Sleep(100 * time.Millisecond) // the flood fills the queue first
	for range politeConns {
		wg.Add(1)
		go loop("polite")
	}
	wg.Wait()
	shut, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	_ = q.Shutdown(shut)
	return waits, srv.Shutdown(shut)
}

// pct is the p-th percentile of d, rounded to 0.1 ms.
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100].Round(100 * time.Microsecond)
}
