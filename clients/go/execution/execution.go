// Package execution reserves a worktree for one executor before it mutates runtime state or
// resources. A retained ownership record requires explicit reconciliation even after the
// crashed process is gone.
//
// The reservation is a snapfence lease on a key named after the worktree, acquired with
// crash_recovery, so that a holder that dies (and stops renewing) leaves the service's recovery
// record behind; the Owner is stored as the lease's metadata. Abandon keeps the record,
// RequireRecovery marks it to be kept, Release clears it, and WithRecovery replaces a retained
// record only after its reconcile callback returns nil. While held, the lease is renewed in the
// background, and Context is cancelled (with coordination.ErrRunLeaseLost as its Cause) before
// the lease could expire.
package execution

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/internal/keep"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// Owner identifies the execution responsible for a worktree. Acquire supplies Token, PID,
// Worktree and AcquiredAt; callers describe Target, Mode and Kind. This record deliberately
// contains no runtime environment or credentials. It is stored, with these JSON names, as the
// metadata of the worktree's lease, and read back from lease_held and recovery_required
// refusals.
type Owner struct {
	// Token identifies the execution: random, made by Acquire (not the fencing token, which
	// Lease.Token is).
	Token string `json:"token"`
	// PID is the executing process's id.
	PID int `json:"pid"`
	// Worktree is the worktree's absolute path.
	Worktree string `json:"worktree"`
	// Target is what the execution works on, as the caller describes it.
	Target string `json:"target,omitempty"`
	// Mode is how it works on it, as the caller describes it.
	Mode string `json:"mode,omitempty"`
	// Kind is what sort of execution it is, as the caller describes it.
	Kind string `json:"kind,omitempty"`
	// AcquiredAt is when Acquire was called (local clock, UTC, millisecond precision).
	AcquiredAt time.Time `json:"acquiredAt"`
}

// ConflictError reports an active owner or abandoned execution awaiting reconciliation. Owner
// can be nil during an owner's metadata publication (or when the lease was not taken by this
// package).
type ConflictError struct {
	// Worktree and Key name what was asked for.
	Worktree, Key string
	// Owner is the active owner (lease_held) or the execution that left the record
	// (recovery_required), or nil.
	Owner *Owner
	// Holder is set for an active owner: the service's view of the live lease.
	Holder *snapfence.Holder
	// Recovery is set for a retained record: the service's recovery record.
	Recovery *snapfence.RecoveryRecord

	code string
	err  error
}

// Code is the service's code: snapfence.CodeLeaseHeld for an active owner,
// snapfence.CodeRecoveryRequired for a retained record (also when a WithRecovery reconcile
// returned an error).
func (e *ConflictError) Code() string { return e.code }

// Error describes the conflict.
func (e *ConflictError) Error() string {
	who := "an unknown owner"
	if e.Owner != nil {
		who = fmt.Sprintf("pid %d (token %s)", e.Owner.PID, e.Owner.Token)
	}
	var msg string
	switch e.code {
	case snapfence.CodeLeaseHeld:
		msg = fmt.Sprintf("execution: worktree %s is being executed by %s", e.Worktree, who)
	default:
		reason := ""
		if e.Recovery != nil {
			reason = " (" + e.Recovery.Reason + ")"
		}
		msg = fmt.Sprintf("execution: worktree %s keeps the record of %s%s awaiting reconciliation", e.Worktree, who, reason)
	}
	if e.err != nil && !errors.Is(e.err, snapfence.ErrLeaseHeld) && !errors.Is(e.err, snapfence.ErrRecoveryRequired) {
		msg += ": reconcile: " + e.err.Error()
	}
	return msg
}

// Unwrap returns the error behind the conflict: the service's *snapfence.Error, or the error a
// WithRecovery reconcile returned.
func (e *ConflictError) Unwrap() error { return e.err }

// Option configures Acquire.
type Option func(*options)

type options struct {
	reconcile   func(ctx context.Context, previous Owner) error
	ttl         time.Duration
	margin      time.Duration
	key         string
	ownerName   string
	callTimeout time.Duration
}

