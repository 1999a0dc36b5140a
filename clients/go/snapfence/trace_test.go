package snapfence_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// The tests of trace context run a server of their own that exports its spans over OTLP/JSON to
// a receiver in the test (testenv.StartTraced), and look at both ends: what the client sent (a
// recording transport) and the server spans it made.

// spanWait is the ceiling of the wait for a span: the server exports every 100 ms.
const spanWait = 30 * time.Second

// caller is a caller's span: what its traceparent says.
type caller struct {
	traceparent, traceID, spanID string
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// newCaller is a caller's span in a new trace, sampled.
func newCaller(t *testing.T) caller {
	t.Helper()
	c := caller{traceID: randomHex(t, 16), spanID: randomHex(t, 8)}
	c.traceparent = "00-" + c.traceID + "-" + c.spanID + "-01"
	return c
}

// exchange is one request the recording transport sent and the answer's traceparent.
type exchange struct {
	method, path string
	header       http.Header
	answered     string
}

// recorder is a transport that records every request it sends (its headers as sent).
type recorder struct {
	mu   sync.Mutex
	seen []exchange
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	e := exchange{method: req.Method, path: req.URL.Path, header: req.Header.Clone()}
	if resp != nil {
		e.answered = resp.Header.Get("Traceparent")
	}
	r.mu.Lock()
	r.seen = append(r.seen, e)
	r.mu.Unlock()
	return resp, err
}

// sent are the requests sent so far with method to path.
func (r *recorder) sent(method, path string) []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []exchange
	for _, e := range r.seen {
		if e.method == method && e.path == path {
			out = append(out, e)
		}
	}
	return out
}

