package coordination_test

import (
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/internal/testenv"
)

func TestAKeepersAcquireRenewalsSavesAndReleaseAreChildrenOfTheCallersSpan(t *testing.T) {
	tr := testenv.StartTracedCaller(t)
	c, spans, ctx, traceID, spanID := tr.Client, tr.Spans, tr.Ctx, tr.TraceID, tr.SpanID
	locker := coordination.NewLocker(c)
	key := testenv.UniqueKey(t, "k")
	// The keeper renews in the background with a context derived from Hold's: every third of
	// the TTL.
	k, ok, err := coordination.Hold(ctx, locker, key, "w", time.Second, coordination.KeeperOptions{})
	if err != nil || !ok {
		t.Fatalf("hold: %v %v", ok, err)
	}
	if _, err := coordination.NewSnapshots(c, "text/plain").Save(k.Context(), k.Lease(), []byte("state")); err != nil {
		t.Fatal(err)
	}
	inCallersTrace := func(name string) func(testenv.Span) bool {
		return func(s testenv.Span) bool { return s.TraceID == traceID && s.Name == name }
	}
	renewals := spans.WaitForN(t, 30*time.Second, "of renewals in the caller's trace", 3, inCallersTrace("POST /v1/leases/{key}/renew"))
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	all := append(renewals,
		spans.WaitFor(t, 30*time.Second, "of the acquire", inCallersTrace("POST /v1/leases/{key}")),
		spans.WaitFor(t, 30*time.Second, "of the save", inCallersTrace("PUT /v1/snapshots/{key}")),
		spans.WaitFor(t, 30*time.Second, "of the release", inCallersTrace("DELETE /v1/leases/{key}")))
	for _, s := range all {
		if s.ParentSpanID != spanID || s.Kind != testenv.SpanKindServer {
			t.Fatalf("the server span %v is not a child of the caller's span %s", s, spanID)
		}
	}
}
