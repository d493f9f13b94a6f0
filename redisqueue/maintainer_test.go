package redisqueue_test

import (
	"context"
	"testing"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// A client its owner closed right after Close (a common shutdown order)
// will never answer: the maintainer stops at once instead of retrying, until
// LeaseTTL, the call that gives its share back.
func TestMaintainerStopsWhenTheClientIsClosed(t *testing.T) {
	needRedis(t)
	defer goleak.VerifyNone(t, goRedisProbe)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	b, err := redisqueue.New(rdb, redisqueue.Options{Name: newName(t), Mode: redisqueue.GlobalQueue})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(backend.Limits{MaxConcurrent: 1, MaxQueue: 2}); err != nil {
		t.Fatal(err)
	}
	tk, err := b.Acquire(context.Background(), backend.Arrival{})
	if err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	_ = rdb.Close()
	b.Release(tk) // its release and the call that gives its share back find the client closed
}
