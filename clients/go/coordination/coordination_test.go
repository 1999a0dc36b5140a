package coordination_test

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

func TestMain(m *testing.M) {
	// The test binary is also the child process of the tests that pause a holder.
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(testenv.Main(m))
}

func newClient(t *testing.T, opts ...snapfence.Option) *snapfence.Client {
	t.Helper()
	c, err := snapfence.New(testenv.Shared.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func wantCode(t *testing.T, err error, code string) *snapfence.Error {
	t.Helper()
	var e *snapfence.Error
	if !errors.As(err, &e) || e.Code() != code {
		t.Fatalf("want a *snapfence.Error with code %s, got %T: %v", code, err, err)
	}
	return e
}

func wantLost(t *testing.T, err error) *coordination.LostError {
	t.Helper()
	var lost *coordination.LostError
	if !errors.Is(err, coordination.ErrRunLeaseLost) || !errors.As(err, &lost) {
		t.Fatalf("want a *LostError matching ErrRunLeaseLost, got %T: %v", err, err)
	}
	return lost
}

func TestValidateRefusesAZeroTokenAndHandBuiltLeases(t *testing.T) {
	valid := coordination.Lease{Key: "k", Owner: "w", Token: 1, ExpiresAt: time.Now()}
	if err := valid.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]coordination.Lease{
		"zero token":   {Key: "k", Owner: "w"},
		"huge token":   {Key: "k", Owner: "w", Token: 1 << 63},
		"empty key":    {Owner: "w", Token: 1},
		"empty owner":  {Key: "k", Token: 1},
		"the zero one": {},
	} {
		// The seed's callers compare with ==: the error is ErrInvalidLease itself.
		if err := l.Validate(); err != coordination.ErrInvalidLease {
			t.Fatalf("%s: Validate() = %v, want ErrInvalidLease itself", name, err)
		}
	}
	// Nothing is sent for an invalid lease.
	c, err := snapfence.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	locker := coordination.NewLocker(c)
	ctx := testenv.Context(t)
	handBuilt := coordination.Lease{Key: "k", Owner: "w"}
	if _, ok, err := locker.Renew(ctx, handBuilt, time.Second); ok || !errors.Is(err, coordination.ErrInvalidLease) {
		t.Fatalf("Renew of a hand-built lease: %v %v", ok, err)
	}
	if err := locker.Release(ctx, handBuilt); !errors.Is(err, coordination.ErrInvalidLease) {
		t.Fatalf("Release of a hand-built lease: %v", err)
	}
	if _, err := coordination.NewSnapshots(c, "").Save(ctx, handBuilt, []byte("x")); !errors.Is(err, coordination.ErrInvalidLease) {
		t.Fatalf("Save with a hand-built lease: %v", err)
	}
	if _, err := coordination.Keep(ctx, locker, handBuilt, time.Second, coordination.KeeperOptions{}); !errors.Is(err, coordination.ErrInvalidLease) {
		t.Fatalf("Keep of a hand-built lease: %v", err)
	}
}

func TestLockerAcquireRenewRelease(t *testing.T) {
	c := newClient(t)
	locker := coordination.NewLocker(c)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	lease, ok, err := locker.Acquire(ctx, key, "worker-1", time.Minute)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if lease.Key != key || lease.Owner != "worker-1" || lease.Validate() != nil || time.Until(lease.ExpiresAt) < 30*time.Second {
		t.Fatalf("lease %+v", lease)
	}
	if _, ok, err := locker.Acquire(ctx, key, "worker-2", time.Minute); ok || err != nil {
		t.Fatalf("a held key: %v %v, want false and no error", ok, err)
	}
	renewed, ok, err := locker.Renew(ctx, lease, 2*time.Minute)
	if err != nil || !ok || renewed.Token != lease.Token || !renewed.ExpiresAt.After(lease.ExpiresAt) {
		t.Fatalf("renew: %+v %v %v", renewed, ok, err)
	}
	if _, _, err := locker.Renew(ctx, lease, 0); err == nil {
		t.Fatal("a renewal without a TTL was accepted")
	}
	if err := locker.Release(ctx, renewed); err != nil {
		t.Fatal(err)
	}
	if l, ok, err := locker.Renew(ctx, renewed, time.Minute); ok || err != nil || l != (coordination.Lease{}) {
		t.Fatalf("renew after release: %+v %v %v, want false and no error", l, ok, err)
	}
	lost := wantLost(t, locker.Release(ctx, renewed))
	wantCode(t, lost, snapfence.CodeLeaseLost)
	next, ok, err := locker.Acquire(ctx, key, "worker-2", time.Minute)
	if err != nil || !ok || next.Token <= lease.Token {
		t.Fatalf("the next grant: %+v %v %v", next, ok, err)
	}

	// A key blocked by a recovery record is not "held by another": it is an error.
	blocked := testenv.UniqueKey(t, "blocked")
	g, err := c.Acquire(ctx, blocked, snapfence.AcquireRequest{Owner: "x", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Abandon(ctx, blocked, g.Token); err != nil {
		t.Fatal(err)
	}
	_, ok, err = locker.Acquire(ctx, blocked, "worker-3", time.Minute)
	if ok {
		t.Fatal("granted a key with a recovery record")
	}
	wantCode(t, err, snapfence.CodeRecoveryRequired)
	_, _, err = locker.Acquire(ctx, "", "w", time.Minute)
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

func TestSnapshotsSaveAndLoadFencedByTheLease(t *testing.T) {
	c := newClient(t)
	locker := coordination.NewLocker(c)
	snaps := coordination.NewSnapshots(c, "application/json")
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	if _, ok, err := snaps.Load(ctx, key); ok || err != nil {
		t.Fatalf("load of a key never saved: %v %v", ok, err)
	}
	lease, _, err := locker.Acquire(ctx, key, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := snaps.Save(ctx, lease, []byte(`{"step":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if saved.Version != 1 || saved.Token != lease.Token || saved.ETag == "" || saved.SavedAt.IsZero() {
		t.Fatalf("saved %+v", saved)
	}
	loaded, ok, err := snaps.Load(ctx, key)
	if err != nil || !ok || string(loaded.Data) != `{"step":1}` || loaded.Token != lease.Token || loaded.Version != 1 || loaded.ETag != saved.ETag {
		t.Fatalf("loaded %+v %v %v", loaded, ok, err)
	}
	if err := locker.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	// A released lease can no longer save.
	_, err = snaps.Save(ctx, lease, []byte(`{"step":2}`))
	wantCode(t, wantLost(t, err), snapfence.CodeStaleToken)
	// A lease of another key is a token never issued for this one.
	other, _, err := locker.Acquire(ctx, testenv.UniqueKey(t, "other"), "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	other.Key = key
	_, err = snaps.Save(ctx, other, []byte(`{"step":3}`))
	wantCode(t, wantLost(t, err), snapfence.CodeUnknownToken)
	loaded, _, err = snaps.Load(ctx, key)
	if err != nil || loaded.Version != 1 {
		t.Fatalf("refused saves were stored: %+v %v", loaded, err)
	}
}

// Two goroutines race for one key through the Locker. The winner then pauses past its TTL
// without renewing (a GC pause, a stalled VM); the other, still trying, is granted the key with
// a greater token and saves. When the paused one wakes and saves with its old lease, the service
// refuses it with stale_token and audits it: the superseded holder loses, however late it
// wakes.
func TestTwoGoroutinesRaceForAKeyAndTheSupersededOnesSaveIsRefusedAndAudited(t *testing.T) {
	c := newClient(t)
	locker := coordination.NewLocker(c)
	snaps := coordination.NewSnapshots(c, "")
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	start := make(chan struct{})
	type result struct {
		name  string
		lease coordination.Lease
		ok    bool
		err   error
	}
	results := make(chan result, 2)
	var ready sync.WaitGroup
	for _, name := range []string{"racer-a", "racer-b"} {
		ready.Add(1)
		go func(name string) {
			ready.Done()
			<-start
			lease, ok, err := locker.Acquire(ctx, key, name, 500*time.Millisecond)
			results <- result{name, lease, ok, err}
		}(name)
	}
	ready.Wait()
	close(start)
	first, second := <-results, <-results
	if first.err != nil || second.err != nil || first.ok == second.ok {
		t.Fatalf("the race: %+v and %+v, want exactly one grant", first, second)
	}
	winner, loser := first, second
	if !winner.ok {
		winner, loser = second, first
	}

	// The loser keeps trying; the winner does not renew, so its lease expires.
	var taken coordination.Lease
	testenv.Eventually(t, time.Minute, loser.name+" is granted the key", func() bool {
		l, ok, err := locker.Acquire(ctx, key, loser.name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		taken = l
		return ok
	})
	if taken.Token <= winner.lease.Token {
		t.Fatalf("the takeover's token %d is not above %d", taken.Token, winner.lease.Token)
	}
	if _, err := snaps.Save(ctx, taken, []byte(loser.name+" was here")); err != nil {
		t.Fatal(err)
	}

	// The winner wakes up and saves with its superseded lease.
	_, err := snaps.Save(ctx, winner.lease, []byte(winner.name+" was here"))
	lost := wantLost(t, err)
	refusal := wantCode(t, lost, snapfence.CodeStaleToken)
	if refusal.PresentedToken != winner.lease.Token || refusal.HighestToken != taken.Token || refusal.AuditID == 0 {
		t.Fatalf("refusal %+v", refusal)
	}
	page, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: key, Reason: snapfence.CodeStaleToken})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 {
		t.Fatalf("rejections %+v", page.Items)
	}
	row := page.Items[0]
	if row.ID != refusal.AuditID || row.PresentedToken != winner.lease.Token || row.HighestToken != taken.Token || row.Holder != loser.name || row.Operation != "put" {
		t.Fatalf("audit row %+v", row)
	}
	loaded, _, err := snaps.Load(ctx, key)
	if err != nil || string(loaded.Data) != loser.name+" was here" {
		t.Fatalf("stored %+v %v", loaded, err)
	}
	// Its renewal says so too.
	if _, ok, err := locker.Renew(ctx, winner.lease, time.Minute); ok || err != nil {
		t.Fatalf("renewal of the superseded lease: %v %v", ok, err)
	}
}