// tracedClient is a client of srv whose requests rec records.
func tracedClient(t *testing.T, srv *testenv.Server, opts ...snapfence.Option) (*snapfence.Client, *recorder) {
	t.Helper()
	rec := &recorder{}
	c, err := snapfence.New(srv.URL, append([]snapfence.Option{snapfence.WithHTTPClient(&http.Client{Transport: rec})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

// childSpan waits for the server span named name in the caller's trace and fails unless it is
// a server span whose parent is the caller's span.
func childSpan(t *testing.T, r *testenv.OTLPReceiver, of caller, name string) testenv.Span {
	t.Helper()
	s := r.WaitFor(t, spanWait, fmt.Sprintf("%q in trace %s", name, of.traceID), func(s testenv.Span) bool {
		return s.TraceID == of.traceID && s.Name == name
	})
	if s.ParentSpanID != of.spanID || s.Kind != testenv.SpanKindServer {
		t.Fatalf("the server span %v is not a server span child of the caller's span %s", s, of.spanID)
	}
	return s
}

// answeredSpan is the trace id and span id of an answer's traceparent (the server's span).
func answeredSpan(t *testing.T, e exchange) (traceID, spanID string) {
	t.Helper()
	parts := strings.Split(e.answered, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		t.Fatalf("the answer to %s %s has no traceparent of its span: %q", e.method, e.path, e.answered)
	}
	return parts[1], parts[2]
}

// rootSpan waits for the server span that answered e, and fails unless it is a root span in a
// trace other than notIn.
func rootSpan(t *testing.T, r *testenv.OTLPReceiver, e exchange, notIn string) testenv.Span {
	t.Helper()
	traceID, spanID := answeredSpan(t, e)
	s := r.WaitFor(t, spanWait, fmt.Sprintf("%s (the answer's)", spanID), func(s testenv.Span) bool {
		return s.TraceID == traceID && s.SpanID == spanID
	})
	if s.ParentSpanID != "" || s.TraceID == notIn {
		t.Fatalf("the server span of %s %s is not a root span of its own trace: %v (caller's trace %s)", e.method, e.path, s, notIn)
	}
	return s
}

func TestACallersTraceparentMakesTheServerSpansOfItsRequestsChildrenOfItsSpan(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	c, rec := tracedClient(t, srv)
	key := testenv.UniqueKey(t, "k")
	me := newCaller(t)
	ctx := snapfence.ContextWithTraceparent(testenv.Context(t), me.traceparent, "vendor=opaque")

	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutSnapshot(ctx, key, g.Token, []byte("state"), snapfence.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{}); err != nil {
		t.Fatal(err)
	}

	// Every request sent it, with its tracestate ...
	path := "/v1/snapshots/" + key
	for _, e := range append(rec.sent(http.MethodPost, "/v1/leases/"+key), append(rec.sent(http.MethodPut, path), rec.sent(http.MethodGet, path)...)...) {
		if got := e.header.Values("Traceparent"); len(got) != 1 || got[0] != me.traceparent {
			t.Fatalf("%s %s sent traceparent %q, want %q", e.method, e.path, got, me.traceparent)
		}
		if got := e.header.Values("Tracestate"); len(got) != 1 || got[0] != "vendor=opaque" {
			t.Fatalf("%s %s sent tracestate %q", e.method, e.path, got)
		}
	}
	if len(rec.seen) != 3 {
		t.Fatalf("%d requests sent, want 3", len(rec.seen))
	}
	// ... and the server made each request's span a child of the caller's.
	childSpan(t, spans, me, "POST /v1/leases/{key}")
	childSpan(t, spans, me, "PUT /v1/snapshots/{key}")
	childSpan(t, spans, me, "GET /v1/snapshots/{key}")
}

func TestACallWithoutATraceparentIsARootSpanOfAnotherTrace(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	c, rec := tracedClient(t, srv)
	key := testenv.UniqueKey(t, "k")
	me := newCaller(t)
	traced := snapfence.ContextWithTraceparent(testenv.Context(t), me.traceparent, "")
	plain := testenv.Context(t)

	// A traced call first, on the same client: nothing of it may stick to the next one.
	g, err := c.Acquire(traced, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutSnapshot(plain, key, g.Token, []byte("state"), snapfence.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	puts := rec.sent(http.MethodPut, "/v1/snapshots/"+key)
	if len(puts) != 1 {
		t.Fatalf("%d puts sent", len(puts))
	}
	childSpan(t, spans, me, "POST /v1/leases/{key}")
	if s := rootSpan(t, spans, puts[0], me.traceID); s.Name != "PUT /v1/snapshots/{key}" || s.Kind != testenv.SpanKindServer {
		t.Fatalf("the put's span is %v", s)
	}
	if got, ok := puts[0].header["Traceparent"]; ok {
		t.Fatalf("a call without a traceparent sent one: %q", got)
	}
	if got, ok := puts[0].header["Tracestate"]; ok {
		t.Fatalf("a call without a traceparent sent a tracestate: %q", got)
	}
}

func TestEveryAttemptOfARetriedCallCarriesTheCallersTraceparent(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	p := testenv.ProxyFor(t, srv.URL)
	c, err := snapfence.New(p.URL, snapfence.WithRetry(snapfence.RetryPolicy{BaseDelay: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	key := testenv.UniqueKey(t, "k")
	me := newCaller(t)
	ctx := snapfence.ContextWithTraceparent(testenv.Context(t), me.traceparent, "")
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p.CutAnswers(2) // the server handles the first two attempts; their answers are lost
	if _, err := c.PutSnapshot(ctx, key, g.Token, []byte("state"), snapfence.PutOptions{}); err != nil {
		t.Fatalf("the retried put: %v", err)
	}
	if p.Cut() != 2 {
		t.Fatalf("%d answers cut, want 2", p.Cut())
	}
	attempts := spans.WaitForN(t, spanWait, "of the put's attempts in the caller's trace", 3, func(s testenv.Span) bool {
		return s.TraceID == me.traceID && s.Name == "PUT /v1/snapshots/{key}"
	})
	ids := map[string]bool{}
	for _, s := range attempts {
		if s.ParentSpanID != me.spanID {
			t.Fatalf("an attempt's span %v is not a child of the caller's span %s", s, me.spanID)
		}
		ids[s.SpanID] = true
	}
	if len(ids) != len(attempts) {
		t.Fatalf("the attempts' spans are not distinct: %v", attempts)
	}
}

func TestConcurrentWaitingCallsEachCarryTheirOwnCallersTraceparent(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	c, _ := tracedClient(t, srv)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	holder := acquireOn(t, c, ctx, key, "holder")

	// Every caller waits in the key's queue at once, then writes and releases in its turn, all
	// on one client.
	const n = 6
	callers := make([]caller, n)
	errs := make(chan error, n)
	for i := range callers {
		callers[i] = newCaller(t)
		go func(i int) {
			cctx := snapfence.ContextWithTraceparent(ctx, callers[i].traceparent, "")
			g, err := c.Acquire(cctx, key, snapfence.AcquireRequest{Owner: fmt.Sprint("w", i), TTL: time.Minute, Wait: time.Minute})
			if err == nil {
				_, err = c.PutSnapshot(cctx, key, g.Token, []byte(fmt.Sprint(i)), snapfence.PutOptions{})
			}
			if err == nil {
				err = c.Release(cctx, key, g.Token)
			}
			errs <- err
		}(i)
	}
	testenv.Eventually(t, spanWait, "every caller waiting", func() bool {
		page, err := c.ListLeaseWaiters(ctx, key, snapfence.PageOptions{})
		return err == nil && len(page.Items) == n
	})
	if err := c.Release(ctx, key, holder); err != nil {
		t.Fatal(err)
	}
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, me := range callers {
		for _, name := range []string{"POST /v1/leases/{key}", "PUT /v1/snapshots/{key}", "DELETE /v1/leases/{key}"} {
			childSpan(t, spans, me, name)
		}
	}
}

// acquireOn takes key on c and returns the token.
func acquireOn(t *testing.T, c *snapfence.Client, ctx context.Context, key, owner string) uint64 {
	t.Helper()
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: owner, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return g.Token
}

func TestAWatchSendsTheTraceparentOfItsContextOnEveryConnection(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	c, rec := tracedClient(t, srv)
	me := newCaller(t)
	ctx := snapfence.ContextWithTraceparent(testenv.Context(t), me.traceparent, "")
	key := testenv.UniqueKey(t, "k")
	// A watch silent for longer than its IdleTimeout resumes on a new connection.
	w, err := c.Watch(ctx, snapfence.WatchOptions{Prefix: key, IdleTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	next, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, _ = w.Next(next) // nothing happens under the prefix: it reconnects a few times
	cancel()
	w.Close()
	conns := rec.sent(http.MethodGet, "/v1/watch")
	if len(conns) < 2 {
		t.Fatalf("the watch connected %d times, want a resumed connection", len(conns))
	}
	for i, e := range conns {
		if got := e.header.Get("Traceparent"); got != me.traceparent {
			t.Fatalf("connection %d sent traceparent %q, want %q", i+1, got, me.traceparent)
		}
	}
	// A watch's span ends with its stream; the closed ones are exported.
	watches := spans.WaitForN(t, spanWait, "of the watch's connections in the caller's trace", 2, func(s testenv.Span) bool {
		return s.TraceID == me.traceID && s.Name == "GET /v1/watch"
	})
	for _, s := range watches {
		if s.ParentSpanID != me.spanID {
			t.Fatalf("a connection's span %v is not a child of the caller's span %s", s, me.spanID)
		}
	}
}

func TestAMalformedTraceparentIsNotSentAndTheCallGoesOn(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	c, rec := tracedClient(t, srv)
	me := newCaller(t)
	id, span := me.traceID, me.spanID
	malformed := map[string]string{
		"uppercase hex":          "00-" + strings.ToUpper(id) + "-" + span + "-01",
		"a trace id of zeros":    "00-" + strings.Repeat("0", 32) + "-" + span + "-01",
		"a span id of zeros":     "00-" + id + "-" + strings.Repeat("0", 16) + "-01",
		"version ff":             "ff-" + id + "-" + span + "-01",
		"version 00 with more":   "00-" + id + "-" + span + "-01-more",
		"a short trace id":       "00-" + id[:30] + "-" + span + "-01",
		"underscores":            "00_" + id + "_" + span + "_01",
		"not hex":                "00-" + id[:31] + "g-" + span + "-01",
		"a line break":           "00-" + id + "-" + span + "-01\r\nX-Injected: 1",
		"a later version, glued": "01-" + id + "-" + span + "-01x",
	}
	for what, tp := range malformed {
		key := testenv.UniqueKey(t, "k")
		ctx := snapfence.ContextWithTraceparent(testenv.Context(t), tp, "vendor=opaque")
		if _, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute}); err != nil {
			t.Fatalf("%s: the call failed: %v", what, err)
		}
		sent := rec.sent(http.MethodPost, "/v1/leases/"+key)
		if len(sent) != 1 {
			t.Fatalf("%s: %d requests sent", what, len(sent))
		}
		rootSpan(t, spans, sent[0], id)
		for _, name := range []string{"Traceparent", "Tracestate", "X-Injected"} {
			if got, ok := sent[0].header[name]; ok {
				t.Fatalf("%s (%q): %s %q was sent", what, tp, name, got)
			}
		}
	}

	// Valid, and sent as given: a later version that goes on after a dash (W3C's forward
	// compatibility), without its tracestate when that is not printable ASCII.
	later := "01-" + id + "-" + span + "-01-more"
	key := testenv.UniqueKey(t, "k")
	ctx := snapfence.ContextWithTraceparent(testenv.Context(t), later, "vendor=caf\u00e9")
	if _, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	sent := rec.sent(http.MethodPost, "/v1/leases/"+key)
	if got := sent[0].header.Values("Traceparent"); len(got) != 1 || got[0] != later {
		t.Fatalf("a later version's traceparent: sent %q", got)
	}
	if got, ok := sent[0].header["Tracestate"]; ok {
		t.Fatalf("a tracestate that is not ASCII was sent: %q", got)
	}
}

// A stand-in for a tracing library: its span in a context, its propagator's inject.
type libSpanKey struct{}

func libInject(ctx context.Context, h http.Header) {
	if tp, ok := ctx.Value(libSpanKey{}).(string); ok {
		h.Set("traceparent", tp)
		h.Set("tracestate", "lib=1")
		h.Set("baggage", "tenant=acme")
	}
	// What the client's own headers must win over, and what is not valid HTTP.
	h.Set("Idempotency-Key", "from-the-hook")
	h.Set("Content-Type", "text/plain")
	h.Set("X-Broken", "a\nb")
	h["Bad Name"] = []string{"x"}
}

func TestWithTraceContextSendsWhatTheHookInjectsButNotOverTheClientsOwnHeaders(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	c, rec := tracedClient(t, srv, snapfence.WithTraceContext(libInject))
	key := testenv.UniqueKey(t, "k")
	me := newCaller(t)
	ctx := context.WithValue(testenv.Context(t), libSpanKey{}, me.traceparent)
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	acq := rec.sent(http.MethodPost, "/v1/leases/"+key)
	if len(acq) != 1 || acq[0].header.Get("Idempotency-Key") == "from-the-hook" || acq[0].header.Get("Content-Type") != "application/json" {
		t.Fatalf("the hook replaced the client's own headers: %v", acq)
	}
	if _, err := c.PutSnapshot(ctx, key, g.Token, []byte("state"), snapfence.PutOptions{ContentType: "application/json"}); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, snapfence.WatchOptions{Prefix: key})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	for _, e := range append(append(acq, rec.sent(http.MethodPut, "/v1/snapshots/"+key)...), rec.sent(http.MethodGet, "/v1/watch")...) {
		if e.header.Get("Traceparent") != me.traceparent || e.header.Get("Tracestate") != "lib=1" || e.header.Get("Baggage") != "tenant=acme" {
			t.Fatalf("%s %s did not send what the hook injected: %v", e.method, e.path, e.header)
		}
		if _, ok := e.header["X-Broken"]; ok {
			t.Fatalf("%s %s sent the hook's X-Broken, whose value is not valid HTTP: %q", e.method, e.path, e.header["X-Broken"])
		}
	}
	childSpan(t, spans, me, "POST /v1/leases/{key}")
	childSpan(t, spans, me, "PUT /v1/snapshots/{key}")

	// Without a span in ctx the hook injects no traceparent, and none is sent.
	plain := testenv.Context(t)
	other := testenv.UniqueKey(t, "k")
	if _, err := c.Acquire(plain, other, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	sent := rec.sent(http.MethodPost, "/v1/leases/"+other)
	if _, ok := sent[0].header["Traceparent"]; ok {
		t.Fatalf("a traceparent was sent without one in the context: %v", sent[0].header)
	}
	rootSpan(t, spans, sent[0], me.traceID)
}

func TestContextWithTraceparentTakesPrecedenceOverTheHooks(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	c, rec := tracedClient(t, srv, snapfence.WithTraceContext(libInject))
	lib, me := newCaller(t), newCaller(t)
	key := testenv.UniqueKey(t, "k")
	ctx := snapfence.ContextWithTraceparent(context.WithValue(testenv.Context(t), libSpanKey{}, lib.traceparent), me.traceparent, "")
	if _, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	sent := rec.sent(http.MethodPost, "/v1/leases/"+key)
	if got := sent[0].header.Values("Traceparent"); len(got) != 1 || got[0] != me.traceparent {
		t.Fatalf("sent traceparent %q, want the context's %q", got, me.traceparent)
	}
	if got, ok := sent[0].header["Tracestate"]; ok {
		t.Fatalf("the hook's tracestate went with another traceparent: %q", got)
	}
	if sent[0].header.Get("Baggage") != "tenant=acme" {
		t.Fatalf("the hook's other headers were dropped: %v", sent[0].header)
	}
	childSpan(t, spans, me, "POST /v1/leases/{key}")

	// A malformed one leaves the hook's.
	key = testenv.UniqueKey(t, "k")
	ctx = snapfence.ContextWithTraceparent(context.WithValue(testenv.Context(t), libSpanKey{}, lib.traceparent), "garbage", "")
	if _, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	sent = rec.sent(http.MethodPost, "/v1/leases/"+key)
	if got := sent[0].header.Get("Traceparent"); got != lib.traceparent {
		t.Fatalf("with a malformed traceparent in the context, sent %q, want the hook's %q", got, lib.traceparent)
	}
	childSpan(t, spans, lib, "POST /v1/leases/{key}")
}

func TestWithTraceContextNeedsAFunction(t *testing.T) {
	if _, err := snapfence.New("http://127.0.0.1:1", snapfence.WithTraceContext(nil)); err == nil {
		t.Fatal("WithTraceContext(nil) was accepted")
	}
}
