package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ginqueue/ginqueue"
)

// check matches what every client read with what the server reported, and
// the counters with both.
func (res *result) check(client map[int64]*record, s *server) {
	res.sent = len(client)
	res.peakRunning, res.peakGlobal = s.peakGen.Load(), s.peakAll.Load()
	if s.backend == "redis" {
		res.limitNote = fmt.Sprintf("%d of %d (one global limit over the old and new Queue)", res.peakGlobal, limit)
		if res.peakGlobal > limit {
			res.problems = append(res.problems, fmt.Sprintf("%d requests ran at once, limit %d", res.peakGlobal, limit))
		}
	} else {
		res.limitNote = fmt.Sprintf("%d of %d per Queue", res.peakRunning, limit)
		if res.peakRunning > limit {
			res.problems = append(res.problems, fmt.Sprintf("%d requests ran at once on one Queue, limit %d", res.peakRunning, limit))
		}
	}
	for id, srv := range s.records {
		if len(srv.outcomes) > 1 {
			res.problems = append(res.problems, fmt.Sprintf("request %d has %d outcomes: %v", id, len(srv.outcomes), srv.outcomes))
		}
		if client[id] == nil {
			res.problems = append(res.problems, fmt.Sprintf("request %d reached the server but not the client's books", id))
		}
		for _, o := range srv.outcomes {
			res.outcomes[o]++
		}
	}
	for id, c := range client {
		srv := s.records[id]
		var o ginqueue.Outcome
		has := srv != nil && len(srv.outcomes) == 1
		if has {
			o = srv.outcomes[0]
		}
		if c.status == 0 {
			res.gone++
			if has {
				res.goneServer[o.String()]++
			} else {
				res.goneServer["never reached the queue"]++
			}
			continue
		}
		res.byStatus[c.status]++
		want := map[int][]ginqueue.Outcome{
			http.StatusOK:                  {ginqueue.OutcomeServed},
			http.StatusInternalServerError: {ginqueue.OutcomeServed},
			http.StatusServiceUnavailable:  {ginqueue.OutcomeQueueFull, ginqueue.OutcomeClosed},
			http.StatusRequestTimeout:      {ginqueue.OutcomeQueueTimeout},
		}[c.status]
		ok := false
		for _, w := range want {
			ok = ok || (has && o == w)
		}
		if !ok || (c.status == http.StatusOK && c.panicked) || (c.status == http.StatusInternalServerError && !c.panicked) {
			res.problems = append(res.problems, fmt.Sprintf("request %d: client read %d (panic %v), server outcome %v",
				id, c.status, c.panicked, srv))
		}
	}
	for _, p := range []struct {
		name string
		got  uint64
		o    ginqueue.Outcome
	}{
		{"Served", res.stats.Served, ginqueue.OutcomeServed},
		{"QueueFull", res.stats.QueueFull, ginqueue.OutcomeQueueFull},
		{"QueueTimeout", res.stats.QueueTimeout, ginqueue.OutcomeQueueTimeout},
		{"Canceled", res.stats.Canceled, ginqueue.OutcomeCanceled},
		{"Closed", res.stats.Closed, ginqueue.OutcomeClosed},
	} {
		if p.got != uint64(res.outcomes[p.o]) {
			res.problems = append(res.problems, fmt.Sprintf("Stats.%s is %d, the server reported %d", p.name, p.got, res.outcomes[p.o]))
		}
	}
	if len(res.problems) > 20 {
		res.problems = append(res.problems[:20], fmt.Sprintf("... and %d more", len(res.problems)-20))
	}
}

func (res *result) lost() int {
	n := 0
	for _, p := range res.problems {
		if strings.HasPrefix(p, "request ") {
			n++
		}
	}
	return n
}

// rows is the summary, one line per figure.
func (res *result) rows() [][2]string {
	return [][2]string{
		{"load", fmt.Sprintf("%v, %d keep-alive + %d short-lived clients, %d Queue rotations (Shutdown with requests in flight)",
			res.duration.Round(time.Second), keepAlive, shortLived, res.rotations)},
		{"requests sent", fmt.Sprint(res.sent)},
		{"200 served", fmt.Sprint(res.byStatus[200])},
		{"500 served, handler panicked", fmt.Sprint(res.byStatus[500])},
		{"503 queue full or closed", fmt.Sprintf("%d (server: %d queue full, %d closed)",
			res.byStatus[503], res.outcomes[ginqueue.OutcomeQueueFull], res.outcomes[ginqueue.OutcomeClosed])},
		{"408 queue timeout", fmt.Sprint(res.byStatus[408])},
		{"client hung up or timed out", fmt.Sprintf("%d (server saw: %s)", res.gone, mapString(res.goneServer))},
		{"peak running", res.limitNote},
		{"peak goroutines", fmt.Sprint(res.peakGoroutines)},
		{"goroutines before / after", fmt.Sprintf("%d / %d (margin %d)", res.goroutinesBefore, res.goroutinesAfter, goroutineMargin)},
		{"heap before / after", fmt.Sprintf("%.1f / %.1f MiB (margin %d MiB)", mib(res.heapBefore), mib(res.heapAfter), heapMargin>>20)},
		{"requests lost or answered twice", fmt.Sprint(res.lost())},
		{"problems", fmt.Sprint(len(res.problems))},
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func mapString(m map[string]int) string {
	var parts []string
	for _, k := range []string{"canceled", "served", "queue_timeout", "queue_full", "closed", "never reached the queue"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
		}
	}
	return strings.Join(parts, ", ")
}

func (res *result) print(w io.Writer) {
	fmt.Fprintf(w, "\n== %s backend\n", res.backend)
	for _, r := range res.rows() {
		fmt.Fprintf(w, "%-34s %s\n", r[0], r[1])
	}
	for _, p := range res.problems {
		fmt.Fprintln(w, "PROBLEM:", p)
	}
}

func writeReport(path string, results []*result, total time.Duration) error {
	var b strings.Builder
	b.WriteString(reportHead)
	fmt.Fprintf(&b, "## The last run\n\n`make soak`, %s, %d cores, %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"),
		runtimeCPU(), goVersion())
	b.WriteString("| | " + results[0].backend + " backend | " + results[1].backend + " backend |\n|---|---|---|\n")
	r0, r1 := results[0].rows(), results[1].rows()
	for i := range r0 {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r0[i][0], r0[i][1], r1[i][1])
	}
	for _, r := range results {
		for _, p := range r.problems {
			fmt.Fprintf(&b, "\nProblem (%s): %s\n", r.backend, p)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
