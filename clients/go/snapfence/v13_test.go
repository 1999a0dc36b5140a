package snapfence_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// needV13 skips a test against a server before contract v1.3: one that does not name the fence
// of a write made under a namespace's lease.
func needV13(t *testing.T, c *snapfence.Client) {
	t.Helper()
	ctx := testenv.Context(t)
	k := testenv.UniqueKey(t, "probe")
	g := acquire(t, c, k, "probe", time.Minute)
	defer c.Release(ctx, k, g.Lease.Token)
	w, err := c.PutSnapshot(ctx, k+"/child", g.Lease.Token, []byte("x"), snapfence.PutOptions{FencingKey: k})
	if err != nil || w.FencingKey != k {
		t.Skipf("the server has no namespace fences (contract v1.3) yet: %v", err)
	}
}

func TestALeaseFencesTheKeysOfItsNamespace(t *testing.T) {
	c := newClient(t)
	needV13(t, c)
	ctx := testenv.Context(t)
	ns := testenv.UniqueKey(t, "ns")
	g := acquire(t, c, ns, "w", time.Minute)
	w, err := c.PutSnapshot(ctx, ns+"/a", g.Lease.Token, []byte("a"), snapfence.PutOptions{FencingKey: ns, Metadata: map[string]any{"step": 1, "name": "é"}})
	if err != nil || w.FencingKey != ns {
		t.Fatalf("%+v %v", w, err)
	}
	s, err := c.GetSnapshot(ctx, ns+"/a", snapfence.GetOptions{})
	if err != nil || s.FencingKey != ns {
		t.Fatalf("%+v %v", s, err)
	}
	var m struct {
		Step int
		Name string
	}
	if err := s.Metadata.Decode(&m); err != nil || m.Step != 1 || m.Name != "é" {
		t.Fatalf("metadata %s: %+v %v", s.Metadata, m, err)
	}
	_, err = c.PutSnapshot(ctx, testenv.UniqueKey(t, "elsewhere"), g.Lease.Token, []byte("x"), snapfence.PutOptions{FencingKey: ns})
	wantCode(t, err, snapfence.CodeInvalidRequest)
	if err := c.Release(ctx, ns, g.Lease.Token); err != nil {
		t.Fatal(err)
	}
	newer := acquire(t, c, ns, "w2", time.Minute)
	_, err = c.PutSnapshot(ctx, ns+"/a", g.Lease.Token, []byte("late"), snapfence.PutOptions{FencingKey: ns})
	if e := wantCode(t, err, snapfence.CodeStaleToken); e.FencingKey != ns {
		t.Fatalf("refusal without its fence: %+v", e)
	}
	if err := c.DeleteSnapshot(ctx, ns+"/a", newer.Lease.Token, snapfence.DeleteOptions{FencingKey: ns}); err != nil {
		t.Fatal(err)
	}
}

func TestATransactionCommitsAllOrNothing(t *testing.T) {
	c := newClient(t)
	needV13(t, c)
	ctx := testenv.Context(t)
	ns := testenv.UniqueKey(t, "ns")
	g := acquire(t, c, ns, "w", time.Minute)
	fence := snapfence.Fence{Key: ns, Token: g.Lease.Token}
	put := func(key, body string, opts snapfence.TxnPutOptions) snapfence.TxnOp {
		op, err := snapfence.TxnPut(key, []byte(body), opts)
		if err != nil {
			t.Fatal(err)
		}
		return op
	}
	first, err := c.Txn(ctx, fence, []snapfence.TxnOp{
		put(ns+"/a", "a", snapfence.TxnPutOptions{Metadata: map[string]int{"n": 1}}),
		put(ns+"/w/1", "1", snapfence.TxnPutOptions{}),
		put(ns+"/w/2", "2", snapfence.TxnPutOptions{ContentType: "text/plain"}),
	})
	if err != nil || first.FencingKey != ns || len(first.Results) != 3 || !first.Results[0].Created || first.Results[0].Version != 1 {
		t.Fatalf("%+v %v", first, err)
	}
	_, err = c.Txn(ctx, fence, []snapfence.TxnOp{
		put(ns+"/c", "c", snapfence.TxnPutOptions{}),
		put(ns+"/a", "a2", snapfence.TxnPutOptions{CreateOnly: true}),
	})
	if e := wantCode(t, err, snapfence.CodePreconditionFailed); e.OpIndex != 1 {
		t.Fatalf("op_index %d", e.OpIndex)
	}
	if _, err := c.GetSnapshot(ctx, ns+"/c", snapfence.GetOptions{}); !errors.Is(err, snapfence.ErrNotFound) {
		t.Fatalf("a failed transaction wrote: %v", err)
	}
	done, err := c.Txn(ctx, fence, []snapfence.TxnOp{snapfence.TxnDelete(ns + "/a"), snapfence.TxnDelete(ns + "/none"), snapfence.TxnDeletePrefix(ns + "/w/")})
	if err != nil {
		t.Fatal(err)
	}
	var counts []int64
	for _, r := range done.Results {
		counts = append(counts, r.DeletedCount())
	}
	if fmt.Sprint(counts) != "[1 0 2]" {
		t.Fatalf("deleted %v", counts)
	}
	if err := c.Release(ctx, ns, g.Lease.Token); err != nil {
		t.Fatal(err)
	}
	_, err = c.Txn(ctx, fence, []snapfence.TxnOp{put(ns+"/late", "late", snapfence.TxnPutOptions{})})
	if e := wantCode(t, err, snapfence.CodeStaleToken); e.FencingKey != ns {
		t.Fatalf("refusal without its fence: %+v", e)
	}
}

func TestTheListingGoesInEitherOrderFromAKeyWithMetadata(t *testing.T) {
	c := newClient(t)
	needV13(t, c)
	ctx := testenv.Context(t)
	ns := testenv.UniqueKey(t, "ns")
	g := acquire(t, c, ns, "w", time.Minute)
	for _, name := range []string{"a", "b", "c"} {
		if _, err := c.PutJSON(ctx, ns+"/"+name, g.Lease.Token, map[string]string{"name": name}, snapfence.PutOptions{FencingKey: ns, Metadata: map[string]string{"name": name}}); err != nil {
			t.Fatal(err)
		}
	}
	asc, err := c.ListSnapshots(ctx, snapfence.ListSnapshotsOptions{Prefix: ns + "/", StartAfter: ns + "/a"})
	if err != nil || len(asc.Items) != 2 || asc.Items[0].Key != ns+"/b" || asc.Items[1].Key != ns+"/c" || asc.Items[0].Metadata != nil {
		t.Fatalf("%+v %v", asc, err)
	}
	desc, err := c.ListSnapshots(ctx, snapfence.ListSnapshotsOptions{Prefix: ns + "/", Descending: true, IncludeMetadata: true})
	if err != nil || len(desc.Items) != 3 {
		t.Fatalf("%+v %v", desc, err)
	}
	for i, name := range []string{"c", "b", "a"} {
		var m map[string]string
		if desc.Items[i].Key != ns+"/"+name || desc.Items[i].Metadata.Decode(&m) != nil || m["name"] != name {
			t.Fatalf("item %d: %+v", i, desc.Items[i])
		}
	}
}
