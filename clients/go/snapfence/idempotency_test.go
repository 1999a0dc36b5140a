package snapfence_test

import (
	"bytes"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// proxied is a client of the shared server through a new proxy.
func proxied(t *testing.T) (*snapfence.Client, *testenv.Proxy) {
	t.Helper()
	p := testenv.ProxyFor(t, testenv.Shared.URL)
	c, err := snapfence.New(p.URL, snapfence.WithRetry(snapfence.RetryPolicy{BaseDelay: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func TestALostAnswerIsRetriedWithTheSameIdempotencyKey(t *testing.T) {
	c := newClient(t)
	pc, p := proxied(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", time.Minute)
	p.CutAnswers(1)
	w, err := pc.PutSnapshot(ctx, key, g.Token, []byte("once"), snapfence.PutOptions{})
	if err != nil {
		t.Fatalf("the retry after a lost answer failed: %v", err)
	}
	keys := p.IdempotencyKeys()
	if p.Cut() != 1 || len(keys) < 2 || keys[0] == "" {
		t.Fatalf("cut %d answers; keys %v", p.Cut(), keys)
	}
	for _, k := range keys {
		if k != keys[0] {
			t.Fatalf("the retry changed the Idempotency-Key: %v", keys)
		}
	}
	if w.Token != g.Token {
		t.Fatalf("written %+v", w)
	}
	// Every attempt but the last lost its answer after the service had handled it; until the
	// service implements Idempotency-Key (issue 13), each of them stored a version.
}

func TestANoAnswerBeyondTheRetriesIsIndeterminateWithItsIdempotencyKey(t *testing.T) {
	c := newClient(t)
	pc, p := proxied(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", time.Minute)
	p.CutAnswers(100)
	err := pc.Release(ctx, key, g.Token)
	var te *snapfence.TransportError
	if !asTransport(err, &te) || !te.Sent || te.Code() != snapfence.CodeIndeterminate || te.Attempts != snapfence.DefaultRetryPolicy.MaxAttempts || te.IdempotencyKey == "" {
		t.Fatalf("no answer at all: %#v", err)
	}
	if !strings.Contains(te.Error(), te.IdempotencyKey) {
		t.Fatalf("the error does not name the Idempotency-Key to repeat: %v", te)
	}
}

func asTransport(err error, te **snapfence.TransportError) bool {
	e, ok := err.(*snapfence.TransportError)
	if ok {
		*te = e
	}
	return ok
}

// serverReplays reports whether the service answers a repeated request with the same
// Idempotency-Key from its store (Idempotent-Replayed: true), sending one PUT twice.
func serverReplays(t *testing.T, c *snapfence.Client) bool {
	t.Helper()
	key := testenv.UniqueKey(t, "probe")
	g := acquire(t, c, key, "probe", time.Minute)
	idem := snapfence.NewIdempotencyKey()
	var replayed []string
	for i := 0; i < 2; i++ {
		req, err := http.NewRequest(http.MethodPut, testenv.Shared.URL+"/v1/snapshots/"+url.PathEscape(key), bytes.NewReader([]byte("probe")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Fencing-Token", strconv.FormatUint(g.Token, 10))
		req.Header.Set("Idempotency-Key", idem)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("probe PUT answered %d", resp.StatusCode)
		}
		replayed = append(replayed, resp.Header.Get("Idempotent-Replayed"))
	}
	return replayed[0] != "true" && replayed[1] == "true"
}

func TestAWriteWhoseAnswerIsLostIsStoredOnce(t *testing.T) {
	c := newClient(t)
	if !serverReplays(t, c) {
		t.Fatal("the server did not replay a PUT sent twice with one Idempotency-Key (Idempotent-Replayed: true on the second answer only)")
	}
	pc, p := proxied(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	g := acquire(t, c, key, "w", time.Minute)
	p.CutAnswers(1)
	w, err := pc.PutSnapshot(ctx, key, g.Token, []byte("exactly once"), snapfence.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Cut() != 1 || !w.Replayed || w.Version != 1 || !w.Created {
		t.Fatalf("after a lost answer: cut %d, written %+v", p.Cut(), w)
	}
	versions, err := c.ListVersions(ctx, key, snapfence.PageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(versions.Items) != 1 || versions.Items[0].Version != 1 {
		t.Fatalf("stored %d versions: %+v", len(versions.Items), versions.Items)
	}
	// The grant too: an acquire whose answer is lost is granted once, and its retry learns the
	// token instead of meeting its own lease as lease_held.
	other := testenv.UniqueKey(t, "acquire")
	p.CutAnswers(1)
	grant, err := pc.Acquire(ctx, other, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	status, err := c.GetLease(ctx, other)
	if err != nil || status.NewestToken != grant.Token || !grant.Replayed {
		t.Fatalf("acquire after a lost answer: %+v, status %+v %v", grant, status, err)
	}
}
