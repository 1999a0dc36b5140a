//go:build !unix

package testenv

import (
	"errors"
	"os"
)

var errNoSignals = errors.New("testenv: no SIGSTOP/SIGCONT on this system")

func freeze(p *os.Process) error { return errNoSignals }
func thaw(p *os.Process) error   { return errNoSignals }

// terminate kills p: there is no SIGTERM to send.
func terminate(p *os.Process) error { return p.Kill() }
