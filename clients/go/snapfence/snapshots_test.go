package snapfence_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

func etagOf(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + hex.EncodeToString(sum[:]) + `"`
}

func TestPutSnapshotStoresVersionsFencedByTheNewestToken(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", time.Minute)
	first, err := c.PutSnapshot(ctx, key, g.Token, []byte(`{"step":3}`), snapfence.PutOptions{ContentType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Created || first.Version != 1 || first.Token != g.Token || first.Key != key || first.Size != 10 ||
		first.ContentType != "application/json" || first.ETag != etagOf([]byte(`{"step":3}`)) || first.Replayed {
		t.Fatalf("first write %+v", first)
	}
	second, err := c.PutSnapshot(ctx, key, g.Token, nil, snapfence.PutOptions{IfMatch: first.ETag})
	if err != nil {
		t.Fatal(err)
	}
	if second.Created || second.Version != 2 || second.Size != 0 || second.ContentType != "application/octet-stream" {
		t.Fatalf("second write %+v", second)
	}
	_, err = c.PutSnapshot(ctx, key, g.Token, []byte("x"), snapfence.PutOptions{IfMatch: first.ETag})
	if e := wantCode(t, err, snapfence.CodePreconditionFailed); e.Status != 412 {
		t.Fatalf("status %d", e.Status)
	}
	snap, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{})
	if err != nil || snap.Version != 2 {
		t.Fatalf("a refused If-Match write changed the snapshot: %+v %v", snap, err)
	}
}

func TestPutSnapshotWithAStaleOrUnknownTokenIsRefusedAndAudited(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	old := acquire(t, c, key, "worker-7", time.Minute)
	if err := c.Release(ctx, key, old.Token); err != nil {
		t.Fatal(err)
	}
	// A released lease may not write, even with no newer grant.
	_, err := c.PutSnapshot(ctx, key, old.Token, []byte("late"), snapfence.PutOptions{})
	wantCode(t, err, snapfence.CodeStaleToken)
	newer := acquire(t, c, key, "worker-8", time.Minute)
	_, err = c.PutSnapshot(ctx, key, old.Token, []byte("later"), snapfence.PutOptions{})
	e := wantCode(t, err, snapfence.CodeStaleToken)
	if !errors.Is(err, snapfence.ErrStaleToken) || e.PresentedToken != old.Token || e.HighestToken != newer.Token || e.AuditID == 0 {
		t.Fatalf("stale_token refusal %+v", e)
	}
	_, err = c.PutSnapshot(ctx, key, newer.Token+1000, []byte("x"), snapfence.PutOptions{})
	unknown := wantCode(t, err, snapfence.CodeUnknownToken)
	if unknown.PresentedToken != newer.Token+1000 || unknown.HighestToken != newer.Token {
		t.Fatalf("unknown_token refusal %+v", unknown)
	}
	neverLeased := testenv.UniqueKey(t, "never")
	_, err = c.PutSnapshot(ctx, neverLeased, 1, []byte("x"), snapfence.PutOptions{})
	if e := wantCode(t, err, snapfence.CodeUnknownToken); e.HighestToken != 0 {
		t.Fatalf("a key never leased shows highest token %d", e.HighestToken)
	}
	// Fencing comes before If-Match.
	_, err = c.PutSnapshot(ctx, key, old.Token, []byte("x"), snapfence.PutOptions{IfMatch: `"nope"`})
	wantCode(t, err, snapfence.CodeStaleToken)

	page, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range page.Items {
		if r.ID == e.AuditID {
			found = true
			if r.Reason != snapfence.CodeStaleToken || r.PresentedToken != old.Token || r.HighestToken != newer.Token ||
				r.Holder != "worker-8" || r.Operation != "put" || r.Key != key || r.RequestID != e.RequestID || r.RemoteAddr == "" {
				t.Fatalf("audit row %+v for refusal %+v", r, e)
			}
		}
	}
	if !found || len(page.Items) != 4 {
		t.Fatalf("audit id %d not among %d rows: %+v", e.AuditID, len(page.Items), page.Items)
	}
	if _, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{}); !errors.Is(err, snapfence.ErrNotFound) {
		t.Fatalf("a refused write was stored: %v", err)
	}
}

