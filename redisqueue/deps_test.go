package redisqueue_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The package itself, not only its tests, links the root package, which
// sets the in-memory Backend that Shares mode admits on: a program that
// imports redisqueue and nothing else of ginqueue must not find it nil.
func TestThePackageLinksTheInMemoryBackend(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	if deps := strings.Fields(string(out)); !slices.Contains(deps, "github.com/ginqueue/ginqueue") {
		t.Fatal("redisqueue does not import github.com/ginqueue/ginqueue: inmem.New would be nil in a program that imports only redisqueue")
	}
}
