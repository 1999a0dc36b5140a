// Package execution reserves a worktree for one executor before it mutates runtime state or
// resources. A retained ownership record requires explicit reconciliation even after the
// crashed process is gone.
//
// Its exported API is the seed execution package's (Acquire, Option, WithRecovery, Owner,
// ConflictError, ReadOwner, ContextWithLease, FromContext, and Lease's Owner, ValidFor,
// RequireRecovery, Abandon and Release), so a program switches to it by changing its import
// path. The reservation is a snapfence lease on a key named after the worktree's real path,
// acquired with crash_recovery, so that a holder that dies (and stops renewing) leaves the
// service's recovery record behind; the Owner is stored as the lease's metadata. Abandon keeps
// the record, RequireRecovery marks it to be kept, Release clears it, and WithRecovery replaces a
// retained record only after its reconcile callback, run while the lease holds the worktree
// (contract v1.2's reconciling acquire), returns nil.
//
// Acquire finds its service in WithClient, else in the environment the snapfence CLI reads
// (SNAPFENCE_URL, default http://127.0.0.1:7878; SNAPFENCE_API_KEY; SNAPFENCE_CA_CERT). Unlike a
// lock file, the lease has a TTL (WithTTL, 30 s by default): it is renewed in the background, and
// a process that cannot renew for longer than that (paused, cut off from the service) loses it.
// Context is then cancelled (with coordination.ErrRunLeaseLost as its coordination.Cause) before
// the service could grant the worktree to anyone else.
package execution

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	// Worktree is the worktree's real path (absolute, symbolic links resolved).
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

// complete reports why a decoded record cannot name an execution, or nil.
func (o Owner) complete() error {
	if o.Token == "" || o.PID <= 0 || o.Worktree == "" || o.AcquiredAt.IsZero() {
		return errors.New("the worktree's execution owner record is incomplete")
	}
	return nil
}

// ConflictError reports an active owner or abandoned execution awaiting reconciliation. Owner
// can be nil during an owner's metadata publication (or when the lease or record was not made by
// this package, or is unreadable).
//
// RecoveryRequired is true when a retained record blocks the worktree: the service refused with
// recovery_required, a WithRecovery reconcile returned an error (Cause), the record could not be
// read as an Owner (Cause says why; such a record is never handed to reconcile), or the lease was
// lost before the reconciliation was confirmed. It is false for an active owner (lease_held),
// including one that is reconciling a record right now. Cause is the reconcile's error, the
// reason the record is unreadable, or otherwise the service's refusal (a *snapfence.Error).
type ConflictError struct {
	Worktree         string
	Owner            *Owner
	RecoveryRequired bool
	Cause            error
}

// Code is always "resource_conflict", as the seed's; ServiceCode is the service's own code.
func (*ConflictError) Code() string { return "resource_conflict" }

// ServiceCode is the service's code for the conflict: snapfence.CodeRecoveryRequired when
// RecoveryRequired, else snapfence.CodeLeaseHeld.
func (e *ConflictError) ServiceCode() string {
	if e.RecoveryRequired {
		return snapfence.CodeRecoveryRequired
	}
	return snapfence.CodeLeaseHeld
}

// refusal is the service's refusal that Cause is (not one a reconcile's error may wrap) with the
// given code, or nil.
func (e *ConflictError) refusal(code string) *snapfence.Error {
	var apiErr *snapfence.Error
	switch cause := e.Cause.(type) {
	case *snapfence.Error:
		apiErr = cause
	case *unreadableRecord:
		apiErr = cause.refusal
	}
	if apiErr != nil && apiErr.Code() == code {
		return apiErr
	}
	return nil
}

// unreadableRecord is the Cause of a recovery_required refusal whose record is no Owner.
type unreadableRecord struct {
	reason  error
	refusal *snapfence.Error
}

func (u *unreadableRecord) Error() string { return u.reason.Error() + " (" + u.refusal.Error() + ")" }