func TestPutSnapshotRefusesZeroTokensLocallyAndTheServerRequiresAToken(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	_, err := c.PutSnapshot(ctx, key, 0, []byte("x"), snapfence.PutOptions{})
	if e := wantCode(t, err, snapfence.CodeInvalidRequest); e.Status != 0 {
		t.Fatalf("status %d, want a local refusal", e.Status)
	}
	// A client whose requests lose their Fencing-Token (a proxy that strips it) sees the
	// service's 428.
	strip := newClient(t, snapfence.WithHTTPClient(&http.Client{Transport: stripHeader{"Fencing-Token", http.DefaultTransport}}))
	_, err = strip.PutSnapshot(ctx, key, 7, []byte("x"), snapfence.PutOptions{})
	if e := wantCode(t, err, snapfence.CodeTokenRequired); e.Status != 428 {
		t.Fatalf("status %d", e.Status)
	}
	wantCode(t, strip.DeleteSnapshot(ctx, key, 7, snapfence.DeleteOptions{}), snapfence.CodeTokenRequired)
	wantCode(t, strip.Release(ctx, key, 7), snapfence.CodeTokenRequired)
	wantCode(t, strip.Abandon(ctx, key, 7), snapfence.CodeTokenRequired)
	wantCode(t, strip.RequireRecovery(ctx, key, 7), snapfence.CodeTokenRequired)
	_, err = c.PutSnapshot(ctx, key, 1, []byte("x"), snapfence.PutOptions{ContentType: "text/plain\u00e9"})
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

type stripHeader struct {
	name string
	next http.RoundTripper
}

func (s stripHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Del(s.name)
	return s.next.RoundTrip(r)
}

func TestPutSnapshotOverTheLimitIsPayloadTooLarge(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", time.Minute)
	_, err := c.PutSnapshot(ctx, key, g.Token, make([]byte, 8<<20+1), snapfence.PutOptions{})
	if e := wantCode(t, err, snapfence.CodePayloadTooLarge); e.Status != 413 {
		t.Fatalf("status %d", e.Status)
	}
	w, err := c.PutSnapshot(ctx, key, g.Token, make([]byte, 8<<20), snapfence.PutOptions{})
	if err != nil || w.Size != 8<<20 || w.Version != 1 {
		t.Fatalf("a write at the limit: %+v %v", w, err)
	}
}

func TestGetAndHeadSnapshotReturnTheBodyAndItsHeaders(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	_, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{})
	wantCode(t, err, snapfence.CodeNotFound)
	_, err = c.HeadSnapshot(ctx, key, snapfence.GetOptions{})
	if e := wantCode(t, err, snapfence.CodeNotFound); e.Status != 404 {
		t.Fatalf("HEAD status %d", e.Status)
	}
	g := acquire(t, c, key, "w", time.Minute)
	body := []byte("the report")
	w, err := c.PutSnapshot(ctx, key, g.Token, body, snapfence.PutOptions{ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snap.Body, body) || snap.ETag != w.ETag || snap.Token != g.Token || snap.Version != 1 ||
		snap.ContentType != "text/plain" || snap.Size != int64(len(body)) || snap.NotModified ||
		snap.LastModified.Unix() != w.UpdatedAt.Unix() {
		t.Fatalf("snapshot %+v after write %+v", snap, w)
	}
	head, err := c.HeadSnapshot(ctx, key, snapfence.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if head.Body != nil || head.Size != int64(len(body)) || head.ETag != w.ETag || head.Version != 1 || head.Token != g.Token {
		t.Fatalf("head %+v", head)
	}
	for _, tag := range []string{w.ETag, "W/" + w.ETag, "*", `"other", ` + w.ETag} {
		nm, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{IfNoneMatch: tag})
		if err != nil {
			t.Fatal(err)
		}
		if !nm.NotModified || nm.Body != nil || nm.ETag != w.ETag || nm.Version != 1 {
			t.Fatalf("If-None-Match %s: %+v", tag, nm)
		}
	}
	other, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{IfNoneMatch: `"other"`})
	if err != nil || other.NotModified || !bytes.Equal(other.Body, body) {
		t.Fatalf("If-None-Match of another tag: %+v %v", other, err)
	}
	_, err = c.GetSnapshot(ctx, key, snapfence.GetOptions{IfNoneMatch: `"unterminated`})
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

func TestVersionsAreListedNewestFirstAndOldOnesArePruned(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	_, err := c.ListVersions(ctx, key, snapfence.PageOptions{})
	wantCode(t, err, snapfence.CodeNotFound)
	g := acquire(t, c, key, "w", time.Minute)
	for i := 1; i <= 12; i++ {
		if _, err := c.PutSnapshot(ctx, key, g.Token, []byte(fmt.Sprintf("v%d", i)), snapfence.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var versions []uint64
	cursor := ""
	for {
		page, err := c.ListVersions(ctx, key, snapfence.PageOptions{Limit: 4, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range page.Items {
			if v.Key != "" || v.Token != g.Token || v.ETag != etagOf([]byte(fmt.Sprintf("v%d", v.Version))) {
				t.Fatalf("version item %+v", v)
			}
			versions = append(versions, v.Version)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if fmt.Sprint(versions) != "[12 11 10 9 8 7 6 5 4 3]" {
		t.Fatalf("retained versions %v (the server keeps 10 by default)", versions)
	}
	v5, err := c.GetSnapshotVersion(ctx, key, 5, snapfence.GetOptions{})
	if err != nil || string(v5.Body) != "v5" || v5.Version != 5 || v5.Token != g.Token {
		t.Fatalf("version 5: %+v %v", v5, err)
	}
	nm, err := c.GetSnapshotVersion(ctx, key, 5, snapfence.GetOptions{IfNoneMatch: v5.ETag})
	if err != nil || !nm.NotModified {
		t.Fatalf("version 5 with If-None-Match: %+v %v", nm, err)
	}
	h, err := c.HeadSnapshotVersion(ctx, key, 5, snapfence.GetOptions{})
	if err != nil || h.Body != nil || h.Size != 2 || h.Version != 5 {
		t.Fatalf("head of version 5: %+v %v", h, err)
	}
	_, err = c.GetSnapshotVersion(ctx, key, 1, snapfence.GetOptions{})
	wantCode(t, err, snapfence.CodeNotFound)
	_, err = c.HeadSnapshotVersion(ctx, key, 1, snapfence.GetOptions{})
	wantCode(t, err, snapfence.CodeNotFound)
	_, err = c.GetSnapshotVersion(ctx, key, 0, snapfence.GetOptions{})
	wantCode(t, err, snapfence.CodeInvalidRequest)
	_, err = c.ListVersions(ctx, key, snapfence.PageOptions{Limit: 0, Cursor: "x"})
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

func TestDeleteSnapshotIsFencedAndKeepsTheVersionCount(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", time.Minute)
	w, err := c.PutSnapshot(ctx, key, g.Token, []byte("one"), snapfence.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.DeleteSnapshot(ctx, key, g.Token, snapfence.DeleteOptions{IfMatch: `"nope"`}), snapfence.CodePreconditionFailed)
	if err := c.DeleteSnapshot(ctx, key, g.Token, snapfence.DeleteOptions{IfMatch: w.ETag}); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSnapshot(ctx, key, snapfence.GetOptions{})
	wantCode(t, err, snapfence.CodeNotFound)
	_, err = c.ListVersions(ctx, key, snapfence.PageOptions{})
	wantCode(t, err, snapfence.CodeNotFound)
	if err := c.DeleteSnapshot(ctx, key, g.Token, snapfence.DeleteOptions{}); err != nil {
		t.Fatalf("deleting a key with no snapshot: %v", err)
	}
	again, err := c.PutSnapshot(ctx, key, g.Token, []byte("two"), snapfence.PutOptions{})
	if err != nil || !again.Created || again.Version != 2 {
		t.Fatalf("the write after a delete: %+v %v", again, err)
	}
	if err := c.Release(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
	acquire(t, c, key, "other", time.Minute)
	err = c.DeleteSnapshot(ctx, key, g.Token, snapfence.DeleteOptions{})
	e := wantCode(t, err, snapfence.CodeStaleToken)
	page, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: key, Reason: snapfence.CodeStaleToken})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != e.AuditID || page.Items[0].Operation != "delete" {
		t.Fatalf("the refused delete's audit row: %+v %v", page, err)
	}
	wantCode(t, c.DeleteSnapshot(ctx, testenv.UniqueKey(t, "never"), 3, snapfence.DeleteOptions{}), snapfence.CodeUnknownToken)
	snap, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{})
	if err != nil || string(snap.Body) != "two" {
		t.Fatalf("a refused delete removed the snapshot: %+v %v", snap, err)
	}
}

func TestAuditRejectionsPageAndFilterByKeyReasonAndTime(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	start := time.Now().Add(-time.Minute)
	g := acquire(t, c, key, "w", time.Minute)
	var ids []int64
	for i := 0; i < 3; i++ {
		_, err := c.PutSnapshot(ctx, key, g.Token+100, []byte("x"), snapfence.PutOptions{})
		ids = append(ids, wantCode(t, err, snapfence.CodeUnknownToken).AuditID)
	}
	if err := c.Release(ctx, key, g.Token); err != nil {
		t.Fatal(err)
	}
	_, err := c.PutSnapshot(ctx, key, g.Token, []byte("x"), snapfence.PutOptions{})
	ids = append(ids, wantCode(t, err, snapfence.CodeStaleToken).AuditID)

	var got []int64
	cursor := ""
	for {
		page, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: key, Limit: 3, Cursor: cursor, Since: start})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Items {
			got = append(got, r.ID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if fmt.Sprint(got) != fmt.Sprint([]int64{ids[3], ids[2], ids[1], ids[0]}) {
		t.Fatalf("rejection ids %v, want %v newest first", got, ids)
	}
	unknown, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: key, Reason: snapfence.CodeUnknownToken})
	if err != nil || len(unknown.Items) != 3 {
		t.Fatalf("reason filter: %+v %v", unknown, err)
	}
	future, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: key, Since: time.Now().Add(time.Hour)})
	if err != nil || len(future.Items) != 0 {
		t.Fatalf("since an hour ahead: %+v %v", future, err)
	}
	past, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: key, Until: start})
	if err != nil || len(past.Items) != 0 {
		t.Fatalf("until before the test: %+v %v", past, err)
	}
	_, err = c.ListRejections(ctx, snapfence.AuditQuery{Reason: "lost"})
	wantCode(t, err, snapfence.CodeInvalidRequest)
	_, err = c.ListRecoveries(ctx, snapfence.AuditQuery{Reason: snapfence.CodeStaleToken})
	wantCode(t, err, snapfence.CodeInvalidRequest)
	_, err = c.ListRejections(ctx, snapfence.AuditQuery{Limit: 1001})
	wantCode(t, err, snapfence.CodeInvalidRequest)
}

func TestAuditRecoveriesPageAndFilterByReason(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	prefix := testenv.UniqueKey(t, "k")
	start := time.Now().Add(-time.Minute)
	reasons := []string{snapfence.ReasonAbandoned, snapfence.ReasonRecoveryRequired, snapfence.ReasonAbandoned}
	for i, reason := range reasons {
		key := fmt.Sprintf("%s/%d", prefix, i)
		g := acquire(t, c, key, "w", time.Minute)
		if reason == snapfence.ReasonAbandoned {
			if err := c.Abandon(ctx, key, g.Token); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := c.RequireRecovery(ctx, key, g.Token); err != nil {
				t.Fatal(err)
			}
			if err := c.Release(ctx, key, g.Token); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "fixer", TTL: time.Minute, Reconciled: true}); err != nil {
			t.Fatal(err)
		}
	}
	var mine []snapfence.RecoveryEntry
	cursor := ""
	for {
		page, err := c.ListRecoveries(ctx, snapfence.AuditQuery{Since: start, Limit: 1, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) > 1 {
			t.Fatalf("a page of limit 1 has %d items", len(page.Items))
		}
		for _, r := range page.Items {
			if strings.HasPrefix(r.Key, prefix+"/") {
				mine = append(mine, r)
			}
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if len(mine) != 3 || mine[0].Key != prefix+"/2" || mine[2].Key != prefix+"/0" || mine[1].Reason != snapfence.ReasonRecoveryRequired {
		t.Fatalf("recoveries %+v", mine)
	}
	abandoned, err := c.ListRecoveries(ctx, snapfence.AuditQuery{Key: prefix + "/1", Reason: snapfence.ReasonAbandoned})
	if err != nil || len(abandoned.Items) != 0 {
		t.Fatalf("reason filter: %+v %v", abandoned, err)
	}
}
