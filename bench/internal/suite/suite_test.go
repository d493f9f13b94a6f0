package suite

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestRun runs every section on tiny sizes and renders the report: no
// measurement fails, every target is checked (the Redis ones where a Redis
// answers), and the charts draw.
func TestRun(t *testing.T) {
	p := SmokePlan()
	p.MemoryWaiters, p.GrowthDepths, p.Flows = 50, []int{10, 100}, 10
	p.GoodputLoads, p.GoodputWindow, p.WeightedWindow, p.RedisPairs = []int{1, 5}, 100*time.Millisecond, 100*time.Millisecond, 5
	p.FleetWarmUp, p.FleetWindow = 500*time.Millisecond, 200*time.Millisecond
	r, err := Run(p, "", io.Discard)
	if err != nil || len(r.Errors) > 0 {
		t.Fatalf("%v %q", err, r.Errors)
	}
	text := func(bs []Block) string {
		var s string
		for _, b := range bs {
			s += "<!-- " + b.Name + " -->\n" + b.Text
		}
		return s
	}
	md := text(Blocks(r, ""))
	for _, s := range []string{"<!-- run -->\n|  |  |\n|---|---|\n| date | ", "| overhead per request, the route alone (1a) | lower |", "| 7. growth, deepest / shallowest (ratio) |",
		"| 10d. growth over flows, deepest / shallowest (ratio) |", "| 12. 5× C: goodput (share of C) |", "| 13. most slots running at once (slots, of 8) | lower | – | – |",
		"| interval-polled, as written | 3 | 5 | 7 |", "<!-- fleet -->\n| way | 14a. admitted, even load (req/s, 4 × 64 clients, 2ms handlers) |",
		"\n| static split | ", "| fleet | static split: peak running across the fleet ≤ 64 |", "<!-- scale -->\nMeasured ", "| N | phase |"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	for _, tg := range scaleTargets(r) {
		if tg.Met == "not measured" && r.FleetScale.Why == "" {
			t.Errorf("target %q not measured", tg.Name)
		}
	}
	for _, tg := range targets(r) {
		if noRedis := (r.RedisWhy != "" && tg.Area == "Redis backend") || (r.FleetWhy != "" && tg.Area == "fleet" && !strings.HasPrefix(tg.Name, "static")); tg.Met == "not measured" && !noRedis {
			t.Errorf("target %q not measured", tg.Name)
		}
	}
	var chart bytes.Buffer
	if err := DrawBurst(&chart, r); err != nil || !strings.Contains(chart.String(), "<svg") {
		t.Errorf("burst chart: %v", err)
	}
	if err := DrawGoodput(&chart, r); err != nil {
		t.Errorf("goodput chart: %v", err)
	}
	for only, want := range map[string]string{
		"weighted":    "<!-- targets -->\n| area | target | figure | met |\n|---|---|---|---|\n| weighted |",
		"fleet-scale": "<!-- scale -->\nMeasured ",
		"fleet":       "<!-- fleet -->\n| way |",
	} {
		if got := text(Blocks(r, only)); !strings.HasPrefix(got, want) || only == "fleet" && !strings.Contains(got, "\n| fleet | Shares: admitted on an even load ≥ 0.8× the static split's |") {
			t.Errorf("section %s alone:\n%s", only, got)
		}
	}
}

// TestFill: a run's blocks replace the text between their lines and the
// rest of the file stays; a block without its lines is an error.
func TestFill(t *testing.T) {
	file := "# B\n<!-- bench:a -->\nold a\n<!-- /bench:a -->\ntext\n<!-- bench:b -->\nold b\n<!-- /bench:b -->\nend\n"
	got, err := Fill([]byte(file), []Block{{"b", "new b\n"}, {"a", ""}})
	if want := "# B\n<!-- bench:a -->\n<!-- /bench:a -->\ntext\n<!-- bench:b -->\nnew b\n<!-- /bench:b -->\nend\n"; err != nil || string(got) != want {
		t.Fatalf("filled: %v\n%q\nwant\n%q", err, got, want)
	}
	crlf := "a\r\n<!-- bench:a -->\r\nold\r\n<!-- /bench:a -->\r\nb\r\n"
	if got, err := Fill([]byte(crlf), []Block{{"a", "new\n"}}); err != nil || string(got) != "a\r\n<!-- bench:a -->\r\nnew\n<!-- /bench:a -->\r\nb\r\n" {
		t.Errorf("CRLF: %v %q", err, got)
	}
	for _, bad := range []string{
		"# no blocks\n",
		"<!-- /bench:a -->\n<!-- bench:a -->\n", // end before begin
		"<!-- bench:a -->\n",                    // no end
		"<!-- bench:a -->\nkept\n<!-- bench:a -->\nx\n<!-- /bench:a -->\n",           // begin twice
		"<!-- bench:a -->\n<!-- /bench:a -->\n<!-- bench:a -->\n<!-- /bench:a -->\n", // the pair twice
		"text <!-- bench:a -->\nx\n<!-- /bench:a -->\n",                              // not a line of its own
	} {
		if _, err := Fill([]byte(bad), []Block{{"a", "x"}}); err == nil || !strings.Contains(err.Error(), "bench:a") {
			t.Errorf("%q: %v, want an error naming the block", bad, err)
		}
	}
	for _, b := range Blocks(&Results{Plan: FullPlan()}, "") {
		if b.Name == "scale" { // make bench would wipe what make bench-fleet-scale wrote
			t.Error("a run without section 15 writes its block")
		}
	}
	md, err := os.ReadFile("../../../BENCHMARKS.md")
	for _, only := range []string{"", "fleet-scale"} {
		if err == nil {
			_, err = Fill(md, Blocks(&Results{Plan: FullPlan()}, only))
		}
	}
	if err != nil {
		t.Errorf("BENCHMARKS.md lacks the lines of a block that make bench or make bench-fleet-scale writes: %v", err)
	}
	for _, r := range []*Results{{Errors: []string{"2. saturated hand-off, ginqueue: boom"}}, {FleetScale: ScaleResults{Why: "no redis-server"}}} {
		if r.Failed() == nil {
			t.Errorf("%+v: not failed", r)
		}
	}
	if err := (&Results{}).Failed(); err != nil {
		t.Errorf("a clean run failed: %v", err)
	}
	for _, text := range []string{"<!-- /bench:b -->\n", "<!-- bench:b -->\n"} {
		if _, err := Fill([]byte(file), []Block{{"a", text}}); err == nil {
			t.Errorf("a block holding %q was written", text)
		}
	}
	nested := "<!-- bench:x -->\n<!-- bench:y -->\n<!-- /bench:y -->\n<!-- /bench:x -->\n"
	if _, err := Fill([]byte(nested), []Block{{"x", "new\n"}}); err == nil || !strings.Contains(err.Error(), "encloses") {
		t.Errorf("a block around another was replaced: %v", err)
	}
	if got, err := Fill([]byte(file), []Block{{"a", "no newline"}}); err != nil || !strings.Contains(string(got), "no newline\n<!-- /bench:a -->") {
		t.Errorf("text without a last newline: %v %q", err, got)
	}
	sized := &Results{Plan: FullPlan(), FleetScale: ScaleResults{Sizes: []ScaleSize{{N: 4, Limit: 2}}}}
	if bs := Blocks(sized, ""); bs[len(bs)-1].Name != "scale" {
		t.Error("a run that measured section 15 (a smoke run) does not write its block")
	}
}

// TestSeedBurst runs the tutorial's 15-request test through every variant
// in a synctest bubble, where the seed port's ticker and the handlers'
// sleeps cost no real time. The 250 ms handlers keep every handler's end
// off the ticks, so the order of events is fixed.
func TestSeedBurst(t *testing.T) {
	p := FullPlan()
	p.BurstWork = 250 * time.Millisecond
	want := map[string][4]int{ // served, refused, timed out, last response in ms
		Bare: {15, 0, 0, 250}, GinQueue: {13, 2, 0, 1250}, Chi: {13, 2, 0, 1250}, XSync: {13, 2, 0, 1250},
		Seed: {10, 5, 0, 1250}, // admits on the ticks at 100, 400, 700 and 1000 ms: 3, 3, 3, 1
		// Two admissions on the first tick, one at 400 ms, then the leaked
		// count blocks every slot; the 7 left expire on the first tick past 5 s.
		SeedAsWritten: {3, 5, 7, 5100},
	}
	for _, v := range burstVariants() {
		t.Run(v.ID, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tl := p.seedBurst(v)
				got := [4]int{tl.Count(OutcomeServed), tl.Count(OutcomeFull), tl.Count(OutcomeTimeout), int(tl.Last().Milliseconds())}
				if got != want[v.Name] {
					t.Errorf("served, refused, timed out, last = %v, want %v", got, want[v.Name])
				}
			})
		})
	}
}

