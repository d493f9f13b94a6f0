//go:build !linux

package suite

import (
	"math"
	"os/exec"
)

// dieWithParent does nothing where the system cannot tie a child's life to
// its parent's: stop the server on every path.
func dieWithParent(*exec.Cmd) {}

// processCPU is NaN: this process's CPU time is read on Linux only.
func processCPU() float64 { return math.NaN() }

// raiseOpenFiles leaves the limit of open files as it is, and returns 0.
func raiseOpenFiles() uint64 { return 0 }
