//go:build unix

package execution_test

import (
	"os"
	"syscall"
)

// killSelf ends the process with SIGKILL: no deferred call, no release.
func killSelf() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }

// killed reports whether the process died of SIGKILL.
func killed(ps *os.ProcessState) bool {
	status, ok := ps.Sys().(syscall.WaitStatus)
	return ok && status.Signaled() && status.Signal() == syscall.SIGKILL
}