// TestSeedIdleDelay: at an idle server a lone request waits for the next
// tick.
func TestSeedIdleDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, stop := newSeed(false)(Limits{3, 10, time.Second}, noContent)
		defer stop()
		time.Sleep(30 * time.Millisecond) // arrive between ticks
		start := time.Now()
		if code := get(h); code != http.StatusNoContent || time.Since(start) != 70*time.Millisecond {
			t.Errorf("status %d after %v, want 204 after 70ms", code, time.Since(start))
		}
	})
}

// TestSendOnce: each way a goodput request can end; the server sees a
// client give up.
func TestSendOnce(t *testing.T) {
	hungUp := make(chan bool, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/full" {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else if r.URL.Path == "/hang" {
			select {
			case <-r.Context().Done():
				hungUp <- true
			case <-time.After(5 * time.Second):
				hungUp <- false
			}
		}
	}))
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{}}
	for path, want := range map[string]int{"/ok": delivered, "/full": refused, "/hang": gaveUp, "x": failed} {
		at, url := time.Now(), srv.URL+path
		if path == "x" {
			url = "http://127.0.0.1:1/" // nobody listens
		}
		if o, end, err := sendOnce(context.Background(), c, url, "", at.Add(100*time.Millisecond)); o != want || (err != nil) != (o == failed) || (o == gaveUp) != (end.Sub(at) >= 100*time.Millisecond) {
			t.Errorf("%s: outcome %d after %v, %v; want %d", path, o, end.Sub(at), err, want)
		}
	}
	if !<-hungUp {
		t.Error("the server never saw the client give up")
	}
	l := parseLoad("used_cpu_sys:1.5\r\nused_cpu_user:2.25\r\nused_cpu_sys_children:9\r\n" +
		"cmdstat_evalsha:calls=10,usec=150,usec_per_call=15.00\r\ncmdstat_client|setinfo:calls=2,usec=4\r\ncmdstat_blpop:calls=3,usec=9\r\n")
	if got := commands(l.calls); l.cpu != 3.75 || got != "evalsha 10, blpop 3, client|setinfo 2" {
		t.Errorf("parseLoad = %v, %q; want 3.75, evalsha 10, blpop 3, client|setinfo 2", l.cpu, got)
	}
	l = parseLoad("used_cpu_sys:1.5\r\nused_cpu_user:2.25\r\nused_cpu_sys_children:9\r\n" +
		"cmdstat_evalsha:calls=10,usec=150,usec_per_call=15.00\r\ncmdstat_eval:calls=2,usec=40\r\ncmdstat_ping:calls=99,usec=99\r\n")
	if calls, usec := l.scripts(); l.cpu != 3.75 || calls != 12 || usec != 190 {
		t.Errorf("parseLoad, scripts = %v, %v, %v; want 3.75, 12, 190", l.cpu, calls, usec)
	}
}

