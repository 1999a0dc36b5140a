// Package coordination declares the exported API of the seed coordination package
// (its documentation, as issues 16 and 32 quote it) and nothing else, without behaviour; see
// ../execution.
package coordination

import (
	"context"
	"errors"
	"time"
)

var (
	ErrInvalidLease = errors.New("declaration only")
	ErrRunLeaseLost = errors.New("declaration only")
)

type Lease struct {
	Key       string
	Owner     string
	Token     uint64
	ExpiresAt time.Time
}

func (lease Lease) Validate() error { panic("declaration only") }

type Locker interface {
	Acquire(ctx context.Context, key string, owner string, ttl time.Duration) (Lease, bool, error)
	Renew(ctx context.Context, lease Lease, ttl time.Duration) (Lease, bool, error)
	Release(ctx context.Context, lease Lease) error
}
