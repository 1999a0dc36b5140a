"""v1.2: reconciling while holding the key (``reconciling=True``, then ``reconciled``). These
run only against a server that has the route: against an older one they are skipped (the
probe below: ``POST /v1/leases/{key}/reconciled`` answered 404 "no such endpoint")."""

from __future__ import annotations

import httpx
import pytest

import snapfence


@pytest.fixture
def v12(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key("probe")
    g = c.acquire(k, "probe", 30)
    try:
        r = httpx.post(f"{url}/v1/leases/{k.replace('/', '%2F')}/reconciled", headers={"Fencing-Token": str(g.token)})
    finally:
        c.release(k, g.token)
    if r.status_code == 404 and "no such endpoint" in r.text:
        pytest.skip("the server has no POST /v1/leases/{key}/reconciled (API v1.2) yet")


def test_reconciling_holds_the_key_and_keeps_the_record_until_reconciled(v12, url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "crashy", 30)
    c.abandon(k, g.token)
    r = c.acquire(k, "fixer", 30, reconciling=True)
    assert r.recovery is not None and r.recovery.token == g.token and r.token > g.token
    with pytest.raises(snapfence.LeaseHeld) as held:
        c.acquire(k, "other", 30)
    assert held.value.holder is not None and held.value.holder.owner == "fixer"
    assert c.get_lease(k).recovery is not None
    c.put_snapshot(k, r.token, b"repaired")
    lease = c.reconciled(k, r.token)
    assert lease.token == r.token
    status = c.get_lease(k)
    assert status.recovery is None and status.state == "held"
    c.release(k, r.token)
    assert c.get_lease(k).state == "released"
    with pytest.raises(snapfence.LeaseLost):
        c.reconciled(k, r.token)


def test_a_reconciling_holder_that_releases_leaves_the_record(v12, url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "crashy", 30)
    c.abandon(k, g.token)
    r = c.acquire(k, "fixer", 30, reconciling=True)
    c.release(k, r.token)
    status = c.get_lease(k)
    assert status.state == "recovery_pending" and status.recovery is not None
    assert status.recovery.token == g.token
    with pytest.raises(snapfence.RecoveryRequired):
        c.acquire(k, "next", 30)


def test_reconciled_and_reconciling_exclude_each_other(url: str, key) -> None:
    with pytest.raises(snapfence.InvalidRequest):
        snapfence.Client(url).acquire(key(), "w", 30, reconciled=True, reconciling=True)


def test_a_keeper_holds_a_key_while_reconciling_it(v12, url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "crashy", 30)
    c.abandon(k, g.token)
    with c.hold(k, owner="fixer", ttl=5, reconciling=True) as lease:
        assert lease.grant.recovery is not None and lease.grant.recovery.token == g.token
        assert c.get_lease(k).recovery is not None
        assert lease.reconciled().token == lease.token
        assert c.get_lease(k).recovery is None
    assert c.get_lease(k).state == "released"


def test_a_keeper_replaces_a_record_with_reconciled(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "crashy", 30)
    c.abandon(k, g.token)
    with c.hold(k, owner="fixer", ttl=5, reconciled=True) as lease:
        assert lease.grant.recovered is not None and lease.grant.recovered.token == g.token
