//go:build !linux

package testenv

import "os/exec"

// stopWithParent does nothing where there is no Pdeathsig: a test binary that dies without
// TestMain's cleanup leaves its server running.
func stopWithParent(cmd *exec.Cmd) {}
