"""The keys that have a current snapshot (``GET /v1/snapshots``, beyond the contract), against a
real service."""

from __future__ import annotations

import asyncio
from typing import Dict, Iterable, Iterator, List

import pytest

import snapfence


@pytest.fixture
def client(url: str) -> Iterator[snapfence.Client]:
    with snapfence.Client(url) as c:
        yield c


def write(
    client: snapfence.Client, keys: Iterable[str], writes: int = 1
) -> Dict[str, snapfence.SnapshotMeta]:
    """Leases each key, writes to it ``writes`` times and releases it; what each last write stored."""
    written = {}
    for k in keys:
        g = client.acquire(k, "writer", 60)
        for i in range(writes):
            written[k] = client.put_snapshot(k, g.token, f"body {i} of {k}", content_type="text/x-test")
        client.release(k, g.token)
    return written


def test_list_snapshots_by_prefix_lists_only_the_keys_under_it_in_byte_order_with_their_metadata(
    client: snapfence.Client, key
) -> None:
    base = key("snaps")
    prefix = base + "/in/"
    under = [prefix + name for name in ("b", "é", "B", "a/deep", "~")]
    written = write(client, [*under, base + "/in", base + "/in-x", base + "/out/a"], writes=2)
    page = client.list_snapshots(prefix=prefix)
    in_byte_order = sorted(under)  # B, a/deep, b, ~, é: code point order is UTF-8's byte order
    assert [s.key for s in page.items] == in_byte_order and page.next_cursor is None
    assert page.items == [written[k] for k in in_byte_order]  # key, version, token, etag, size, ...
    assert all(s.version == 2 and s.content_type == "text/x-test" for s in page.items)


def test_list_snapshots_leaves_out_keys_without_a_current_snapshot(client: snapfence.Client, key) -> None:
    prefix = key("snaps") + "/"
    written = write(client, [prefix + "deleted", prefix + "kept"])
    g = client.acquire(prefix + "deleted", "deleter", 60)
    client.delete_snapshot(prefix + "deleted", g.token)
    client.release(prefix + "deleted", g.token)
    leased = client.acquire(prefix + "leased-only", "holder", 60)
    assert client.list_snapshots(prefix=prefix).items == [written[prefix + "kept"]]
    client.release(prefix + "leased-only", leased.token)


def test_list_snapshots_with_a_small_limit_walks_every_page(client: snapfence.Client, key) -> None:
    prefix = key("snaps") + "/"
    keys = [prefix + name for name in "abcde"]
    write(client, keys)
    seen: List[str] = []
    pages = 0
    cursor = None
    while True:
        page = client.list_snapshots(prefix=prefix, limit=2, cursor=cursor)
        pages += 1
        assert len(page.items) <= 2
        seen += [s.key for s in page.items if s.key is not None]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == keys and pages == 3


def test_iter_snapshots_follows_the_cursors_to_the_last_page(client: snapfence.Client, key) -> None:
    prefix = key("snaps") + "/"
    keys = [prefix + name for name in "abc"]
    written = write(client, keys)
    assert list(client.iter_snapshots(prefix=prefix, page_size=1)) == [written[k] for k in keys]


def test_list_snapshots_refuses_an_out_of_range_limit_or_a_bad_cursor(client: snapfence.Client) -> None:
    with pytest.raises(snapfence.InvalidRequest):
        client.list_snapshots(limit=1001)
    with pytest.raises(snapfence.InvalidRequest):
        client.list_snapshots(cursor="!")


def test_the_async_client_lists_and_iterates_the_snapshots_under_a_prefix(url: str, key) -> None:
    with snapfence.Client(url) as c:
        prefix = key("snaps") + "/"
        keys = [prefix + name for name in "ab"]
        written = write(c, keys)

    async def main() -> None:
        async with snapfence.AsyncClient(url) as ac:
            page = await ac.list_snapshots(prefix=prefix, limit=1)
            assert page.items == [written[keys[0]]] and page.next_cursor is not None
            assert [s async for s in ac.iter_snapshots(prefix=prefix, page_size=1)] == [
                written[k] for k in keys
            ]

    asyncio.run(main())
