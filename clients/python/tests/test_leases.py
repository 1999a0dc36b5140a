"""Every lease operation against a real service."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

import snapfence


@pytest.fixture
def client(url: str):
    with snapfence.Client(url) as c:
        yield c


def test_acquire_renew_release(client: snapfence.Client, key) -> None:
    k = key()
    g = client.acquire(k, "worker-7", timedelta(seconds=30), metadata={"pid": 4242, "target": "build"})
    lease = g.lease
    assert (lease.key, lease.owner, lease.ttl_ms, lease.ttl) == (k, "worker-7", 30000, 30.0)
    assert lease.metadata == {"pid": 4242, "target": "build"}
    assert lease.expires_at > lease.acquired_at and g.recovered is None
    renewed = client.renew(k, g.token, ttl=60)
    assert renewed.token == g.token and renewed.ttl_ms == 60000 and renewed.expires_at > lease.expires_at
    status = client.get_lease(k)
    assert status.state == "held" and status.newest_token == g.token and status.lease.owner == "worker-7"
    client.release(k, g.token)
    assert client.get_lease(k).state == "released"
    with pytest.raises(snapfence.LeaseLost):
        client.renew(k, g.token)
    with pytest.raises(snapfence.LeaseLost):
        client.release(k, g.token)
    # Every grant mints a new token, also for the same owner.
    again = client.acquire(k, "worker-7", 30)
    assert again.token > g.token
    client.release(k, again.token)


def test_a_held_key_is_refused_with_its_holder(client: snapfence.Client, key) -> None:
    k = key()
    g = client.acquire(k, "a", 30, metadata={"x": 1})
    with pytest.raises(snapfence.LeaseHeld) as e:
        client.acquire(k, "b", 30)
    assert e.value.holder is not None and e.value.holder.owner == "a" and e.value.holder.metadata == {"x": 1}
    assert e.value.status == 409 and e.value.code == "lease_held" and e.value.request_id
    client.release(k, g.token)


def test_never_leased_and_invalid_input(client: snapfence.Client, key) -> None:
    with pytest.raises(snapfence.NotFound):
        client.get_lease(key())
    with pytest.raises(snapfence.InvalidRequest):
        client.acquire(key(), "a", 0.001)  # below the server's minimum TTL
    with pytest.raises(snapfence.InvalidRequest):
        client.acquire("", "a", 10)  # refused before sending
    with pytest.raises(snapfence.InvalidRequest):
        client.acquire("..", "a", 10)


def test_a_waiting_acquire_gets_the_key_when_it_is_released(client: snapfence.Client, key) -> None:
    k = key()
    holder = client.acquire(k, "holder", 30)
    got: list[snapfence.Grant] = []
    waiter = threading.Thread(target=lambda: got.append(client.acquire(k, "waiter", 30, wait=60)))
    waiter.start()
    # The waiter is queued: the holder is still the holder.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and client.get_lease(k).lease.owner != "holder":
        time.sleep(0.05)
    time.sleep(0.3)
    assert not got
    client.release(k, holder.token)
    waiter.join(60)
    assert got and got[0].lease.owner == "waiter" and got[0].token > holder.token
    # A wait that runs out answers lease_held.
    t0 = time.monotonic()
    with pytest.raises(snapfence.LeaseHeld) as e:
        client.acquire(k, "late", 30, wait=0.5)
    assert time.monotonic() - t0 >= 0.4 and e.value.holder is not None and e.value.holder.owner == "waiter"
    client.release(k, got[0].token)


def test_abandon_leaves_a_recovery_record_that_reconciled_replaces(client: snapfence.Client, key) -> None:
    k = key()
    g = client.acquire(k, "crashy", 30, metadata={"step": 3})
    client.abandon(k, g.token)
    status = client.get_lease(k)
    assert status.state == "recovery_pending" and status.recovery is not None
    assert (status.recovery.owner, status.recovery.token, status.recovery.reason) == ("crashy", g.token, "abandoned")
    with pytest.raises(snapfence.RecoveryRequired) as e:
        client.acquire(k, "next", 30)
    assert e.value.recovery is not None and e.value.recovery.metadata == {"step": 3}
    g2 = client.acquire(k, "next", 30, reconciled=True)
    assert g2.recovered is not None and g2.recovered.token == g.token and g2.token > g.token
    recs = list(client.iter_recoveries(key=k))
    assert len(recs) == 1 and recs[0].recovery is not None and recs[0].recovery.token == g.token
    assert recs[0].highest_token == g2.token and recs[0].holder == "next" and recs[0].operation == "reconcile"
    page = client.recoveries(key=k, limit=1)
    assert [r.id for r in page.items] == [recs[0].id]
    client.release(k, g2.token)


def test_require_recovery_keeps_the_lease_and_leaves_a_record(client: snapfence.Client, key) -> None:
    k = key()
    g = client.acquire(k, "w", 30)
    client.require_recovery(k, g.token)
    status = client.get_lease(k)
    assert status.state == "held" and status.lease.recovery_required
    client.release(k, g.token)
    status = client.get_lease(k)
    assert status.state == "recovery_pending" and status.recovery is not None
    assert status.recovery.reason == "recovery_required"
    with pytest.raises(snapfence.LeaseLost):
        client.require_recovery(k, g.token)


def test_crash_recovery_lease_that_expires_leaves_a_record(client: snapfence.Client, key) -> None:
    k = key()
    g = client.acquire(k, "w", 0.3, crash_recovery=True)
    assert g.lease.crash_recovery
    deadline = time.monotonic() + 30
    while client.get_lease(k).state == "held" and time.monotonic() < deadline:
        time.sleep(0.05)
    status = client.get_lease(k)
    assert status.state == "recovery_pending" and status.recovery is not None
    assert status.recovery.reason == "expired"


def test_list_leases_pages_and_iterates(client: snapfence.Client, key) -> None:
    prefix = key("list") + "/"
    tokens = {}
    for name in ("a", "b", "c"):
        tokens[prefix + name] = client.acquire(prefix + name, "w", 30).token
    client.release(prefix + "b", tokens[prefix + "b"])
    page = client.list_leases(prefix=prefix, limit=2)
    assert [s.key for s in page.items] == [prefix + "a", prefix + "b"] and page.next_cursor
    rest = client.list_leases(prefix=prefix, limit=2, cursor=page.next_cursor)
    assert [s.key for s in rest.items] == [prefix + "c"] and rest.next_cursor is None
    assert [s.key for s in client.iter_leases(prefix=prefix, page_size=1)] == sorted(tokens)
    held = [s.key for s in client.iter_leases(prefix=prefix, state="held")]
    assert held == [prefix + "a", prefix + "c"]


def test_keys_are_sent_as_one_percent_encoded_segment(client: snapfence.Client, key) -> None:
    for name in ("a b%é?#&", "v1.2~x_y-z", "...", "slash/inside/key", "ü" * 200):
        k = key() + "/" + name
        g = client.acquire(k, "w", 30)
        assert g.lease.key == k
        client.put_snapshot(k, g.token, name)
        assert client.get_snapshot(k).text == name
        assert client.get_lease(k).key == k
        client.release(k, g.token)
    with pytest.raises(snapfence.InvalidRequest):
        client.acquire("x" * 513, "w", 30)
    with pytest.raises(snapfence.InvalidRequest):
        client.acquire("bad\nkey", "w", 30)
