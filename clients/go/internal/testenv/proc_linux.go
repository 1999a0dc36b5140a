//go:build linux

package testenv

import (
	"os/exec"
	"syscall"
)

// stopWithParent makes the kernel send cmd SIGTERM when the test binary dies (Pdeathsig).
func stopWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