// WithRecovery permits replacing a retained owner only after reconcile returns nil. The callback
// runs while the retained record still blocks every other execution of the worktree (no grant is
// made while it is retained) and must establish that resources left by the previous execution
// no longer conflict. A dead PID alone cannot establish this: children and external resources
// can outlive it. previous is decoded from the record's metadata (zero fields when the record
// was not left by this package).
func WithRecovery(reconcile func(ctx context.Context, previous Owner) error) Option {
	return func(o *options) { o.reconcile = reconcile }
}

// WithTTL sets the lease's TTL (default 30 s): how long after a crash the record appears and
// the worktree stays blocked; renewals keep it while the process lives.
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithMargin sets how long before the lease could expire its Context is cancelled when
// renewals keep failing (default a fifth of the TTL).
func WithMargin(margin time.Duration) Option { return func(o *options) { o.margin = margin } }

// WithKey names the service key of the worktree instead of the default, "worktree:" followed by
// its absolute path (or by the path's SHA-256 when that is longer than a key may be).
func WithKey(key string) Option { return func(o *options) { o.key = key } }

// WithOwnerName sets the lease's owner as the service shows it (default "<hostname>/<pid>").
func WithOwnerName(name string) Option { return func(o *options) { o.ownerName = name } }

// WithCallTimeout bounds each of Abandon, RequireRecovery and Release (default 30 s), which take
// no context.
func WithCallTimeout(d time.Duration) Option { return func(o *options) { o.callTimeout = d } }

// KeyFor is the default service key of worktree.
func KeyFor(worktree string) string {
	key := "worktree:" + worktree
	if len(key) > 512 {
		sum := sha256.Sum256([]byte(worktree))
		key = "worktree-sha256:" + hex.EncodeToString(sum[:])
	}
	return key
}

type state int

const (
	stateHeld state = iota
	stateRecoveryRequired
	stateMarkFailed
	stateAbandoned
	stateReleased
)

// Lease is a held worktree. Make one with Acquire; end it with Release (cleanup confirmed) or
// Abandon (keep the record).
type Lease struct {
	client      *snapfence.Client
	key         string
	owner       Owner
	grant       snapfence.Grant
	keeper      *keep.Keeper
	callTimeout time.Duration

	mu      sync.Mutex
	st      state
	markErr error
}

