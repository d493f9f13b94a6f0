// Command browser408 measures what a browser does with a queue timeout: it
// serves a page to headless Chromium, and the page's fetch() times out in a
// Queue's queue while a long request holds the only slot. It runs twice:
// with the default 408 and with Config.QueueTimeoutStatus 503, and prints
// every attempt the server saw and what fetch() finally resolved with.
//
//	cd soak && go run ./browser408
//
// The page first opens two keep-alive connections (two requests in
// parallel; -warm changes how many), so the fetch that times out goes out
// on a reused connection, as it would on any page that has already loaded
// something.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
)

func main() {
	chromium := flag.String("chromium", "chromium", "the Chromium (or Chrome) binary")
	hold := flag.Duration("hold", 3*time.Second, "how long the request that holds the slot runs")
	timeout := flag.Duration("timeout", 500*time.Millisecond, "Config.QueueTimeout")
	warm := flag.Int("warm", 2, "keep-alive connections the page opens first")
	flag.Parse()
	gin.SetMode(gin.ReleaseMode)

	version, _ := exec.Command(*chromium, "--version").Output()
	fmt.Printf("%s; MaxConcurrent 1, MaxQueue 8, QueueTimeout %v, the slot held %v, %d connections warmed\n",
		strings.TrimSpace(string(version)), *timeout, *hold, *warm)

	var runs []*run
	for _, status := range []int{0, http.StatusServiceUnavailable} {
		r, err := measure(*chromium, status, *timeout, *hold, *warm)
		if err != nil {
			fmt.Fprintln(os.Stderr, "browser408:", err)
			os.Exit(1)
		}
		r.print(os.Stdout)
		runs = append(runs, r)
	}
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "QueueTimeoutStatus\tattempts the server saw\tfetch() resolved with\tafter")
	for _, r := range runs {
		var codes []string
		for _, a := range r.probe() {
			codes = append(codes, strconv.Itoa(a.status))
		}
		fmt.Fprintf(w, "%s\t%d (%s)\t%s\t%.2f s\n", r.name(), len(codes), strings.Join(codes, ", "),
			r.page.resolved(), r.page.Millis/1000)
	}
	_ = w.Flush()
}

// attempt is one request as the server saw it.
type attempt struct {
	rid      string
	conn     string // the client's address: one per connection
	nth      int    // the how-manieth request on its connection
	arrived  time.Time
	answered time.Time
	status   int
	outcome  string
}

// pageReport is what the page posts back once its fetch() resolved.
type pageReport struct {
	Status int     `json:"status"` // 0 if fetch() rejected
	Err    string  `json:"err"`
	Millis float64 `json:"ms"` // from the call of fetch() to its resolution
}

func (p pageReport) resolved() string {
	if p.Err != "" {
		return "error: " + p.Err
	}
	return strconv.Itoa(p.Status)
}

// run is one measurement.
type run struct {
	status   int // Config.QueueTimeoutStatus
	mu       sync.Mutex
	attempts []*attempt
	perConn  map[string]int
	page     pageReport
}

func (r *run) name() string {
	if r.status == 0 {
		return "0 (408)"
	}
	return strconv.Itoa(r.status)
}

// probe is the attempts of the fetch that times out, in arrival order.
func (r *run) probe() []*attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*attempt
	for _, a := range r.attempts {
		if a.rid == "probe" {
			out = append(out, a)
		}
	}
	return out
}

