package snapfence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// waited is the answer of a waiting acquire.
type waited struct {
	grant *snapfence.Grant
	err   error
}

// waitQueue is a held key with waiting acquires queued behind its holder, in the order of
// owners.
type waitQueue struct {
	t       *testing.T
	c       *snapfence.Client
	ctx     context.Context
	key     string
	holder  *snapfence.Grant
	owners  []string
	answers []chan waited
}

// queueWaiters holds key as "holder" and queues a waiting acquire for each of owners behind it,
// each started once the one before is listed, so that the queue's order is theirs. At the end of
// the test the key is handed down the queue (each waiter is granted it in turn and releases it),
// so that no acquire is left waiting.
func queueWaiters(t *testing.T, c *snapfence.Client, key string, owners ...string) *waitQueue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	wc, err := snapfence.New(testenv.Shared.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := &waitQueue{t: t, c: c, ctx: ctx, key: key, holder: acquire(t, c, key, "holder", time.Minute)}
	t.Cleanup(func() {
		defer cancel()
		for len(q.answers) > 0 {
			q.next()
		}
		if err := c.Release(ctx, key, q.holder.Token); err != nil {
			t.Errorf("releasing %s after the last waiter: %v", key, err)
		}
	})
	for i, owner := range owners {
		answer := make(chan waited, 1)
		go func(owner string) {
			g, err := wc.Acquire(ctx, key, snapfence.AcquireRequest{Owner: owner, TTL: time.Minute, Wait: time.Minute})
			answer <- waited{g, err}
		}(owner)
		q.owners = append(q.owners, owner)
		q.answers = append(q.answers, answer)
		queued := i + 1
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%s queued as waiter %d", owner, queued), func() bool {
			select {
			case a := <-answer:
				answer <- a // for the cleanup
				t.Fatalf("the waiting acquire of %s was answered while %s was held: %+v, %v", owner, key, a.grant, a.err)
			default:
			}
			page, err := c.ListLeaseWaiters(ctx, key, snapfence.PageOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return len(page.Items) == queued
		})
	}
	return q
}

// next releases the key's holder and returns the grant of the first waiter, the new holder.
func (q *waitQueue) next() *snapfence.Grant {
	q.t.Helper()
	if err := q.c.Release(q.ctx, q.key, q.holder.Token); err != nil {
		q.t.Fatalf("releasing %s: %v", q.key, err)
	}
	owner, answer := q.owners[0], q.answers[0]
	q.owners, q.answers = q.owners[1:], q.answers[1:]
	select {
	case a := <-answer:
		if a.err != nil {
			q.t.Fatalf("the waiting acquire of %s: %v", owner, a.err)
		}
		if a.grant.Owner != owner {
			q.t.Fatalf("the waiter %s was granted the lease of %s", owner, a.grant.Owner)
		}
		q.holder = a.grant
	case <-time.After(time.Minute):
		q.t.Fatalf("the waiter %s was not granted %s within a minute of the release", owner, q.key)
	}
	return q.holder
}

func TestListLeaseWaitersListsAHeldKeysWaitingAcquiresFirstQueuedFirst(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	queueWaiters(t, c, key, "first", "second")
	page, err := c.ListLeaseWaiters(ctx, key, snapfence.PageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 2 || page.NextCursor != "" {
		t.Fatalf("the queue of two waiters: %+v", page)
	}
	first, second := page.Items[0], page.Items[1]
	if first.Position != 1 || first.Owner != "first" || second.Position != 2 || second.Owner != "second" {
		t.Fatalf("the waiters in queue order: %+v", page.Items)
	}
	if first.Since.IsZero() || second.Since.Before(first.Since) {
		t.Fatalf("the waiters' since: %v then %v", first.Since, second.Since)
	}
}

func TestListLeaseWaitersPagesWithPositionsCountedOverTheWholeQueue(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	queueWaiters(t, c, key, "first", "second", "third")
	var got []string
	cursor := ""
	pages := 0
	for {
		page, err := c.ListLeaseWaiters(ctx, key, snapfence.PageOptions{Limit: 1, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page.Items) != 1 {
			t.Fatalf("page %d of limit 1 has %d waiters", pages, len(page.Items))
		}
		got = append(got, fmt.Sprintf("%d:%s", page.Items[0].Position, page.Items[0].Owner))
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if fmt.Sprint(got) != "[1:first 2:second 3:third]" {
		t.Fatalf("the pages of the queue: %v", got)
	}
}

func TestAWaiterGrantedTheKeyLeavesTheQueueAndTheNextBecomesFirst(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	q := queueWaiters(t, c, key, "first", "second")
	q.next()
	page, err := c.ListLeaseWaiters(ctx, key, snapfence.PageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 || page.Items[0].Position != 1 || page.Items[0].Owner != "second" {
		t.Fatalf("the queue after the first waiter's grant: %+v", page.Items)
	}
}

func TestListLeaseWaitersOfAKeyNoOneWaitsForIsAnEmptyPage(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	never := testenv.UniqueKey(t, "never-leased")
	held := testenv.UniqueKey(t, "held")
	g := acquire(t, c, held, "holder", time.Minute)
	for _, key := range []string{never, held} {
		page, err := c.ListLeaseWaiters(ctx, key, snapfence.PageOptions{})
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if len(page.Items) != 0 || page.NextCursor != "" {
			t.Fatalf("the queue of %s, which no one waits for: %+v", key, page)
		}
	}
	if err := c.Release(ctx, held, g.Token); err != nil {
		t.Fatal(err)
	}
}

func TestListLeaseWaitersSendsTheKeyAsOnePathSegment(t *testing.T) {
	c := newClient(t)
	key := testenv.UniqueKey(t, "k") + "/a b%é?#&/waiters"
	// queueWaiters polls ListLeaseWaiters until the waiter shows in this key's queue.
	queueWaiters(t, c, key, "only")
}

func TestListLeaseWaitersRefusesAnEmptyKeyOrABadCursor(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	_, err := c.ListLeaseWaiters(ctx, "", snapfence.PageOptions{})
	if e := wantCode(t, err, snapfence.CodeInvalidRequest); e.Status != 0 {
		t.Fatalf("an empty key: status %d, want a local refusal", e.Status)
	}
	_, err = c.ListLeaseWaiters(ctx, testenv.UniqueKey(t, "k"), snapfence.PageOptions{Cursor: "not-an-id"})
	wantCode(t, err, snapfence.CodeInvalidRequest)
}
