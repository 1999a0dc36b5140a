package snapfence_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// The service cannot be made to answer 503 on demand, so these tests of the retry rules use a
// stand-in that answers what the contract describes.

type scripted struct {
	mu       sync.Mutex
	answers  []func(w http.ResponseWriter)
	requests []*http.Request
	times    []time.Time
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := len(s.requests)
	s.requests = append(s.requests, r.Clone(context.Background()))
	s.times = append(s.times, time.Now())
	answer := s.answers[len(s.answers)-1]
	if n < len(s.answers) {
		answer = s.answers[n]
	}
	s.mu.Unlock()
	answer(w)
}

func (s *scripted) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

func problem(status int, code, retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/problem+json")
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"type":"urn:snapfence:problem:%s","title":"x","status":%d,"detail":"scripted","code":%q}`, code, status, code)
	}
}

func written(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprint(w, `{"key":"k","version":1,"token":7,"etag":"\"e\"","size":1,"content_type":"application/octet-stream","updated_at":"2026-12-02T13:05:00.123Z"}`)
}

func scriptedClient(t *testing.T, s *scripted, opts ...snapfence.Option) *snapfence.Client {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := snapfence.New(srv.URL, append([]snapfence.Option{snapfence.WithRetry(snapfence.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestUnavailableIsRetriedWithTheSameIdempotencyKeyAfterRetryAfter(t *testing.T) {
	s := &scripted{answers: []func(http.ResponseWriter){problem(503, "unavailable", "1"), written}}
	c := scriptedClient(t, s)
	w, err := c.PutSnapshot(testenv.Context(t), "k", 7, []byte("x"), snapfence.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Version != 1 || s.count() != 2 {
		t.Fatalf("written %+v after %d requests", w, s.count())
	}
	k1, k2 := s.requests[0].Header.Get("Idempotency-Key"), s.requests[1].Header.Get("Idempotency-Key")
	if k1 == "" || k1 != k2 {
		t.Fatalf("Idempotency-Keys %q then %q", k1, k2)
	}
	if gap := s.times[1].Sub(s.times[0]); gap < time.Second {
		t.Fatalf("retried %v after a Retry-After of 1 s", gap)
	}
}

func TestIndeterminateIsRetriedWithTheSameIdempotencyKey(t *testing.T) {
	s := &scripted{answers: []func(http.ResponseWriter){problem(503, "indeterminate", ""), problem(503, "indeterminate", ""), written}}
	c := scriptedClient(t, s)
	if _, err := c.PutSnapshot(testenv.Context(t), "k", 7, []byte("x"), snapfence.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, r := range s.requests {
		keys[r.Header.Get("Idempotency-Key")] = true
	}
	if s.count() != 3 || len(keys) != 1 || keys[""] {
		t.Fatalf("%d requests with keys %v", s.count(), keys)
	}
}

func TestRetriesAreBoundedAndTheLastAnswerIsReturned(t *testing.T) {
	s := &scripted{answers: []func(http.ResponseWriter){problem(503, "unavailable", "")}}
	c := scriptedClient(t, s, snapfence.WithRetry(snapfence.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
	err := c.Release(testenv.Context(t), "k", 7)
	e := wantCode(t, err, snapfence.CodeUnavailable)
	if s.count() != 3 || e.Attempts != 3 || !e.Retryable() || e.IdempotencyKey == "" {
		t.Fatalf("%d requests, error %+v", s.count(), e)
	}
}

func TestARetryAfterBeyondThePolicysCapIsReturnedNotWaitedFor(t *testing.T) {
	s := &scripted{answers: []func(http.ResponseWriter){problem(429, "too_many_requests", "3600"), written}}
	c := scriptedClient(t, s)
	_, err := c.PutSnapshot(testenv.Context(t), "k", 7, []byte("x"), snapfence.PutOptions{})
	e := wantCode(t, err, snapfence.CodeTooManyRequests)
	if s.count() != 1 || e.RetryAfter != time.Hour {
		t.Fatalf("%d requests, Retry-After %v", s.count(), e.RetryAfter)
	}
}

func TestARetryThatWouldOutliveTheContextIsNotWaitedFor(t *testing.T) {
	s := &scripted{answers: []func(http.ResponseWriter){problem(503, "unavailable", "30"), written}}
	c := scriptedClient(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := c.PutSnapshot(ctx, "k", 7, []byte("x"), snapfence.PutOptions{})
	wantCode(t, err, snapfence.CodeUnavailable)
	if s.count() != 1 || ctx.Err() != nil {
		t.Fatalf("%d requests; context %v: the client waited into the context's end", s.count(), ctx.Err())
	}
}

func TestDefiniteAnswersAreNotRetried(t *testing.T) {
	for _, code := range []string{"lease_held", "stale_token", "idempotency_key_reused", "invalid_request"} {
		status := map[string]int{"lease_held": 409, "stale_token": 409, "idempotency_key_reused": 422, "invalid_request": 400}[code]
		s := &scripted{answers: []func(http.ResponseWriter){problem(status, code, "1"), written}}
		c := scriptedClient(t, s)
		_, err := c.PutSnapshot(testenv.Context(t), "k", 7, []byte("x"), snapfence.PutOptions{})
		if e := wantCode(t, err, code); e.Retryable() || s.count() != 1 {
			t.Fatalf("%s: retried (%d requests)", code, s.count())
		}
	}
}

func TestRequestInProgressAndGatewayErrorsAreRetried(t *testing.T) {
	gateway := func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, "<html>bad gateway</html>")
	}
	s := &scripted{answers: []func(http.ResponseWriter){problem(409, "request_in_progress", "1"), gateway, written}}
	c := scriptedClient(t, s)
	if _, err := c.PutSnapshot(testenv.Context(t), "k", 7, []byte("x"), snapfence.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if s.count() != 3 {
		t.Fatalf("%d requests", s.count())
	}
	s = &scripted{answers: []func(http.ResponseWriter){gateway}}
	c = scriptedClient(t, s, snapfence.WithRetry(snapfence.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
	_, err := c.GetLease(testenv.Context(t), "k")
	var e *snapfence.Error
	if !errors.As(err, &e) || e.Code() != "" || e.Status != 502 || s.count() != 2 {
		t.Fatalf("a gateway's 502: %v after %d requests", err, s.count())
	}
}

func TestEveryChangingCallCarriesItsOwnIdempotencyKeyAndReadsNone(t *testing.T) {
	ok := func(status int, body string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) { w.WriteHeader(status); fmt.Fprint(w, body) }
	}
	lease := `{"key":"k","owner":"w","token":7,"acquired_at":"2026-12-02T13:05:00.123Z","expires_at":"2026-12-02T13:05:30.123Z","ttl_ms":30000,"metadata":null,"crash_recovery":false,"recovery_required":false}`
	s := &scripted{answers: []func(http.ResponseWriter){
		ok(201, lease), ok(200, lease), ok(204, ""), ok(204, ""), ok(204, ""), written, ok(204, ""), ok(200, lease),
		ok(200, `{"key":"k","state":"held","lease":`+lease+`,"recovery":null,"newest_token":7}`),
		ok(204, ""),
	}}
	c := scriptedClient(t, s)
	ctx := testenv.Context(t)
	calls := []func() error{
		func() error {
			_, err := c.Acquire(ctx, "k", snapfence.AcquireRequest{Owner: "w", TTL: time.Second})
			return err
		},
		func() error { _, err := c.Renew(ctx, "k", 7, time.Second); return err },
		func() error { return c.Release(ctx, "k", 7) },
		func() error { return c.Abandon(ctx, "k", 7) },
		func() error { return c.RequireRecovery(ctx, "k", 7) },
		func() error { _, err := c.PutSnapshot(ctx, "k", 7, []byte("x"), snapfence.PutOptions{}); return err },
		func() error { return c.DeleteSnapshot(ctx, "k", 7, snapfence.DeleteOptions{}) },
		func() error { _, err := c.Reconciled(ctx, "k", 7); return err },
		func() error { _, err := c.GetLease(ctx, "k"); return err },
	}
	for i, call := range calls {
		if err := call(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	seen := map[string]bool{}
	for i, r := range s.requests[:8] {
		k := r.Header.Get("Idempotency-Key")
		if k == "" || seen[k] {
			t.Fatalf("request %d (%s %s) has Idempotency-Key %q", i, r.Method, r.URL.Path, k)
		}
		seen[k] = true
	}
	if k := s.requests[8].Header.Get("Idempotency-Key"); k != "" {
		t.Fatalf("a read carries Idempotency-Key %q", k)
	}
	fixed := snapfence.WithIdempotencyKey(ctx, "my-key-1")
	if err := c.Release(fixed, "k", 7); err != nil {
		t.Fatal(err)
	}
	if k := s.requests[9].Header.Get("Idempotency-Key"); k != "my-key-1" {
		t.Fatalf("WithIdempotencyKey sent %q", k)
	}
	wantCode(t, c.Release(snapfence.WithIdempotencyKey(ctx, "has space"), "k", 7), snapfence.CodeInvalidRequest)
}

func TestNoConnectionIsUnavailableAndRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := snapfence.New("http://"+addr, snapfence.WithRetry(snapfence.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Release(testenv.Context(t), "k", 7)
	var te *snapfence.TransportError
	if !errors.As(err, &te) || te.Sent || te.Code() != snapfence.CodeUnavailable || te.Attempts != 3 || !errors.Is(err, snapfence.ErrUnavailable) {
		t.Fatalf("no connection: %#v", err)
	}
}

func TestErrorsMatchTheirSentinelsAndCodes(t *testing.T) {
	s := &scripted{answers: []func(http.ResponseWriter){problem(409, "stale_token", "")}}
	c := scriptedClient(t, s)
	_, err := c.PutSnapshot(testenv.Context(t), "k", 7, []byte("x"), snapfence.PutOptions{})
	wrapped := fmt.Errorf("saving: %w", err)
	if !errors.Is(wrapped, snapfence.ErrStaleToken) || errors.Is(wrapped, snapfence.ErrUnknownToken) || snapfence.CodeOf(wrapped) != "stale_token" {
		t.Fatalf("%v does not match its sentinel", wrapped)
	}
	if snapfence.CodeOf(errors.New("plain")) != "" {
		t.Fatal("a plain error has a code")
	}
	if got := err.Error(); got != "snapfence: stale_token (409): scripted" {
		t.Fatalf("Error() = %q", got)
	}
}

func TestNewRefusesBadConfigurations(t *testing.T) {
	for _, u := range []string{"", "ftp://x", "http://", "http://h:1/?q=1", "::"} {
		if _, err := snapfence.New(u); err == nil {
			t.Fatalf("New(%q) accepted", u)
		}
	}
	if _, err := snapfence.New("http://h", snapfence.WithCACertPEM([]byte("not pem"))); err == nil {
		t.Fatal("WithCACertPEM accepted no certificate")
	}
	if _, err := snapfence.New("http://h", snapfence.WithCACertFile("/nonexistent/ca.pem")); err == nil {
		t.Fatal("WithCACertFile accepted a missing file")
	}
	if _, err := snapfence.New("http://h", snapfence.WithTimeout(0)); err == nil {
		t.Fatal("WithTimeout(0) accepted")
	}
	c, err := snapfence.New("http://h:1/prefix/")
	if err != nil || c.URL() != "http://h:1/prefix" {
		t.Fatalf("New kept %q (%v)", c.URL(), err)
	}
}
