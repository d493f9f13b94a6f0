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

// raiseOpenFiles raises the limit of open files as far as it may, for the
// fleets of thousands of replicas, and returns it.
func raiseOpenFiles() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	for _, n := range []uint64{1 << 20, 1 << 18, 1 << 16} {
		if n <= l.Cur {
			break
		}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: max(n, l.Max)}) == nil {
			return n
		}
	}
	if l.Cur < l.Max && syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: l.Max, Max: l.Max}) == nil {
		return l.Max
	}
	return l.Cur
}
