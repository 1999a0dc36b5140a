package coordination

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/keep"
)

// KeeperOptions tune a Keeper. The zero value is a sensible default.
type KeeperOptions struct {
	// Margin is how long before the lease's deadline the Keeper declares it lost when
	// renewals keep failing: the time the work needs to stop. 0 for a fifth of the TTL.
	Margin time.Duration
	// RenewEvery is the time between renewals. 0 for a third of the TTL (less when the margin
	// leaves less than two of those before the deadline).
	RenewEvery time.Duration
	// Wait makes Hold wait in the key's queue up to this long while it is held (contract v1.1);
	// the locker must be a WaitingLocker (the ServiceLocker is). 0 never waits.
	Wait time.Duration
}

// WaitingLocker is a Locker whose acquire can wait in the key's queue, as the service's can.
type WaitingLocker interface {
	Locker
	// AcquireWait is Acquire waiting up to wait while the key is held; false (no error) when
	// the wait ends first.
	AcquireWait(ctx context.Context, key, owner string, ttl, wait time.Duration) (Lease, bool, error)
}

// Keeper holds a lease and renews it in the background. Its Context is cancelled, with
// ErrRunLeaseLost as its Cause, as soon as the lease is lost:
//   - a renewal answered that the lease is no longer held (it expired, was released or was
//     taken over), or was refused in a way retrying cannot change (e.g. unauthorized); or
//   - renewals kept failing (the service is unreachable, frozen or answering 503) and the
//     lease's deadline is less than the margin away.
//
// The deadline is measured on the local monotonic clock from the moment the request that last
// proved the lease live (a renewal, or the acquire) was about to be sent, plus the TTL. The
// service started that TTL later, when the request arrived, so the deadline is never after the
// service's expiry: when the context is cancelled, the lease is still live for at least the
// margin, and work that stops within the margin never overlaps another holder. A grant that
// waited in the queue is renewed at once and dated from that renewal, never from the wait's
// start. Err and Context().Err() read the clock themselves: a process that wakes from a pause
// past its TTL learns of the loss at its next check, before its next write.
//
// Go 1.19 has no context.WithCancelCause, so the cause is read with this package's Cause
// (context.Cause of Go 1.20+ does not know it): Context().Err() is context.Canceled, and
// Cause(Context()) is a *LostError that matches ErrRunLeaseLost.
type Keeper struct {
	locker Locker
	ttl    time.Duration
	k      *keep.Keeper

	mu    sync.Mutex
	lease Lease
}

// Hold acquires key for owner through locker and keeps the lease with a Keeper. It answers
// false, with no error, while another lease on key is live. ctx bounds the acquire and is the
// parent of the Keeper's context: renewals stop when it is done.
func Hold(ctx context.Context, locker Locker, key, owner string, ttl time.Duration, opts KeeperOptions) (*Keeper, bool, error) {
	kopts := keep.Options{TTL: ttl, Margin: opts.Margin, RenewEvery: opts.RenewEvery}
	if _, err := kopts.Resolve(); err != nil {
		return nil, false, err
	}
	sent := time.Now()
	var lease Lease
	var ok bool
	var err error
	if opts.Wait > 0 {
		waiting, can := locker.(WaitingLocker)
		if !can {
			return nil, false, fmt.Errorf("coordination: KeeperOptions.Wait needs a WaitingLocker (such as NewLocker's), not a %T", locker)
		}
		lease, ok, err = waiting.AcquireWait(ctx, key, owner, ttl, opts.Wait)
	} else {
		lease, ok, err = locker.Acquire(ctx, key, owner, ttl)
	}
	if err != nil || !ok {
		return nil, ok, err
	}
	if keep.IsSlowGrant(sent, time.Now(), ttl) {
		// The grant came long after the request was sent (it waited in the queue): date the
		// lease from a renewal sent now, not from the start of the wait.
		again := time.Now()
		renewed, held, rerr := locker.Renew(ctx, lease, ttl)
		switch {
		case rerr == nil && held:
			lease, sent = renewed, again
		case rerr == nil:
			return nil, false, &LostError{Key: lease.Key, Token: lease.Token, Reason: keep.ReasonNotHeld}
		}
		// A failed renewal leaves the lease dated from the acquire: the loop renews, or
		// declares the lapse.
	}
	k, err := start(ctx, locker, lease, sent, kopts)
	if err != nil {
		return nil, false, err
	}
	return k, true, nil
}

