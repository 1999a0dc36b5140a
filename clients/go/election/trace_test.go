package election_test

import (
	"context"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/election"
	"github.com/snapfence/snapfence/clients/go/internal/testenv"
)

func TestACampaignItsProclaimAndObserveAreChildrenOfTheCallersSpan(t *testing.T) {
	tr := testenv.StartTracedCaller(t)
	c, spans, ctx, traceID, spanID := tr.Client, tr.Spans, tr.Ctx, tr.TraceID, tr.SpanID
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
