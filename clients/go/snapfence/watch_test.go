package snapfence_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

func nextEvent(t *testing.T, w *snapfence.Watch) *snapfence.ChangeEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	return ev
}

func TestWatchDeliversEveryChangeUnderItsPrefixInOrder(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	w, err := c.Watch(ctx, snapfence.WatchOptions{Prefix: key})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	g := acquire(t, c, key, "w", time.Minute)
	if _, err := c.PutSnapshot(ctx, key, g.Lease.Token, []byte("x"), snapfence.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, key, g.Lease.Token); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for _, want := range []string{snapfence.EventLeaseGranted, snapfence.EventSnapshotWritten, snapfence.EventLeaseReleased} {
		ev := nextEvent(t, w)
		if ev.Kind != want || ev.Key != key || ev.Token != g.Lease.Token || ev.ID <= last {
			t.Fatalf("got %s %s %d (id %d after %d), want %s", ev.Kind, ev.Key, ev.Token, ev.ID, last, want)
		}
		last = ev.ID
	}
	if w.LastID() != last {
		t.Fatalf("LastID %d, want %d", w.LastID(), last)
	}
}

func TestWatchResumesAfterTheChangeItWasGiven(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	first, err := c.Watch(ctx, snapfence.WatchOptions{Prefix: key})
	if err != nil {
		t.Fatal(err)
	}
	g := acquire(t, c, key, "w", time.Minute)
	granted := nextEvent(t, first)
	first.Close()
	if err := c.Release(ctx, key, g.Lease.Token); err != nil {
		t.Fatal(err)
	}
	again, err := c.Watch(ctx, snapfence.WatchOptions{Prefix: key, Since: granted.ID})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if ev := nextEvent(t, again); ev.Kind != snapfence.EventLeaseReleased || ev.ID <= granted.ID {
		t.Fatalf("resumed with %s %d", ev.Kind, ev.ID)
	}
}

func TestWatchNextEndsWithItsContextAndGoesOn(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	w, err := c.Watch(ctx, snapfence.WatchOptions{Prefix: key})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := w.Next(short); err != context.DeadlineExceeded {
		t.Fatalf("Next with nothing to say: %v", err)
	}
	acquire(t, c, key, "w", time.Minute)
	if ev := nextEvent(t, w); ev.Kind != snapfence.EventLeaseGranted {
		t.Fatalf("then %s", ev.Kind)
	}
}

func TestTheOperationsEndpointsAnswer(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := c.Metrics(ctx)
	if err != nil || !strings.Contains(m, "# TYPE") {
		t.Fatalf("%.200s %v", m, err)
	}
}

func TestWatchResumesWithoutAGapAfterItsConnectionIsCut(t *testing.T) {
	p := testenv.ProxyFor(t, testenv.Shared.URL)
	behind, err := snapfence.New(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	w, err := behind.Watch(ctx, snapfence.WatchOptions{Prefix: key})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	g := acquire(t, c, key, "w", time.Minute)
	if ev := nextEvent(t, w); ev.Kind != snapfence.EventLeaseGranted {
		t.Fatalf("first %s", ev.Kind)
	}
	if p.CutConnections() == 0 {
		t.Fatal("the watch had no connection to cut")
	}
	// Changes made while the watch has no connection are delivered after it resumes.
	if _, err := c.PutSnapshot(ctx, key, g.Lease.Token, []byte("x"), snapfence.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, key, g.Lease.Token); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{snapfence.EventSnapshotWritten, snapfence.EventLeaseReleased} {
		if ev := nextEvent(t, w); ev.Kind != want {
			t.Fatalf("got %s, want %s", ev.Kind, want)
		}
	}
}
