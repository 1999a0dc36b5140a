"""The watch against a server that ends every stream after a second (``--max-watch``) and keeps
two seconds of history (``--watch-retention``): the client resumes each ended stream without gap
or duplicate, and a watch from a change no longer retained ends with Compacted."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Iterator, List

import pytest
from conftest import Server, start_server

import snapfence


@pytest.fixture(scope="module")
def short() -> Iterator[Server]:
    s = start_server(["--max-watch", "1s", "--watch-retention", "2s"])
    try:
        yield s
    finally:
        s.stop()


def test_a_watch_outlives_the_streams_the_server_ends(short: Server, key) -> None:
    c = snapfence.Client(short.url)
    k = key()
    g = c.acquire(k, "w", 60)
    writes = 12
    with c.watch(prefix=k).open() as watch:

        def write() -> None:
            for i in range(writes):
                c.put_snapshot(k, g.token, str(i))
                time.sleep(0.3)  # the writes span several of the server's one-second streams

        writer = threading.Thread(target=write)
        writer.start()
        started = time.monotonic()
        versions: List[int] = []
        for ev in watch:
            if ev.kind == "snapshot.written":
                versions.append(ev.version or 0)
                if ev.version == writes:
                    break
        writer.join(60)
    assert versions == list(range(1, writes + 1))
    assert time.monotonic() - started > 2.0  # so more than one stream served it
    c.release(k, g.token)


def test_a_watch_from_a_change_no_longer_retained_ends_with_compacted(short: Server, key) -> None:
    c = snapfence.Client(short.url)
    k = key()
    g = c.acquire(k, "w", 60)
    with c.watch(prefix=k).open() as w:
        c.put_snapshot(k, g.token, b"first")
        # (the grant before it may come first: see test_a_watch_starts_after_what_committed_before_it)
        first = next(ev for ev in w if ev.kind == "snapshot.written")
    deadline = time.monotonic() + 60
    while True:
        c.put_snapshot(k, g.token, b"more")  # history keeps moving on
        try:
            with c.watch(prefix=k, since=first.id) as w:
                next(w)
        except snapfence.Compacted as e:
            assert e.status == 410
            break
        assert time.monotonic() < deadline, "the change was never compacted"
        time.sleep(0.5)

    async def main() -> None:
        async with snapfence.AsyncClient(short.url) as ac:
            with pytest.raises(snapfence.Compacted):
                async for _ in ac.watch(prefix=k, since=first.id):
                    pass

    asyncio.run(main())
    c.release(k, g.token)


def test_since_zero_is_the_oldest_retained_change_even_after_pruning(short: Server, key) -> None:
    c = snapfence.Client(short.url)
    k = key()
    g = c.acquire(k, "w", 60)
    # The grant falls out of the two seconds of retention when the pruner next runs, which a
    # loaded machine delays: each round writes a change and reads from the oldest one kept.
    deadline = time.monotonic() + 30
    while True:
        time.sleep(1)
        c.put_snapshot(k, g.token, b"retained")
        with c.watch(prefix=k, since=0) as w:
            ev = next(w)
        if ev.kind != "lease.granted" or time.monotonic() > deadline:
            break
    assert ev.kind == "snapshot.written" and ev.key == k
    c.release(k, g.token)
