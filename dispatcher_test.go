// The in-memory Backend's lifecycle, through the exported API.

package ginqueue_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/internal/inmem"
)

// A Backend serves one Queue: giving the same one to a second Queue is
// refused with a clear error, and the first keeps its own limits.
func TestBackendServesOneQueue(t *testing.T) {
	b := inmem.New()
	q := mustQueue(t, ginqueue.Config{MaxConcurrent: 3, Backend: b})
	_, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 7, MaxQueue: 5, Backend: b})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already serves a Queue")
	assert.Equal(t, 3, q.Stats().Limit, "the first Queue keeps its limits")
}

// A Backend that never started (NewQueue refused its Config first) can still
// be closed and drained, more than once, and once closed it starts no Queue.
func TestMemoryBackendClosedBeforeStart(t *testing.T) {
	b := inmem.New()
	_, err := ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: -1, Backend: b})
	require.Error(t, err)
	assert.NoError(t, b.Drain(context.Background()))
	assert.NoError(t, b.Close())
	assert.NoError(t, b.Close())
	assert.NoError(t, b.Drain(context.Background()))
	_, err = ginqueue.NewQueue(ginqueue.Config{MaxConcurrent: 1, Backend: b})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "closed before it started")
}
