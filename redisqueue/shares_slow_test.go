package redisqueue_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// callHook holds every call of its client in wait before it goes to
// Redis; a call whose wait fails fails with its error.
type callHook struct{ wait func(context.Context) error }

func (h callHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h callHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h callHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

// slowHook delays every call of its client by delay, or until the call's
// context ends: a Redis that answers, but late.
type slowHook struct{ delay atomic.Int64 }

func (h *slowHook) wait(ctx context.Context) error {
	d := time.Duration(h.delay.Load())
	if d == 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stateLog records a Backend's OnStateChange calls.
type stateLog struct{ downs, ups atomic.Int64 }

func (l *stateLog) hook(down bool, _ error) {
	if down {
		l.downs.Add(1)
	} else {
		l.ups.Add(1)
	}
}

// A Redis that answers every call three CallTimeouts late is slow, not
// gone: a replica of a large fleet (65 here) marks it down, then its
// probes wait longer for their answers, and one gets it while Redis is
// still that slow. Each probe used to wait one CallTimeout, so the replica
// stayed marked down for as long as Redis was slow: a thousand replicas
// started at once kept Redis that slow with their probes alone, for tens
// of seconds.
func TestAReplicaOfALargeFleetFindsASlowRedisAnswering(t *testing.T) {
	needRedis(t)
	slow := &slowHook{}
	rdb := newClient(t, redisAddr)
	rdb.AddHook(callHook{slow.wait})
	var log stateLog
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, CallTimeout: 50 * time.Millisecond}
	startBackends(t, 64, backend.Limits{MaxConcurrent: 2, MaxQueue: 8}, o)
	o.FailureThreshold, o.OnStateChange = 1, log.hook
	r := newReplicaOn(t, rdb, ginqueue.Config{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: 3 * time.Second}, o, nil)
	slow.delay.Store(int64(150 * time.Millisecond))
	t.Cleanup(func() { slow.delay.Store(0) }) // before the Queue closes: it says goodbye to Redis
	_ = r.b.SetLimit(3)                       // a call that times out: Redis is marked down
	eventually(t, 2*time.Second, "Redis was never marked down", func() bool { return log.downs.Load() > 0 })
	eventually(t, 3*time.Second, "a Redis that answers 150 ms late was never found answering", func() bool { return log.ups.Load() > 0 })
}

// A replica that starts while Redis is too busy to answer its first calls
// within their CallTimeout (here, for its first 700 ms) keeps its requests
// waiting until its probes get an answer, and serves them. It used to
// answer 503 from its first probe that ran out of time.
func TestAStartingReplicaWaitsForABusyRedis(t *testing.T) {
	needRedis(t)
	slow := &slowHook{}
	slow.delay.Store(int64(120 * time.Millisecond))
	rdb := newClient(t, redisAddr)
	rdb.AddHook(callHook{slow.wait})
	var log stateLog
	o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, CallTimeout: 50 * time.Millisecond, OnStateChange: log.hook}
	busy := time.AfterFunc(700*time.Millisecond, func() { slow.delay.Store(0) })
	defer busy.Stop()
	r := newReplicaOn(t, rdb, ginqueue.Config{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: 5 * time.Second}, o, nil)
	if code := r.get(); code != http.StatusOK {
		t.Fatalf("a request to a replica that started while Redis answered 120 ms late: %d, want 200", code)
	}
	if log.downs.Load() == 0 {
		t.Fatal("Redis was never marked down: the test did not test a slow start")
	}
}

// A replica that starts while its Redis is stopped (SIGSTOP: it accepts
// connections and answers nothing) answers 503 once its probes have waited
// long enough, within a few seconds, not 408 at the end of a QueueTimeout
// of 6 s. With a CallTimeout below 62.5 ms it used to answer 408: its
// probes never waited long enough.
func TestAReplicaStartedOnAStoppedRedisAnswersUnavailable(t *testing.T) {
	for _, ct := range []time.Duration{20 * time.Millisecond, redisqueue.DefaultCallTimeout} {
		t.Run(ct.String(), func(t *testing.T) {
			srv := startRedis(t)
			p := srv.cmd.Process
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = p.Signal(syscall.SIGCONT) }()
			o := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, CallTimeout: ct}
			r := newReplica(t, srv.addr(), ginqueue.Config{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: 6 * time.Second}, o, nil)
			start := time.Now()
			code := r.get()
			took := time.Since(start)
			t.Logf("answered %d after %v", code, took)
			if code != http.StatusServiceUnavailable || took > 4*time.Second {
				t.Fatalf("a request to a replica that started while Redis was stopped: %d after %v, want 503 within 4 s", code, took)
			}
			_ = p.Signal(syscall.SIGCONT) // before the Queue closes: it says goodbye to Redis
		})
	}
}
