// Allocation counts, without -race: `make test` runs them with -run 'Allocat'.

package ginqueue_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
)

// Behaviour 1: a free slot and nobody waiting runs at once, with no
// allocation beyond the bare route's.
func TestFastPathAllocatesNothingExtra(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts need a build without -race; `make test` runs this test in one")
	}
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Second})
	assertAllocatesAsBare(t, q)
	st := q.Stats()
	assert.Equal(t, 0, st.Running)
	assert.EqualValues(t, 1001, st.Served)
}

// Server-Timing on a request that did not wait allocates nothing either.
func TestServerTimingAllocatesNothingExtra(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts need a build without -race; `make test` runs this test in one")
	}
	assertAllocatesAsBare(t, mustQueue(t, ginqueue.Config{MaxConcurrent: 4, ServerTiming: true}))
}

// assertAllocatesAsBare checks that a request through q, finding a free
// slot, allocates what the bare route does (1001 requests in all).
func assertAllocatesAsBare(t *testing.T, q *ginqueue.Queue) {
	t.Helper()
	h := func(c *gin.Context) { c.Status(http.StatusNoContent) }
	bare := gin.New()
	bare.GET("/", h)
	guarded := gin.New()
	guarded.Use(q.Handler())
	guarded.GET("/", h)
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	w := &discardWriter{h: http.Header{}}
	allocs := func(r *gin.Engine) float64 {
		return testing.AllocsPerRun(1000, func() { r.ServeHTTP(w, req) })
	}
	assert.Equal(t, allocs(bare), allocs(guarded))
}

// With Config.Deadline, a request that sends no deadline and finds a free
// slot allocates nothing more than without the Queue.
func TestDeadlineWithoutHeaderAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts need a build without -race; `make test` runs this test in one")
	}
	q := deadlineQueue(t, ginqueue.Config{MaxConcurrent: 4, MaxQueue: 4, QueueTimeout: time.Second})
	assertAllocatesAsBare(t, q)
	assert.EqualValues(t, 1001, q.Stats().Served)
}

// The middleware's defers are open-coded: a defer the compiler puts on the
// stack instead costs the fast path about 20 ns, a third of its time. The
// compiler open-codes a function's defers only while they and its returns
// are few, so a defer added to serve can tip it over.
func TestMiddlewareDefersAreOpenCoded(t *testing.T) {
	out, err := exec.Command("go", "build", "-o", os.DevNull, "-gcflags=-d=defer", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "ginqueue.go") {
			assert.Contains(t, line, "open-coded defer")
		}
	}
	assert.Contains(t, string(out), "ginqueue.go", "the compiler's report names the middleware's defers")
}
