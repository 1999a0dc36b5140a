//go:build !unix

package execution_test

import "os"

// killSelf ends the process at once (TerminateProcess): no deferred call, no release.
func killSelf() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
}

// killed reports whether the process ended without success (Windows has no signals to tell).
func killed(ps *os.ProcessState) bool { return ps.Exited() && !ps.Success() }
