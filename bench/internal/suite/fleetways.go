package suite

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ginqueue/ginqueue"
	"github.com/ginqueue/ginqueue/redisqueue"
	"github.com/redis/go-redis/v9"
)

// Section 14: one limit for a fleet of replicas, shared three ways.

// The ways of sharing the limit, the rows of section 14's table.
const (
	FleetStatic = "static split"
	FleetGlobal = "redisqueue GlobalQueue"
	FleetShares = "redisqueue Shares"
)

// fleetWays are section 14's ways, in the order each scenario runs them.
func fleetWays() []string { return []string{FleetStatic, FleetGlobal, FleetShares} }

// FleetShare is a replica's slots in the static split.
func (p Plan) FleetShare() int { return p.FleetLimits.MaxConcurrent / p.FleetReplicas }

// FleetUnevenClients lists the clients of each replica under uneven
// saturation: "8, 8, 8 and 104".
func (p Plan) FleetUnevenClients() string { return andList(p.FleetUneven) }

// seenNames is a go-redis hook that notes the name of every command a
// client sends.
type seenNames struct{ names sync.Map } // name → nil

func (s *seenNames) note(name string) {
	if _, ok := s.names.Load(name); !ok {
		s.names.Store(name, nil)
	}
}

func (s *seenNames) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *seenNames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { s.note(cmd.Name()); return next(ctx, cmd) }
}

func (s *seenNames) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			s.note(c.Name())
		}
		return next(ctx, cmds)
	}
}

// roundTrips splits d's calls into those the replicas sent and those
// their scripts ran inside Redis. A client sent a command that a hook saw,
// one that Redis refuses to run in a script (COMMAND INFO flag noscript),
// and INFO and PING, which redisqueue sends on clients no hook sees.
func roundTrips(ctx context.Context, ctl *redis.Client, seen *seenNames, d redisLoad) (sent, inScript map[string]float64, err error) {
	args, moved := []any{"command", "info"}, []string{}
	for c, n := range d.calls {
		if n != 0 { // Redis 7 takes a subcommand such as "client|setinfo" as is
			args, moved = append(args, c), append(moved, c)
		}
	}
	res, err := ctl.Do(ctx, args...).Slice()
	if err != nil {
		return nil, nil, fmt.Errorf("COMMAND INFO: %w", err)
	}
	noscript := map[string]bool{}
	for i, e := range res {
		if info, _ := e.([]any); i < len(moved) && len(info) > 2 { // nil: unknown to this Redis
			flags, _ := info[2].([]any)
			noscript[moved[i]] = slices.Contains(flags, any("noscript"))
		}
	}
	sent, inScript = map[string]float64{}, map[string]float64{}
	for c, n := range d.calls {
		cmd, _, _ := strings.Cut(c, "|")
		if _, ok := seen.names.Load(cmd); ok || noscript[c] || cmd == "info" || cmd == "ping" {
			sent[c] = n
		} else {
			inScript[c] = n
		}
	}
	sent["info"]-- // the window's first INFO is in the second's count: the measurement's own
	return sent, inScript, nil
}

