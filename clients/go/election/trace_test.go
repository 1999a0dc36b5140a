package election_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/election"
	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

func TestACampaignItsProclaimAndObserveAreChildrenOfTheCallersSpan(t *testing.T) {
	srv, spans := testenv.StartTraced(t)
	c, err := snapfence.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var ids [24]byte
	if _, err := rand.Read(ids[:]); err != nil {
		t.Fatal(err)
	}
	traceID, spanID := hex.EncodeToString(ids[:16]), hex.EncodeToString(ids[16:])
	ctx := snapfence.ContextWithTraceparent(testenv.Context(t), "00-"+traceID+"-"+spanID+"-01", "")
	e := election.New(c, testenv.UniqueKey(t, "election"), election.Options{TTL: 5 * time.Second})
	if err := e.Campaign(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Proclaim(ctx, []byte("plan"), "text/plain"); err != nil {
		t.Fatal(err)
	}
	observing, stop := context.WithCancel(ctx)
	leaders := e.Observe(observing)
	if l := <-leaders; l.Owner != "node-a" {
		t.Fatalf("observed %+v", l)
	}
	stop()
	for range leaders {
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"POST /v1/leases/{key}", "PUT /v1/snapshots/{key}", "GET /v1/watch", "DELETE /v1/leases/{key}"} {
		s := spans.WaitFor(t, 30*time.Second, name+" in the caller's trace", func(s testenv.Span) bool {
			return s.TraceID == traceID && s.Name == name
		})
		if s.ParentSpanID != spanID || s.Kind != testenv.SpanKindServer {
			t.Fatalf("the server span %v is not a child of the caller's span %s", s, spanID)
		}
	}
}
