package snapfence_test

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// writeSnapshots leases each key (released at the end of the test) and writes a body to it
// writes times, and returns what each last write stored.
func writeSnapshots(t *testing.T, c *snapfence.Client, keys []string, writes int) map[string]*snapfence.Written {
	t.Helper()
	ctx := testenv.Context(t)
	written := map[string]*snapfence.Written{}
	for _, key := range keys {
		key := key
		g := acquire(t, c, key, "writer", time.Minute)
		t.Cleanup(func() { _ = c.Release(ctx, key, g.Token) })
		for i := 0; i < writes; i++ {
			w, err := c.PutSnapshot(ctx, key, g.Token, []byte("body of "+key+strings.Repeat("!", i)), snapfence.PutOptions{ContentType: "text/x-test"})
			if err != nil {
				t.Fatalf("put %s: %v", key, err)
			}
			written[key] = w
		}
	}
	return written
}

// listAll walks every page of ListSnapshots under prefix, limit items at a time, and returns the
// items and the number of pages.
func listAll(t *testing.T, c *snapfence.Client, prefix string, limit int) ([]snapfence.SnapshotMeta, int) {
	t.Helper()
	ctx := testenv.Context(t)
	var items []snapfence.SnapshotMeta
	cursor := ""
	pages := 0
	for {
		page, err := c.ListSnapshots(ctx, snapfence.ListSnapshotsOptions{Prefix: prefix, Limit: limit, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if limit > 0 && len(page.Items) > limit {
			t.Fatalf("a page of limit %d has %d items", limit, len(page.Items))
		}
		items = append(items, page.Items...)
		if page.NextCursor == "" {
			return items, pages
		}
		cursor = page.NextCursor
	}
}

func keysOf(items []snapfence.SnapshotMeta) []string {
	var keys []string
	for _, item := range items {
		keys = append(keys, item.Key)
	}
	return keys
}

func TestListSnapshotsByPrefixListsOnlyTheKeysUnderItInByteOrderWithTheirMetadata(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	base := testenv.UniqueKey(t, "snaps")
	prefix := base + "/in/"
	var under []string
	for _, name := range []string{"b", "é", "B", "a/deep", "~"} {
		under = append(under, prefix+name)
	}
	outside := []string{base + "/in", base + "/in-x", base + "/out/a"}
	written := writeSnapshots(t, c, append(append([]string{}, under...), outside...), 2)
	page, err := c.ListSnapshots(ctx, snapfence.ListSnapshotsOptions{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(under) // byte order: B, a/deep, b, ~, é
	if got := keysOf(page.Items); strings.Join(got, "|") != strings.Join(under, "|") || page.NextCursor != "" {
		t.Fatalf("the keys under %s: %q (next cursor %q), want %q", prefix, got, page.NextCursor, under)
	}
	for _, item := range page.Items {
		w := written[item.Key].SnapshotMeta
		if item.Version != 2 || item.Version != w.Version || item.Token != w.Token || item.ETag != w.ETag ||
			item.Size != w.Size || item.ContentType != "text/x-test" || !item.UpdatedAt.Equal(w.UpdatedAt) {
			t.Fatalf("the listed metadata of %s: %+v, its last write stored %+v", item.Key, item, w)
		}
	}
}

func TestListSnapshotsLeavesOutKeysWithoutACurrentSnapshot(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	prefix := testenv.UniqueKey(t, "snaps") + "/"
	written := writeSnapshots(t, c, []string{prefix + "deleted", prefix + "kept"}, 1)
	status, err := c.GetLease(ctx, prefix+"deleted")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, prefix+"deleted", status.NewestToken, snapfence.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	acquire(t, c, prefix+"leased-only", "holder", time.Minute)
	page, err := c.ListSnapshots(ctx, snapfence.ListSnapshotsOptions{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 || page.Items[0].Key != prefix+"kept" || page.Items[0].ETag != written[prefix+"kept"].ETag {
		t.Fatalf("the keys with a current snapshot: %+v", page.Items)
	}
}

func TestListSnapshotsWithASmallLimitWalksEveryPage(t *testing.T) {
	c := newClient(t)
	prefix := testenv.UniqueKey(t, "snaps") + "/"
	var keys []string
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		keys = append(keys, prefix+name)
	}
	writeSnapshots(t, c, keys, 1)
	items, pages := listAll(t, c, prefix, 2)
	if got := keysOf(items); strings.Join(got, ",") != strings.Join(keys, ",") || pages != 3 {
		t.Fatalf("the keys in pages of 2: %q in %d pages, want %q in 3", got, pages, keys)
	}
}

func TestListSnapshotsRefusesAnOutOfRangeLimitOrABadCursor(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	_, err := c.ListSnapshots(ctx, snapfence.ListSnapshotsOptions{Limit: 1001})
	wantCode(t, err, snapfence.CodeInvalidRequest)
	_, err = c.ListSnapshots(ctx, snapfence.ListSnapshotsOptions{Cursor: "!"})
	wantCode(t, err, snapfence.CodeInvalidRequest)
}
