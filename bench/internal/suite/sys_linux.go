package suite

import (
	"math"
	"os/exec"
	"syscall"
)

// dieWithParent has Linux kill cmd's process when the thread that started
// it dies, so that a run killed outright leaves no redis-server behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processCPU is the CPU time this process has used so far, user and
// system, in seconds; NaN if the system does not tell.
func processCPU() float64 {
	var u syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &u) != nil {
		return math.NaN()
	}
	return float64(u.Utime.Nano()+u.Stime.Nano()) / 1e9
}
