package coordination_test

import (
	"context"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
)

// The seed coordination package's exported API, declared exactly as its users know it (its
// documentation, as issues 16 and 32 quote it); the declarations below fail to compile if this
// package drifts from it. Validate's error is ErrInvalidLease itself (TestValidateRefuses...).

type issueLease struct {
	Key       string
	Owner     string
	Token     uint64
	ExpiresAt time.Time
}

type issueLocker interface {
	Acquire(ctx context.Context, key string, owner string, ttl time.Duration) (coordination.Lease, bool, error)
	Renew(ctx context.Context, lease coordination.Lease, ttl time.Duration) (coordination.Lease, bool, error)
	Release(ctx context.Context, lease coordination.Lease) error
}

var (
	// Lease has exactly these fields (a conversion needs identical field sets and types).
	_ = coordination.Lease(issueLease{})
	_ = issueLease(coordination.Lease{})
	// func (Lease) Validate() error
	_ func() error = coordination.Lease{}.Validate
	// var ErrInvalidLease, ErrRunLeaseLost error
	_ error = coordination.ErrInvalidLease
	_ error = coordination.ErrRunLeaseLost
	// The Locker interface is the issue's, and the service's Locker satisfies both.
	_ issueLocker         = coordination.Locker(nil)
	_ coordination.Locker = issueLocker(nil)
	_ issueLocker         = (*coordination.ServiceLocker)(nil)
	_ coordination.Locker = (*coordination.ServiceLocker)(nil)
)
