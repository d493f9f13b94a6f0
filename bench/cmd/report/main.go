// Command report runs the benchmark suite of ginqueue and its peers and
// writes BENCHMARKS.md and its charts.
//
//	go run ./cmd/report -out ..   # full run, rewrites ../BENCHMARKS.md, ../docs/bench-burst.svg and ../docs/bench-goodput.svg
//	go run ./cmd/report -smoke    # every measurement once on tiny sizes; writes nothing
//	go run ./cmd/report -goodput  # section 12 alone, full size; prints its targets and table, writes nothing
//	go run ./cmd/report -weighted # section 13 alone, full size; prints its targets and table, writes nothing
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ginqueue/ginqueue/bench/internal/render"
	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

func main() {
	testing.Init() // registers -test.benchtime, which testing.Benchmark reads
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	out := fs.String("out", "", "repository root to write BENCHMARKS.md, "+render.ChartPath+" and "+render.GoodputChartPath+" into; empty prints the report")
	smoke := fs.Bool("smoke", false, "run every measurement once on tiny sizes and write nothing")
	goodput := fs.Bool("goodput", false, "run section 12 (goodput under overload) alone, print its targets and table, and write nothing")
	weighted := fs.Bool("weighted", false, "run section 13 (weighted requests) alone, print its targets and table, and write nothing")
	_ = fs.Parse(os.Args[1:])
	if *goodput && *weighted {
		fmt.Fprintln(os.Stderr, "report: -goodput and -weighted each run one section alone; give one")
		os.Exit(2)
	}
	if err := run(*out, *smoke, *goodput, *weighted); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(out string, smoke, goodput, weighted bool) error {
	plan := suite.FullPlan()
	if smoke {
		plan = suite.SmokePlan()
		out = ""
	}
	if goodput {
		plan.Only = []string{"goodput"}
		out = ""
	}
	if weighted {
		plan.Only = []string{"weighted"}
		out = ""
	}
	res, err := suite.Run(plan, os.Stderr)
	if err != nil {
		return err
	}
	day := res.Date.Format("2006-01-02")
	var md, burst, good bytes.Buffer
	if weighted {
		// Section 13 has no chart.
		if err := render.WeightedMarkdown(&md, res); err != nil {
			return err
		}
		_, err := io.Copy(os.Stdout, &md)
		for _, e := range res.Errors {
			fmt.Fprintln(os.Stderr, "failed:", e)
		}
		return err
	}
	if goodput {
		if err := render.GoodputMarkdown(&md, res); err != nil {
			return err
		}
	} else {
		if err := render.Markdown(&md, res); err != nil {
			return err
		}
		if err := render.Timeline(&burst, res.Timelines, fmt.Sprintf("A burst of 15 requests, 3 slots, 10 places (%s)", day)); err != nil {
			return err
		}
	}
	title := fmt.Sprintf("Goodput under overload: 8 slots of 10 ms, clients that give up after 1 s (%s)", day)
	if err := render.GoodputChart(&good, res.Goodput, title); err != nil {
		return err
	}
	if out == "" {
		_, err := io.Copy(os.Stdout, &md)
		for _, e := range res.Errors {
			fmt.Fprintln(os.Stderr, "failed:", e)
		}
		fmt.Fprintf(os.Stderr, "charts: %d and %d bytes of SVG, not written\n", burst.Len(), good.Len())
		return err
	}
	files := []struct {
		path string
		b    []byte
	}{{render.ChartPath, burst.Bytes()}, {render.GoodputChartPath, good.Bytes()}, {"BENCHMARKS.md", md.Bytes()}}
	for _, f := range files {
		p := filepath.Join(out, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wrote BENCHMARKS.md, %s and %s in %v\n", render.ChartPath, render.GoodputChartPath, res.Took.Round(1e9))
	return nil
}
