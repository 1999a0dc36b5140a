// Command seedprogram is a program written against the seed packages' API alone (execution, and
// coordination's): no snapfence name appears below but the import paths. TestASeedProgramRunsUnchanged compiles it
// against the seed's declarations (testdata/seedapi) and against this module, and runs it
// against a real service (found, as Acquire finds it, in SNAPFENCE_URL).
//
// Usage: seedprogram BASE SCENARIO, BASE a directory in which to make worktrees. It prints "ok"
// and exits 0, or prints what went wrong and exits 1.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/execution"
)

var scenarios = map[string]func(base string) error{
	"nil-lease":                   nilLease,
	"symlinked-competitor":        symlinkedCompetitor,
	"abandon-keeps-the-record":    abandonKeepsTheRecord,
	"require-recovery-release":    requireRecoveryThenRelease,
	"failing-reconcile":           failingReconcileLeavesTheRecord,
	"refused-during-reconcile":    refusedDuringReconcile,
	"reconcile-replaces-a-record": reconcileReplacesARecord,
	"coordination-lease":          coordinationLease,
}

func main() {
	if len(os.Args) != 3 || scenarios[os.Args[2]] == nil {
		fmt.Println("usage: seedprogram BASE SCENARIO")
		os.Exit(2)
	}
	if err := scenarios[os.Args[2]](os.Args[1]); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

// worktree makes a worktree directory and a symbolic link to it.
func worktree(base, name string) (dir, link, real string, err error) {
	dir = filepath.Join(base, name)
	link = filepath.Join(base, name+"-link")
	if err = os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	if err = os.Symlink(dir, link); err != nil {
		return
	}
	real, err = filepath.EvalSymlinks(dir)
	return
}

// conflictOf is err's *ConflictError, or an error saying what err is instead.
func conflictOf(err error, recoveryRequired bool) (*execution.ConflictError, error) {
	var conflict *execution.ConflictError
	if !errors.As(err, &conflict) {
		return nil, fmt.Errorf("want a *ConflictError, got %T: %v", err, err)
	}
	if conflict.RecoveryRequired != recoveryRequired || conflict.Code() != "resource_conflict" {
		return nil, fmt.Errorf("want RecoveryRequired %v and code resource_conflict: %+v, %q", recoveryRequired, conflict, conflict.Code())
	}
	return conflict, nil
}

func readToken(worktree string) (string, error) {
	owner, err := execution.ReadOwner(worktree)
	if err != nil || owner == nil {
		return "", err
	}
	return owner.Token, nil
}

// Every method of a nil *Lease is safe.
func nilLease(base string) error {
	var lease *execution.Lease
	if lease.Owner() != (execution.Owner{}) || lease.ValidFor(base) {
		return errors.New("a nil lease has an owner or is valid")
	}
	lease.RequireRecovery()
	if err := lease.Release(); err != nil {
		return fmt.Errorf("Release of nil: %v", err)
	}
	if err := lease.Abandon(); err != nil {
		return fmt.Errorf("Abandon of nil: %v", err)
	}
	if execution.FromContext(context.Background()) != nil || execution.FromContext(execution.ContextWithLease(context.Background(), nil)) != nil {
		return errors.New("FromContext found a lease")
	}
	return nil
}

// Two paths to one worktree are one lease: a competitor through a symbolic link is refused at
// once, naming the owner, and the owner's record is left alone.
func symlinkedCompetitor(base string) error {
	dir, link, real, err := worktree(base, "competed")
	if err != nil {
		return err
	}
	lease, err := execution.Acquire(dir, execution.Owner{Target: "prod", Mode: "apply", Kind: "deploy"})
	if err != nil {
		return err
	}
	owner := lease.Owner()
	if owner.Token == "" || owner.PID != os.Getpid() || owner.Worktree != real || owner.AcquiredAt.IsZero() || owner.Target != "prod" {
		return fmt.Errorf("owner %+v", owner)
	}
	_, err = execution.Acquire(link, execution.Owner{Target: "other"})
	conflict, cerr := conflictOf(err, false)
	if cerr != nil {
		return fmt.Errorf("a competitor through the link: %v", cerr)
	}
	if conflict.Owner == nil || *conflict.Owner != owner || conflict.Worktree != real {
		return fmt.Errorf("the conflict names %+v in %s, want %+v in %s", conflict.Owner, conflict.Worktree, owner, real)
	}
	if token, err := readToken(link); err != nil || token != owner.Token {
		return fmt.Errorf("ReadOwner through the link: %q %v", token, err)
	}
	if !lease.ValidFor(link) || !lease.ValidFor(dir) || lease.ValidFor(base) {
		return errors.New("ValidFor does not follow the real path")
	}
	if err := lease.Release(); err != nil {
		return err
	}
	if err := lease.Release(); err != nil {
		return fmt.Errorf("a second Release: %v", err)
	}
	if token, err := readToken(dir); err != nil || token != "" {
		return fmt.Errorf("a released worktree has the owner %q (%v)", token, err)
	}
	next, err := execution.Acquire(link, execution.Owner{})
	if err != nil {
		return fmt.Errorf("after the release: %v", err)
	}
	return next.Release()
}

// Abandon keeps the record: the next Acquire is refused until a reconcile.
func abandonKeepsTheRecord(base string) error {
	dir, link, _, err := worktree(base, "abandoned")
	if err != nil {
		return err
	}
	lease, err := execution.Acquire(dir, execution.Owner{Kind: "migration"})
	if err != nil {
		return err
	}
	if err := lease.Abandon(); err != nil {
		return err
	}
	if err := lease.Abandon(); err != nil {
		return fmt.Errorf("a second Abandon: %v", err)
	}
	if err := lease.Release(); err != nil {
		return fmt.Errorf("Release after Abandon: %v", err)
	}
	if lease.ValidFor(dir) {
		return errors.New("an abandoned lease is valid")
	}
	_, err = execution.Acquire(link, execution.Owner{})
	conflict, cerr := conflictOf(err, true)
	if cerr != nil {
		return cerr
	}
	if conflict.Owner == nil || conflict.Owner.Token != lease.Owner().Token || conflict.Owner.Kind != "migration" {
		return fmt.Errorf("the conflict names %+v", conflict.Owner)
	}
	if token, err := readToken(dir); err != nil || token != lease.Owner().Token {
		return fmt.Errorf("ReadOwner after Abandon: %q %v", token, err)
	}
	return nil
}

// RequireRecovery stops the lease from being borrowed, and the Release after it keeps the record.
func requireRecoveryThenRelease(base string) error {
	dir, link, _, err := worktree(base, "marked")
	if err != nil {
		return err
	}
	lease, err := execution.Acquire(dir, execution.Owner{})
	if err != nil {
		return err
	}
	ctx := execution.ContextWithLease(context.Background(), lease)
	if execution.FromContext(ctx) != lease || !execution.FromContext(ctx).ValidFor(link) {
		return errors.New("the lease in the context cannot be borrowed")
	}
	lease.RequireRecovery()
	if execution.FromContext(ctx).ValidFor(dir) {
		return errors.New("a lease marked for recovery is still valid")
	}
	if _, err := conflictOf(firstErr(execution.Acquire(dir, execution.Owner{})), false); err != nil {
		return fmt.Errorf("while marked and held: %v", err)
	}
	if err := lease.Release(); err != nil {
		return err
	}
	conflict, err := conflictOf(firstErr(execution.Acquire(link, execution.Owner{})), true)
	if err != nil {
		return fmt.Errorf("after the release: %v", err)
	}
	if conflict.Owner == nil || conflict.Owner.Token != lease.Owner().Token {
		return fmt.Errorf("the conflict names %+v", conflict.Owner)
	}
	return nil
}

func firstErr(lease *execution.Lease, err error) error {
	if err == nil {
		_ = lease.Release()
		return errors.New("granted")
	}
	return err
}

// abandoned makes a worktree whose record an abandoned execution left.
func abandoned(base, name string) (dir, link string, left execution.Owner, err error) {
	dir, link, _, err = worktree(base, name)
	if err != nil {
		return
	}
	lease, err := execution.Acquire(dir, execution.Owner{Target: "db", Kind: "migration"})
	if err != nil {
		return
	}
	left = lease.Owner()
	err = lease.Abandon()
	return
}

// A reconcile that fails replaces nothing: the record stays as it was.
func failingReconcileLeavesTheRecord(base string) error {
	dir, link, left, err := abandoned(base, "unreconciled")
	if err != nil {
		return err
	}
	errLeftovers := errors.New("the half-applied migration still holds the table")
	var seen execution.Owner
	_, err = execution.Acquire(link, execution.Owner{}, execution.WithRecovery(func(previous execution.Owner) error {
		seen = previous
		return errLeftovers
	}))
	conflict, cerr := conflictOf(err, true)
	if cerr != nil {
		return cerr
	}
	if conflict.Cause != errLeftovers || !errors.Is(err, errLeftovers) || conflict.Owner == nil || *conflict.Owner != left || seen != left {
		return fmt.Errorf("conflict %+v (owner %+v), reconcile saw %+v, want %+v", conflict, conflict.Owner, seen, left)
	}
	if token, err := readToken(dir); err != nil || token != left.Token {
		return fmt.Errorf("the record after a failed reconcile: %q %v", token, err)
	}
	if _, err := conflictOf(firstErr(execution.Acquire(dir, execution.Owner{})), true); err != nil {
		return fmt.Errorf("after a failed reconcile: %v", err)
	}
	return nil
}

// While a reconcile runs, the reconciler holds the worktree: another Acquire, with or without
// WithRecovery, meets it as an active owner, and the record stays until reconcile returns nil.
func refusedDuringReconcile(base string) error {
	dir, link, left, err := abandoned(base, "reconciling")
	if err != nil {
		return err
	}
	var during error
	var reconciler *execution.Owner
	lease, err := execution.Acquire(dir, execution.Owner{Kind: "cleanup"}, execution.WithRecovery(func(previous execution.Owner) error {
		if previous != left {
			during = fmt.Errorf("reconcile got %+v, want %+v", previous, left)
			return during
		}
		conflict, err := conflictOf(firstErr(execution.Acquire(link, execution.Owner{})), false)
		if err != nil {
			during = fmt.Errorf("a plain Acquire during the reconcile: %v", err)
			return during
		}
		reconciler = conflict.Owner
		called := false
		_, err = conflictOf(firstErr(execution.Acquire(dir, execution.Owner{}, execution.WithRecovery(func(execution.Owner) error {
			called = true
			return nil
		}))), false)
		if err != nil || called {
			during = fmt.Errorf("a second reconciler during the reconcile (its reconcile called: %v): %v", called, err)
			return during
		}
		if token, err := readToken(dir); err != nil || token != left.Token {
			during = fmt.Errorf("the record during the reconcile: %q %v", token, err)
			return during
		}
		return nil
	}))
	if during != nil {
		return during
	}
	if err != nil {
		return err
	}
	if reconciler == nil || *reconciler != lease.Owner() || reconciler.Kind != "cleanup" {
		return fmt.Errorf("the competitor met %+v, want the reconciler %+v", reconciler, lease.Owner())
	}
	if !lease.ValidFor(link) {
		return errors.New("the reconciled lease is not valid")
	}
	if token, err := readToken(dir); err != nil || token != lease.Owner().Token {
		return fmt.Errorf("the owner after the reconcile: %q %v", token, err)
	}
	if err := lease.Release(); err != nil {
		return err
	}
	if token, err := readToken(dir); err != nil || token != "" {
		return fmt.Errorf("the owner after the release: %q %v", token, err)
	}
	return nil
}

// A reconcile that returns nil replaces a record that Abandon and RequireRecovery left.
func reconcileReplacesARecord(base string) error {
	dir, link, left, err := abandoned(base, "replaced")
	if err != nil {
		return err
	}
	var seen execution.Owner
	lease, err := execution.Acquire(link, execution.Owner{}, execution.WithRecovery(func(previous execution.Owner) error {
		seen = previous
		return nil
	}))
	if err != nil {
		return err
	}
	if seen != left {
		return fmt.Errorf("reconcile saw %+v, want %+v", seen, left)
	}
	lease.RequireRecovery()
	if err := lease.Release(); err != nil {
		return err
	}
	marked := lease.Owner()
	again, err := execution.Acquire(dir, execution.Owner{}, execution.WithRecovery(func(previous execution.Owner) error {
		seen = previous
		return nil
	}))
	if err != nil {
		return err
	}
	if seen != marked {
		return fmt.Errorf("the second reconcile saw %+v, want %+v", seen, marked)
	}
	return again.Release()
}

// A hand-built coordination lease is refused with ErrInvalidLease itself, which the seed's
// callers compare with ==; a Locker is used through the seed's interface.
func coordinationLease(base string) error {
	for _, lease := range []coordination.Lease{{}, {Key: "k", Owner: "o"}, {Owner: "o", Token: 1}, {Key: "k", Token: 1}} {
		if err := lease.Validate(); err != coordination.ErrInvalidLease {
			return fmt.Errorf("Validate of %+v = %v, want ErrInvalidLease itself", lease, err)
		}
	}
	minted := coordination.Lease{Key: "k", Owner: "o", Token: 7, ExpiresAt: time.Now()}
	if err := minted.Validate(); err != nil {
		return fmt.Errorf("Validate of %+v = %v", minted, err)
	}
	if errors.Is(coordination.ErrInvalidLease, coordination.ErrRunLeaseLost) {
		return errors.New("ErrInvalidLease is ErrRunLeaseLost")
	}
	var locker coordination.Locker
	_ = holdWith(locker)
	return nil
}

// holdWith is how a seed program takes a run lease through a Locker (compiled, not run: the seed
// names no Locker to make).
func holdWith(locker coordination.Locker) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		lease, ok, err := locker.Acquire(ctx, "runs/42", "worker-7", 30*time.Second)
		if err != nil || !ok {
			return err
		}
		if _, ok, err := locker.Renew(ctx, lease, 30*time.Second); err != nil || !ok {
			return coordination.ErrRunLeaseLost
		}
		return locker.Release(ctx, lease)
	}
}
