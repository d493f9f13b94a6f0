// Command report runs the benchmark suite of ginqueue and its peers:
//
//	go run ./cmd/report -out ..      # the whole suite; writes its tables into ../BENCHMARKS.md and its charts into ../docs
//	go run ./cmd/report -smoke       # every measurement once on tiny sizes; writes nothing
//	go run ./cmd/report -goodput     # section 12 alone; prints its targets and table, writes nothing
//	go run ./cmd/report -weighted    # section 13 alone; prints its targets and table, writes nothing
//	go run ./cmd/report -fleet       # section 14 alone; prints its table and targets, writes nothing
//	go run ./cmd/report -fleet-scale # section 15 alone (not in the whole suite); prints its tables and targets, writes nothing
//	go run ./cmd/report -fleet-scale -sizes 256,1024 # section 15 on these fleet sizes only
//	go run ./cmd/report -fleet-scale -out ..  # section 15 alone; writes its tables into ../BENCHMARKS.md
//	go run ./cmd/report -fleet-scale -parts 4 -sizes 4096 # each Name split into 4 parts on a Cluster of 4 shards; prints, writes nothing
//
// BENCHMARKS.md is kept by hand apart from the blocks between its lines
// <!-- bench:name --> and <!-- /bench:name -->, which a run rewrites.
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
	sizes := flag.String("sizes", "", "with -fleet-scale and without -out, the fleet sizes to run, comma-separated (default 16,64,256,1024)")
	parts := flag.Int("parts", 0, "with -fleet-scale, split each Name into this many parts on a Redis Cluster of as many shards; prints, writes nothing")
	flag.Parse()
	plan, only, alone := suite.FullPlan(), "", 0
	for name, set := range map[string]bool{"goodput": *goodput, "weighted": *weighted, "fleet": *fleet, "fleet-scale": *fleetScale} {
		if set {
			only, alone = name, alone+1
		}
	}
	if alone > 1 {
		fail(2, "-goodput, -weighted, -fleet and -fleet-scale each run one section alone; give one")
	}
	if *smoke {
		plan = suite.SmokePlan()
	}
	if *sizes != "" {
		n, err := parseSizes(*sizes)
		if err != nil || !*fleetScale || *out != "" {
			fail(2, "-sizes takes fleet sizes above 1, comma-separated, with -fleet-scale and without -out (BENCHMARKS.md describes the default sizes): "+*sizes)
		}
		plan.Scale.Replicas = n
	}
	if *parts != 0 {
		if *parts < 2 || !*fleetScale {
			fail(2, fmt.Sprintf("-parts takes 2 or more, with -fleet-scale: %d", *parts))
		}
		plan.Scale.Parts, *out = *parts, ""
	}
	if *smoke || only != "" && only != "fleet-scale" {
		*out = ""
	}
	if err := run(plan, only, *out); err != nil {
		fail(1, err.Error())
	}
}

func fail(code int, msg string) {
	fmt.Fprintln(os.Stderr, "report:", msg)
	os.Exit(code)
}

func run(plan suite.Plan, only, out string) error {
	path := filepath.Join(out, "BENCHMARKS.md")
	if out != "" { // find every block's lines before measuring for minutes
		md, err := os.ReadFile(path)
		if err == nil {
			_, err = suite.Fill(md, suite.Blocks(&suite.Results{Plan: plan}, only))
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	res, err := suite.Run(plan, only, os.Stderr)
	if err != nil {
		return err
	}
	for _, e := range res.Errors {
		fmt.Fprintln(os.Stderr, "failed:", e)
	}
	blocks := suite.Blocks(res, only)
	if err := res.Failed(); out != "" && err != nil {
		printBlocks(blocks)
		return fmt.Errorf("%s left as it was (what was measured is printed above): %w", path, err)
	}
	charts := map[string]*bytes.Buffer{}
	if only == "" {
		charts[suite.BurstChart], charts[suite.GoodputChart] = new(bytes.Buffer), new(bytes.Buffer)
		if err := suite.DrawBurst(charts[suite.BurstChart], res); err != nil {
			return err
		}
		if err := suite.DrawGoodput(charts[suite.GoodputChart], res); err != nil {
			return err
		}
	}
	if out == "" {
		printBlocks(blocks)
		for path, b := range charts {
			fmt.Fprintf(os.Stderr, "%s: %d bytes of SVG, not written\n", path, b.Len())
		}
		return nil
	}
	md, err := os.ReadFile(path)
	if err == nil {
		md, err = suite.Fill(md, blocks)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for name, b := range charts {
		if err := os.WriteFile(filepath.Join(out, name), b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(path+".new", md, 0o644); err != nil {
		return err
	}
	if err := os.Rename(path+".new", path); err != nil { // never half a file
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %d blocks of %s and %d charts in %v\n", len(blocks), path, len(charts), res.Took.Round(1e9))
	return nil
}

// printBlocks writes blocks to stdout between their marker lines.
func printBlocks(blocks []suite.Block) {
	for _, b := range blocks {
		fmt.Printf("<!-- bench:%s -->\n%s<!-- /bench:%s -->\n\n", b.Name, b.Text, b.Name)
	}
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
