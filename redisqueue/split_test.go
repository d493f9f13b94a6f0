// A Name split into parts (Options.Parts): the limit holds across the
// parts, moves to where the demand is, and goes to the highest priority
// first; replicas that disagree on the split refuse to start.

package redisqueue_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/backend"
	"github.com/ginqueue/ginqueue/redisqueue"
)

// splitOptions is a split of a Name into parts that rebalances 5 times a
// second.
func splitOptions(t *testing.T, parts int) redisqueue.Options {
	return redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares, Shares: redisqueue.SharesOptions{Parts: parts, RebalancePeriod: 200 * time.Millisecond}}
}

// byPart groups replicas by the part they run in.
func byPart(rs []*replica, parts int) [][]*replica {
	out := make([][]*replica, parts)
	for _, r := range rs {
		p := redisqueue.PartOf(r.b)
		out[p] = append(out[p], r)
	}
	return out
}

// The limit holds across the parts at every instant (a counter outside the
// library), every part is served while the load is spread, and when the
// load moves to one part the limit follows it within a few rebalances.
func TestSplitKeepsTheLimitAndFollowsTheLoad(t *testing.T) {
	needRedis(t)
	const limit, parts, handler = 8, 4, 10 * time.Millisecond
	f := &fleetCounter{}
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 256, QueueTimeout: 5 * time.Second}
	rs := sharesFleet(t, 16, cfg, splitOptions(t, parts), f.handler(handler))
	groups := byPart(rs, parts)

	clients := make([]int, len(rs))
	for i := range clients {
		clients[i] = 2
	}
	got := drive(rs, clients, 2*time.Second)
	for p, g := range groups {
		served := 0
		for _, r := range g {
			for i := range rs {
				if rs[i] == r {
					served += got[i][http.StatusOK]
				}
			}
		}
		if len(g) > 0 && served == 0 {
			t.Errorf("part %d (%d replicas) served nothing while the load was spread", p, len(g))
		}
	}
	for i, m := range got {
		if m[http.StatusRequestTimeout] > 0 || m[http.StatusServiceUnavailable] > 0 {
			t.Errorf("replica %d answered %v", i, m)
		}
	}

	// The load moves to the largest part alone.
	big := 0
	for p := range groups {
		if len(groups[p]) > len(groups[big]) {
			big = p
		}
	}
	moved := make([]int, len(rs))
	for i, r := range rs {
		if redisqueue.PartOf(r.b) == big {
			moved[i] = 8
		}
	}
	start := time.Now()
	var reached time.Duration
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		for time.Since(start) < 3*time.Second {
			if reached == 0 && f.now.Load() >= limit-1 {
				reached = time.Since(start)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	drive(rs, moved, 3*time.Second)
	<-stop
	if reached == 0 || reached > 2*time.Second {
		t.Errorf("the part with the load ran %d of %d at most, %v after the load moved to it", f.now.Load(), limit, reached)
	} else {
		t.Logf("the part with the load ran %d of %d within %v", limit-1, limit, reached)
	}
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d running across the parts, limit %d", p, limit)
	}
}

// A priority-5 request in one part goes before a priority-0 request in
// another: the rebalancer gives the limit to the highest band first.
func TestSplitComparesPrioritiesAcrossParts(t *testing.T) {
	needRedis(t)
	const limit, parts, handler = 4, 2, 20 * time.Millisecond
	pc := &prioCounter{n: map[int]int{}}
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 10 * time.Second,
		Priority: func(c *gin.Context) int { p, _ := strconv.Atoi(c.Query("p")); return p }}
	o := splitOptions(t, parts)
	var groups [][]*replica
	for range 20 {
		rs := sharesFleet(t, 4, cfg, o, pc.handler(handler))
		if groups = byPart(rs, parts); len(groups[0]) > 0 && len(groups[1]) > 0 {
			break
		}
		o.Name = newName(t)
	}
	if len(groups[0]) == 0 || len(groups[1]) == 0 {
		t.Fatal("the replicas fell in one part 20 times running")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	prioClients(groups[0][0], 12, 0, stop, &wg)
	prioClients(groups[1][0], 6, 5, stop, &wg)
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	lo, hi := pc.get(0), pc.get(5)
	t.Logf("priority 5: %d answers, priority 0: %d", hi, lo)
	if hi < 5*max(lo, 1) {
		t.Errorf("priority 5 got %d answers and priority 0 %d, want at least 5×", hi, lo)
	}
}

