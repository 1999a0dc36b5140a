//go:build unix

package testenv

import (
	"os"
	"syscall"
)

func freeze(p *os.Process) error    { return p.Signal(syscall.SIGSTOP) }
func thaw(p *os.Process) error      { return p.Signal(syscall.SIGCONT) }
func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }
