package execution_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/execution"
	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

func TestMain(m *testing.M) {
	if os.Getenv("SF_GO_CRASH_HELPER") != "" {
		crashingExecution()
		return
	}
	os.Exit(testenv.Main(m))
}

// crashingExecution is the test binary run as a child: it takes the worktree's execution lease,
// says so, and dies with SIGKILL half-way through its work, leaving the lease to expire.
func crashingExecution() {
	// The service is found in the environment (SNAPFENCE_URL), as the seed's users find it.
	lease, err := execution.Acquire(os.Getenv("SF_GO_WORKTREE"),
		execution.Owner{Target: "prod", Mode: "apply", Kind: "deploy"},
		execution.WithKey(os.Getenv("SF_GO_KEY")), execution.WithTTL(time.Second), execution.WithOwnerName("crasher"))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Printf("acquired %d %s\n", lease.Token(), lease.Owner().Token)
	_ = os.Stdout.Sync()
	killSelf()
	select {}
}

func newClient(t *testing.T) *snapfence.Client {
	t.Helper()
	c, err := snapfence.NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// worktree makes a worktree directory and returns its real path and a key of its own.
func worktree(t *testing.T) (string, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "wt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return real, testenv.UniqueKey(t, "wt")
}

// on is the options that make Acquire use the test's client and context, and key.
func on(c *snapfence.Client, ctx context.Context, key string, more ...execution.Option) []execution.Option {
	return append([]execution.Option{execution.WithClient(c), execution.WithContext(ctx), execution.WithKey(key)}, more...)
}

// wantConflict checks that err is a *ConflictError of the service's code.
func wantConflict(t *testing.T, err error, serviceCode string) *execution.ConflictError {
	t.Helper()
	var c *execution.ConflictError
	if !errors.As(err, &c) || c.Code() != "resource_conflict" || snapfence.CodeOf(err) != "resource_conflict" ||
		c.ServiceCode() != serviceCode || c.RecoveryRequired != (serviceCode == snapfence.CodeRecoveryRequired) {
		t.Fatalf("want a *ConflictError of service code %s, got %T: %v", serviceCode, err, err)
	}
	return c
}

// requireV12 skips a test of WithRecovery when the service has no contract v1.2 (it answers 404
// for POST /v1/leases/{key}/reconciled).
func requireV12(t *testing.T) {
	t.Helper()
	if !hasReconciledRoute(t) {
		t.Skip("the service answers 404 for POST /v1/leases/{key}/reconciled: it has no contract v1.2, which WithRecovery needs")
	}
}

func TestAcquireStoresTheOwnerAsTheLeasesMetadata(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	before := time.Now().Add(-time.Second)
	l, err := execution.Acquire(dir, execution.Owner{Token: "ignored", PID: 1, Target: "prod", Mode: "apply", Kind: "deploy"}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	o := l.Owner()
	if o.Token == "" || o.Token == "ignored" || o.PID != os.Getpid() || o.Worktree != dir || o.Target != "prod" ||
		o.Mode != "apply" || o.Kind != "deploy" || o.AcquiredAt.Before(before) || o.AcquiredAt.After(time.Now()) {
		t.Fatalf("owner %+v", o)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !status.Lease.CrashRecovery || status.Lease.Token != l.Token() || status.State != snapfence.StateHeld {
		t.Fatalf("lease %+v", status.Lease)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(status.Lease.Metadata, &fields); err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "acquiredAt,kind,mode,pid,target,token,worktree" {
		t.Fatalf("metadata names %v", names)
	}
	var stored execution.Owner
	if err := status.Lease.Metadata.Decode(&stored); err != nil || stored != o {
		t.Fatalf("stored owner %+v, want %+v (%v)", stored, o, err)
	}

	// Without Target, Mode and Kind, they are left out.
	plainDir, plainKey := worktree(t)
	plain, err := execution.Acquire(plainDir, execution.Owner{}, on(c, ctx, plainKey)...)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Release()
	status, err = c.GetLease(ctx, plainKey)
	if err != nil {
		t.Fatal(err)
	}
	if m := string(status.Lease.Metadata); strings.Contains(m, "target") || strings.Contains(m, "mode") || strings.Contains(m, "kind") {
		t.Fatalf("empty fields stored: %s", m)
	}
}

func TestAcquireRejectsACompetingExecutionAtOnceAndLeavesTheOwnersRecordAlone(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	first, err := execution.Acquire(dir, execution.Owner{Target: "a"}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	before, err := c.GetLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = execution.Acquire(dir, execution.Owner{Target: "b"}, on(c, ctx, key)...)
	conflict := wantConflict(t, err, snapfence.CodeLeaseHeld)
	if time.Since(start) > 30*time.Second {
		t.Fatal("the competing acquire waited")
	}
	if conflict.Owner == nil || *conflict.Owner != first.Owner() || conflict.Holder() == nil || conflict.Recovery() != nil || conflict.Worktree != dir {
		t.Fatalf("conflict %+v", conflict)
	}
	if !errors.Is(err, snapfence.ErrLeaseHeld) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("error %v", err)
	}
	after, err := c.GetLease(ctx, key)
	if err != nil || after.Lease.Token != before.Lease.Token || string(after.Lease.Metadata) != string(before.Lease.Metadata) {
		t.Fatalf("the rejection touched the owner's lease: %+v %v", after, err)
	}
	// The default key is the worktree's real path: a relative path and a symbolic link to the
	// worktree name the same one.
	rel, err := filepath.Rel(mustGetwd(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	byPath, err := execution.Acquire(rel, execution.Owner{}, execution.WithClient(c))
	if err != nil {
		t.Fatal(err)
	}
	defer byPath.Release()
	if byPath.Key() != execution.KeyFor(dir) || byPath.Owner().Worktree != dir {
		t.Fatalf("key %q, worktree %q for %q", byPath.Key(), byPath.Owner().Worktree, rel)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	_, err = execution.Acquire(link, execution.Owner{}, execution.WithClient(c))
	if conflict := wantConflict(t, err, snapfence.CodeLeaseHeld); conflict.Worktree != dir || *conflict.Owner != byPath.Owner() {
		t.Fatalf("conflict %+v", conflict)
	}
	if real, err := execution.RealPath(link); err != nil || real != dir {
		t.Fatalf("RealPath(%s) = %q, %v", link, real, err)
	}
	if owner, err := execution.ReadOwnerWith(link, execution.WithClient(c)); err != nil || owner == nil || *owner != byPath.Owner() {
		t.Fatalf("ReadOwnerWith(%s) = %+v, %v", link, owner, err)
	}
}

func mustGetwd(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

func TestReleaseClearsTheRecordAndUnlocks(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	l, err := execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if l.Context().Err() == nil {
		t.Fatal("the lease's context outlived the release")
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateReleased || status.Recovery != nil {
		t.Fatalf("after release: %+v %v", status, err)
	}
	if err := l.Release(); err != nil {
		t.Fatalf("a second release: %v", err)
	}
	next, err := execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
	if err != nil || next.Recovered() != nil {
		t.Fatalf("the next execution: %v %v", next, err)
	}
	_ = next.Release()
}

func TestAbandonKeepsTheRecordAndAReleaseAfterItLeavesTheRecord(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	l, err := execution.Acquire(dir, execution.Owner{Kind: "migration"}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Abandon(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateRecoveryPending || status.Recovery.Reason != snapfence.ReasonAbandoned {
		t.Fatalf("after abandon and release: %+v %v", status, err)
	}
	_, err = execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
	conflict := wantConflict(t, err, snapfence.CodeRecoveryRequired)
	if conflict.Owner == nil || *conflict.Owner != l.Owner() || conflict.Recovery() == nil || conflict.Recovery().Token != l.Token() {
		t.Fatalf("conflict %+v", conflict)
	}
	if !errors.Is(err, snapfence.ErrRecoveryRequired) {
		t.Fatalf("unwraps to %v", errors.Unwrap(err))
	}
	after, err := c.GetLease(ctx, key)
	if err != nil || after.Recovery == nil || after.Recovery.Token != l.Token() {
		t.Fatalf("the rejected acquire touched the record: %+v %v", after, err)
	}
}

func TestRequireRecoveryKeepsHoldingStopsBorrowingAndReleaseKeepsTheRecord(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	l, err := execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	borrowed := execution.ContextWithLease(ctx, l)
	if got := execution.FromContext(borrowed); got != l || !got.ValidFor(dir) {
		t.Fatal("FromContext does not return a held lease")
	}
	l.RequireRecovery()
	if execution.FromContext(borrowed).ValidFor(dir) {
		t.Fatal("a lease marked for recovery can still be borrowed")
	}
	if l.Err() != nil {
		t.Fatalf("the mark failed: %v", l.Err())
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateHeld || !status.Lease.RecoveryRequired {
		t.Fatalf("after RequireRecovery: %+v %v", status, err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	status, err = c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateRecoveryPending || status.Recovery.Reason != snapfence.ReasonRecoveryRequired {
		t.Fatalf("after release: %+v %v", status, err)
	}
	if execution.FromContext(ctx) != nil {
		t.Fatal("FromContext found a lease in a context without one")
	}
}

// A crash (SIGKILL of a child process holding the worktree) leaves the record; a reconcile that
// fails replaces nothing; one that succeeds replaces it, and the audit log says so.
func TestACrashLeavesARecordThatWithRecoveryReplacesOnlyAfterReconcileSucceeds(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	start := time.Now().Add(-time.Minute)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "SF_GO_CRASH_HELPER=1", "SF_GO_WORKTREE="+dir, "SF_GO_KEY="+key)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line := <-testenv.ReadLines(bufio.NewReader(out))
	werr := child.Wait()
	var childToken uint64
	var ownerToken string
	if _, err := fmt.Sscanf(line, "acquired %d %s", &childToken, &ownerToken); err != nil {
		t.Fatalf("the child said %q (%v)", line, werr)
	}
	if !killed(child.ProcessState) {
		t.Fatalf("the child was not killed: %v", werr)
	}
	childPID := child.Process.Pid

	testenv.Eventually(t, time.Minute, "the crashed execution's lease expires into a record", func() bool {
		s, err := c.GetLease(ctx, key)
		return err == nil && s.State == snapfence.StateRecoveryPending
	})
	_, err = execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
	conflict := wantConflict(t, err, snapfence.CodeRecoveryRequired)
	if conflict.Owner == nil || conflict.Owner.PID != childPID || conflict.Owner.Token != ownerToken ||
		conflict.Owner.Target != "prod" || conflict.Recovery().Reason != snapfence.ReasonExpired || conflict.Recovery().Token != childToken {
		t.Fatalf("conflict %+v, owner %+v", conflict, conflict.Owner)
	}

	// The reconcile finds the crashed deploy's leftovers still in the way: nothing is replaced.
	requireV12(t)
	errLeftovers := errors.New("the half-applied deploy still holds the load balancer")
	var seen execution.Owner
	_, err = execution.Acquire(dir, execution.Owner{}, on(c, ctx, key, execution.WithOwnerName("reconciler"),
		execution.WithRecoveryContext(func(ctx context.Context, previous execution.Owner) error {
			seen = previous
			return errLeftovers
		}))...)
	conflict = wantConflict(t, err, snapfence.CodeRecoveryRequired)
	if !errors.Is(err, errLeftovers) || conflict.Cause != errLeftovers || !strings.Contains(err.Error(), errLeftovers.Error()) ||
		seen.PID != childPID || seen.Token != ownerToken || *conflict.Owner != seen || conflict.Recovery() != nil || conflict.Holder() != nil {
		t.Fatalf("failed reconcile: %v; reconcile saw %+v", err, seen)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateRecoveryPending || status.Recovery.Token != childToken {
		t.Fatalf("a failed reconcile replaced the record: %+v %v", status, err)
	}

	// Cleaned up: the reconcile succeeds, and the record is replaced.
	l, err := execution.Acquire(dir, execution.Owner{Kind: "cleanup"}, on(c, ctx, key, execution.WithOwnerName("reconciler"),
		execution.WithRecovery(func(previous execution.Owner) error { return nil }))...)
	if err != nil {
		t.Fatal(err)
	}
	if r := l.Recovered(); r == nil || r.Token != childToken || r.Reason != snapfence.ReasonExpired || r.Owner != "crasher" {
		t.Fatalf("recovered %+v", r)
	}
	status, err = c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateHeld || status.Lease.Token != l.Token() || status.Recovery != nil {
		t.Fatalf("after the reconciled acquire: %+v %v", status, err)
	}
	page, err := c.ListRecoveries(ctx, snapfence.AuditQuery{Key: key, Since: start})
	if err != nil {
		t.Fatal(err)
	}
	// The confirmation is audited once (the reconciling grants, the failed one too, are noted
	// as "reconciling").
	var entry *snapfence.RecoveryEntry
	for i := range page.Items {
		if page.Items[i].Operation == "reconciled" {
			if entry != nil {
				t.Fatalf("the replacement is in the audit log twice: %+v", page.Items)
			}
			entry = &page.Items[i]
		}
	}
	if entry == nil || entry.Recovery.Token != childToken || entry.ReconciledBy != "reconciler" || entry.HighestToken != l.Token() ||
		entry.Reason != snapfence.ReasonExpired || entry.Recovery.Owner != "crasher" {
		t.Fatalf("audit entry %+v of %+v", entry, page.Items)
	}
	var crashed execution.Owner
	if err := entry.Recovery.Metadata.Decode(&crashed); err != nil || crashed.PID != childPID {
		t.Fatalf("the audit log's record names %+v (%v)", crashed, err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	status, err = c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateReleased {
		t.Fatalf("after the release: %+v %v", status, err)
	}
}

func TestTheLeasesContextIsCancelledWithRunLeaseLostWhenTheLeaseIsTakenOver(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	l, err := execution.Acquire(dir, execution.Owner{}, on(c, ctx, key, execution.WithTTL(3*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	borrowed := execution.ContextWithLease(ctx, l)
	// Someone with the token ends the lease and another execution is granted the worktree.
	if err := c.Release(ctx, key, l.Token()); err != nil {
		t.Fatal(err)
	}
	other, err := execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	select {
	case <-l.Context().Done():
	case <-time.After(time.Minute):
		t.Fatal("the lease's context was not cancelled within a minute")
	}
	if !errors.Is(coordination.Cause(l.Context()), coordination.ErrRunLeaseLost) || !errors.Is(l.Err(), coordination.ErrRunLeaseLost) {
		t.Fatalf("cause %v, err %v", coordination.Cause(l.Context()), l.Err())
	}
	if execution.FromContext(borrowed).ValidFor(dir) {
		t.Fatal("a lost lease can still be borrowed")
	}
	if err := l.Release(); !errors.Is(err, coordination.ErrRunLeaseLost) {
		t.Fatalf("release of a lost lease: %v", err)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.Lease.Token != other.Token() || status.State != snapfence.StateHeld {
		t.Fatalf("the other execution's lease was touched: %+v %v", status, err)
	}
}

func TestAcquireRefusesBadOptionsBeforeSendingAnything(t *testing.T) {
	c, err := snapfence.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t)
	for name, opts := range map[string][]execution.Option{
		"margin above the ttl": {execution.WithTTL(time.Second), execution.WithMargin(2 * time.Second)},
		"no ttl":               {execution.WithTTL(-time.Second)},
	} {
		if _, err := execution.Acquire(t.TempDir(), execution.Owner{}, append(opts, execution.WithClient(c), execution.WithContext(ctx))...); err == nil || errors.Is(err, snapfence.ErrUnavailable) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for _, dir := range []string{"", filepath.Join(t.TempDir(), "missing")} {
		if _, err := execution.Acquire(dir, execution.Owner{}, execution.WithClient(c)); err == nil || errors.Is(err, snapfence.ErrUnavailable) {
			t.Fatalf("the worktree %q: %v", dir, err)
		}
	}
	if k := execution.KeyFor("/" + strings.Repeat("d", 600)); len(k) > 512 || !strings.HasPrefix(k, "worktree-sha256:") {
		t.Fatalf("the key of a long path: %q", k)
	}
}

// Every method of a nil *Lease is safe: it holds nothing.
func TestANilLeaseHoldsNothing(t *testing.T) {
	var l *execution.Lease
	if l.Owner() != (execution.Owner{}) || l.ValidFor(t.TempDir()) || l.Key() != "" || l.Token() != 0 || l.Recovered() != nil || l.Err() != nil {
		t.Fatal("a nil lease holds something")
	}
	l.RequireRecovery()
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Abandon(); err != nil {
		t.Fatal(err)
	}
	if l.Context().Err() == nil {
		t.Fatal("a nil lease's context is not done")
	}
	if execution.FromContext(execution.ContextWithLease(context.Background(), l)) != nil {
		t.Fatal("FromContext made up a lease")
	}
}

func TestAbandonAfterReleaseAndASecondAbandonAreNil(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	l, err := execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Abandon(); err != nil {
		t.Fatalf("Abandon after Release: %v", err)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateReleased || status.Recovery != nil {
		t.Fatalf("Abandon after Release left a record: %+v %v", status, err)
	}
	other, err := execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	if other.ValidFor(filepath.Dir(dir)) || !other.ValidFor(dir) {
		t.Fatal("ValidFor does not compare the worktree")
	}
	for i := 0; i < 2; i++ {
		if err := other.Abandon(); err != nil {
			t.Fatalf("Abandon %d: %v", i+1, err)
		}
	}
	if other.ValidFor(dir) {
		t.Fatal("an abandoned lease is valid")
	}
}

// foreignRecord makes key keep a recovery record whose metadata is no execution Owner, as a
// lease taken by another client leaves.
func foreignRecord(t *testing.T, c *snapfence.Client, ctx context.Context, key string, metadata any) {
	t.Helper()
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "someone-else", TTL: 30 * time.Second, CrashRecovery: true, Metadata: metadata})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Abandon(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
}

// A record that cannot be read as an Owner (none, another shape, or incomplete) is refused: it
// is never handed to reconcile as a zero Owner, and it stays as it was.
func TestAnUnreadableRecordIsRefusedNotReconciled(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	v12 := hasReconciledRoute(t)
	for name, metadata := range map[string]any{
		"no metadata":  nil,
		"another kind": map[string]any{"job": 7},
		"incomplete":   map[string]any{"token": "abc", "pid": 0, "worktree": "/x", "acquiredAt": time.Now()},
	} {
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			dir, key := worktree(t)
			foreignRecord(t, c, ctx, key, metadata)
			before, err := c.GetLease(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			_, err = execution.Acquire(dir, execution.Owner{}, on(c, ctx, key)...)
			conflict := wantConflict(t, err, snapfence.CodeRecoveryRequired)
			if conflict.Owner != nil || conflict.Cause == nil || !errors.Is(err, snapfence.ErrRecoveryRequired) ||
				!strings.Contains(err.Error(), "owner record") || conflict.Recovery() == nil || conflict.Recovery().Token != before.Recovery.Token {
				t.Fatalf("conflict %+v: %v", conflict, err)
			}
			if owner, err := execution.ReadOwnerWith(dir, on(c, ctx, key)...); err == nil || owner != nil {
				t.Fatalf("ReadOwner of an unreadable record: %+v %v", owner, err)
			}
			if !v12 {
				t.Skip("the service answers 404 for POST /v1/leases/{key}/reconciled: it has no contract v1.2, which WithRecovery needs")
			}
			called := false
			_, err = execution.Acquire(dir, execution.Owner{}, on(c, ctx, key, execution.WithRecovery(func(execution.Owner) error {
				called = true
				return nil
			}))...)
			conflict = wantConflict(t, err, snapfence.CodeRecoveryRequired)
			if called || conflict.Owner != nil || conflict.Cause == nil {
				t.Fatalf("reconcile called: %v; conflict %+v", called, conflict)
			}
			after, err := c.GetLease(ctx, key)
			if err != nil || after.State != snapfence.StateRecoveryPending || after.Recovery == nil ||
				after.Recovery.Token != before.Recovery.Token || string(after.Recovery.Metadata) != string(before.Recovery.Metadata) {
				t.Fatalf("the record after the refusal: %+v %v (before %+v)", after, err, before)
			}
		})
	}
}

// The reconcile runs while the worktree is held by a lease of its own, with that lease's
// Context; a reconcile that panics gives the worktree up and leaves the record.
func TestTheReconcileRunsHoldingTheWorktree(t *testing.T) {
	requireV12(t)
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	left, err := execution.Acquire(dir, execution.Owner{Kind: "first"}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := left.Abandon(); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the reconcile's panic was swallowed")
			}
		}()
		_, _ = execution.Acquire(dir, execution.Owner{}, on(c, ctx, key, execution.WithRecovery(func(execution.Owner) error { panic("reconcile") }))...)
	}()
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateRecoveryPending || status.Recovery.Token != left.Token() {
		t.Fatalf("after a panicking reconcile: %+v %v", status, err)
	}

	var during *snapfence.KeyStatus
	var reconcileCtx context.Context
	l, err := execution.Acquire(dir, execution.Owner{Kind: "second"}, on(c, ctx, key, execution.WithOwnerName("reconciler"),
		execution.WithRecoveryContext(func(rctx context.Context, previous execution.Owner) error {
			reconcileCtx = rctx
			if rctx.Err() != nil {
				return rctx.Err()
			}
			var err error
			during, err = c.GetLease(rctx, key)
			return err
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if during == nil || during.State != snapfence.StateHeld || during.Lease.Owner != "reconciler" || during.Lease.Token != l.Token() ||
		during.Recovery == nil || during.Recovery.Token != left.Token() {
		t.Fatalf("during the reconcile: %+v", during)
	}
	if reconcileCtx != l.Context() {
		t.Fatal("the reconcile did not get the lease's context")
	}
	if r := l.Recovered(); r == nil || r.Token != left.Token() || r.Reason != snapfence.ReasonAbandoned {
		t.Fatalf("recovered %+v", r)
	}
	status, err = c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateHeld || status.Recovery != nil || status.Lease.Token != l.Token() {
		t.Fatalf("after the reconcile: %+v %v", status, err)
	}
}

// WithRecovery needs contract v1.2: on a key with no record it is a plain grant; a server without
// v1.2 refuses the reconciling acquire, and the error says what is missing.
func TestWithRecoveryOnAKeyWithNoRecord(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	l, err := execution.Acquire(dir, execution.Owner{}, on(c, ctx, key, execution.WithRecovery(func(execution.Owner) error {
		t.Error("reconcile called without a record")
		return nil
	}))...)
	if !hasReconciledRoute(t) {
		if err == nil || snapfence.CodeOf(err) != snapfence.CodeInvalidRequest || !strings.Contains(err.Error(), "contract v1.2") {
			t.Fatalf("WithRecovery on a server without v1.2: %v", err)
		}
		return
	}
	if err != nil || l.Recovered() != nil || !l.ValidFor(dir) {
		t.Fatalf("%+v %v", l, err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

// A reconcile whose lease ends before the confirmation (here someone releases it meanwhile)
// replaces nothing: Acquire reports the record as still awaiting reconciliation.
func TestAReconcileThatOutlivesItsLeaseLeavesTheRecord(t *testing.T) {
	requireV12(t)
	c := newClient(t)
	ctx := testenv.Context(t)
	dir, key := worktree(t)
	left, err := execution.Acquire(dir, execution.Owner{Kind: "first"}, on(c, ctx, key)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := left.Abandon(); err != nil {
		t.Fatal(err)
	}
	_, err = execution.Acquire(dir, execution.Owner{}, on(c, ctx, key, execution.WithRecoveryContext(func(rctx context.Context, previous execution.Owner) error {
		status, err := c.GetLease(ctx, key)
		if err != nil {
			return err
		}
		return c.Release(ctx, key, status.Lease.Token)
	}))...)
	conflict := wantConflict(t, err, snapfence.CodeRecoveryRequired)
	if !errors.Is(err, coordination.ErrRunLeaseLost) || !errors.Is(err, snapfence.ErrLeaseLost) || conflict.Owner == nil || *conflict.Owner != left.Owner() {
		t.Fatalf("conflict %+v: %v", conflict, err)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateRecoveryPending || status.Recovery == nil || status.Recovery.Token != left.Token() {
		t.Fatalf("the record after a reconcile that outlived its lease: %+v %v", status, err)
	}
}
