package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// lockedBuffer is a bytes.Buffer for the span exporter's goroutine and the
// test's.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.buf.Bytes())
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"`)

// parse reads the samples of a Prometheus text exposition.
func parse(t *testing.T, body string) []sample {
	t.Helper()
	var samples []sample
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("a line without a value: %q", line)
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		name, labels, _ := strings.Cut(series, "{")
		s := sample{name: name, labels: map[string]string{}, value: v}
		for _, m := range labelPair.FindAllStringSubmatch(labels, -1) {
			s.labels[m[1]] = m[2]
		}
		samples = append(samples, s)
	}
	return samples
}

// find returns the value of the sample of queue "api" named name whose
// labels include those given as name, value pairs.
func find(t *testing.T, samples []sample, name string, labels ...string) float64 {
	t.Helper()
	for _, s := range samples {
		if s.name != name || s.labels["ginqueue_queue"] != "api" {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && s.labels[labels[i]] == labels[i+1]
		}
		if match {
			return s.value
		}
	}
	t.Errorf("no sample %s %v in /metrics", name, labels)
	return 0
}

// The server on a loopback port: a burst that overflows the queue, then a
// real scrape of /metrics agrees with what the client saw, and every span
// carries the decision that matches its status.
func TestServer(t *testing.T) {
	gin.SetMode(gin.TestMode)
	spans := &lockedBuffer{}
	a, err := newApp(spans, work)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	transport := &http.Transport{MaxIdleConnsPerHost: burst}
	client := &http.Client{Transport: transport, Timeout: 5 * time.Second}
	base := "http://" + ln.Addr().String()

	statuses := sendBurst(client, base+"/api/work", burst)
	t.Logf("statuses %v", statuses)
	if statuses[0] > 0 || statuses[http.StatusOK] == 0 || statuses[http.StatusServiceUnavailable] == 0 {
		t.Errorf("statuses %v: want no error, some served and some turned away (%d slots, %d places, %d at once)",
			statuses, slots, places, burst)
	}

	body, err := get(client, base+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	samples := parse(t, body)
	for outcome, want := range map[string]int{
		"served":        statuses[http.StatusOK],
		"queue_full":    statuses[http.StatusServiceUnavailable],
		"queue_timeout": statuses[http.StatusRequestTimeout],
		"canceled":      0,
		"closed":        0,
		"panic":         0,
	} {
		if got := find(t, samples, "ginqueue_requests_total", "ginqueue_outcome", outcome); got != float64(want) {
			t.Errorf("ginqueue_requests_total{outcome=%q} = %v, want %d (what the client saw)", outcome, got, want)
		}
	}
	for name, want := range map[string]float64{
		"ginqueue_slot_limit":     slots,
		"ginqueue_slot_usage":     0,
		"ginqueue_request_queued": 0,
	} {
		if got := find(t, samples, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := find(t, samples, "ginqueue_drain_rate_per_second"); got <= 0 {
		t.Errorf("ginqueue_drain_rate_per_second = %v, want above 0 once requests have finished", got)
	}

	// The buckets are cumulative, and +Inf counts every served request.
	var bounds []float64
	for _, s := range samples {
		if s.name == "ginqueue_wait_bucket_total" && s.labels["ginqueue_wait_upper_bound"] != "+Inf" {
			b, err := strconv.ParseFloat(s.labels["ginqueue_wait_upper_bound"], 64)
			if err != nil {
				t.Fatal(err)
			}
			bounds = append(bounds, b)
		}
	}
	slices.Sort(bounds)
	if len(bounds) != 26 {
		t.Errorf("%d finite buckets, want 26", len(bounds))
	}
	last := 0.0
	for _, b := range bounds {
		n := find(t, samples, "ginqueue_wait_bucket_total", "ginqueue_wait_upper_bound", strconv.FormatFloat(b, 'g', -1, 64))
		if n < last {
			t.Errorf("bucket %v = %v, below the one before (%v)", b, n, last)
		}
		last = n
	}
	inf := find(t, samples, "ginqueue_wait_bucket_total", "ginqueue_wait_upper_bound", "+Inf")
	if inf < last || inf != float64(statuses[http.StatusOK]) {
		t.Errorf("bucket +Inf = %v, want the %d served (and not below the last bucket, %v)", inf, statuses[http.StatusOK], last)
	}
	// Past the first slots' worth, the served requests waited: at most the
	// queue timeout each.
	waited := find(t, samples, "ginqueue_wait_time_seconds_total")
	if n := statuses[http.StatusOK]; n > slots && (waited <= 0 || waited > float64(n)*queueTimeout.Seconds()) {
		t.Errorf("ginqueue_wait_time_seconds_total = %v, want above 0 and at most %v", waited, float64(n)*queueTimeout.Seconds())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// First the client's connections: one it dialed and never used would
	// hold Shutdown for 5 s.
	transport.CloseIdleConnections()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatal(err)
	}
	if err := a.shutdown(ctx); err != nil { // flushes the spans
		t.Fatal(err)
	}
	checkSpans(t, spans.Bytes(), statuses)
}

// checkSpans reads the exported spans and checks that each request's span
// has one ginqueue event, whose outcome matches its status, and that there
// is one span per request the client sent.
func checkSpans(t *testing.T, out []byte, statuses map[int]int) {
	t.Helper()
	type kv struct {
		Key   string
		Value struct{ Value any }
	}
	type span struct {
		Name       string
		Attributes []kv
		Events     []struct {
			Name       string
			Attributes []kv
		}
	}
	outcomeOf := map[float64]string{200: "served", 503: "queue_full", 408: "queue_timeout"}
	seen := map[int]int{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var s span
		if err := dec.Decode(&s); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding the spans: %v", err)
		}
		attr := func(kvs []kv, key string) any {
			for _, a := range kvs {
				if a.Key == key {
					return a.Value.Value
				}
			}
			return nil
		}
		status, _ := attr(s.Attributes, "http.response.status_code").(float64)
		seen[int(status)]++
		if len(s.Events) != 1 {
			t.Errorf("span %s (status %v): %d events, want 1", s.Name, status, len(s.Events))
			continue
		}
		e := s.Events[0]
		wantEvent := "ginqueue.rejected"
		if status == 200 {
			wantEvent = "ginqueue.granted"
		}
		if e.Name != wantEvent || attr(e.Attributes, "ginqueue.outcome") != outcomeOf[status] ||
			attr(e.Attributes, "ginqueue.queue") != "api" || attr(s.Attributes, "ginqueue.outcome") != outcomeOf[status] {
			t.Errorf("span with status %v: event %s %v, span attributes %v", status, e.Name, e.Attributes, s.Attributes)
		}
	}
	delete(statuses, 0)
	if !maps.Equal(seen, statuses) {
		t.Errorf("spans by status %v, the client saw %v", seen, statuses)
	}
}
