package redisqueue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	good := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer good.Close()
	plain := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer plain.Close()
	tests := []struct {
		name string
		rdb  redis.UniversalClient
		o    redisqueue.Options
		want string
	}{
		{"empty name", good, redisqueue.Options{Mode: redisqueue.GlobalQueue}, "Options.Name"},
		{"name with a brace", good, redisqueue.Options{Name: "a}b", Mode: redisqueue.GlobalQueue}, "Options.Name"},
		{"prefix with a brace", good, redisqueue.Options{Name: "a", KeyPrefix: "{x", Mode: redisqueue.GlobalQueue}, "Options.KeyPrefix"},
		{"negative lease", good, redisqueue.Options{Name: "a", LeaseTTL: -1, Mode: redisqueue.GlobalQueue}, "Options.LeaseTTL"},
		{"lease shorter than call timeouts", good, redisqueue.Options{Name: "a", LeaseTTL: 300 * time.Millisecond, CallTimeout: 100 * time.Millisecond, Mode: redisqueue.GlobalQueue}, "Options.LeaseTTL"},
		{"negative call timeout", good, redisqueue.Options{Name: "a", CallTimeout: -1, Mode: redisqueue.GlobalQueue}, "Options.CallTimeout"},
		{"tick above lease/3", good, redisqueue.Options{Name: "a", LeaseTTL: time.Second, Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: time.Second}}, "Options.GlobalQueue.TickInterval"},
		{"tick below 10 ms", good, redisqueue.Options{Name: "a", Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{TickInterval: time.Millisecond}}, "Options.GlobalQueue.TickInterval"},
		{"unknown policy", good, redisqueue.Options{Name: "a", OnRedisDown: 7, Mode: redisqueue.GlobalQueue}, "Options.OnRedisDown"},
		{"negative local limit", good, redisqueue.Options{Name: "a", Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{LocalLimit: -1}}, "Options.GlobalQueue.LocalLimit"},
		{"negative local queue", good, redisqueue.Options{Name: "a", Mode: redisqueue.GlobalQueue, GlobalQueue: redisqueue.GlobalQueueOptions{LocalQueue: -1}}, "Options.GlobalQueue.LocalQueue"},
		{"negative failure threshold", good, redisqueue.Options{Name: "a", FailureThreshold: -1, Mode: redisqueue.GlobalQueue}, "Options.FailureThreshold"},
		{"failures outlast the lease", good, redisqueue.Options{Name: "a", FailureThreshold: 10, CallTimeout: 150 * time.Millisecond, LeaseTTL: 600 * time.Millisecond, Mode: redisqueue.GlobalQueue}, "Options.FailureThreshold × Options.CallTimeout (10 × 150ms = 1.5s) must be below Options.LeaseTTL (600ms)"},
		{"failures last the default lease", good, redisqueue.Options{Name: "a", FailureThreshold: 100, Mode: redisqueue.GlobalQueue}, "Options.FailureThreshold × Options.CallTimeout (100 × 150ms = 15s)"},
		{"unknown mode", good, redisqueue.Options{Name: "a", Mode: 2}, "Options.Mode"},
		{"negative share period", good, redisqueue.Options{Name: "a", Shares: redisqueue.SharesOptions{Period: -1}}, "Options.Shares.Period"},
		{"share period below 5 ms", good, redisqueue.Options{Name: "a", Mode: redisqueue.Shares, Shares: redisqueue.SharesOptions{Period: time.Millisecond}}, "Options.Shares.Period"},
		{"share period above lease/4", good, redisqueue.Options{Name: "a", Mode: redisqueue.Shares, LeaseTTL: time.Second, Shares: redisqueue.SharesOptions{Period: 300 * time.Millisecond}}, "Options.Shares.Period"},
		{"local limit in shares mode", good, redisqueue.Options{Name: "a", Mode: redisqueue.Shares, GlobalQueue: redisqueue.GlobalQueueOptions{LocalLimit: 3}}, "Options.GlobalQueue is for GlobalQueue mode"},
		{"local queue in shares mode", good, redisqueue.Options{Name: "a", GlobalQueue: redisqueue.GlobalQueueOptions{LocalQueue: 3}}, "Options.GlobalQueue is for GlobalQueue mode"},
		{"parts in global queue mode", good, redisqueue.Options{Name: "a", Mode: redisqueue.GlobalQueue, Shares: redisqueue.SharesOptions{Parts: 2}}, "Options.Shares is for Shares mode"},
		{"nil client", nil, redisqueue.Options{Name: "a", Mode: redisqueue.GlobalQueue}, "nil"},
		{"client without context timeouts", plain, redisqueue.Options{Name: "a", Mode: redisqueue.GlobalQueue}, "ContextTimeoutEnabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := redisqueue.New(tt.rdb, tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: got %v, want an error naming %s", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "redisqueue: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
}

// New names the options type the user built when a setting is missing.
func TestNewNamesTheOptionsTypeUsed(t *testing.T) {
	for _, tt := range []struct {
		name string
		rdb  redis.UniversalClient
		want string
	}{
		{"plain", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "redis.Options (or redis.UniversalOptions)"},
		{"universal single", redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}}), "redis.UniversalOptions"},
		{"sentinel", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}}), "redis.FailoverOptions"},
		{"universal sentinel", redis.NewUniversalClient(&redis.UniversalOptions{MasterName: "m", Addrs: []string{"127.0.0.1:1"}}), "redis.FailoverOptions (or redis.UniversalOptions"},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), "redis.ClusterOptions"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer tt.rdb.Close()
			_, err := redisqueue.New(tt.rdb, redisqueue.Options{Name: "x", Mode: redisqueue.GlobalQueue})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
				t.Fatalf("got %v, want an error naming %q and ContextTimeoutEnabled", err, tt.want)
			}
		})
	}
}
