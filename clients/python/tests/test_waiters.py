"""The queue of a key's waiting acquires (``GET /v1/leases/{key}/waiters``, beyond the contract),
against a real service."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, List, Tuple

import pytest

import snapfence


@pytest.fixture
def client(url: str) -> Iterator[snapfence.Client]:
    with snapfence.Client(url) as c:
        yield c


def wait_queued(
    client: snapfence.Client, key: str, owner: str, n: int, answer: Future[snapfence.Grant]
) -> None:
    """Polls the key's queue until it has ``n`` waiters, the last being ``owner``'s acquire."""
    deadline = time.monotonic() + 30
    while len(client.lease_waiters(key).items) != n:
        assert not answer.done(), f"the waiting acquire of {owner} was answered while {key} was held"
        assert time.monotonic() < deadline, f"{owner} not queued as waiter {n} within 30 s"
        time.sleep(0.05)


class Queue:
    """A key held by ``holder`` with waiting acquires queued behind it, in the order of ``owners``:
    each is started once the one before is listed."""

    def __init__(self, client: snapfence.Client, key: str, owners: List[str]) -> None:
        self.client = client
        self.key = key
        self.holder = client.acquire(key, "holder", 60)
        self.pool = ThreadPoolExecutor(max_workers=len(owners))
        self.waiting: List[Tuple[str, Future[snapfence.Grant]]] = []
        for n, owner in enumerate(owners, 1):
            answer = self.pool.submit(client.acquire, key, owner, 60, wait=60)
            self.waiting.append((owner, answer))
            wait_queued(client, key, owner, n, answer)

    def next(self) -> snapfence.Grant:
        """Releases the key and returns the grant of the first waiter, the new holder."""
        self.client.release(self.key, self.holder.token)
        owner, answer = self.waiting.pop(0)
        grant = answer.result(timeout=60)
        assert grant.lease.owner == owner
        self.holder = grant
        return grant

    def drain(self) -> None:
        """Hands the key down the queue until no one waits, then releases it."""
        try:
            while self.waiting:
                self.next()
            self.client.release(self.key, self.holder.token)
        finally:
            self.pool.shutdown(wait=False)


@pytest.fixture
def queue(client: snapfence.Client) -> Iterator[Callable[..., Queue]]:
    """``queue(key, "a", "b")``: ``key`` held, with waiting acquires of a then b queued behind
    it; at the end of the test every waiter is granted the key in turn, so none is left waiting."""
    made: List[Queue] = []

    def make(key: str, *owners: str) -> Queue:
        q = Queue(client, key, list(owners))
        made.append(q)
        return q

    yield make
    for q in made:
        q.drain()


def test_the_waiters_of_a_held_key_are_listed_first_queued_first(
    client: snapfence.Client, key, queue
) -> None:
    k = key()
    queue(k, "first", "second")
    page = client.lease_waiters(k)
    assert [(w.position, w.owner) for w in page.items] == [(1, "first"), (2, "second")]
    assert page.next_cursor is None
    assert page.items[0].since.tzinfo is not None and page.items[0].since <= page.items[1].since
    assert all(isinstance(w, snapfence.Waiter) for w in page.items)


def test_lease_waiters_pages_with_positions_counted_over_the_whole_queue(
    client: snapfence.Client, key, queue
) -> None:
    k = key()
    queue(k, "first", "second", "third")
    first = client.lease_waiters(k, limit=2)
    assert [(w.position, w.owner) for w in first.items] == [(1, "first"), (2, "second")]
    assert first.next_cursor is not None
    rest = client.lease_waiters(k, limit=2, cursor=first.next_cursor)
    assert [(w.position, w.owner) for w in rest.items] == [(3, "third")] and rest.next_cursor is None


def test_iter_lease_waiters_follows_the_cursors_through_the_whole_queue(
    client: snapfence.Client, key, queue
) -> None:
    k = key()
    queue(k, "first", "second", "third")
    waiters = list(client.iter_lease_waiters(k, page_size=1))
    assert [(w.position, w.owner) for w in waiters] == [(1, "first"), (2, "second"), (3, "third")]


def test_a_waiter_granted_the_key_leaves_the_queue_and_the_next_becomes_first(
    client: snapfence.Client, key, queue
) -> None:
    k = key()
    q = queue(k, "first", "second")
    q.next()
    assert [(w.position, w.owner) for w in client.lease_waiters(k).items] == [(1, "second")]


def test_a_key_no_one_waits_for_has_an_empty_queue(client: snapfence.Client, key) -> None:
    never, held = key("never-leased"), key("held")
    g = client.acquire(held, "holder", 60)
    for k in (never, held):
        page = client.lease_waiters(k)
        assert page.items == [] and page.next_cursor is None
        assert list(client.iter_lease_waiters(k)) == []
    client.release(held, g.token)


def test_lease_waiters_sends_the_key_as_one_percent_encoded_segment(
    client: snapfence.Client, key, queue
) -> None:
    k = key() + "/a b%é?#&/waiters"
    queue(k, "only")  # polls lease_waiters until the waiter shows in this key's queue
    assert [w.owner for w in client.lease_waiters(k).items] == ["only"]


def test_lease_waiters_refuses_a_key_that_cannot_be_sent_as_a_path_segment(client: snapfence.Client) -> None:
    for bad in ("", "..", "bad\nkey"):
        with pytest.raises(snapfence.InvalidRequest):
            client.lease_waiters(bad)


def test_the_async_client_lists_and_iterates_a_keys_waiters(url: str, key, queue) -> None:
    k = key()
    queue(k, "first", "second")

    async def main() -> None:
        async with snapfence.AsyncClient(url) as c:
            page = await c.lease_waiters(k, limit=1)
            assert [(w.position, w.owner) for w in page.items] == [(1, "first")] and page.next_cursor
            assert [w.owner async for w in c.iter_lease_waiters(k, page_size=1)] == ["first", "second"]

    asyncio.run(main())
