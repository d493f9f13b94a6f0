// Command load sends requests all at once and counts the statuses that come
// back: the load for the README's Quick start (go run ./quickstart).
//
//	cd _example && go run ./load                 # 20 requests to http://127.0.0.1:8080/api/report
//	cd _example && go run ./load -n 40 -url http://127.0.0.1:8080/api/report
package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8080/api/report", "the URL to GET")
	n := flag.Int("n", 20, "how many requests to send at once")
	flag.Parse()

	// The default transport dials a connection for each request in flight,
	// so no pool holds the burst back.
	client := &http.Client{Timeout: time.Minute}
	statuses := make([]int, *n) // 0 where the request failed
	errs := make([]error, *n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range *n {
		wg.Go(func() {
			resp, err := client.Get(*url)
			if err != nil {
				errs[i] = err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	took := time.Since(start)

	counts := map[int]int{}
	for _, s := range statuses {
		counts[s]++
	}
	if counts[0] == *n {
		fmt.Fprintf(os.Stderr, "load: every request failed (is the server running?): %v\n", firstErr(errs))
		os.Exit(1)
	}
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(counts)) {
		if s == 0 {
			parts = append(parts, fmt.Sprintf("%d failed (%v)", counts[s], firstErr(errs)))
			continue
		}
		parts = append(parts, fmt.Sprintf("%d × %d %s", counts[s], s, http.StatusText(s)))
	}
	fmt.Printf("%d requests in %v: %s\n", *n, took.Round(time.Millisecond), strings.Join(parts, ", "))
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
