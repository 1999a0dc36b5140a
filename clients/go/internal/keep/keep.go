// Package keep is the renewal loop shared by coordination's Keeper and execution's Lease: it
// renews a lease in the background and cancels a context, with a cause that Cause reports,
// before the lease could expire on the server.
//
// The deadline is measured on the local monotonic clock from the moment the request that last
// proved the lease live (a renewal, or the grant) was about to be sent, plus the TTL. The server
// started that TTL later, when it received the request, so the deadline is never after the
// server's expiry, whatever the clocks of the two machines say. A grant that came long after its
// request was sent (it waited in the queue) is renewed at once by its callers (SlowGrant), so a
// long wait does not read as a lapsing lease. The lease is lost at the deadline minus the margin,
// whoever looks first: the loop, or Err and the context's Err, which read the clock themselves so
// that a process waking from a pause knows at its next check.
package keep

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"time"
)

// RenewFunc renews the lease once. held false with a nil error means the lease is no longer
// held (lease_lost): the loss is certain. An error is a failure to learn the outcome, retried
// until the margin is reached, unless it carries a contract code that retrying cannot change.
type RenewFunc func(ctx context.Context) (held bool, err error)

// Options are the timing of a Keeper.
type Options struct {
	// TTL is the lease's TTL, as granted and as each renewal asks for.
	TTL time.Duration
	// Margin is how long before the deadline the lease is declared lost when renewals keep
	// failing: the time the holder needs to stop. 0 for TTL/5.
	Margin time.Duration
	// RenewEvery is the time between renewals. 0 for TTL/3, or less when the margin leaves
	// less than two of those before the lapse. Each pause is shortened by a random part of up
	// to a quarter, so that many keepers do not renew in step.
	RenewEvery time.Duration
}

// Resolve fills the defaults of o and checks that they can work.
func (o Options) Resolve() (Options, error) {
	if o.TTL <= 0 {
		return o, errors.New("keeper: the TTL must be positive")
	}
	if o.Margin == 0 {
		o.Margin = o.TTL / 5
	}
	if o.Margin < 0 || o.Margin >= o.TTL {
		return o, fmt.Errorf("keeper: a margin of %v leaves no time to renew a lease of %v", o.Margin, o.TTL)
	}
	window := o.TTL - o.Margin
	if o.RenewEvery == 0 {
		o.RenewEvery = o.TTL / 3
		if window/2 < o.RenewEvery {
			o.RenewEvery = window / 2
		}
	}
	if o.RenewEvery <= 0 || o.RenewEvery >= window {
		return o, fmt.Errorf("keeper: renewing every %v is too rare for a lease of %v with a margin of %v", o.RenewEvery, o.TTL, o.Margin)
	}
	return o, nil
}

// LostFunc makes the error that the keeper's context reports as its cause: reason says why,
// last is the last renewal error (nil when the server said the lease is gone).
type LostFunc func(reason string, last error) error

// Reasons a lease is declared lost, as passed to LostFunc.
const (
	ReasonNotHeld = "a renewal answered that the lease is no longer held (expired, released or taken over)"
	ReasonRefused = "a renewal was refused"
	ReasonLapsing = "renewals kept failing and the lease is about to lapse"
	// ReasonUnproved is a lapse with no failed renewal behind it: nothing ran in time (the
	// process was paused or starved past its TTL).
	ReasonUnproved = "no renewal proved the lease live in time and it is about to lapse (was the process paused?)"
)

// SlowGrant is the part of the TTL after which a grant's answer came too long after its request
// was sent to date the lease from that send time: callers renew such a grant at once.
const SlowGrant = 10

// IsSlowGrant reports whether a grant of ttl requested at sent and answered at received must be
// renewed at once to date its lease.
func IsSlowGrant(sent, received time.Time, ttl time.Duration) bool {
	return received.Sub(sent) > ttl/SlowGrant
}

// Keeper renews one lease until it is stopped or lost.
type Keeper struct {
	opts   Options
	renew  RenewFunc
	lostFn LostFunc
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	deadline time.Time // sent + TTL of the newest successful renewal
	lost     error
	lostAt   time.Time
	stopped  bool

	stop     chan struct{}
	stopOnce sync.Once
	exited   chan struct{}
}

type causeKey struct{}

// leaseCtx is the keeper's context: a plain cancel context that also answers causeKey.
type leaseCtx struct {
	context.Context
	k *Keeper
}

// Err reads the clock first: past the deadline minus the margin, the lease is declared lost and
// the context cancelled before Err answers.
func (c leaseCtx) Err() error {
	c.k.check()
	return c.Context.Err()
}

func (c leaseCtx) Value(key any) any {
	if key == (causeKey{}) {
		return c.k
	}
	return c.Context.Value(key)
}

// Start keeps a lease granted (or renewed) by a request that was about to be sent at sent. The
// returned keeper's Context is a child of parent; renewals stop when parent is done.
func Start(parent context.Context, sent time.Time, opts Options, renew RenewFunc, lost LostFunc) (*Keeper, error) {
	opts, err := opts.Resolve()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(parent)
	k := &Keeper{
		opts:     opts,
		renew:    renew,
		lostFn:   lost,
		parent:   parent,
		cancel:   cancel,
		deadline: sent.Add(opts.TTL),
		stop:     make(chan struct{}),
		exited:   make(chan struct{}),
	}
	k.ctx = leaseCtx{Context: ctx, k: k}
	go k.run(sent)
	return k, nil
}

