// Command report runs the benchmark suite of ginqueue and its peers:
//
//	go run ./cmd/report -out ..   # the whole suite; rewrites ../BENCHMARKS.md and ../docs/bench-*.svg
//	go run ./cmd/report -smoke    # every measurement once on tiny sizes; writes nothing
//	go run ./cmd/report -goodput  # section 12 alone; prints its targets and table, writes nothing
//	go run ./cmd/report -weighted # section 13 alone; prints its targets and table, writes nothing
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

func main() {
	testing.Init() // registers -test.benchtime, which testing.Benchmark reads
	out := flag.String("out", "", "the repository root to write BENCHMARKS.md and docs/bench-*.svg into; empty prints the report")
	smoke := flag.Bool("smoke", false, "run every measurement once on tiny sizes and write nothing")
	goodput := flag.Bool("goodput", false, "run section 12 (goodput under overload) alone, print its targets and table, write nothing")
	weighted := flag.Bool("weighted", false, "run section 13 (weighted requests) alone, print its targets and table, write nothing")
	flag.Parse()
	plan, only := suite.FullPlan(), map[bool]string{true: "goodput"}[*goodput]+map[bool]string{true: "weighted"}[*weighted]
	if *goodput && *weighted {
		fmt.Fprintln(os.Stderr, "report: -goodput and -weighted each run one section alone; give one")
		os.Exit(2)
	}
	if *smoke {
		plan = suite.SmokePlan()
	}
	if *smoke || only != "" {
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
	if err == nil && only != "weighted" {
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
	for path, b := range map[string][]byte{suite.BurstChart: burst.Bytes(), suite.GoodputChart: good.Bytes(), "BENCHMARKS.md": md.Bytes()} {
		if err := os.WriteFile(filepath.Join(out, path), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wrote BENCHMARKS.md, %s and %s in %v\n", suite.BurstChart, suite.GoodputChart, res.Took.Round(1e9))
	return nil
}
