package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// Traced is a client of a test's own traced server (StartTraced) and a caller's span in a new
// trace: the trace tests of the packages built on the client check that the server spans of their
// calls are children of that span.
type Traced struct {
	Client *snapfence.Client
	// Spans receives the server's spans.
	Spans *OTLPReceiver
	// Ctx is the test's Context carrying the caller's traceparent (sampled).
	Ctx context.Context
	// TraceID and SpanID are the caller's span, in lowercase hex as the server's spans say them.
	TraceID, SpanID string
}

// StartTracedCaller starts a traced server and makes a client of it and a caller's span.
func StartTracedCaller(t testing.TB) Traced {
	t.Helper()
	srv, spans := StartTraced(t)
	c, err := snapfence.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var ids [24]byte
	if _, err := rand.Read(ids[:]); err != nil {
		t.Fatal(err)
	}
	traceID, spanID := hex.EncodeToString(ids[:16]), hex.EncodeToString(ids[16:])
	ctx := snapfence.ContextWithTraceparent(Context(t), "00-"+traceID+"-"+spanID+"-01", "")
	return Traced{Client: c, Spans: spans, Ctx: ctx, TraceID: traceID, SpanID: spanID}
}
