package backend_test

import (
	"strings"
	"testing"

	"github.com/ginqueue/ginqueue/backend"
)

// CheckLimit takes 1 to MaxLimit and names any other n.
func TestCheckLimit(t *testing.T) {
	for _, n := range []int{1, 2, backend.MaxLimit} {
		if err := backend.CheckLimit(n); err != nil {
			t.Errorf("CheckLimit(%d) = %v, want nil", n, err)
		}
	}
	for _, n := range []int{0, -1, backend.MaxLimit + 1} {
		err := backend.CheckLimit(n)
		if err == nil || !strings.Contains(err.Error(), "limit must be in [1, 1073741824]") {
			t.Errorf("CheckLimit(%d) = %v, want an error naming the range", n, err)
		}
	}
}
