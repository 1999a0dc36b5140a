package snapfence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

func TestAcquireGrantsALeaseWithANewTokenEachTime(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{
		Owner:    "worker-7",
		TTL:      30 * time.Second,
		Metadata: map[string]any{"pid": 4242, "target": "build"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if g.Key != key || g.Owner != "worker-7" || g.Token == 0 || g.TTL() != 30*time.Second || g.CrashRecovery || g.Recovered != nil {
		t.Fatalf("unexpected grant %+v", g)
	}
	if !g.ExpiresAt.After(g.AcquiredAt) {
		t.Fatalf("expires_at %v is not after acquired_at %v", g.ExpiresAt, g.AcquiredAt)
	}
	var meta struct {
		PID    int    `json:"pid"`
		Target string `json:"target"`
	}
	if err := g.Metadata.Decode(&meta); err != nil || meta.PID != 4242 || meta.Target != "build" {
		t.Fatalf("metadata %s decoded to %+v (%v)", g.Metadata, meta, err)
	}
	if err := c.Release(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
	again := acquire(t, c, key, "worker-7", time.Second)
	if again.Token <= g.Token {
		t.Fatalf("the same owner's new grant has token %d, not above %d", again.Token, g.Token)
	}
	if again.Metadata != nil {
		t.Fatalf("a grant without metadata shows %s", again.Metadata)
	}
	if err := again.Metadata.Decode(&meta); !errors.Is(err, snapfence.ErrNoMetadata) {
		t.Fatalf("Decode of no metadata: %v", err)
	}
}

func TestAcquireOfAHeldKeyIsLeaseHeldWithTheHolderButNotItsToken(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "first", TTL: 30 * time.Second, Metadata: map[string]int{"pid": 1}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "second", TTL: time.Second})
	e := wantCode(t, err, snapfence.CodeLeaseHeld)
	if !errors.Is(err, snapfence.ErrLeaseHeld) || e.Status != 409 {
		t.Fatalf("errors.Is(ErrLeaseHeld) false or status %d", e.Status)
	}
	if e.Holder == nil || e.Holder.Owner != "first" || !e.Holder.ExpiresAt.Equal(g.ExpiresAt) || string(e.Holder.Metadata) != `{"pid":1}` {
		t.Fatalf("holder %+v", e.Holder)
	}
	if e.State != snapfence.StateHeld || e.Waiters != 0 {
		t.Fatalf("state %q, waiters %d", e.State, e.Waiters)
	}
	if strings.Contains(string(e.Body), `"token"`) {
		t.Fatalf("the refusal shows the holder's token: %s", e.Body)
	}
	if e.RequestID == "" || e.Detail == "" || e.IdempotencyKey == "" || e.Attempts != 1 {
		t.Fatalf("request id %q, detail %q, idempotency key %q, attempts %d", e.RequestID, e.Detail, e.IdempotencyKey, e.Attempts)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if status.Lease.Token != g.Token || status.Lease.Owner != "first" || !status.Lease.ExpiresAt.Equal(g.ExpiresAt) {
		t.Fatalf("the refused acquire changed the holder's lease: %+v", status.Lease)
	}
}

func TestAcquireRefusesInvalidRequests(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	cases := map[string]snapfence.AcquireRequest{
		"ttl below the minimum":  {Owner: "w", TTL: 10 * time.Millisecond},
		"ttl above the maximum":  {Owner: "w", TTL: 25 * time.Hour},
		"metadata not an object": {Owner: "w", TTL: time.Second, Metadata: []int{1, 2}},
		"owner too long":         {Owner: strings.Repeat("o", 257), TTL: time.Second},
		"owner with a control":   {Owner: "a\x01b", TTL: time.Second},
	}
	for name, req := range cases {
		_, err := c.Acquire(ctx, key, req)
		if e := wantCode(t, err, snapfence.CodeInvalidRequest); e.Status != 400 {
			t.Fatalf("%s: status %d", name, e.Status)
		}
	}
	// Refused by the client before anything is sent (Status 0).
	local := map[string]func() error{
		"empty key": func() error {
			_, err := c.Acquire(ctx, "", snapfence.AcquireRequest{Owner: "w", TTL: time.Second})
			return err
		},
		"empty owner": func() error { _, err := c.Acquire(ctx, key, snapfence.AcquireRequest{TTL: time.Second}); return err },
		"no ttl":      func() error { _, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w"}); return err },
		"bad metadata": func() error {
			_, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Second, Metadata: func() {}})
			return err
		},
	}
	for name, call := range local {
		if e := wantCode(t, call(), snapfence.CodeInvalidRequest); e.Status != 0 {
			t.Fatalf("%s: status %d, want a local refusal", name, e.Status)
		}
	}
	if _, err := c.GetLease(ctx, key); !errors.Is(err, snapfence.ErrNotFound) {
		t.Fatalf("refused acquires left a lease: %v", err)
	}
}

func TestRenewExtendsTheLiveLeaseAndKeepsItsToken(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", 2*time.Second)
	renewed, err := c.Renew(ctx, key, g.Token, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Token != g.Token || renewed.TTL() != time.Minute || !renewed.ExpiresAt.After(g.ExpiresAt) {
		t.Fatalf("renewed %+v from %+v", renewed, g.Lease)
	}
	kept, err := c.Renew(ctx, key, g.Token, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kept.TTL() != time.Minute {
		t.Fatalf("a renewal without a TTL changed it to %v", kept.TTL())
	}
}

func TestRenewOfALeaseThatIsNotLiveIsLeaseLost(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", 30*time.Second)
	_, err := c.Renew(ctx, key, g.Token+1000, time.Second)
	wantCode(t, err, snapfence.CodeLeaseLost)
	if err := c.Release(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
	_, err = c.Renew(ctx, key, g.Token, time.Second)
	if !errors.Is(wantCode(t, err, snapfence.CodeLeaseLost), snapfence.ErrLeaseLost) {
		t.Fatal("errors.Is(ErrLeaseLost) is false")
	}

	expiring := testenv.UniqueKey(t, "expiring")
	short := acquire(t, c, expiring, "w", 200*time.Millisecond)
	testenv.Eventually(t, 30*time.Second, "the lease expires", func() bool {
		s, err := c.GetLease(ctx, expiring)
		return err == nil && s.State == snapfence.StateExpired
	})
	_, err = c.Renew(ctx, expiring, short.Token, time.Second)
	wantCode(t, err, snapfence.CodeLeaseLost)
	_, err = c.Renew(ctx, testenv.UniqueKey(t, "never"), 5, time.Second)
	wantCode(t, err, snapfence.CodeLeaseLost)
	_, err = c.Renew(ctx, key, g.Token, 10*time.Millisecond)
	wantCode(t, err, snapfence.CodeInvalidRequest)
	_, err = c.Renew(ctx, key, 0, time.Second)
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

func TestReleaseFreesTheKeyAndRefusesATokenThatIsNotLive(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", 30*time.Second)
	if err := c.Release(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
	s, err := c.GetLease(ctx, key)
	if err != nil || s.State != snapfence.StateReleased || s.Recovery != nil {
		t.Fatalf("after release: %+v %v", s, err)
	}
	newer := acquire(t, c, key, "newer", 30*time.Second)
	err = c.Release(ctx, key, g.Token)
	wantCode(t, err, snapfence.CodeLeaseLost)
	s, err = c.GetLease(ctx, key)
	if err != nil || s.State != snapfence.StateHeld || s.Lease.Token != newer.Token {
		t.Fatalf("a refused release touched the newer holder: %+v %v", s, err)
	}
	wantCode(t, c.Release(ctx, key, 0), snapfence.CodeInvalidRequest)
}

func TestAbandonUnlocksAndKeepsARecoveryRecord(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: 30 * time.Second, Metadata: map[string]string{"step": "3"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Abandon(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
	s, err := c.GetLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != snapfence.StateRecoveryPending || s.Recovery == nil || s.Recovery.Reason != snapfence.ReasonAbandoned ||
		s.Recovery.Token != g.Token || s.Recovery.Owner != "w" || string(s.Recovery.Metadata) != `{"step":"3"}` {
		t.Fatalf("after abandon: %+v, recovery %+v", s, s.Recovery)
	}
	_, err = c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "next", TTL: time.Second})
	e := wantCode(t, err, snapfence.CodeRecoveryRequired)
	if e.Recovery == nil || e.Recovery.Token != g.Token || e.Recovery.Reason != snapfence.ReasonAbandoned {
		t.Fatalf("recovery_required carries %+v", e.Recovery)
	}
	wantCode(t, c.Abandon(ctx, key, g.Token), snapfence.CodeLeaseLost)
}

func TestRequireRecoveryKeepsTheLeaseLiveAndItsReleaseLeavesARecord(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", 30*time.Second)
	if err := c.RequireRecovery(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
	s, err := c.GetLease(ctx, key)
	if err != nil || s.State != snapfence.StateHeld || !s.Lease.RecoveryRequired || s.Recovery != nil {
		t.Fatalf("after require-recovery: %+v %v", s, err)
	}
	if _, err := c.Renew(ctx, key, g.Token, time.Minute); err != nil {
		t.Fatalf("a marked lease cannot renew: %v", err)
	}
	if err := c.Release(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
	s, err = c.GetLease(ctx, key)
	if err != nil || s.State != snapfence.StateRecoveryPending || s.Recovery == nil || s.Recovery.Reason != snapfence.ReasonRecoveryRequired {
		t.Fatalf("after release of a marked lease: %+v %v", s, err)
	}
	wantCode(t, c.RequireRecovery(ctx, key, g.Token), snapfence.CodeLeaseLost)
}

func TestACrashRecoveryLeaseThatExpiresLeavesARecordThatOnlyAReconciledAcquireReplaces(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	before := time.Now().Add(-time.Minute)
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "deployer-1", TTL: 200 * time.Millisecond, CrashRecovery: true})
	if err != nil {
		t.Fatal(err)
	}
	if !g.CrashRecovery {
		t.Fatal("crash_recovery not shown on the grant")
	}
	testenv.Eventually(t, 30*time.Second, "the record appears", func() bool {
		s, err := c.GetLease(ctx, key)
		return err == nil && s.State == snapfence.StateRecoveryPending
	})
	_, err = c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "deployer-2", TTL: time.Second})
	e := wantCode(t, err, snapfence.CodeRecoveryRequired)
	if e.Recovery.Reason != snapfence.ReasonExpired || e.Recovery.Owner != "deployer-1" || e.Recovery.Token != g.Token {
		t.Fatalf("record %+v", e.Recovery)
	}
	granted, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "deployer-2", TTL: 30 * time.Second, Reconciled: true})
	if err != nil {
		t.Fatal(err)
	}
	if granted.Recovered == nil || granted.Recovered.Token != g.Token || granted.Recovered.Reason != snapfence.ReasonExpired {
		t.Fatalf("recovered %+v", granted.Recovered)
	}
	page, err := c.ListRecoveries(ctx, snapfence.AuditQuery{Key: key, Since: before})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 {
		t.Fatalf("recoveries: %+v", page.Items)
	}
	r := page.Items[0]
	if r.Key != key || r.Reason != snapfence.ReasonExpired || r.Operation != "reconcile" || r.HighestToken != granted.Token ||
		r.Holder != "deployer-2" || r.ReconciledBy != "deployer-2" || r.Recovery.Token != g.Token || r.RequestID == "" {
		t.Fatalf("recovery entry %+v", r)
	}
	// A reconciled acquire of a key with no record is a plain grant.
	plain, err := c.Acquire(ctx, testenv.UniqueKey(t, "plain"), snapfence.AcquireRequest{Owner: "w", TTL: time.Second, Reconciled: true})
	if err != nil || plain.Recovered != nil {
		t.Fatalf("reconciled acquire of a fresh key: %+v %v", plain, err)
	}
}

func TestGetLeaseShowsTheStateAndIsNotFoundForAKeyNeverLeased(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	_, err := c.GetLease(ctx, key)
	if e := wantCode(t, err, snapfence.CodeNotFound); e.Status != 404 {
		t.Fatalf("status %d", e.Status)
	}
	g := acquire(t, c, key, "w", 30*time.Second)
	s, err := c.GetLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if s.Key != key || s.State != snapfence.StateHeld || s.NewestToken != g.Token || s.Lease.Owner != "w" || s.Recovery != nil {
		t.Fatalf("status %+v", s)
	}
	_, err = c.GetLease(ctx, "")
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

func TestKeysArePercentEncodedAsOnePathSegment(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	base := testenv.UniqueKey(t, "k")
	for _, key := range []string{base + "/with/slashes", base + " 100% sure?#&=+", base + "/ünïcødé ✓", base + "/..", base + "%2F"} {
		g := acquire(t, c, key, "w", 30*time.Second)
		if g.Key != key {
			t.Fatalf("granted %q for %q", g.Key, key)
		}
		s, err := c.GetLease(ctx, key)
		if err != nil || s.Key != key {
			t.Fatalf("get %q: %+v %v", key, s, err)
		}
		w, err := c.PutSnapshot(ctx, key, g.Token, []byte(key), snapfence.PutOptions{})
		if err != nil || w.Key != key {
			t.Fatalf("put %q: %+v %v", key, w, err)
		}
		snap, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{})
		if err != nil || string(snap.Body) != key {
			t.Fatalf("get snapshot %q: %+v %v", key, snap, err)
		}
		if err := c.Release(ctx, key, g.Token); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Acquire(ctx, base+"\x7f", snapfence.AcquireRequest{Owner: "w", TTL: time.Second})
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

func TestListLeasesPagesByPrefixAndFiltersByState(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	prefix := testenv.UniqueKey(t, "list") + "/"
	var tokens []uint64
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		tokens = append(tokens, acquire(t, c, prefix+name, "w", time.Minute).Token)
	}
	if err := c.Release(ctx, prefix+"b", tokens[1]); err != nil {
		t.Fatal(err)
	}
	if err := c.Abandon(ctx, prefix+"d", tokens[3]); err != nil {
		t.Fatal(err)
	}
	var keys []string
	cursor := ""
	pages := 0
	for {
		page, err := c.ListLeases(ctx, snapfence.ListLeasesOptions{Prefix: prefix, Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page.Items) > 2 {
			t.Fatalf("a page of limit 2 has %d items", len(page.Items))
		}
		for _, item := range page.Items {
			keys = append(keys, strings.TrimPrefix(item.Key, prefix))
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if strings.Join(keys, ",") != "a,b,c,d,e" || pages < 3 {
		t.Fatalf("keys %v in %d pages", keys, pages)
	}
	states := map[string]string{snapfence.StateHeld: "a,c,e", snapfence.StateReleased: "b", snapfence.StateRecoveryPending: "d", snapfence.StateExpired: ""}
	for state, want := range states {
		page, err := c.ListLeases(ctx, snapfence.ListLeasesOptions{Prefix: prefix, State: state})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, item := range page.Items {
			if item.State != state {
				t.Fatalf("state filter %s returned %s", state, item.State)
			}
			got = append(got, strings.TrimPrefix(item.Key, prefix))
		}
		if strings.Join(got, ",") != want {
			t.Fatalf("state %s: %v, want %s", state, got, want)
		}
	}
	_, err := c.ListLeases(ctx, snapfence.ListLeasesOptions{Limit: 1001})
	wantCode(t, err, snapfence.CodeInvalidRequest)
	_, err = c.ListLeases(ctx, snapfence.ListLeasesOptions{State: "asleep"})
	wantCode(t, err, snapfence.CodeInvalidRequest)
	_, err = c.ListLeases(ctx, snapfence.ListLeasesOptions{Cursor: "!"})
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

func TestHealthAndReadiness(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
}

// Contract v1.2: a reconciling acquire holds the key and keeps the record until Reconciled.
func TestAReconcilingAcquireHoldsTheKeyAndKeepsTheRecordUntilReconciled(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	if _, err := c.Acquire(ctx, "k", snapfence.AcquireRequest{Owner: "o", TTL: time.Second, Reconciled: true, Reconciling: true}); snapfence.CodeOf(err) != snapfence.CodeInvalidRequest {
		t.Fatalf("reconciled with reconciling: %v", err)
	}
	key := testenv.UniqueKey(t, "k")
	left, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "crashed", TTL: 30 * time.Second, CrashRecovery: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reconciled(ctx, key, left.Token); err != nil {
		var apiErr *snapfence.Error
		if errors.As(err, &apiErr) && apiErr.Status == 404 {
			t.Skip("the service answers 404 for POST /v1/leases/{key}/reconciled: it has no contract v1.2")
		}
		// A lease with no record to confirm: whatever the service says, it is not 404.
	}
	if err := c.Abandon(ctx, key, left.Token); err != nil {
		t.Fatal(err)
	}
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "reconciler", TTL: 30 * time.Second, CrashRecovery: true, Reconciling: true})
	if err != nil {
		t.Fatal(err)
	}
	if g.Recovery == nil || g.Recovery.Token != left.Token || g.Recovery.Reason != snapfence.ReasonAbandoned || g.Recovered != nil || g.Token <= left.Token {
		t.Fatalf("reconciling grant %+v (recovery %+v)", g, g.Recovery)
	}
	_, err = c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "other", TTL: time.Second, Reconciled: true})
	var held *snapfence.Error
	if !errors.As(err, &held) || held.Code() != snapfence.CodeLeaseHeld || held.Holder == nil || held.Holder.Owner != "reconciler" {
		t.Fatalf("another acquire during the reconcile: %v", err)
	}
	status, err := c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateHeld || status.Recovery == nil || status.Recovery.Token != left.Token {
		t.Fatalf("during the reconcile: %+v %v", status, err)
	}
	if _, err := c.Reconciled(ctx, key, left.Token); !errors.Is(err, snapfence.ErrLeaseLost) {
		t.Fatalf("Reconciled with a token that is not live: %v", err)
	}
	l, err := c.Reconciled(ctx, key, g.Token)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token != g.Token || l.Owner != "reconciler" {
		t.Fatalf("reconciled lease %+v", l)
	}
	status, err = c.GetLease(ctx, key)
	if err != nil || status.State != snapfence.StateHeld || status.Recovery != nil {
		t.Fatalf("after Reconciled: %+v %v", status, err)
	}
	if err := c.Release(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
}

func TestAWaitingAcquireLongerThanTheClientsTimeoutIsSentOnceAndGranted(t *testing.T) {
	holderClient := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	held, err := holderClient.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "holder", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// One attempt of at most a second, for a wait of five: the wait must lengthen the attempt.
	c := newClient(t, snapfence.WithTimeout(time.Second), snapfence.WithRetry(snapfence.RetryPolicy{MaxAttempts: 1}))
	go func() {
		time.Sleep(2 * time.Second)
		_ = holderClient.Release(ctx, key, held.Token)
	}()
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "waiter", TTL: time.Minute, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("the waiting acquire failed: %v", err)
	}
	if g.Owner != "waiter" || g.Token <= held.Token {
		t.Fatalf("unexpected grant %+v after token %d", g, held.Token)
	}
	if err := c.Release(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
}