// TestTargets: figures on each side of a limit, the kinds of comparison,
// and the formats.
func TestTargets(t *testing.T) {
	r := &Results{Plan: FullPlan()}
	r.Main.Rows = []Row{
		{Metric: "1a. uncontended, route only: allocs", Format: FormatCount, Values: map[string]float64{Bare: 0, GinQueue: 0}},
		{Metric: "2. saturated hand-off", Higher: true, Format: FormatRate, Values: map[string]float64{GinQueue: 900, Chi: 1000, XSync: 800}},
		{Metric: "4. grant latency p99", Format: FormatDuration, Values: map[string]float64{GinQueue: 150e3}},
	}
	r.Features.Rows = []Row{{Metric: "10c. saturated hand-off", Higher: true, Format: FormatRate, Values: map[string]float64{Plain: 1000, PrioFlows: 700}}}
	r.Fleet = Table{Cols: fleetWays(), Rows: []Row{
		{Metric: "14a. admitted, even load", Unit: "req/s", Higher: true, Format: FormatRate, Values: map[string]float64{FleetStatic: 50000, FleetShares: 39000}},
		{Metric: "14b. Redis round trips per admitted request", Format: FormatSmall, Values: map[string]float64{FleetGlobal: 2.5, FleetShares: 0.002344}},
		{Metric: "14c. peak running across the fleet", Format: FormatCount, Values: map[string]float64{FleetStatic: 64, FleetGlobal: 65, FleetShares: 64}},
	}}
	if got, want := byColumn(r.Fleet, "way"), "| way | 14a. admitted, even load (req/s) | 14b. Redis round trips per admitted request | 14c. peak running across the fleet |\n"+
		"|---|---|---|---|\n| static split | 50,000/s | – | 64 |\n| redisqueue GlobalQueue | – | 2.50 | 65 |\n| redisqueue Shares | 39,000/s | 0.00234 | 64 |\n"; got != want {
		t.Errorf("byColumn:\n%s\nwant\n%s", got, want)
	}
	want := map[string]string{
		"uncontended allocs/op = bare gin's (route only)":                       "yes: 0 vs bare gin 0",
		"hand-off throughput ≥ 1.0× the best peer":                              "no: 900/s vs best peer chi Throttle 1,000/s: 0.90×",
		"grant latency p99 ≤ 100 µs":                                            "no: 150.0 µs (limit 100.0 µs)",
		"Priority + FlowKey: saturated hand-off, time per request ≤ 1.3× plain": "no: 700/s vs plain ginqueue 1,000/s: 1.43× the cost (≤ 1.30×)",
		"schedule efficiency ≥ the best peer's":                                 "not measured: –",
		"Shares: admitted on an even load ≥ 0.8× the static split's":            "no: 39,000/s vs static split 50,000/s: 0.78× (≥ 0.80×)",
		"Shares: ≤ 0.01 Redis round trips per admitted request at saturation":   "yes: 0.00234 (limit 0.0100)",
		"GlobalQueue: peak running across the fleet ≤ 64":                       "no: 65 (limit 64)",
	}
	for _, tg := range targets(r) {
		if w, ok := want[tg.Name]; ok && tg.Met+": "+tg.Figure != w {
			t.Errorf("%s: %s: %s, want %s", tg.Name, tg.Met, tg.Figure, w)
		}
	}
	for x, want := range map[float64]string{41.6: "42 ns", 999.96e3: "1.0 ms", 999.97e6: "1.00 s"} {
		if got := format(FormatDuration, x); got != want {
			t.Errorf("format(%v) = %q, want %q", x, got, want)
		}
	}
	if got := format(FormatRate, 1234567) + format(FormatBytes, -820) + format(FormatShare, 0.9346) + " " + format(FormatSmall, 0) + " " + format(FormatSmall, 512.4); got != "1,234,567/s-820 B93.5% 0 512" {
		t.Errorf("formats: %q", got)
	}
}

