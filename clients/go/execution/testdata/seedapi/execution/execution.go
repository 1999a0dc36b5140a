// Package execution declares the exported API of the seed execution package
// (its documentation and published source, as issue 32 quotes them) and nothing else,
// without behaviour. TestASeedProgramRunsUnchanged compiles testdata/seedprogram against it,
// with only its import paths changed, to show that the program uses the seed's API alone.
package execution

import (
	"context"
	"time"
)

type Owner struct {
	Token      string    `json:"token"`
	PID        int       `json:"pid"`
	Worktree   string    `json:"worktree"`
	Target     string    `json:"target,omitempty"`
	Mode       string    `json:"mode,omitempty"`
	Kind       string    `json:"kind,omitempty"`
	AcquiredAt time.Time `json:"acquiredAt"`
}

type ConflictError struct {
	Worktree         string
	Owner            *Owner
	RecoveryRequired bool
	Cause            error
}

func (*ConflictError) Code() string { return "resource_conflict" }

func (e *ConflictError) Error() string { return "declaration only" }

func (e *ConflictError) Unwrap() error { return e.Cause }

type options struct{}

type Option func(*options)

func WithRecovery(reconcile func(Owner) error) Option { panic("declaration only") }

type Lease struct{ unexported int }

func Acquire(worktree string, owner Owner, opts ...Option) (*Lease, error) {
	panic("declaration only")
}

func ReadOwner(worktree string) (*Owner, error) { panic("declaration only") }

func (l *Lease) Owner() Owner { panic("declaration only") }

func (l *Lease) ValidFor(worktree string) bool { panic("declaration only") }

func (l *Lease) Release() error { panic("declaration only") }

func (l *Lease) RequireRecovery() { panic("declaration only") }

func (l *Lease) Abandon() error { panic("declaration only") }

func ContextWithLease(ctx context.Context, lease *Lease) context.Context {
	panic("declaration only")
}

func FromContext(ctx context.Context) *Lease { panic("declaration only") }