// commands lists calls by name, most first: "evalsha 1,234, blpop 56".
func commands(calls map[string]float64) string {
	names := slices.SortedFunc(maps.Keys(calls), func(a, b string) int { return cmp.Or(cmp.Compare(calls[b], calls[a]), cmp.Compare(a, b)) })
	s := make([]string, 0, len(names))
	for _, n := range names {
		if calls[n] != 0 {
			s = append(s, n+" "+digits(int(calls[n])))
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// fleetRun serves clients[i] closed-loop clients on replica i, handlers
// that sleep work, the replicas sharing the limit as way says.
func (r *runner) fleetRun(sh *sharedRedis, way, name string, clients []int, work time.Duration) (*fleetPoint, error) {
	ctx, seen := context.Background(), &seenNames{}
	l := r.FleetLimits
	f := &fleet{replicas: make([]replica, len(clients)), work: work,
		cfg: ginqueue.Config{MaxConcurrent: l.MaxConcurrent, MaxQueue: l.MaxQueue, QueueTimeout: l.QueueTimeout}}
	if way == FleetStatic {
		f.cfg.MaxConcurrent = r.FleetShare()
	} else {
		f.dial = func() redis.UniversalClient {
			c := newRedisClient(sh.addr)
			c.AddHook(seen)
			return c
		}
		f.opts = redisqueue.Options{Name: sh.prefix + name, Mode: redisqueue.Shares}
		if way == FleetGlobal {
			f.opts.Mode = redisqueue.GlobalQueue
		}
		f.nodes = []*redis.Client{sh.ctl}
	}
	defer f.close()
	if err := f.start(ctx); err != nil {
		return nil, err
	}
	pt, err := f.measure(ctx, clients, 0, r.FleetWarmUp, r.FleetWindow, nil)
	if err == nil && pt.redis != nil {
		pt.sent, pt.inScript, err = roundTrips(ctx, sh.ctl, seen, pt.redis[0])
	}
	if n := pt.refusals(); err == nil && n > 0 {
		err = fmt.Errorf("%d requests not served: 503 %d, 408 %d, other %d", n, pt.Refused[refused503], pt.Refused[refused408], pt.Refused[refusedOther])
	}
	return pt, err
}

// fleet is section 14: every way under an even load, an even load of short
// handlers and an uneven load; without a Redis, the static split alone.
func (r *runner) fleet() {
	ctx, ways := context.Background(), fleetWays()
	r.res.Fleet.Cols = ways
	sh, _, why := openRedis(ctx)
	defer sh.ctl.Close()
	if why != "" {
		r.res.FleetWhy = fmt.Sprintf("No Redis answered at REDIS_ADDR (default %s), so only the static split was measured in this run (%s).", DefaultRedisAddr, why)
		r.logf("  %s", r.res.FleetWhy)
		ways = ways[:1]
	} else {
		defer r.deleteKeys(ctx, sh, FleetShares, "14. deleting the run's keys")
	}
	rows := r.fleetRows()
	saturated := slices.Repeat([]int{r.FleetClients}, r.FleetReplicas)
	seq := 0
	for _, sc := range []struct {
		name    string
		clients []int
		work    time.Duration
	}{
		{"even", saturated, r.FleetWork},
		{"short", saturated, r.FleetShortWork},
		{"uneven", r.FleetUneven, r.FleetUnevenWork},
	} {
		for _, way := range ways {
			seq++
			pt, err := r.fleetRun(sh, way, fmt.Sprintf("-fleet%d", seq), sc.clients, sc.work)
			if err != nil {
				r.fail(way, "14. "+sc.name, err)
			}
			if pt != nil {
				r.logFleet(sc.name, way, pt)
				r.fleetRecord(rows, sc.name, way, pt)
			}
		}
	}
	for _, i := range []int{0, 9} { // 14a and 14e: the ratio to the static split
		if base := rows[i].Values[FleetStatic]; base > 0 {
			for way, x := range rows[i].Values {
				if way != FleetStatic {
					rows[i+1].Values[way] = x / base
				}
			}
		}
	}
	r.res.Fleet.Rows = append(r.res.Fleet.Rows, rows...)
}

// fleetRows are the rows of section 14, with no figures yet.
func (r *runner) fleetRows() []Row {
	limit := r.FleetLimits.MaxConcurrent
	even := func(work time.Duration) string {
		return fmt.Sprintf("req/s, %d × %d clients, %v handlers", r.FleetReplicas, r.FleetClients, work)
	}
	rows := []Row{
		{Metric: "14a. admitted, even load", Unit: even(r.FleetWork), Format: FormatRate, Higher: true},
		{Metric: "14a. ratio to the static split", Unit: "admitted, like for like", Format: FormatRatio, Higher: true},
		{Metric: "14a. handler time, mean", Unit: fmt.Sprintf("asked %v", r.FleetWork), Format: FormatDuration},
		{Metric: "14a. CPU per admitted request", Unit: "this process, clients included", Format: FormatDuration},
		{Metric: "14b. Redis round trips per admitted request", Unit: "commands the replicas sent, at saturation, 14e", Format: FormatSmall},
		{Metric: "14b. Redis CPU per admitted request", Unit: "used_cpu_sys + used_cpu_user, 14e", Format: FormatDuration},
		{Metric: "14c. peak running across the fleet", Unit: fmt.Sprintf("of %d, every scenario", limit), Format: FormatCount},
		{Metric: "14d. mean running, uneven", Unit: fmt.Sprintf("of %d; %s clients, %v handlers", limit, r.FleetUnevenClients(), r.FleetUnevenWork), Format: FormatCount, Higher: true},
		{Metric: "14d. utilization, uneven", Unit: fmt.Sprintf("mean running ÷ %d", limit), Format: FormatShare, Higher: true},
		{Metric: "14e. admitted, sub-millisecond handlers", Unit: even(r.FleetShortWork), Format: FormatRate, Higher: true},
		{Metric: "14e. ratio to the static split", Unit: "admitted, not like for like", Format: FormatRatio, Higher: true},
		{Metric: "14e. handler time, mean", Unit: fmt.Sprintf("asked %v", r.FleetShortWork), Format: FormatDuration},
	}
	for i := range rows {
		rows[i].Values = map[string]float64{}
	}
	return rows
}

// fleetRecord puts what way gave in scenario into rows (see fleetRows).
func (r *runner) fleetRecord(rows []Row, scenario, way string, pt *fleetPoint) {
	window := pt.Window.Seconds()
	rows[6].Values[way] = max(rows[6].Values[way], float64(pt.Peak))
	if scenario == "uneven" {
		mean := pt.busy.Seconds() / window
		rows[7].Values[way], rows[8].Values[way] = mean, mean/float64(r.FleetLimits.MaxConcurrent)
		return
	}
	i := map[string]int{"even": 0, "short": 9}[scenario] // 14a or 14e
	rows[i].Values[way] = float64(pt.Served) / window
	if pt.Served == 0 {
		return
	}
	rows[i+2].Values[way] = float64(pt.handled) / float64(pt.Served)
	if scenario == "even" && !math.IsNaN(pt.BenchCPU) {
		rows[3].Values[way] = pt.BenchCPU * 1e9 / float64(pt.Served)
	}
	if scenario == "short" && pt.sent != nil {
		rows[4].Values[way] = sum(slices.Collect(maps.Values(pt.sent))) / float64(pt.Served)
		rows[5].Values[way] = pt.RedisCPU * 1e9 / float64(pt.Served)
	}
}

// logFleet logs what way gave in scenario.
func (r *runner) logFleet(scenario, way string, pt *fleetPoint) {
	window := pt.Window.Seconds()
	line := fmt.Sprintf("  %s, %s: admitted %s, handler time %s, peak %d, mean running %.1f, refused %d, outages %d, process CPU %.2f s",
		scenario, way, format(FormatRate, float64(pt.Served)/window), format(FormatDuration, float64(pt.handled)/float64(max(pt.Served, 1))),
		pt.Peak, pt.busy.Seconds()/window, pt.refusals(), pt.Outages, pt.BenchCPU)
	if pt.sent != nil {
		line += fmt.Sprintf("; Redis: CPU %s, commands sent %s, run by the scripts %s",
			format(FormatDuration, pt.RedisCPU*1e9), commands(pt.sent), commands(pt.inScript))
	}
	r.logf("%s", line)
}