// measure serves the page to a new headless Chromium, with a Queue whose
// QueueTimeoutStatus is status, until the page reports.
func measure(chromium string, status int, timeout, hold time.Duration, warm int) (*run, error) {
	r := &run{status: status, perConn: map[string]int{}}
	q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, MaxQueue: 8, QueueTimeout: timeout,
		QueueTimeoutStatus: status,
		OnOutcome:          func(c *gin.Context, o ginqueue.Outcome, _ time.Duration) { c.Set("outcome", o.String()) },
	})
	if err != nil {
		return nil, err
	}
	defer q.Close()
	reported := make(chan struct{})
	var once sync.Once

	e := gin.New()
	e.Use(r.record)
	e.GET("/", func(c *gin.Context) {
		html := strings.NewReplacer("HOLD_MS", strconv.FormatInt(hold.Milliseconds(), 10), "WARM", strconv.Itoa(warm)).Replace(page)
		c.Data(http.StatusOK, "text/html; charset=utf-8", []byte(html))
	})
	e.GET("/favicon.ico", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	e.GET("/warm", func(c *gin.Context) { // outside the Queue
		time.Sleep(300 * time.Millisecond)
		c.String(http.StatusOK, "warm")
	})
	api := e.Group("/api", q.Handler())
	api.GET("/hold", func(c *gin.Context) {
		ms, _ := strconv.Atoi(c.Query("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		c.String(http.StatusOK, "held")
	})
	api.GET("/probe", func(c *gin.Context) { c.String(http.StatusOK, "served") })
	e.POST("/report", func(c *gin.Context) {
		body, _ := io.ReadAll(c.Request.Body)
		r.mu.Lock()
		err := json.Unmarshal(body, &r.page)
		r.mu.Unlock()
		if err != nil {
			c.Status(http.StatusBadRequest)
			return
		}
		c.Status(http.StatusNoContent)
		once.Do(func() { close(reported) })
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: e}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	profile, err := os.MkdirTemp("", "browser408-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(profile)
	url := "http://" + ln.Addr().String() + "/"
	cmd := exec.Command(chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-extensions", "--user-data-dir="+profile, url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // so its helpers end with it
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the group this command started
		_ = cmd.Wait()
	}()
	select {
	case <-reported:
	case <-time.After(hold + 30*time.Second):
		return nil, errors.New("the page did not report within 30 s; Chromium said:\n" + logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	return r, nil
}

// record notes every request: its connection, arrival, answer and outcome.
func (r *run) record(c *gin.Context) {
	a := &attempt{rid: c.Query("rid"), conn: c.Request.RemoteAddr, arrived: time.Now()}
	if a.rid == "" {
		a.rid = c.Request.URL.Path
	}
	r.mu.Lock()
	r.perConn[a.conn]++
	a.nth = r.perConn[a.conn]
	r.attempts = append(r.attempts, a)
	r.mu.Unlock()
	c.Next()
	o, _ := c.Get("outcome")
	r.mu.Lock()
	a.answered, a.status = time.Now(), c.Writer.Status()
	a.outcome, _ = o.(string)
	r.mu.Unlock()
}

func (r *run) print(out io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var t0 time.Time
	for _, a := range r.attempts {
		if a.rid == "hold" {
			t0 = a.arrived
			break
		}
	}
	fmt.Fprintf(out, "\nQueueTimeoutStatus %s: every request the server saw, times from the hold's arrival\n", r.name())
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "request\tconnection\tnth on it\tarrived\tanswered\toutcome\tstatus")
	for _, a := range r.attempts {
		outcome := a.outcome
		if outcome == "" {
			outcome = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%+.3f s\t%+.3f s\t%s\t%d\n", a.rid, a.conn, a.nth,
			a.arrived.Sub(t0).Seconds(), a.answered.Sub(t0).Seconds(), outcome, a.status)
	}
	_ = w.Flush()
	fmt.Fprintf(out, "fetch(/api/probe) resolved with %s after %.0f ms\n", r.page.resolved(), r.page.Millis)
}

// page warms WARM keep-alive connections, starts the request that holds the
// slot, then 100 ms later the fetch that will time out in the queue, and
// posts what that fetch resolved with and after how long.
const page = `<!doctype html>
<title>browser408</title>
<script>
const sleep = ms => new Promise(r => setTimeout(r, ms));
async function main() {
  // All at once: as many connections, idle and kept alive afterwards.
  await Promise.all([...Array(WARM).keys()].map(i => fetch('/warm?rid=warm' + i, {cache: 'no-store'}).then(r => r.text())));
  await sleep(200);
  const hold = fetch('/api/hold?rid=hold&ms=HOLD_MS', {cache: 'no-store'}).then(r => r.text());
  await sleep(100);
  const report = {status: 0, err: '', ms: 0};
  const start = performance.now();
  try {
    const r = await fetch('/api/probe?rid=probe', {cache: 'no-store'});
    await r.text();
    report.status = r.status;
  } catch (e) {
    report.err = String(e);
  }
  report.ms = performance.now() - start;
  await hold.catch(() => {});
  await fetch('/report', {method: 'POST', body: JSON.stringify(report)});
}
main();
</script>
`
