// The wait room through the Queue: priorities, flows taking turns, extreme keys.

package ginqueue_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
)

// 1 slot held, 50 low-priority waiters, then 1 high: the high one runs next,
// then the low ones in arrival order.
func TestHigherPriorityRunsFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := priorityQueue(t, 60, 0)
		g, r := gated(q)
		out := make(chan result, 52)
		sendAt(r, 0, 0, "", out)
		for id := 1; id <= 50; id++ {
			sendAt(r, id, 0, "", out)
		}
		sendAt(r, 99, 5, "", out)
		assert.Equal(t, []backend.PriorityCount{{Priority: 5, Queued: 1}, {Priority: 0, Queued: 50}}, q.Stats().QueuedByPriority)
		assert.Equal(t, 0, <-g.started)
		want := append([]int{99}, seq(1, 50)...)
		for _, id := range want {
			g.open(1)
			assert.Equal(t, id, <-g.started)
		}
		g.open(1)
		for range 52 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
		assert.Nil(t, q.Stats().QueuedByPriority)
	})
}

func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// Flow A queues 40, then flow B queues 4: B's 4 are among the first 8
// started, and each flow stays FIFO.
func TestFlowsTakeTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := priorityQueue(t, 50, 0)
		g, r := gated(q)
		out := make(chan result, 45)
		sendAt(r, 0, 0, "hold", out)
		for id := 1; id <= 40; id++ {
			sendAt(r, id, 0, "A", out)
		}
		for id := 101; id <= 104; id++ {
			sendAt(r, id, 0, "B", out)
		}
		<-g.started
		var order []int
		for range 44 {
			g.open(1)
			order = append(order, <-g.started)
		}
		g.open(1)
		var firstB, a, b []int
		for i, id := range order {
			if id > 100 {
				b = append(b, id)
				if i < 8 {
					firstB = append(firstB, id)
				}
			} else {
				a = append(a, id)
			}
		}
		assert.Equal(t, []int{101, 102, 103, 104}, firstB, "order %v", order[:8])
		assert.Equal(t, seq(1, 40), a, "flow A must stay FIFO")
		assert.Equal(t, []int{101, 102, 103, 104}, b)
		for range 45 {
			<-out
		}
	})
}

// Timeouts, hang-ups and Close reach waiters at every priority; the counters
// and the per-priority stats follow.
func TestOutcomesAtEveryPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, err := ginqueue.NewQueue(ginqueue.Config{
			MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: time.Second,
			Priority: byQueryPriority, FlowKey: byQueryFlow,
		})
		require.NoError(t, err)
		g, r := gated(q)
		out := make(chan result, 10)
		sendAt(r, 0, 0, "", out)
		t0 := time.Now()
		sendAt(r, 1, 3, "x", out) // times out
		sendAt(r, 2, -3, "y", out)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, "/?id=3&p=7", nil))
			out <- result{id: 3, code: w.Code}
		}()
		synctest.Wait()
		assert.Equal(t, []backend.PriorityCount{{Priority: 7, Queued: 1}, {Priority: 3, Queued: 1}, {Priority: -3, Queued: 1}}, q.Stats().QueuedByPriority)
		cancel()
		assert.Equal(t, result{id: 3, code: ginqueue.StatusClientClosedRequest}, <-out)
		time.Sleep(500 * time.Millisecond)
		sendAt(r, 4, 9, "z", out) // arrives later: closed before its deadline
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		got := map[int]int{}
		for range 2 {
			res := <-out
			got[res.id] = res.code
		}
		assert.Equal(t, map[int]int{1: http.StatusRequestTimeout, 2: http.StatusRequestTimeout}, got)
		assert.Equal(t, time.Second, time.Since(t0))
		require.NoError(t, q.Close())
		assert.Equal(t, result{id: 4, code: http.StatusServiceUnavailable}, <-out)
		g.open(1)
		assert.Equal(t, http.StatusOK, (<-out).code)
		st := q.Stats()
		assert.Equal(t, ginqueue.Stats{Stats: backend.Stats{Limit: 1, Served: 1, ServedAtOnce: 1, Released: 1}, QueueTimeout: 2, Canceled: 1, Closed: 1, DrainRate: 1}, st)
	})
}

// Bad input at the extremes: priorities at MinInt and MaxInt, flow keys of
// 1 MiB and of invalid UTF-8. Each request gets a clear outcome, in priority
// order, and no panic.
func TestExtremeInputs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := mustQueue(t, ginqueue.Config{
			MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Minute, MaxQueuePerFlow: 2,
			Priority: func(c *gin.Context) int {
				switch c.GetHeader("X-Priority") {
				case "max":
					return math.MaxInt
				case "min":
					return math.MinInt
				}
				return 0
			},
			FlowKey: ginqueue.ByHeader("X-Client"),
		})
		g, r := gated(q)
		out := make(chan result, 8)
		huge := strings.Repeat("x", 1<<20)
		send := func(id int, prio, client string) {
			go func() {
				req := httptest.NewRequest(http.MethodGet, fmt.Sprintf("/?id=%d", id), nil)
				req.Header.Set("X-Priority", prio)
				req.Header.Set("X-Client", client)
				w := httptest.NewRecorder()
				r.ServeHTTP(w, req)
				out <- result{id: id, code: w.Code}
			}()
			synctest.Wait()
		}
		send(0, "", "a")
		send(1, "min", huge)
		send(2, "min", huge)
		send(3, "min", huge) // the 1 MiB key's flow is at its cap of 2
		assert.Equal(t, result{id: 3, code: http.StatusServiceUnavailable}, <-out)
		send(4, "max", "\xff\xfe\xfd")
		send(5, "", "b")
		assert.Equal(t, []backend.PriorityCount{{Priority: math.MaxInt, Queued: 1}, {Priority: 0, Queued: 1}, {Priority: math.MinInt, Queued: 2}}, q.Stats().QueuedByPriority)
		assert.Equal(t, 0, <-g.started)
		for _, id := range []int{4, 5, 1, 2} {
			g.open(1)
			assert.Equal(t, id, <-g.started)
		}
		g.open(1)
		for range 5 {
			assert.Equal(t, http.StatusOK, (<-out).code)
		}
	})
}