// Context is cancelled when the lease is lost (Cause then reports the LostFunc's error), when
// Stop is called, or when the parent is done.
func (k *Keeper) Context() context.Context { return k.ctx }

// Err is the loss, or nil while the lease is live. It reads the clock: once the deadline minus
// the margin has passed (renewals are late, or the process was paused) the lease is declared
// lost here, before the loop notices.
func (k *Keeper) Err() error { return k.check() }

func (k *Keeper) check() error {
	k.mu.Lock()
	lost, lapse, stopped := k.lost, k.deadline.Add(-k.opts.Margin), k.stopped
	k.mu.Unlock()
	// A stopped keeper's lease was given up (or left to expire): the clock says nothing more.
	if lost != nil || stopped || time.Now().Before(lapse) {
		return lost
	}
	k.declare(ReasonUnproved, nil)
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lost
}

// LostAt is when the loss was declared (local clock), or zero.
func (k *Keeper) LostAt() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lostAt
}

// Deadline is the local time before which the server cannot expire the lease: the send time of
// the newest successful renewal plus the TTL.
func (k *Keeper) Deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deadline
}

// Stop ends the renewals (the lease is left to expire unless released) and cancels the
// context. It waits for a renewal in flight to end.
func (k *Keeper) Stop() {
	k.mu.Lock()
	k.stopped = true
	k.mu.Unlock()
	k.stopOnce.Do(func() { close(k.stop) })
	<-k.exited
	k.cancel()
}

// Exited is closed when the renewal loop has ended.
func (k *Keeper) Exited() <-chan struct{} { return k.exited }

// declare records the loss once (the loop and a holder's check may both see it) and cancels
// the context.
func (k *Keeper) declare(reason string, last error) {
	err := k.lostFn(reason, last)
	k.mu.Lock()
	if k.lost != nil {
		k.mu.Unlock()
		return
	}
	k.lost = err
	k.lostAt = time.Now()
	k.mu.Unlock()
	// The cause is set before the context is cancelled, so Cause never sees a cancelled
	// context without it.
	k.cancel()
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d - time.Duration(rand.Int63n(int64(d)/4+1))
}

func (k *Keeper) run(sent time.Time) {
	defer close(k.exited)
	// Renewals in flight end at Stop as well as at the parent's end.
	loopCtx, cancelLoop := context.WithCancel(k.parent)
	defer cancelLoop()
	go func() {
		select {
		case <-k.stop:
			cancelLoop()
		case <-k.ctx.Done(): // a loss declared by a holder's check
			cancelLoop()
		case <-loopCtx.Done():
		}
	}()

	next := sent.Add(jitter(k.opts.RenewEvery))
	var last error
	for {
		lapse := k.Deadline().Add(-k.opts.Margin)
		wake := next
		if lapse.Before(wake) {
			wake = lapse
		}
		timer := time.NewTimer(time.Until(wake))
		select {
		case <-timer.C:
		case <-loopCtx.Done():
			timer.Stop()
			return
		}
		if !time.Now().Before(lapse) {
			if last == nil {
				k.declare(ReasonUnproved, nil)
			} else {
				k.declare(ReasonLapsing, last)
			}
			return
		}
		rctx, cancel := context.WithDeadline(loopCtx, lapse)
		start := time.Now()
		held, err := k.renew(rctx)
		cancel()
		if loopCtx.Err() != nil {
			return
		}
		switch {
		case err == nil && held:
			k.mu.Lock()
			if k.lost == nil {
				k.deadline = start.Add(k.opts.TTL)
			}
			k.mu.Unlock()
			last = nil
			next = start.Add(jitter(k.opts.RenewEvery))
		case err == nil:
			k.declare(ReasonNotHeld, nil)
			return
		case permanent(err):
			k.declare(ReasonRefused, err)
			return
		default:
			last = err
			pause := k.opts.RenewEvery / 8
			if pause < 20*time.Millisecond {
				pause = 20 * time.Millisecond
			}
			next = time.Now().Add(pause)
		}
	}
}

// permanent reports an error that retrying a renewal cannot change: one with a contract code
// other than those the contract says may be retried.
func permanent(err error) bool {
	var coded interface{ Code() string }
	if !errors.As(err, &coded) {
		return false
	}
	switch coded.Code() {
	case "", "unavailable", "indeterminate", "too_many_requests", "request_in_progress":
		return false
	}
	return true
}

// Cause returns why ctx was cancelled: for the context of a Keeper, or one derived from it,
// that the keeper declared the lease lost, the LostFunc's error (once ctx.Err() is
// context.Canceled); otherwise ctx.Err(), or the Cause of the keeper's parent when that ended
// first. nil while ctx is not done.
func Cause(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	k, ok := ctx.Value(causeKey{}).(*Keeper)
	if !ok || err != context.Canceled {
		return err
	}
	if lost := k.Err(); lost != nil {
		return lost
	}
	if k.parent.Err() != nil {
		return Cause(k.parent)
	}
	return err
}