func (u *unreadableRecord) Unwrap() error { return u.refusal }

// Holder is the service's view of the active owner's lease, when the service refused with
// lease_held; nil otherwise.
func (e *ConflictError) Holder() *snapfence.Holder {
	if r := e.refusal(snapfence.CodeLeaseHeld); r != nil {
		return r.Holder
	}
	return nil
}

// Recovery is the service's retained recovery record, when the service refused with
// recovery_required; nil otherwise (also after a failed reconcile: Owner names the record then).
func (e *ConflictError) Recovery() *snapfence.RecoveryRecord {
	if r := e.refusal(snapfence.CodeRecoveryRequired); r != nil {
		return r.Recovery
	}
	return nil
}

// Error describes the conflict.
func (e *ConflictError) Error() string {
	msg := fmt.Sprintf("execution: worktree %s is already being executed", e.Worktree)
	if e.RecoveryRequired {
		msg = fmt.Sprintf("execution: worktree %s awaits the reconciliation of an earlier execution before another can start", e.Worktree)
	}
	if e.Owner != nil {
		msg += fmt.Sprintf(" (pid %d, target %q, mode %q, kind %q)", e.Owner.PID, e.Owner.Target, e.Owner.Mode, e.Owner.Kind)
	}
	// The service's plain refusal says nothing the message does not.
	if e.Cause != nil && !plainRefusal(e.Cause) {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

func plainRefusal(err error) bool {
	apiErr, ok := err.(*snapfence.Error)
	return ok && (apiErr.Code() == snapfence.CodeLeaseHeld || apiErr.Code() == snapfence.CodeRecoveryRequired)
}

// Unwrap returns Cause.
func (e *ConflictError) Unwrap() error { return e.Cause }

// Option configures Acquire (and ReadOwnerWith).
type Option func(*options)

type options struct {
	client      *snapfence.Client
	ctx         context.Context
	reconcile   func(ctx context.Context, previous Owner) error
	ttl         time.Duration
	margin      time.Duration
	key         string
	ownerName   string
	callTimeout time.Duration
}

// WithRecovery permits replacing a retained owner only after reconcile returns nil. The callback
// runs while holding the worktree (a reconciling lease: every other Acquire is refused as by an
// active owner, and the record stays until the replacement is confirmed) and must establish that
// resources left by the previous execution no longer conflict. A dead PID alone cannot establish
// this: children and external resources can outlive it. When reconcile returns an error, the
// worktree is released and the record is kept as it was. A record that cannot be read as an
// Owner is refused without calling reconcile. It needs a service with contract v1.2.
func WithRecovery(reconcile func(Owner) error) Option {
	return func(o *options) {
		o.reconcile = nil
		if reconcile != nil {
			o.reconcile = func(_ context.Context, previous Owner) error { return reconcile(previous) }
		}
	}
}

// WithRecoveryContext is WithRecovery with a reconcile that takes the lease's Context, which is
// cancelled should the lease be lost while reconcile runs (it then should stop; the record
// stays).
func WithRecoveryContext(reconcile func(ctx context.Context, previous Owner) error) Option {
	return func(o *options) { o.reconcile = reconcile }
}

// WithClient makes Acquire use client instead of one made from the environment.
func WithClient(client *snapfence.Client) Option { return func(o *options) { o.client = client } }

// WithContext bounds Acquire's calls to the service with ctx, and makes ctx the parent of the
// lease's Context: when ctx is done, the renewals stop (and the lease, unless released, expires
// into a recovery record). Without it, context.Background().
func WithContext(ctx context.Context) Option { return func(o *options) { o.ctx = ctx } }

// WithTTL sets the lease's TTL (default 30 s): how long after a crash the record appears and
// the worktree stays blocked; renewals keep it while the process lives.
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithMargin sets how long before the lease could expire its Context is cancelled when
// renewals keep failing (default a fifth of the TTL).
func WithMargin(margin time.Duration) Option { return func(o *options) { o.margin = margin } }

// WithKey names the service key of the worktree instead of KeyFor of its real path.
func WithKey(key string) Option { return func(o *options) { o.key = key } }

// WithOwnerName sets the lease's owner as the service shows it (default "<hostname>/<pid>").
func WithOwnerName(name string) Option { return func(o *options) { o.ownerName = name } }

// WithCallTimeout bounds each of Abandon, RequireRecovery and Release (default 30 s), which take
// no context.
func WithCallTimeout(d time.Duration) Option { return func(o *options) { o.callTimeout = d } }

// KeyFor is the default service key of the worktree whose real path is worktree: "worktree:"
// followed by the path, or "worktree-sha256:" and the path's SHA-256 when that is longer than a
// key may be.
func KeyFor(worktree string) string {
	key := "worktree:" + worktree
	if len(key) > 512 {
		sum := sha256.Sum256([]byte(worktree))
		key = "worktree-sha256:" + hex.EncodeToString(sum[:])
	}
	return key
}

// RealPath is the worktree's real path, as Acquire names it: absolute, with symbolic links
// resolved. The worktree must exist.
func RealPath(worktree string) (string, error) {
	if worktree == "" {
		return "", errors.New("execution: empty worktree")
	}
	abs, err := filepath.Abs(worktree)
	if err != nil {
		return "", fmt.Errorf("execution: resolving worktree %s: %w", worktree, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("execution: resolving worktree %s: %w", worktree, err)
	}
	return real, nil
}

var envClients struct {
	sync.Mutex
	byEnv map[[3]string]*snapfence.Client
}

// clientFromEnv is the client of the environment's service, one per distinct environment.
func clientFromEnv() (*snapfence.Client, error) {
	env := [3]string{os.Getenv("SNAPFENCE_URL"), os.Getenv("SNAPFENCE_API_KEY"), os.Getenv("SNAPFENCE_CA_CERT")}
	envClients.Lock()
	defer envClients.Unlock()
	if c := envClients.byEnv[env]; c != nil {
		return c, nil
	}
	c, err := snapfence.NewFromEnv()
	if err != nil {
		return nil, fmt.Errorf("execution: the service of the environment (SNAPFENCE_URL, SNAPFENCE_API_KEY, SNAPFENCE_CA_CERT): %w", err)
	}
	if envClients.byEnv == nil {
		envClients.byEnv = map[[3]string]*snapfence.Client{}
	}
	envClients.byEnv[env] = c
	return c, nil
}

func resolve(opts []Option) (options, error) {
	o := options{ttl: 30 * time.Second, callTimeout: 30 * time.Second}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.ctx == nil {
		o.ctx = context.Background()
	}
	if o.callTimeout <= 0 {
		return o, fmt.Errorf("execution: a call timeout of %v leaves no time for a call", o.callTimeout)
	}
	if o.client == nil {
		c, err := clientFromEnv()
		if err != nil {
			return o, err
		}
		o.client = c
	}
	return o, nil
}

type state int

const (
	stateHeld state = iota
	stateRecoveryRequired
	stateMarkFailed
	stateClosed
)

// Lease is a held worktree. Make one with Acquire; end it with Release (cleanup confirmed) or
// Abandon (keep the record). Every method is safe on a nil *Lease (which holds nothing) and for
// concurrent use.
type Lease struct {
	client      *snapfence.Client
	key         string
	owner       Owner
	grant       snapfence.Grant
	recovered   *snapfence.RecoveryRecord
	keeper      *keep.Keeper
	callTimeout time.Duration

	mu      sync.Mutex
	st      state
	markErr error
}

// Acquire immediately rejects a competing execution, including one in the same process, with a
// *ConflictError. It never modifies the previous owner's record on rejection: a retained record
// is a *ConflictError with RecoveryRequired unless WithRecovery's reconcile, run while holding
// the worktree, returns nil. owner's Target, Mode and Kind describe the execution; Acquire fills
// in Token, PID, Worktree (its real path: two paths to one worktree are one lease) and
// AcquiredAt. The worktree must exist.
func Acquire(worktree string, owner Owner, opts ...Option) (*Lease, error) {
	o, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	kopts, err := keep.Options{TTL: o.ttl, Margin: o.margin}.Resolve()
	if err != nil {
		return nil, fmt.Errorf("execution: %w", err)
	}
	real, err := RealPath(worktree)
	if err != nil {
		return nil, err
	}
	key := o.key
	if key == "" {
		key = KeyFor(real)
	}
	name := o.ownerName
	if name == "" {
		host, _ := os.Hostname()
		name = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	owner.Token = snapfence.NewIdempotencyKey()
	owner.PID = os.Getpid()
	owner.Worktree = real
	owner.AcquiredAt = time.Now().UTC().Truncate(time.Millisecond)

	req := snapfence.AcquireRequest{Owner: name, TTL: o.ttl, Metadata: owner, CrashRecovery: true, Reconciling: o.reconcile != nil}
	sent := time.Now()
	g, err := o.client.Acquire(o.ctx, key, req)
	if err != nil {
		var apiErr *snapfence.Error
		if req.Reconciling && errors.As(err, &apiErr) && apiErr.Code() == snapfence.CodeInvalidRequest && strings.Contains(apiErr.Detail, "reconciling") {
			return nil, fmt.Errorf("execution: WithRecovery needs a service that takes reconciling acquires (contract v1.2): %w", err)
		}
		return nil, conflict(real, err)
	}
	l := &Lease{client: o.client, key: key, owner: owner, grant: *g, callTimeout: o.callTimeout}
	if l.keeper, err = keep.Start(o.ctx, sent, kopts, l.renew, lostError(key, g.Token)); err != nil {
		return nil, err
	}
	if g.Recovery == nil {
		return l, nil
	}

	// A reconciling grant: the worktree is held, and the record stays until it is confirmed.
	// Anything but a confirmation gives the worktree up again (a release before the confirmation
	// leaves the record as it was), also a reconcile that panics.
	confirmed := false
	defer func() {
		if !confirmed {
			l.giveUp()
		}
	}()
	previous, err := recordOwner(g.Recovery)
	if err != nil {
		return nil, &ConflictError{Worktree: real, RecoveryRequired: true, Cause: err}
	}
	if err := o.reconcile(l.Context(), *previous); err != nil {
		return nil, &ConflictError{Worktree: real, Owner: previous, RecoveryRequired: true, Cause: err}
	}
	if lost := l.keeper.Err(); lost != nil {
		return nil, &ConflictError{Worktree: real, Owner: previous, RecoveryRequired: true, Cause: lost}
	}
	ctx, cancel := context.WithTimeout(o.ctx, o.callTimeout)
	defer cancel()
	if _, err := o.client.Reconciled(ctx, key, g.Token); err != nil {
		if errors.Is(err, snapfence.ErrLeaseLost) {
			err = &coordination.LostError{Key: key, Token: g.Token, Reason: "the lease was lost before the reconciliation was confirmed", Err: err}
		} else {
			err = fmt.Errorf("execution: confirming the reconciliation of %s: %w", real, err)
		}
		return nil, &ConflictError{Worktree: real, Owner: previous, RecoveryRequired: true, Cause: err}
	}
	confirmed = true
	l.recovered = g.Recovery
	return l, nil
}

// conflict turns the service's lease_held and recovery_required refusals into *ConflictError.
func conflict(worktree string, err error) error {
	var apiErr *snapfence.Error
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.Code() {
	case snapfence.CodeLeaseHeld:
		var holder *Owner
		if apiErr.Holder != nil {
			holder, _ = ownerOf(apiErr.Holder.Metadata)
		}
		return &ConflictError{Worktree: worktree, Owner: holder, Cause: apiErr}
	case snapfence.CodeRecoveryRequired:
		previous, readErr := recordOwner(apiErr.Recovery)
		if readErr != nil {
			// Say why the record cannot be reconciled through this package.
			return &ConflictError{Worktree: worktree, RecoveryRequired: true, Cause: &unreadableRecord{reason: readErr, refusal: apiErr}}
		}
		return &ConflictError{Worktree: worktree, Owner: previous, RecoveryRequired: true, Cause: apiErr}
	}
	return err
}

// giveUp releases a reconciling lease whose reconciliation was not confirmed: the record stays.
func (l *Lease) giveUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keeper.Stop()
	l.st = stateClosed
	ctx, cancel := l.callContext()
	defer cancel()
	// Should this fail, the lease expires; the record stays either way.
	_ = l.client.Release(ctx, l.key, l.grant.Token)
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

// ownerOf decodes a complete Owner from lease or record metadata.
func ownerOf(m snapfence.Metadata) (*Owner, error) {
	var o Owner
	if err := m.Decode(&o); err != nil {
		return nil, fmt.Errorf("the worktree's execution owner record is unreadable: %w", err)
	}
	if err := o.complete(); err != nil {
		return nil, err
	}
	return &o, nil
}

// recordOwner decodes the Owner of a recovery record.
func recordOwner(r *snapfence.RecoveryRecord) (*Owner, error) {
	if r == nil {
		return nil, errors.New("the service named no recovery record")
	}
	return ownerOf(r.Metadata)
}

// ReadOwner reads the worktree's ownership record from the environment's service (as Acquire
// finds it) without changing anything: the retained recovery record's Owner if there is one
// (also while a reconciling execution holds the worktree), else the active owner's, else nil. The
// presence of an Owner does not tell an active owner from an abandoned execution; only Acquire
// can. A record that cannot be read as an Owner is an error.
func ReadOwner(worktree string) (*Owner, error) { return ReadOwnerWith(worktree) }

// ReadOwnerWith is ReadOwner with options: WithClient, WithContext and WithKey apply.
func ReadOwnerWith(worktree string, opts ...Option) (*Owner, error) {
	o, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	real, err := RealPath(worktree)
	if err != nil {
		return nil, err
	}
	key := o.key
	if key == "" {
		key = KeyFor(real)
	}
	ctx, cancel := context.WithTimeout(o.ctx, o.callTimeout)
	defer cancel()
	status, err := o.client.GetLease(ctx, key)
	if errors.Is(err, snapfence.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("execution: reading the owner of %s: %w", real, err)
	}
	var owner *Owner
	switch {
	case status.Recovery != nil:
		owner, err = recordOwner(status.Recovery)
	case status.State == snapfence.StateHeld:
		owner, err = ownerOf(status.Lease.Metadata)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("execution: reading the owner of %s: %w", real, err)
	}
	return owner, nil
}

// Owner is the execution's Owner record, as stored with the lease; the zero Owner for nil.
func (l *Lease) Owner() Owner {
	if l == nil {
		return Owner{}
	}
	return l.owner
}

// ValidFor permits an engine to reuse its caller's live lease. An absent (nil), released,
// abandoned, recovery-required, lost or different-worktree lease cannot grant admission.
// worktree is compared by its real path.
func (l *Lease) ValidFor(worktree string) bool {
	if l == nil {
		return false
	}
	real, err := RealPath(worktree)
	if err != nil || real != l.owner.Worktree {
		return false
	}
	return l.usable()
}

// usable reports whether the lease may still be borrowed for execution.
func (l *Lease) usable() bool {
	l.mu.Lock()
	st := l.st
	l.mu.Unlock()
	return st == stateHeld && l.keeper.Err() == nil && l.keeper.Context().Err() == nil
}

// Key is the service key of the worktree ("" for nil).
func (l *Lease) Key() string {
	if l == nil {
		return ""
	}
	return l.key
}

// Token is the lease's fencing token: present it on snapshot writes that this execution makes
// (0 for nil).
func (l *Lease) Token() uint64 {
	if l == nil {
		return 0
	}
	return l.grant.Token
}

// Recovered is the recovery record that WithRecovery reconciled and replaced to grant this lease,
// or nil.
func (l *Lease) Recovered() *snapfence.RecoveryRecord {
	if l == nil {
		return nil
	}
	return l.recovered
}

var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// Context is cancelled when the lease is lost (a renewal said it is no longer held, or renewals
// kept failing until the margin before it could expire; coordination.Cause then reports a
// *coordination.LostError matching coordination.ErrRunLeaseLost), when it is abandoned or
// released, or when WithContext's context is done. A nil lease's is already cancelled.
func (l *Lease) Context() context.Context {
	if l == nil {
		return doneContext
	}
	return l.keeper.Context()
}

// Err reports what went wrong with the lease while it was held: its loss, or the failure of a
// RequireRecovery call (Release then abandons, to keep the record). nil otherwise, and for nil.
func (l *Lease) Err() error {
	if l == nil {
		return nil
	}
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

// end makes the call that ends the lease (abandon or release) unless it has ended already.
func (l *Lease) end(what string, call func(ctx context.Context, key string, token uint64) error) error {
	l.keeper.Stop()
	ctx, cancel := l.callContext()
	defer cancel()
	err := call(ctx, l.key, l.grant.Token)
	switch {
	case err == nil:
		l.st = stateClosed
		return nil
	case errors.Is(err, snapfence.ErrLeaseLost):
		// Nothing left to end: the lease expired (leaving a record) or was taken over.
		l.st = stateClosed
		return &coordination.LostError{Key: l.key, Token: l.grant.Token, Reason: what + " a lease that was no longer held", Err: err}
	default:
		// The outcome is unknown: a later call tries again (the lease, no longer renewed,
		// expires into a record otherwise).
		return fmt.Errorf("execution: %s %s: %w", what, l.owner.Worktree, err)
	}
}

// Abandon unlocks the worktree while preserving the recovery record. It never grants another
// execution permission to proceed without reconciliation. Use RequireRecovery while the current
// owner still has finalization work to do. Abandon after Abandon or Release, and on nil, returns
// nil; a lease that was no longer held is an error matching coordination.ErrRunLeaseLost.
func (l *Lease) Abandon() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == stateClosed {
		return nil
	}
	return l.end("abandoned", l.client.Abandon)
}

// RequireRecovery marks cleanup incomplete without unlocking the worktree. Call this before
// writing final status or restoring an enclosing operation's temporary environment. It
// immediately prevents borrowing this lease for more execution (ValidFor answers false);
// Release retains the recovery marker once finalization is complete. Should the service not
// confirm the mark, Err reports it and Release abandons instead, which keeps a record too.
func (l *Lease) RequireRecovery() {
	if l == nil {
		return
	}
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
// Abandon leaves its recovery marker intact (and returns nil, as a second Release and one on nil
// do). A lease that was no longer held is an error matching coordination.ErrRunLeaseLost.
func (l *Lease) Release() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.st {
	case stateClosed:
		return nil
	case stateMarkFailed:
		// The mark was not confirmed: abandoning is the other way to keep a record.
		return l.end("abandoned", l.client.Abandon)
	}
	return l.end("released", l.client.Release)
}

type leaseKey struct{}

// ContextWithLease returns a context that carries lease, for FromContext.
func ContextWithLease(ctx context.Context, lease *Lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, lease)
}

// FromContext returns the lease that ContextWithLease put in ctx, or nil. Check ValidFor before
// borrowing it for execution.
func FromContext(ctx context.Context) *Lease {
	l, _ := ctx.Value(leaseKey{}).(*Lease)
	return l
}