// TestScaleTargets: section 15's targets and table on figures made up for
// the test, on each side of the limits; sizes not measured stay so.
func TestScaleTargets(t *testing.T) {
	r := &Results{Plan: FullPlan()}
	w := 5 * time.Second
	r.FleetScale.Sizes = []ScaleSize{
		{N: 16, Limit: 8, Phases: []ScalePhase{{Name: ScaleMoves, Window: w, SharesAt: 120 * time.Millisecond, RunningAt: 150 * time.Millisecond, Peak: 8}}},
		{N: 1024, Limit: 512, Phases: []ScalePhase{
			{Name: ScaleIdle, Window: w, Calls: 1000, RedisCPU: 1},
			{Name: ScaleLoaded, Window: w, Calls: 5000, RedisCPU: 2, Outages: 3, Down: 700, Refused: [3]int64{1234, 5, 6}, Served: 100_000, Peak: 513},
			{Name: ScaleMoves, Window: w, Calls: 5000, RedisCPU: 2, SharesAt: -1, RunningAt: -1},
		}},
	}
	want := map[string]string{
		"N=1,024 idle: Redis CPU ≤ 25% of a core":                                  "yes: 20.0% (limit 25.0%)",
		"N=1,024 idle: no replica marks Redis down":                                "yes: 0 times; 0 replicas down at the end",
		"N=1,024 loaded: Redis CPU ≤ 25% of a core":                                "no: 40.0% (limit 25.0%)",
		"N=1,024 loaded: no replica marks Redis down":                              "no: 3 times; 700 replicas down at the end",
		"N=1,024 loaded: no 503 or 408 (the load calls for none)":                  "no: 503: 1,234, 408: 5",
		"N=16 load moves: the loaded half holds 90% of the limit within 200 ms":    "yes: 120.0 ms",
		"N=64 load moves: the loaded half holds 90% of the limit within 200 ms":    "not measured: –",
		"N=1,024 load moves: the loaded half holds 90% of the limit within 200 ms": "no: not within 5s",
		"peak running ≤ the limit, every size and phase":                           "no: 513 of 512 at N=1,024, loaded",
	}
	got := scaleTargets(r)
	if len(got) != len(want)+1 { // N=256 is not measured either
		t.Errorf("%d targets, want %d", len(got), len(want)+1)
	}
	for _, tg := range got {
		if w, ok := want[tg.Name]; ok && tg.Met+": "+tg.Figure != w {
			t.Errorf("%s: %s: %s, want %s", tg.Name, tg.Met, tg.Figure, w)
		}
	}
	if row := "| 1,024 | loaded | 1,000/s | 400.0 µs | 40.0% | 20,000/s (78.1%) | 1,234 | 5 | 6 | 3; 700 | 513 of 512 | – |\n"; !strings.Contains(scaleTable(r), row) {
		t.Errorf("scaleTable lacks\n%s in\n%s", row, scaleTable(r))
	}
}