// Replicas that split a Name otherwise, or do not split it, refuse to
// start beside live ones, whichever starts first.
func TestSplitRefusesOtherSplits(t *testing.T) {
	needRedis(t)
	l := backend.Limits{MaxConcurrent: 4, MaxQueue: 8}
	o := splitOptions(t, 4)
	startBackends(t, 1, l, o)
	cases := []struct {
		name string
		o    redisqueue.Options
		l    backend.Limits
	}{
		{"other parts", redisqueue.Options{Name: o.Name, Mode: redisqueue.Shares, Shares: redisqueue.SharesOptions{Parts: 2}}, l},
		{"no parts", redisqueue.Options{Name: o.Name, Mode: redisqueue.Shares}, l},
		{"global queue", redisqueue.Options{Name: o.Name, Mode: redisqueue.GlobalQueue}, l},
		{"other MaxConcurrent", o, backend.Limits{MaxConcurrent: 5, MaxQueue: 8}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := redisqueue.New(newClient(t, redisAddr), c.o)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if err := b.Start(c.l); !errors.Is(err, redisqueue.ErrConflict) {
				t.Fatalf("Start beside a split of 4 parts: %v, want ErrConflict", err)
			}
		})
	}
	// And a split replica refuses to start beside replicas that do not split.
	plain := redisqueue.Options{Name: newName(t), Mode: redisqueue.Shares}
	startBackends(t, 1, l, plain)
	b, err := redisqueue.New(newClient(t, redisAddr), redisqueue.Options{Name: plain.Name, Mode: redisqueue.Shares, Shares: redisqueue.SharesOptions{Parts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Start(l); !errors.Is(err, redisqueue.ErrConflict) {
		t.Fatalf("a split replica beside one that does not split: %v, want ErrConflict", err)
	}
}

// SetLimit on any replica moves the Name's limit, and the parts follow at
// once; GlobalStats reports the Name's figures.
func TestSplitSetLimit(t *testing.T) {
	needRedis(t)
	l := backend.Limits{MaxConcurrent: 4, MaxQueue: 8}
	bs := startBackends(t, 6, l, splitOptions(t, 3))
	if err := bs[0].SetLimit(9); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the Name's limit is 9", func() bool {
		gs, err := bs[5].GlobalStats(context.Background())
		return err == nil && gs.Limit == 9 && gs.Replicas == 6
	})
}

// On a Redis Cluster of 3 shards, a Name split into 3 parts puts each part
// on a shard of its own, and the limit holds across them.
func TestTopologyClusterSplit(t *testing.T) {
	long(t)
	c := startCluster(t)
	const limit, parts, handler = 6, 3, 10 * time.Millisecond
	o := splitOptions(t, parts)
	masters := map[string]bool{}
	for p := range parts {
		m, _, err := c.owner(c.addrs()[0], redisqueue.PartKey(o, p, "sm"))
		if err != nil {
			t.Fatal(err)
		}
		masters[m] = true
	}
	if len(masters) != parts {
		t.Fatalf("the %d parts are on %d shards, want one each", parts, len(masters))
	}
	top := clusterTopology(c)
	f := &fleetCounter{}
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 256, QueueTimeout: 5 * time.Second}
	rs := make([]*replica, 9)
	for i := range rs {
		rs[i] = newReplicaOn(t, top.client(false), cfg, o, f.handler(handler))
	}
	clients := make([]int, len(rs))
	for i := range clients {
		clients[i] = 2
	}
	got := drive(rs, clients, 3*time.Second)
	for p, g := range byPart(rs, parts) {
		served := 0
		for _, r := range g {
			served += got[slices.Index(rs, r)][http.StatusOK]
		}
		if len(g) > 0 && served == 0 {
			t.Errorf("part %d (%d replicas) served nothing", p, len(g))
		}
	}
	if p := f.peak.Load(); p > limit {
		t.Errorf("peak %d running across the shards, limit %d", p, limit)
	}
	gs, err := rs[0].b.GlobalStats(context.Background())
	if err != nil || gs.Limit != limit || gs.Replicas != len(rs) {
		t.Errorf("GlobalStats = %+v (%v), want the limit %d and %d replicas", gs, err, limit, len(rs))
	}
}

// With far more parts than replicas, the limit still follows the demand,
// and an idle fleet stays known: about three replicas try to rebalance
// each period whatever the parts. Each replica used to try with odds of
// three in (its part's replicas × the parts): 4 replicas in 1,024 parts
// rebalanced about once a minute, a loaded replica kept 2 of 8 slots for
// 20 s, and once idle the fleet's entry lapsed, so that a replica that
// did not split the Name started beside it.
func TestSplitWithManyPartsFollowsTheLoad(t *testing.T) {
	needRedis(t)
	const limit = 8
	o := splitOptions(t, redisqueue.MaxParts)
	o.LeaseTTL = time.Second
	cfg := ginqueue.Config{MaxConcurrent: limit, MaxQueue: 64, QueueTimeout: 5 * time.Second}
	rs := sharesFleet(t, 4, cfg, o, func(c *gin.Context) { time.Sleep(10 * time.Millisecond) })
	clients := []int{16, 0, 0, 0}
	done := make(chan struct{})
	go func() { drive(rs, clients, 3*time.Second); close(done) }()
	eventually(t, 2500*time.Millisecond, "the loaded replica never held 6 of the 8 slots", func() bool {
		return rs[0].b.Stats().Limit >= 6
	})
	<-done
	// Idle past the fleet's entry (3 periods and a lease), then a replica
	// that does not split the Name is refused.
	time.Sleep(2 * time.Second)
	b, err := redisqueue.New(newClient(t, redisAddr), redisqueue.Options{Name: o.Name, Mode: redisqueue.Shares})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Start(backend.Limits{MaxConcurrent: limit, MaxQueue: 8}); !errors.Is(err, redisqueue.ErrConflict) {
		t.Fatalf("an unsplit replica beside an idle split fleet: %v, want ErrConflict", err)
	}
}

// Weighted requests are refused on a split Name: a part's limit could be
// below a request's cost, and a request of cost 6 ran in a part given 3
// slots (13 running, limit 10).
func TestSplitRefusesWeightedRequests(t *testing.T) {
	needRedis(t)
	b, err := redisqueue.New(newClient(t, redisAddr), splitOptions(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = b.Start(backend.Limits{MaxConcurrent: 10, MaxQueue: 8, Weighted: true})
	if err == nil || !strings.Contains(err.Error(), "Config.Cost") {
		t.Fatalf("Start with weighted requests on a split Name: %v, want an error naming Config.Cost", err)
	}
}