// Keep keeps a lease acquired earlier. Its deadline is not known (the acquire's send time is
// not in the Lease), so Keep renews it at once and measures the deadline from that renewal; a
// lease that is no longer held is a *LostError. ctx bounds that renewal and is the parent of
// the Keeper's context.
func Keep(ctx context.Context, locker Locker, lease Lease, ttl time.Duration, opts KeeperOptions) (*Keeper, error) {
	if err := lease.Validate(); err != nil {
		return nil, err
	}
	kopts := keep.Options{TTL: ttl, Margin: opts.Margin, RenewEvery: opts.RenewEvery}
	if _, err := kopts.Resolve(); err != nil {
		return nil, err
	}
	sent := time.Now()
	renewed, ok, err := locker.Renew(ctx, lease, ttl)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &LostError{Key: lease.Key, Token: lease.Token, Reason: keep.ReasonNotHeld}
	}
	return start(ctx, locker, renewed, sent, kopts)
}

func start(ctx context.Context, locker Locker, lease Lease, sent time.Time, opts keep.Options) (*Keeper, error) {
	k := &Keeper{locker: locker, ttl: opts.TTL, lease: lease}
	renew := func(rctx context.Context) (bool, error) {
		current := k.Lease()
		renewed, ok, err := locker.Renew(rctx, current, opts.TTL)
		if ok && err == nil {
			k.mu.Lock()
			k.lease = renewed
			k.mu.Unlock()
		}
		return ok, err
	}
	lost := func(reason string, last error) error {
		return &LostError{Key: lease.Key, Token: lease.Token, Reason: reason, Err: last}
	}
	kk, err := keep.Start(ctx, sent, opts, renew, lost)
	if err != nil {
		return nil, err
	}
	k.k = kk
	return k, nil
}

// Lease is the lease as of its newest successful renewal.
func (k *Keeper) Lease() Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease
}

// Context is the context of the work the lease guards: cancelled when the lease is lost (Cause
// is then a *LostError matching ErrRunLeaseLost), when Stop or Release is called, or when the
// parent context is done.
func (k *Keeper) Context() context.Context { return k.k.Context() }

// Done is Context().Done().
func (k *Keeper) Done() <-chan struct{} { return k.k.Context().Done() }

// Err is the loss (a *LostError matching ErrRunLeaseLost and snapfence.ErrLeaseLost), or nil
// while the lease is live. It reads the clock: past the deadline minus the margin the lease is
// lost, also when the renewal loop has not run (the process was paused). Check it before each
// write.
func (k *Keeper) Err() error { return k.k.Err() }

// Deadline is the local time before which the service cannot expire the lease (the send time of
// the newest successful renewal plus the TTL). The Keeper declares the lease lost at Deadline
// minus the margin if renewals keep failing.
func (k *Keeper) Deadline() time.Time { return k.k.Deadline() }

// Stop ends the renewals and cancels the Context without releasing the lease, which then
// expires by itself.
func (k *Keeper) Stop() { k.k.Stop() }

// Release ends the renewals, cancels the Context and releases the lease. A lease that was no
// longer held is a *LostError.
func (k *Keeper) Release(ctx context.Context) error {
	k.k.Stop()
	return k.locker.Release(ctx, k.Lease())
}

// Cause returns why ctx was cancelled: a *LostError matching ErrRunLeaseLost when ctx is (or
// derives from) a Keeper's Context that was cancelled because the lease was lost; otherwise
// ctx.Err(). It stands in for context.Cause, which Go 1.19 lacks. nil while ctx is not done.
func Cause(ctx context.Context) error { return keep.Cause(ctx) }
