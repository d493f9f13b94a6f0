// Config.Validate, the errors it gives, and the flow key helpers.

package ginqueue_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ginqueue/ginqueue"
)

// Behaviour 11: bad configuration is refused, naming the field and value.
func TestBadConfigIsRefused(t *testing.T) {
	tests := []struct {
		name string
		cfg  ginqueue.Config
		want string
	}{
		{"zero value", ginqueue.Config{}, "Config.MaxConcurrent must be at least 1, got 0"},
		{"negative concurrency", ginqueue.Config{MaxConcurrent: -3}, "got -3"},
		{"huge concurrency", ginqueue.Config{MaxConcurrent: 1 << 31}, "Config.MaxConcurrent must be at most"},
		{"negative queue", ginqueue.Config{MaxConcurrent: 1, MaxQueue: -1}, "Config.MaxQueue must not be negative, got -1"},
		{"huge queue", ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1 << 31}, "Config.MaxQueue must be at most"},
		{"negative timeout", ginqueue.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: -time.Second}, "Config.QueueTimeout must not be negative, got -1s"},
		{"negative retry", ginqueue.Config{MaxConcurrent: 1, RetryAfter: -1}, "Config.RetryAfter must not be negative"},
		{"timeout status 200", ginqueue.Config{MaxConcurrent: 1, QueueTimeoutStatus: 200}, "Config.QueueTimeoutStatus must be 0 or in [400, 599], got 200"},
		{"timeout status 399", ginqueue.Config{MaxConcurrent: 1, QueueTimeoutStatus: 399}, "Config.QueueTimeoutStatus must be 0 or in [400, 599], got 399"},
		{"timeout status 600", ginqueue.Config{MaxConcurrent: 1, QueueTimeoutStatus: 600}, "Config.QueueTimeoutStatus must be 0 or in [400, 599], got 600"},
		{"negative timeout status", ginqueue.Config{MaxConcurrent: 1, QueueTimeoutStatus: -408}, "got -408"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "ginqueue: "), err.Error())
			assert.Contains(t, err.Error(), tt.want)
			_, err = ginqueue.NewQueue(tt.cfg)
			assert.Error(t, err)
			assert.PanicsWithError(t, err.Error(), func() { ginqueue.New(tt.cfg) })
		})
	}
	assert.NoError(t, ginqueue.DefaultConfig().Validate())
}

func TestPriorityConfigIsChecked(t *testing.T) {
	flow := ginqueue.ByClientIP()
	for _, tt := range []struct {
		cfg  ginqueue.Config
		want string
	}{
		{ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, MaxQueuePerFlow: -1, FlowKey: flow}, "Config.MaxQueuePerFlow must not be negative, got -1"},
		{ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, MaxQueuePerFlow: 5, FlowKey: flow}, "Config.MaxQueuePerFlow must not exceed Config.MaxQueue (4), got 5"},
		{ginqueue.Config{MaxConcurrent: 1, MaxQueue: 4, MaxQueuePerFlow: 2}, "Config.MaxQueuePerFlow 2 needs Config.FlowKey"},
	} {
		err := tt.cfg.Validate()
		require.Error(t, err)
		assert.Contains(t, err.Error(), tt.want)
	}
}

func TestFlowKeyHelpers(t *testing.T) {
	r := gin.New()
	var ip, hdr, route string
	r.GET("/users/:id", func(c *gin.Context) {
		ip, hdr, route = ginqueue.ByClientIP()(c), ginqueue.ByHeader("X-Tenant")(c), ginqueue.ByRoute()(c)
	})
	req := httptest.NewRequest(http.MethodGet, "/users/42", nil)
	req.RemoteAddr = "192.0.2.7:5555"
	req.Header.Set("X-Tenant", "acme")
	r.ServeHTTP(httptest.NewRecorder(), req)
	assert.Equal(t, "192.0.2.7", ip)
	assert.Equal(t, "acme", hdr)
	assert.Equal(t, "/users/:id", route)
}
