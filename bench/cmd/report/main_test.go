package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain runs main in a child process when the test asks for it.
func TestMain(m *testing.M) {
	if os.Getenv("REPORT_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// report runs the command with args: its exit code and what it printed.
func report(t *testing.T, args ...string) (int, string) {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "REPORT_MAIN=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// TestBadUseFailsAtOnce: flags that do not go together, and a file without
// the markers of the blocks a run writes, fail before anything is measured.
func TestBadUseFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "BENCHMARKS.md"), []byte("# no blocks\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-fleet-scale", "-sizes", "4", "-out", dir}, 2, "without -out"},
		{[]string{"-sizes", "4"}, 2, "with -fleet-scale"},
		{[]string{"-parts", "2"}, 2, "-parts takes 2 or more, with -fleet-scale"},
		{[]string{"-goodput", "-fleet"}, 2, "give one"},
		{[]string{"-fleet-scale", "-out", dir}, 1, `0 lines "<!-- bench:scale -->"`},
		{[]string{"-out", t.TempDir()}, 1, "no such file"},
	} {
		code, out := report(t, c.args...)
		if code != c.code || !strings.Contains(out, c.want) || strings.Contains(out, "1. uncontended") {
			t.Errorf("report %q: exit %d, %q; want exit %d and %q, and nothing measured", c.args, code, out, c.code, c.want)
		}
	}
}

// TestFailedRunKeepsTheFile: section 15 cannot run without redis-server,
// so its block is printed and BENCHMARKS.md stays as it was.
func TestFailedRunKeepsTheFile(t *testing.T) {
	dir := t.TempDir()
	md := []byte("# B\n<!-- bench:scale -->\nthe last good tables\n<!-- /bench:scale -->\n")
	if err := os.WriteFile(filepath.Join(dir, "BENCHMARKS.md"), md, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir()) // no redis-server
	code, out := report(t, "-fleet-scale", "-out", dir)
	got, err := os.ReadFile(filepath.Join(dir, "BENCHMARKS.md"))
	if code != 1 || !strings.Contains(out, "<!-- bench:scale -->\nNo redis-server") || !strings.Contains(out, "left as it was") || err != nil || string(got) != string(md) {
		t.Errorf("exit %d, %q; file %q, %v", code, out, got, err)
	}
}