// Acquire immediately rejects a competing execution, including one in the same process, with a
// *ConflictError (code lease_held). It never modifies the previous owner's record on rejection:
// a retained record is a *ConflictError with code recovery_required unless WithRecovery's
// reconcile returns nil. owner's Target, Mode and Kind describe the execution; Acquire fills in
// Token, PID, Worktree (made absolute) and AcquiredAt. ctx bounds the acquire and is the parent
// of the lease's Context.
func Acquire(ctx context.Context, client *snapfence.Client, worktree string, owner Owner, opts ...Option) (*Lease, error) {
	o := options{ttl: 30 * time.Second, callTimeout: 30 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	kopts, err := keep.Options{TTL: o.ttl, Margin: o.margin}.Resolve()
	if err != nil {
		return nil, fmt.Errorf("execution: %w", err)
	}
	if worktree == "" {
		return nil, errors.New("execution: empty worktree")
	}
	if abs, err := filepath.Abs(worktree); err == nil {
		worktree = abs
	}
	key := o.key
	if key == "" {
		key = KeyFor(worktree)
	}
	name := o.ownerName
	if name == "" {
		host, _ := os.Hostname()
		name = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	owner.Token = snapfence.NewIdempotencyKey()
	owner.PID = os.Getpid()
	owner.Worktree = worktree
	owner.AcquiredAt = time.Now().UTC().Truncate(time.Millisecond)

	req := snapfence.AcquireRequest{Owner: name, TTL: o.ttl, Metadata: owner, CrashRecovery: true}
	sent := time.Now()
	g, err := client.Acquire(ctx, key, req)
	var apiErr *snapfence.Error
	if errors.As(err, &apiErr) && apiErr.Code() == snapfence.CodeRecoveryRequired && o.reconcile != nil {
		previous := recordOwner(apiErr.Recovery)
		if rerr := o.reconcile(ctx, valueOr(previous)); rerr != nil {
			return nil, &ConflictError{Worktree: worktree, Key: key, Owner: previous, Recovery: apiErr.Recovery, code: snapfence.CodeRecoveryRequired, err: rerr}
		}
		req.Reconciled = true
		sent = time.Now()
		g, err = client.Acquire(ctx, key, req)
		if err == nil && g.Recovered != nil && g.Recovered.Token != apiErr.Recovery.Token {
			// Another execution replaced the record we reconciled, and left one of its own,
			// between our two acquires; the service replaced that one on our say-so. Reconcile it
			// too, now that we hold the worktree, or give the worktree up keeping a record.
			l := newLease(client, key, owner, *g, o)
			if l.keeper, err = keep.Start(ctx, sent, kopts, l.renew, lostError(key, g.Token)); err != nil {
				return nil, err
			}
			other := recordOwner(g.Recovered)
			if rerr := o.reconcile(ctx, valueOr(other)); rerr != nil {
				_ = l.Abandon()
				return nil, &ConflictError{Worktree: worktree, Key: key, Owner: other, Recovery: g.Recovered, code: snapfence.CodeRecoveryRequired, err: rerr}
			}
			return l, nil
		}
	}
	if err != nil {
		if errors.As(err, &apiErr) {
			switch apiErr.Code() {
			case snapfence.CodeLeaseHeld:
				var holder *Owner
				if apiErr.Holder != nil {
					holder = ownerOf(apiErr.Holder.Metadata)
				}
				return nil, &ConflictError{Worktree: worktree, Key: key, Owner: holder, Holder: apiErr.Holder, code: snapfence.CodeLeaseHeld, err: err}
			case snapfence.CodeRecoveryRequired:
				return nil, &ConflictError{Worktree: worktree, Key: key, Owner: recordOwner(apiErr.Recovery), Recovery: apiErr.Recovery, code: snapfence.CodeRecoveryRequired, err: err}
			}
		}
		return nil, err
	}
	l := newLease(client, key, owner, *g, o)
	keeper, err := keep.Start(ctx, sent, kopts, l.renew, lostError(key, g.Token))
	if err != nil {
		return nil, err
	}
	l.keeper = keeper
	return l, nil
}

func newLease(client *snapfence.Client, key string, owner Owner, g snapfence.Grant, o options) *Lease {
	return &Lease{client: client, key: key, owner: owner, grant: g, callTimeout: o.callTimeout}
}

func lostError(key string, token uint64) keep.LostFunc {
	return func(reason string, last error) error {
		return &coordination.LostError{Key: key, Token: token, Reason: reason, Err: last}
	}
}

func (l *Lease) renew(ctx context.Context) (bool, error) {
	_, err := l.client.Renew(ctx, l.key, l.grant.Token, l.grant.TTL())
	if errors.Is(err, snapfence.ErrLeaseLost) {
		return false, nil
	}
	return err == nil, err
}

// ownerOf decodes an Owner from lease metadata, or nil when it holds none.
func ownerOf(m snapfence.Metadata) *Owner {
	var o Owner
	if m.Decode(&o) != nil || o.Token == "" {
		return nil
	}
	return &o
}

// recordOwner decodes the Owner of a recovery record, or nil.
func recordOwner(r *snapfence.RecoveryRecord) *Owner {
	if r == nil {
		return nil
	}
	return ownerOf(r.Metadata)
}

func valueOr(o *Owner) Owner {
	if o == nil {
		return Owner{}
	}
	return *o
}

// Owner is the execution's Owner record, as stored with the lease.
func (l *Lease) Owner() Owner { return l.owner }

// Key is the service key of the worktree.
func (l *Lease) Key() string { return l.key }

// Token is the lease's fencing token: present it on snapshot writes that this execution makes.
func (l *Lease) Token() uint64 { return l.grant.Token }

// Recovered is the recovery record that WithRecovery replaced to grant this lease, or nil.
func (l *Lease) Recovered() *snapfence.RecoveryRecord { return l.grant.Recovered }

// Context is cancelled when the lease is lost (a renewal said it is no longer held, or renewals
// kept failing until the margin before it could expire; coordination.Cause then reports a
// *coordination.LostError matching coordination.ErrRunLeaseLost), when it is abandoned or
// released, or when Acquire's context is done.
func (l *Lease) Context() context.Context { return l.keeper.Context() }

// Err reports what went wrong with the lease while it was held: its loss, or the failure of a
// RequireRecovery call (Release then abandons, to keep the record). nil otherwise.
func (l *Lease) Err() error {
	if err := l.keeper.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.markErr
}

func (l *Lease) callContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), l.callTimeout)
}

