package promqueue_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/promqueue"
)

// BenchmarkScrape is one gather of a registry holding a Collector with 1
// and with 50 Queues: what a Prometheus scrape costs the process.
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{1, 50} {
		b.Run(strconv.Itoa(n)+" queues", func(b *testing.B) {
			c := promqueue.NewCollector()
			for i := range n {
				q, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Second})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = q.Close() })
				if err := c.Add("q"+strconv.Itoa(i), q); err != nil {
					b.Fatal(err)
				}
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(c)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
