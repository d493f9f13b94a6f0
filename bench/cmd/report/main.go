// Command report runs the benchmark suite of ginqueue and its peers and
// writes BENCHMARKS.md and the seed burst chart.
//
//	go run ./cmd/report -out ..   # full run, rewrites ../BENCHMARKS.md and ../docs/bench-burst.svg
//	go run ./cmd/report -smoke    # every measurement once on tiny sizes; writes nothing
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
	out := fs.String("out", "", "repository root to write BENCHMARKS.md and "+render.ChartPath+" into; empty prints the report")
	smoke := fs.Bool("smoke", false, "run every measurement once on tiny sizes and write nothing")
	_ = fs.Parse(os.Args[1:])
	if err := run(*out, *smoke); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(out string, smoke bool) error {
	plan := suite.FullPlan()
	if smoke {
		plan = suite.SmokePlan()
		out = ""
	}
	res, err := suite.Run(plan, os.Stderr)
	if err != nil {
		return err
	}
	var md, svg bytes.Buffer
	if err := render.Markdown(&md, res); err != nil {
		return err
	}
	title := fmt.Sprintf("A burst of 15 requests, 3 slots, 10 places (%s)", res.Date.Format("2006-01-02"))
	if err := render.Timeline(&svg, res.Timelines, title); err != nil {
		return err
	}
	if out == "" {
		_, err := io.Copy(os.Stdout, &md)
		fmt.Fprintf(os.Stderr, "chart: %d bytes of SVG, not written\n", svg.Len())
		return err
	}
	if err := os.MkdirAll(filepath.Join(out, filepath.Dir(render.ChartPath)), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, render.ChartPath), svg.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "BENCHMARKS.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote BENCHMARKS.md and %s in %v\n", render.ChartPath, res.Took.Round(1e9))
	return nil
}
