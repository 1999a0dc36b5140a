// Package coordination is the coordination package's contract (Lease with a fencing token, the
// Locker interface, ErrInvalidLease, ErrRunLeaseLost) backed by a snapfence service: a Locker
// whose leases carry the service's fencing tokens, fenced snapshot saves that the service
// refuses from superseded holders, and a Keeper that renews a lease in the background and
// cancels a context before the lease could expire.
package coordination

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/snapfence/snapfence/clients/go/snapfence"
)

var (
	// ErrInvalidLease reports a lease that no Locker minted: a zero Token, an empty Key or Owner.
	ErrInvalidLease = errors.New("coordination: invalid lease")
	// ErrRunLeaseLost reports that the worker executing a run no longer holds the run lease
	// (renewal returned not-held or failed) and must stop executing before another worker reaps
	// or takes over the run. Errors of this package that mean so (LostError) match it with
	// errors.Is, and a Keeper's context reports it as its Cause.
	ErrRunLeaseLost = errors.New("agentflow: run lease lost")
)

// Lease is a held lock plus its fencing token. Token is assigned by the Locker on every
// successful Acquire and is monotonically increasing per key (the service draws it from one
// sequence); Renew keeps the token unchanged. Downstream writers (fenced snapshot saves)
// compare the token against the newest token of the key and reject writes from superseded
// holders.
type Lease struct {
	// Key is the leased key.
	Key string
	// Owner is who holds it.
	Owner string
	// Token is the fencing token of the grant: greater than every token granted before it.
	Token uint64
	// ExpiresAt is when the service expires the lease unless it is renewed (database clock).
	ExpiresAt time.Time
}

// Validate reports whether the lease is well-formed. A zero Token means the lease was
// hand-built or predates fencing and is rejected: only Locker implementations mint valid
// leases. A token above 2^63-1 (which no service mints), an empty Key or an empty Owner is
// rejected too. The error is ErrInvalidLease itself, so callers may compare with ==.
func (lease Lease) Validate() error {
	if lease.Token == 0 || lease.Token > 1<<63-1 || lease.Key == "" || lease.Owner == "" {
		return ErrInvalidLease
	}
	return nil
}

// Locker hands out leases with fencing tokens.
type Locker interface {
	Acquire(ctx context.Context, key string, owner string, ttl time.Duration) (Lease, bool, error)
	Renew(ctx context.Context, lease Lease, ttl time.Duration) (Lease, bool, error)
	Release(ctx context.Context, lease Lease) error
}

// LostError says that a lease is no longer held, or can no longer be relied on, and why. It
// matches ErrRunLeaseLost with errors.Is, and unwraps to the error behind it (a
// *snapfence.Error with code lease_lost, stale_token or unknown_token, or the last failure of
// a renewal), if any.
type LostError struct {
	// Key is the lease's key.
	Key string
	// Token is the lease's fencing token.
	Token uint64
	// Reason says what happened.
	Reason string
	// Err is the error behind it, or nil.
	Err error
}

// Error describes the loss.
func (e *LostError) Error() string {
	msg := fmt.Sprintf("%v: key %q, token %d: %s", ErrRunLeaseLost, e.Key, e.Token, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches ErrRunLeaseLost, and snapfence.ErrLeaseLost: the keeper's loss is the contract's
// lease_lost, whatever told it (the service's answer, or the clock).
func (e *LostError) Is(target error) bool {
	return target == ErrRunLeaseLost || target == snapfence.ErrLeaseLost
}

// Unwrap returns the error behind the loss.
func (e *LostError) Unwrap() error { return e.Err }

// ServiceLocker is the Locker of a snapfence service. Its leases are the service's: the Token is
// the service's fencing token and ExpiresAt its expiry by the database clock. Make one with
// NewLocker; it is safe for concurrent use.
type ServiceLocker struct {
	client *snapfence.Client
}

// NewLocker returns the Locker of the service client talks to.
func NewLocker(client *snapfence.Client) *ServiceLocker {
	return &ServiceLocker{client: client}
}

func fromSnapfence(l snapfence.Lease) Lease {
	return Lease{Key: l.Key, Owner: l.Owner, Token: l.Token, ExpiresAt: l.ExpiresAt}
}

// Acquire takes a lease on key for owner, with a new fencing token. It answers false, with no
// error, while another lease on key is live (it never waits). A key blocked by a recovery record
// (left by an execution lease) is an error with code recovery_required: acquire it with the
// execution package's WithRecovery, or snapfence's Reconciled.
func (l *ServiceLocker) Acquire(ctx context.Context, key string, owner string, ttl time.Duration) (Lease, bool, error) {
	g, err := l.client.Acquire(ctx, key, snapfence.AcquireRequest{Owner: owner, TTL: ttl})
	if err != nil {
		if errors.Is(err, snapfence.ErrLeaseHeld) {
			return Lease{}, false, nil
		}
		return Lease{}, false, err
	}
	return fromSnapfence(g.Lease), true, nil
}

// AcquireWait is Acquire waiting in the key's queue up to wait while it is held (contract
// v1.1): false, with no error, when the wait ends first.
func (l *ServiceLocker) AcquireWait(ctx context.Context, key, owner string, ttl, wait time.Duration) (Lease, bool, error) {
	g, err := l.client.Acquire(ctx, key, snapfence.AcquireRequest{Owner: owner, TTL: ttl, Wait: wait})
	if err != nil {
		if errors.Is(err, snapfence.ErrLeaseHeld) {
			return Lease{}, false, nil
		}
		return Lease{}, false, err
	}
	return fromSnapfence(g.Lease), true, nil
}

// Renew extends lease to ttl from the service's now, keeping its token. It answers false, with
// no error, when the lease is no longer held (it expired, was released or was taken over): the
// holder must stop working.
func (l *ServiceLocker) Renew(ctx context.Context, lease Lease, ttl time.Duration) (Lease, bool, error) {
	if err := lease.Validate(); err != nil {
		return Lease{}, false, err
	}
	if ttl <= 0 {
		return Lease{}, false, fmt.Errorf("coordination: renewing %q needs a positive TTL, not %v", lease.Key, ttl)
	}
	renewed, err := l.client.Renew(ctx, lease.Key, lease.Token, ttl)
	if err != nil {
		if errors.Is(err, snapfence.ErrLeaseLost) {
			return Lease{}, false, nil
		}
		return Lease{}, false, err
	}
	return fromSnapfence(*renewed), true, nil
}

// Release ends lease; the key is free at once. A lease that was no longer held is a *LostError
// (errors.Is(err, ErrRunLeaseLost)): whatever ran under it may have overlapped another holder.
func (l *ServiceLocker) Release(ctx context.Context, lease Lease) error {
	if err := lease.Validate(); err != nil {
		return err
	}
	err := l.client.Release(ctx, lease.Key, lease.Token)
	if errors.Is(err, snapfence.ErrLeaseLost) {
		return &LostError{Key: lease.Key, Token: lease.Token, Reason: "released a lease that was no longer held", Err: err}
	}
	return err
}
