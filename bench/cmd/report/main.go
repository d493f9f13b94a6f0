// Command report runs the benchmark suite of ginqueue and its peers:
//
//	go run ./cmd/report -out ..      # the whole suite; rewrites ../BENCHMARKS.md and ../docs/bench-*.svg
//	go run ./cmd/report -smoke       # every measurement once on tiny sizes; writes nothing
//	go run ./cmd/report -goodput     # section 12 alone; prints its targets and table, writes nothing
//	go run ./cmd/report -weighted    # section 13 alone; prints its targets and table, writes nothing
//	go run ./cmd/report -fleet       # section 14 alone; prints its table and targets, writes nothing
//	go run ./cmd/report -fleet-scale # section 15 alone (not in the whole suite); prints its tables and targets, writes nothing
//	go run ./cmd/report -fleet-scale -sizes 256,1024 # section 15 on these fleet sizes only
//	go run ./cmd/report -fleet-scale -out ..  # section 15 alone; writes its tables into ../BENCHMARKS.md
//	go run ./cmd/report -fleet-scale -parts 4 -sizes 4096 # each Name split into 4 parts on a Cluster of 4 shards; prints, writes nothing
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

func main() {
	testing.Init() // registers -test.benchtime, which testing.Benchmark reads
	out := flag.String("out", "", "the repository root to write BENCHMARKS.md and docs/bench-*.svg into; empty prints the report")
	smoke := flag.Bool("smoke", false, "run every measurement once on tiny sizes and write nothing")
	goodput := flag.Bool("goodput", false, "run section 12 (goodput under overload) alone, print its targets and table, write nothing")
	weighted := flag.Bool("weighted", false, "run section 13 (weighted requests) alone, print its targets and table, write nothing")
	fleet := flag.Bool("fleet", false, "run section 14 (one limit for a fleet, three ways) alone, print its table and targets, write nothing")
	fleetScale := flag.Bool("fleet-scale", false, "run section 15 (one Name for up to 1,024 replicas in Shares mode, on a redis-server of its own) alone, print its tables and targets, write nothing")
	sizes := flag.String("sizes", "", "with -fleet-scale, the fleet sizes to run, comma-separated (default 16,64,256,1024)")
	parts := flag.Int("parts", 0, "with -fleet-scale, split each Name into this many parts on a Redis Cluster of as many shards; prints, writes nothing")
	flag.Parse()
	plan, only, alone := suite.FullPlan(), "", 0
	for name, set := range map[string]bool{"goodput": *goodput, "weighted": *weighted, "fleet": *fleet, "fleet-scale": *fleetScale} {
		if set {
			only, alone = name, alone+1
		}
	}
	if alone > 1 {
		fmt.Fprintln(os.Stderr, "report: -goodput, -weighted, -fleet and -fleet-scale each run one section alone; give one")
		os.Exit(2)
	}
	if *smoke {
		plan = suite.SmokePlan()
	}
	if *sizes != "" {
		n, err := parseSizes(*sizes)
		if err != nil || !*fleetScale {
			fmt.Fprintln(os.Stderr, "report: -sizes takes fleet sizes above 1, comma-separated, with -fleet-scale:", *sizes)
			os.Exit(2)
		}
		plan.Scale.Replicas = n
	}
	if *parts != 0 {
		if *parts < 2 || !*fleetScale {
			fmt.Fprintln(os.Stderr, "report: -parts takes 2 or more, with -fleet-scale:", *parts)
			os.Exit(2)
		}
		plan.Scale.Parts, *out = *parts, ""
	}
	if *smoke || only != "" && only != "fleet-scale" {
		*out = ""
	}
	if err := run(plan, only, *out); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(plan suite.Plan, only, out string) error {
	res, err := suite.Run(plan, only, os.Stderr)
	if err != nil {
		return err
	}
	var md, burst, good bytes.Buffer
	err = suite.Markdown(&md, res, only)
	if err == nil && only == "" {
		err = suite.DrawBurst(&burst, res)
	}
	if err == nil && (only == "" || only == "goodput") {
		err = suite.DrawGoodput(&good, res)
	}
	for _, e := range res.Errors {
		fmt.Fprintln(os.Stderr, "failed:", e)
	}
	if err != nil || out == "" {
		if err == nil {
			_, err = os.Stdout.Write(md.Bytes())
			fmt.Fprintf(os.Stderr, "charts: %d and %d bytes of SVG, not written\n", burst.Len(), good.Len())
		}
		return err
	}
	path := filepath.Join(out, "BENCHMARKS.md")
	old, _ := os.ReadFile(path)
	if only == "fleet-scale" {
		// Section 15 alone: its tables go into BENCHMARKS.md, the rest stays.
		b, err := spliceSection(old, md.Bytes(), scaleSection)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "wrote section 15 of %s\n", path)
		return os.WriteFile(path, b, 0o644)
	}
	if res.FleetScale.Sizes == nil && bytes.Contains(section(old, scaleSection), []byte("| N | phase |")) {
		// make bench does not run section 15: keep the tables of the last
		// make bench-fleet-scale -out.
		b, err := spliceSection(md.Bytes(), old, scaleSection)
		if err != nil {
			return err
		}
		md.Reset()
		md.Write(b)
	}
	for path, b := range map[string][]byte{suite.BurstChart: burst.Bytes(), suite.GoodputChart: good.Bytes(), "BENCHMARKS.md": md.Bytes()} {
		if err := os.WriteFile(filepath.Join(out, path), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wrote BENCHMARKS.md, %s and %s in %v\n", suite.BurstChart, suite.GoodputChart, res.Took.Round(1e9))
	return nil
}

// parseSizes reads "16,64,256": fleet sizes of at least 2 replicas.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return nil, fmt.Errorf("bad fleet size %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// scaleSection is the heading that starts section 15.
const scaleSection = "## 15. "

// section is the part of md from the line that starts with heading to the
// next "## " heading (excluded), or nil.
func section(md []byte, heading string) []byte {
	var rest []byte
	if bytes.HasPrefix(md, []byte(heading)) {
		rest = md
	} else if i := bytes.Index(md, []byte("\n"+heading)); i >= 0 {
		rest = md[i+1:]
	} else {
		return nil
	}
	if j := bytes.Index(rest[1:], []byte("\n## ")); j >= 0 {
		return rest[:j+2]
	}
	return rest
}

// spliceSection returns into with its section under heading replaced by
// from's.
func spliceSection(into, from []byte, heading string) ([]byte, error) {
	old, src := section(into, heading), section(from, heading)
	if old == nil || src == nil {
		return nil, fmt.Errorf("no section %q to replace", heading)
	}
	return bytes.Replace(into, old, src, 1), nil
}
