package coordination_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// Time bounds in these tests are ceilings for a loaded machine, never expectations; what they
// check is the order of events (the keeper fires before the server could expire the lease).

func TestKeeperRenewsPastTheTTLUntilReleased(t *testing.T) {
	c := newClient(t)
	locker := coordination.NewLocker(c)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	k, ok, err := coordination.Hold(ctx, locker, key, "w", time.Second, coordination.KeeperOptions{})
	if err != nil || !ok {
		t.Fatalf("hold: %v %v", ok, err)
	}
	first := k.Lease()
	// Three TTLs later the lease is still held, by renewals, with the same token.
	time.Sleep(3 * time.Second)
	if err := k.Err(); err != nil {
		t.Fatalf("the keeper lost the lease: %v", err)
	}
	if k.Context().Err() != nil {
		t.Fatal("the keeper's context ended while held")
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateHeld || status.Lease.Token != first.Token {
		t.Fatalf("after 3 TTLs: %+v %v", status, err)
	}
	if got := k.Lease(); got.Token != first.Token || !got.ExpiresAt.After(first.ExpiresAt) {
		t.Fatalf("the keeper's lease %+v did not move on from %+v", got, first)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if k.Context().Err() != context.Canceled || coordination.Cause(k.Context()) != context.Canceled || k.Err() != nil {
		t.Fatalf("after release: context %v, cause %v, err %v", k.Context().Err(), coordination.Cause(k.Context()), k.Err())
	}
	status, err = c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateReleased {
		t.Fatalf("after release: %+v %v", status, err)
	}
	if _, ok, err := coordination.Hold(ctx, locker, key, "w2", time.Second, coordination.KeeperOptions{}); !ok || err != nil {
		t.Fatalf("hold after release: %v %v", ok, err)
	}
}

func TestHoldOfAHeldKeyIsFalseAndBadOptionsAreRefusedBeforeAcquiring(t *testing.T) {
	c := newClient(t)
	locker := coordination.NewLocker(c)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	k, ok, err := coordination.Hold(ctx, locker, key, "w", 10*time.Second, coordination.KeeperOptions{})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	defer k.Stop()
	if other, ok, err := coordination.Hold(ctx, locker, key, "w2", 10*time.Second, coordination.KeeperOptions{}); ok || err != nil || other != nil {
		t.Fatalf("hold of a held key: %v %v %v", other, ok, err)
	}
	fresh := testenv.UniqueKey(t, "fresh")
	for _, opts := range []coordination.KeeperOptions{{Margin: 10 * time.Second}, {Margin: 11 * time.Second}, {RenewEvery: 9 * time.Second}} {
		if _, _, err := coordination.Hold(ctx, locker, fresh, "w", 10*time.Second, opts); err == nil {
			t.Fatalf("options %+v accepted", opts)
		}
	}
	if _, err := c.GetLease(ctx, fresh); !errors.Is(err, snapfence.ErrNotFound) {
		t.Fatalf("refused options acquired the key: %v", err)
	}
}

func TestKeepTakesOverTheRenewalOfAnExistingLease(t *testing.T) {
	c := newClient(t)
	locker := coordination.NewLocker(c)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	lease, _, err := locker.Acquire(ctx, key, "w", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k, err := coordination.Keep(ctx, locker, lease, time.Second, coordination.KeeperOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if err := k.Err(); err != nil {
		t.Fatalf("lost: %v", err)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = coordination.Keep(ctx, locker, lease, time.Second, coordination.KeeperOptions{})
	wantLost(t, err)
}

// freezer stops the service the keeper talks to: SIGSTOP of the serve process the tests started
// (or, against SNAPFENCE_URL, a proxy that holds every byte), and resumes it.
type freezer struct {
	url    string
	freeze func() error
	thaw   func() error
}

func newFreezer(t *testing.T) freezer {
	t.Helper()
	s := testenv.Shared
	if s.Owned() {
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { _ = s.Thaw() }) })
		return freezer{url: s.URL, freeze: s.Freeze, thaw: func() error {
			var err error
			once.Do(func() { err = s.Thaw() })
			return err
		}}
	}
	p := testenv.ProxyFor(t, s.URL)
	return freezer{url: p.URL, freeze: func() error { p.Stall(); return nil }, thaw: func() error { p.Unstall(); return nil }}
}

func TestKeeperFiresRunLeaseLostBeforeExpiryWhenTheServiceIsFrozen(t *testing.T) {
	f := newFreezer(t)
	c, err := snapfence.New(f.url)
	if err != nil {
		t.Fatal(err)
	}
	locker := coordination.NewLocker(c)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	k, ok, err := coordination.Hold(ctx, locker, key, "w", 6*time.Second,
		coordination.KeeperOptions{Margin: 3 * time.Second, RenewEvery: 500 * time.Millisecond})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	defer k.Stop()
	// Let a renewal land, then freeze the service.
	granted := k.Lease()
	testenv.Eventually(t, time.Minute, "a renewal", func() bool { return k.Lease().ExpiresAt.After(granted.ExpiresAt) })
	if err := f.freeze(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.Done():
	case <-time.After(time.Minute):
		t.Fatal("the keeper did not fire within a minute of the freeze")
	}
	lostAt := time.Now()
	// The service's expiry of the lease as of the newest renewal the keeper saw answered; a
	// renewal the frozen service applies later can only move it on.
	serverExpiry := k.Lease().ExpiresAt
	if err := f.thaw(); err != nil {
		t.Fatal(err)
	}
	cause := coordination.Cause(k.Context())
	lost := wantLost(t, cause)
	if !strings.Contains(lost.Reason, "about to lapse") || k.Err() != cause {
		t.Fatalf("cause %v, keeper error %v", cause, k.Err())
	}
	if k.Context().Err() != context.Canceled {
		t.Fatalf("the keeper's context ended with %v", k.Context().Err())
	}
	// The service and the tests share this machine's clock.
	if !lostAt.Before(serverExpiry) {
		t.Fatalf("the keeper fired at %v, not before the service's expiry %v", lostAt, serverExpiry)
	}
	if !k.Deadline().Before(serverExpiry.Add(time.Millisecond)) {
		t.Fatalf("the keeper's deadline %v is after the service's expiry %v", k.Deadline(), serverExpiry)
	}
}

func TestKeeperFiresRunLeaseLostWhenTheLeaseIsTakenOver(t *testing.T) {
	c := newClient(t)
	locker := coordination.NewLocker(c)
	snaps := coordination.NewSnapshots(c, "")
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	k, ok, err := coordination.Hold(ctx, locker, key, "w", 3*time.Second, coordination.KeeperOptions{RenewEvery: 300 * time.Millisecond})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	defer k.Stop()
	work, cancel := context.WithCancel(k.Context())
	defer cancel()
	// An operator ends the lease with its token, and another worker takes the key.
	held := k.Lease()
	if err := c.Release(ctx, key, held.Token); err != nil {
		t.Fatal(err)
	}
	usurper, ok, err := locker.Acquire(ctx, key, "usurper", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	select {
	case <-work.Done():
	case <-time.After(time.Minute):
		t.Fatal("the keeper did not notice the takeover within a minute")
	}
	lost := wantLost(t, coordination.Cause(work))
	if !strings.Contains(lost.Reason, "no longer held") || lost.Token != held.Token {
		t.Fatalf("cause %+v", lost)
	}
	if _, err := snaps.Save(ctx, held, []byte("late")); !errors.Is(err, coordination.ErrRunLeaseLost) {
		t.Fatalf("the superseded holder's save: %v", err)
	}
	if err := k.Release(ctx); !errors.Is(err, coordination.ErrRunLeaseLost) {
		t.Fatalf("release of a lost lease: %v", err)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.Lease.Token != usurper.Token || status.State != snapfence.StateHeld {
		t.Fatalf("the usurper's lease was touched: %+v %v", status, err)
	}
}

// A Locker whose renewals hang, answer not-held, or fail, for the keeper's own rules.
type fakeLocker struct {
	renew func(ctx context.Context) (bool, error)
	mu    sync.Mutex
	calls int
}

func (f *fakeLocker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (coordination.Lease, bool, error) {
	return coordination.Lease{Key: key, Owner: owner, Token: 1, ExpiresAt: time.Now().Add(ttl)}, true, nil
}

func (f *fakeLocker) Renew(ctx context.Context, lease coordination.Lease, ttl time.Duration) (coordination.Lease, bool, error) {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	ok, err := f.renew(ctx)
	if !ok {
		return coordination.Lease{}, false, err
	}
	lease.ExpiresAt = time.Now().Add(ttl)
	return lease, true, nil
}

func (f *fakeLocker) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *fakeLocker) Release(ctx context.Context, lease coordination.Lease) error { return nil }

func TestKeeperGivesUpAtTheMarginWhenRenewalsHang(t *testing.T) {
	hang := &fakeLocker{renew: func(ctx context.Context) (bool, error) { <-ctx.Done(); return false, ctx.Err() }}
	sent := time.Now()
	k, _, err := coordination.Hold(context.Background(), hang, "k", "w", 6*time.Second, coordination.KeeperOptions{Margin: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	<-k.Done()
	firedAt := time.Now()
	if firedAt.Sub(sent) < 3*time.Second-50*time.Millisecond {
		t.Fatalf("fired %v after the acquire, before the margin", firedAt.Sub(sent))
	}
	if !firedAt.Before(sent.Add(6 * time.Second)) {
		t.Fatalf("fired %v after the acquire, not before the lease could expire", firedAt.Sub(sent))
	}
	lost := wantLost(t, coordination.Cause(k.Context()))
	if !errors.Is(lost, context.DeadlineExceeded) {
		t.Fatalf("the last renewal's failure is not behind the loss: %v", lost)
	}
}

func TestKeeperGivesUpAtOnceOnARefusalRetryingCannotChange(t *testing.T) {
	refused := &fakeLocker{renew: func(ctx context.Context) (bool, error) {
		return false, snapfence.ErrUnauthorized
	}}
	k, _, err := coordination.Hold(context.Background(), refused, "k", "w", time.Hour, coordination.KeeperOptions{RenewEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	select {
	case <-k.Done():
	case <-time.After(time.Minute):
		t.Fatal("not given up")
	}
	if lost := wantLost(t, k.Err()); !errors.Is(lost, snapfence.ErrUnauthorized) || refused.count() != 1 {
		t.Fatalf("%v after %d renewals", lost, refused.count())
	}
}

func TestKeeperRetriesFailingRenewalsUntilOneSucceeds(t *testing.T) {
	var n int
	var mu sync.Mutex
	flaky := &fakeLocker{renew: func(ctx context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n%3 != 0 {
			return false, snapfence.ErrUnavailable
		}
		return true, nil
	}}
	k, _, err := coordination.Hold(context.Background(), flaky, "k", "w", 2*time.Second, coordination.KeeperOptions{RenewEvery: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if err := k.Err(); err != nil {
		t.Fatalf("lost with renewals that succeed every third try: %v", err)
	}
	k.Stop()
	if coordination.Cause(k.Context()) != context.Canceled {
		t.Fatalf("cause after Stop: %v", coordination.Cause(k.Context()))
	}
}

func TestCauseReachesContextsDerivedFromTheKeepersAndTheParentsEnd(t *testing.T) {
	gone := &fakeLocker{renew: func(ctx context.Context) (bool, error) { return false, nil }}
	k, _, err := coordination.Hold(context.Background(), gone, "k", "w", time.Hour, coordination.KeeperOptions{RenewEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	child, cancel := context.WithTimeout(k.Context(), time.Hour)
	defer cancel()
	if coordination.Cause(child) != nil {
		t.Fatal("a cause before the end")
	}
	<-child.Done()
	if child.Err() != context.Canceled {
		t.Fatalf("child ended with %v", child.Err())
	}
	wantLost(t, coordination.Cause(child))
	if coordination.Cause(context.Background()) != nil {
		t.Fatal("Background has a cause")
	}

	parent, stop := context.WithCancel(context.Background())
	fine := &fakeLocker{renew: func(ctx context.Context) (bool, error) { return true, nil }}
	k2, _, err := coordination.Hold(parent, fine, "k", "w", time.Hour, coordination.KeeperOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	<-k2.Done()
	if cause := coordination.Cause(k2.Context()); cause != context.Canceled || k2.Err() != nil {
		t.Fatalf("after the parent's end: cause %v, err %v", cause, k2.Err())
	}
	// A keeper inside another's context reports the outer loss.
	inner, _, err := coordination.Hold(k.Context(), fine, "k2", "w", time.Hour, coordination.KeeperOptions{})
	if err != nil {
		t.Fatal(err)
	}
	<-inner.Done()
	wantLost(t, coordination.Cause(inner.Context()))
}