// Abandon unlocks the worktree while preserving the recovery record. It never grants another
// execution permission to proceed without reconciliation. Use RequireRecovery while the current
// owner still has finalization work to do.
func (l *Lease) Abandon() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == stateAbandoned {
		return nil
	}
	l.keeper.Stop()
	ctx, cancel := l.callContext()
	defer cancel()
	if err := l.client.Abandon(ctx, l.key, l.grant.Token); err != nil {
		return fmt.Errorf("execution: abandoning %s: %w", l.owner.Worktree, err)
	}
	l.st = stateAbandoned
	return nil
}

// RequireRecovery marks cleanup incomplete without unlocking the worktree. Call this before
// writing final status or restoring an enclosing operation's temporary environment. It
// immediately prevents borrowing this lease for more execution (FromContext no longer returns
// it); Release retains the recovery marker once finalization is complete. Should the service not
// confirm the mark, Err reports it and Release abandons instead, which keeps a record too.
func (l *Lease) RequireRecovery() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st != stateHeld {
		return
	}
	l.st = stateMarkFailed
	ctx, cancel := l.callContext()
	defer cancel()
	if err := l.client.RequireRecovery(ctx, l.key, l.grant.Token); err != nil {
		l.markErr = fmt.Errorf("execution: marking %s for recovery: %w", l.owner.Worktree, err)
		return
	}
	l.st = stateRecoveryRequired
}

// Release clears the ownership record and unlocks the worktree. The caller must have confirmed
// resource cleanup first, or called RequireRecovery to preserve the record. A Release after
// Abandon leaves its recovery marker intact. A lease that was no longer held is an error
// matching coordination.ErrRunLeaseLost.
func (l *Lease) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.st {
	case stateAbandoned, stateReleased:
		return nil
	}
	l.keeper.Stop()
	ctx, cancel := l.callContext()
	defer cancel()
	var err error
	if l.st == stateMarkFailed {
		// The mark was not confirmed: abandoning is the other way to keep a record.
		err = l.client.Abandon(ctx, l.key, l.grant.Token)
		if err == nil {
			l.st = stateAbandoned
		}
	} else {
		err = l.client.Release(ctx, l.key, l.grant.Token)
		if err == nil {
			l.st = stateReleased
		}
	}
	if errors.Is(err, snapfence.ErrLeaseLost) {
		return &coordination.LostError{Key: l.key, Token: l.grant.Token, Reason: "released a lease that was no longer held", Err: err}
	}
	if err != nil {
		return fmt.Errorf("execution: releasing %s: %w", l.owner.Worktree, err)
	}
	return nil
}

// usable reports whether the lease may still be borrowed for execution.
func (l *Lease) usable() bool {
	l.mu.Lock()
	st := l.st
	l.mu.Unlock()
	return st == stateHeld && l.keeper.Err() == nil && l.keeper.Context().Err() == nil
}

type leaseKey struct{}

// NewContext returns a context that carries l, for FromContext.
func NewContext(ctx context.Context, l *Lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

// FromContext returns the lease that NewContext put in ctx, while it may still be borrowed for
// execution: not after RequireRecovery, Abandon or Release, nor once it was lost.
func FromContext(ctx context.Context) (*Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*Lease)
	if !ok || !l.usable() {
		return nil, false
	}
	return l, true
}
