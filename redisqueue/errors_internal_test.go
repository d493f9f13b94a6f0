package redisqueue

import (
	"errors"
	"strings"
	"testing"

	"github.com/ginqueue/ginqueue/backend"
)

// A wrapped error names its package once, and still matches what it wraps.
func TestWrappedErrorsNameTheirPackageOnce(t *testing.T) {
	conflict := &conflictError{name: "api", why: "they disagree"}
	cases := []struct {
		err    error
		want   string
		target error
	}{
		{errorf("redisqueue: SetLimit(%d): %w", 0, backend.CheckLimit(0)),
			"redisqueue: SetLimit(0): limit must be in", nil},
		{errorf("redisqueue: SetLimit(%d): %w: %w", 3, ErrUnavailable, errors.New("i/o timeout")),
			"redisqueue: SetLimit(3): redis unavailable: i/o timeout", ErrUnavailable},
		{errorf("redisqueue: SetLimit(%d): %w", 3, conflict),
			`redisqueue: SetLimit(3): Name "api": they disagree`, ErrConflict},
		{errEvicted, "redisqueue: an arrival of higher priority took this place in the full queue: queue full",
			backend.ErrQueueFull},
	}
	for _, c := range cases {
		msg := c.err.Error()
		if !strings.HasPrefix(msg, c.want) {
			t.Errorf("message %q, want it to begin %q", msg, c.want)
		}
		if n := strings.Count(msg, "redisqueue: ") + strings.Count(msg, "ginqueue: "); n != 1 {
			t.Errorf("message %q names a package %d times, want once", msg, n)
		}
		if c.target != nil && !errors.Is(c.err, c.target) {
			t.Errorf("%q does not match %v", msg, c.target)
		}
	}
	var ce *conflictError
	if !errors.As(cases[2].err, &ce) || ce.name != "api" {
		t.Errorf("errors.As found %v, want the conflict", ce)
	}
}
