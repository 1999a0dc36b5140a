"""The watch: typed events of every kind of change, in id order, each once, also across cut
connections (resumed with Last-Event-ID by the client itself) and from ``since``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List

from conftest import Proxy

import snapfence


def take(watch, n: int) -> List[snapfence.ChangeEvent]:
    out = []
    for ev in watch:
        out.append(ev)
        if len(out) == n:
            break
    return out


def test_the_watch_delivers_typed_events_of_every_change(url: str, key) -> None:
    c = snapfence.Client(url)
    prefix = key("w") + "/"
    k = prefix + "a"
    with c.watch(prefix=prefix).open() as watch:
        start = watch.last_id
        assert start is not None
        g = c.acquire(k, "w1", 30)
        w = c.put_snapshot(k, g.token, b"x")
        try:
            c.put_snapshot(k, g.token + 1000, b"refused")
        except snapfence.UnknownToken as e:
            refused = e
        c.delete_snapshot(k, g.token)
        c.require_recovery(k, g.token)
        c.abandon(k, g.token)
        g2 = c.acquire(k, "w2", 30, reconciled=True)
        c.release(k, g2.token)
        c.acquire(key("elsewhere"), "w", 30)  # outside the prefix: not delivered
        events = take(watch, 9)
    kinds = [e.kind for e in events]
    assert kinds == [
        "lease.granted",
        "snapshot.written",
        "write.refused",
        "snapshot.deleted",
        "lease.recovery_required",
        "lease.abandoned",
        "lease.reconciled",
        "lease.granted",
        "lease.released",
    ]
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == 9 and ids[0] > start
    assert all(e.key == k for e in events)
    granted, written, refusal = events[0], events[1], events[2]
    assert granted.token == g.token and granted.owner == "w1" and granted.expires_at is not None
    assert (written.version, written.etag, written.token) == (1, w.etag, g.token)
    assert refusal.reason == "unknown_token" and refusal.audit_id == refused.audit_id
    assert refusal.operation == "put" and refusal.highest_token == g.token
    reconciled = events[6]
    assert reconciled.record_token == g.token and reconciled.reason == "abandoned"
    assert events[7].token == g2.token and events[8].token == g2.token


def test_the_watch_resumes_across_cut_connections_without_gap_or_duplicate(proxy: Proxy, url: str, key) -> None:
    c = snapfence.Client(url)
    watching = snapfence.Client(
        proxy.url, retry=snapfence.RetryPolicy(max_attempts=10, initial_backoff=0.05, max_backoff=0.2)
    )
    k = key()
    g = c.acquire(k, "w", 60)
    writes = 40
    cuts: List[int] = []
    with watching.watch(prefix=k).open() as watch:

        def write() -> None:
            for i in range(writes):
                c.put_snapshot(k, g.token, str(i))
                if i % 10 == 5:
                    cuts.append(proxy.cut_connections())
                    time.sleep(0.05)

        writer = threading.Thread(target=write)
        writer.start()
        versions, ids = [], []
        for ev in watch:
            if ev.kind == "lease.granted" and ev.token == g.token:
                continue  # see test_a_watch_starts_after_what_committed_before_it
            assert ev.kind == "snapshot.written"
            versions.append(ev.version)
            ids.append(ev.id)
            if ev.version == writes:
                break
        writer.join(60)
    assert versions == list(range(1, writes + 1))
    assert ids == sorted(ids) and len(set(ids)) == writes
    assert sum(cuts) >= 3 and proxy.accepted >= 4, (cuts, proxy.accepted)
    c.release(k, g.token)


def test_a_watch_from_since_delivers_what_came_after(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    with c.watch(prefix=k).open() as w1:
        g = c.acquire(k, "w", 30)
        c.put_snapshot(k, g.token, b"1")
        c.put_snapshot(k, g.token, b"2")
        first = take(w1, 2)
    # A later watch from the id of the first event gets the rest, already committed.
    with c.watch(prefix=k, since=first[0].id) as w2:
        rest = take(w2, 2)
    assert [e.kind for e in rest] == ["snapshot.written", "snapshot.written"]
    assert [e.version for e in rest] == [1, 2] and rest[0].id == first[1].id
    c.release(k, g.token)


def test_async_watch(proxy: Proxy, url: str, key) -> None:
    async def main() -> None:
        async with snapfence.AsyncClient(url) as direct, snapfence.AsyncClient(
            proxy.url, retry=snapfence.RetryPolicy(max_attempts=10, initial_backoff=0.05)
        ) as c:
            k = key()
            watch = await c.watch(prefix=k).open()
            async with watch:
                g = await direct.acquire(k, "w", 30)
                await direct.put_snapshot(k, g.token, b"1")
                got = [await watch.__anext__()]
                assert proxy.cut_connections() >= 1
                await direct.put_snapshot(k, g.token, b"2")
                await direct.release(k, g.token)
                async for ev in watch:
                    got.append(ev)
                    if len(got) == 3:
                        break
            assert [e.kind for e in got] == ["lease.granted", "snapshot.written", "snapshot.written"]
            assert [e.version for e in got[1:]] == [1, 2]

    asyncio.run(main())


def test_a_watch_starts_after_what_committed_before_it(url: str, key) -> None:
    """A watch without ``since`` starts with the next change (API.md): the grant committed
    before it opened must not be delivered."""
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "w", 30)
    with c.watch(prefix=k).open() as watch:
        c.put_snapshot(k, g.token, b"after")
        first = take(watch, 1)[0]
    c.release(k, g.token)
    assert (first.kind, first.version) == ("snapshot.written", 1), first
