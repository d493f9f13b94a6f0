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
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("report %q: exit %d, %q; want exit %d and %q", c.args, code, out, c.code, c.want)
		}
	}
}
