"""Contract v1.3 against a server that has it: a lease fences its namespace, transactions commit
all or nothing, snapshot metadata, the ordered listing. Skipped against an older server (the
probe: a write naming a Fencing-Key is refused as an unknown header or field)."""

from __future__ import annotations

import pytest

import snapfence
from snapfence import TxnOp


@pytest.fixture
def v13(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key("probe")
    g = c.acquire(k, "probe", 30)
    try:
        meta = c.put_snapshot(f"{k}/child", g.token, b"x", fencing_key=k)
    except snapfence.SnapfenceError:
        pytest.skip("the server has no namespace fences (contract v1.3) yet")
    finally:
        c.release(k, g.token)
    if meta.fencing_key != k:
        pytest.skip("the server does not name the fence of a write (contract v1.3) yet")


def test_a_lease_fences_the_keys_of_its_namespace(v13, url: str, key) -> None:
    c = snapfence.Client(url)
    ns = key("ns")
    g = c.acquire(ns, "w", 30)
    meta = c.put_snapshot(f"{ns}/a", g.token, b"a", fencing_key=ns, metadata={"step": 1})
    assert meta.fencing_key == ns
    snap = c.get_snapshot(f"{ns}/a")
    assert snap.fencing_key == ns and snap.metadata == {"step": 1}
    with pytest.raises(snapfence.InvalidRequest):
        c.put_snapshot(key("elsewhere"), g.token, b"x", fencing_key=ns)
    c.release(ns, g.token)
    newer = c.acquire(ns, "w2", 30)
    with pytest.raises(snapfence.StaleToken) as e:
        c.put_snapshot(f"{ns}/a", g.token, b"late", fencing_key=ns)
    assert e.value.fencing_key == ns
    c.delete_snapshot(f"{ns}/a", newer.token, fencing_key=ns)
    c.release(ns, newer.token)


def test_a_transaction_commits_all_or_nothing(v13, url: str, key) -> None:
    c = snapfence.Client(url)
    ns = key("ns")
    g = c.acquire(ns, "w", 30)
    first = c.txn(
        ns,
        g.token,
        [
            TxnOp.put(f"{ns}/a", b"a", metadata={"n": 1}),
            TxnOp.put(f"{ns}/w/1", b"1"),
            TxnOp.put(f"{ns}/w/2", b"2", content_type="text/plain"),
        ],
    )
    assert first.fencing_key == ns and first.token == g.token
    assert [r.put.version for r in first.results if r.put] == [1, 1, 1]
    assert c.get_snapshot(f"{ns}/a").metadata == {"n": 1}
    with pytest.raises(snapfence.PreconditionFailed) as e:
        c.txn(ns, g.token, [TxnOp.put(f"{ns}/c", b"c"), TxnOp.put(f"{ns}/a", b"a2", create_only=True)])
    assert e.value.op_index == 1
    with pytest.raises(snapfence.NotFound):
        c.get_snapshot(f"{ns}/c")
    done = c.txn(ns, g.token, [TxnOp.delete(f"{ns}/a"), TxnOp.delete(f"{ns}/none"), TxnOp.delete_prefix(f"{ns}/w/")])
    assert [r.deleted for r in done.results] == [1, 0, 2]
    assert list(c.iter_snapshots(prefix=f"{ns}/")) == []
    c.release(ns, g.token)
    with pytest.raises(snapfence.StaleToken) as refused:
        c.txn(ns, g.token, [TxnOp.put(f"{ns}/late", b"late")])
    assert refused.value.fencing_key == ns


def test_the_listing_goes_in_either_order_from_a_key_with_metadata(v13, url: str, key) -> None:
    c = snapfence.Client(url)
    ns = key("ns")
    g = c.acquire(ns, "w", 30)
    for name in ("a", "b", "c"):
        c.put_json(f"{ns}/{name}", g.token, {"name": name}, fencing_key=ns, metadata={"name": name})
    asc = [m.key for m in c.iter_snapshots(prefix=f"{ns}/", start_after=f"{ns}/a")]
    assert asc == [f"{ns}/b", f"{ns}/c"]
    desc = c.list_snapshots(prefix=f"{ns}/", order="desc", include_metadata=True)
    assert [(m.key, m.metadata) for m in desc.items] == [
        (f"{ns}/{n}", {"name": n}) for n in ("c", "b", "a")
    ]
    c.release(ns, g.token)


def test_the_leaders_token_fences_the_keys_under_the_election(v13, url: str, key) -> None:
    c = snapfence.Client(url)
    name = key("election")
    a = snapfence.Election(c, name, candidate="a", ttl=5)
    with a.campaign() as leadership:
        deposed = leadership.token
        c.put_snapshot(f"{name}/plan", leadership.token, b"a's plan", fencing_key=name)
    b = snapfence.Election(c, name, candidate="b", ttl=5)
    with b.campaign() as leadership:
        with pytest.raises(snapfence.StaleToken):
            c.put_snapshot(f"{name}/plan", deposed, b"a again", fencing_key=name)
        c.put_snapshot(f"{name}/plan", leadership.token, b"b's plan", fencing_key=name)
    assert c.get_snapshot(f"{name}/plan").body == b"b's plan"
