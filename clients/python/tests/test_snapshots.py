"""Every snapshot and audit operation against a real service."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import pytest

import snapfence


@pytest.fixture
def client(url: str):
    with snapfence.Client(url) as c:
        yield c


def etag_of(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest() + '"'


def test_put_get_head_versions_delete(client: snapfence.Client, key) -> None:
    k = key()
    g = client.acquire(k, "w", 30)
    first = client.put_snapshot(k, g.token, b"one", content_type="application/x-test")
    assert (first.key, first.version, first.token, first.size) == (k, 1, g.token, 3)
    assert first.etag == etag_of(b"one") and first.content_type == "application/x-test"
    second = client.put_snapshot(k, g.token, "two")  # text: stored as UTF-8
    assert second.version == 2 and second.content_type.startswith("text/plain")
    snap = client.get_snapshot(k)
    assert (snap.body, snap.text, snap.version, snap.token, snap.etag) == (b"two", "two", 2, g.token, second.etag)
    assert snap.last_modified.tzinfo is not None
    head = client.head_snapshot(k)
    assert (head.body, head.size, head.version, head.etag) == (b"", 3, 2, second.etag)
    assert client.get_snapshot_if_none_match(k, second.etag) is None
    assert client.get_snapshot_if_none_match(k, first.etag) == snap
    versions = client.list_versions(k)
    assert [v.version for v in versions.items] == [2, 1] and versions.items[1].etag == first.etag
    assert versions.items[0].key is None
    page = client.list_versions(k, limit=1)
    assert [v.version for v in page.items] == [2] and page.next_cursor
    assert [v.version for v in client.iter_versions(k, page_size=1)] == [2, 1]
    old = client.get_version(k, 1)
    assert old.body == b"one" and old.version == 1 and old.content_type == "application/x-test"
    with pytest.raises(snapfence.NotFound):
        client.get_version(k, 99)
    client.delete_snapshot(k, g.token)
    with pytest.raises(snapfence.NotFound):
        client.get_snapshot(k)
    with pytest.raises(snapfence.NotFound):
        client.head_snapshot(k)
    client.release(k, g.token)


def test_if_match_is_a_compare_and_set(client: snapfence.Client, key) -> None:
    k = key()
    g = client.acquire(k, "w", 30)
    w = client.put_snapshot(k, g.token, b"v1")
    w2 = client.put_snapshot(k, g.token, b"v2", if_match=w.etag)
    assert w2.version == 2
    with pytest.raises(snapfence.PreconditionFailed):
        client.put_snapshot(k, g.token, b"v3", if_match=w.etag)
    with pytest.raises(snapfence.PreconditionFailed):
        client.delete_snapshot(k, g.token, if_match=w.etag)
    client.delete_snapshot(k, g.token, if_match=w2.etag)
    client.release(k, g.token)


def test_stale_and_unknown_tokens_are_refused_and_audited(client: snapfence.Client, key) -> None:
    since = datetime.now(timezone.utc) - timedelta(seconds=5)
    k = key()
    with pytest.raises(snapfence.UnknownToken) as unknown:
        client.put_snapshot(k, 1, b"never leased")
    assert unknown.value.highest_token is None and unknown.value.presented_token == 1
    old = client.acquire(k, "old", 30)
    client.release(k, old.token)
    new = client.acquire(k, "new", 30)
    with pytest.raises(snapfence.StaleToken) as stale:
        client.put_snapshot(k, old.token, b"late write")
    e = stale.value
    assert (e.presented_token, e.highest_token, e.status) == (old.token, new.token, 409) and e.audit_id
    with pytest.raises(snapfence.UnknownToken) as ahead:
        client.delete_snapshot(k, new.token + 1000)
    assert ahead.value.highest_token == new.token
    rows = list(client.iter_rejections(key=k, since=since, page_size=1))
    assert [(r.reason, r.operation, r.presented_token) for r in rows] == [
        ("unknown_token", "delete", new.token + 1000),
        ("stale_token", "put", old.token),
        ("unknown_token", "put", 1),
    ]
    assert rows[1].id == e.audit_id and rows[1].holder == "new" and rows[1].highest_token == new.token
    only_stale = client.rejections(key=k, reason="stale_token")
    assert [r.id for r in only_stale.items] == [e.audit_id]
    assert client.rejections(key=k, until=since).items == []
    client.release(k, new.token)


def test_put_json_and_get_json_round_trip_a_value(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "w", 30)
    meta = c.put_json(k, g.token, {"step": 3, "done": ["a", "b"], "name": "é"})
    assert meta.content_type.startswith("application/json")
    assert c.get_json(k) == {"step": 3, "done": ["a", "b"], "name": "é"}
    assert c.get_snapshot(k).json() == {"step": 3, "done": ["a", "b"], "name": "é"}
    c.release(k, g.token)


def test_the_operations_endpoints_answer(url: str) -> None:
    c = snapfence.Client(url)
    c.health()
    c.ready()
    assert "# TYPE" in c.metrics()
