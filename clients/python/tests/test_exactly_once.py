"""Exactly once across a lost answer: a proxy drops the first answer (after the server handled
the request), the client retries with the same Idempotency-Key, and the change happens once."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Proxy

import snapfence

FAST = snapfence.RetryPolicy(max_attempts=4, initial_backoff=0.05, max_backoff=0.2)


def test_a_grant_whose_answer_is_lost_happens_once(proxy: Proxy, url: str, key) -> None:
    retries: list[snapfence.SnapfenceError] = []
    c = snapfence.Client(proxy.url, retry=FAST, on_retry=lambda e, pause: retries.append(e))
    direct = snapfence.Client(url)
    k = key()
    proxy.cut_answers(1)
    g = c.acquire(k, "w", 30)
    assert proxy.cut_done == 1
    assert len(retries) == 1 and isinstance(retries[0], snapfence.TransportError) and retries[0].may_have_reached
    # One grant: the retry was answered with the first attempt's, not refused as lease_held.
    status = direct.get_lease(k)
    assert status.newest_token == g.token and status.lease.owner == "w"
    keys = proxy.idempotency_keys()
    assert len(keys) == 2 and keys[0] == keys[1]


def test_a_write_whose_answer_is_lost_happens_once(proxy: Proxy, url: str, key) -> None:
    c = snapfence.Client(proxy.url, retry=FAST)
    direct = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "w", 30)
    proxy.cut_answers(1)
    w = c.put_snapshot(k, g.token, b"once")
    assert proxy.cut_done == 1 and w.version == 1
    assert [v.version for v in direct.iter_versions(k)] == [1]
    # Each call has its own key; a call's attempts share one.
    proxy.cut_answers(1)
    c.release(k, g.token)
    keys = proxy.idempotency_keys()
    assert len(keys) == 5 and keys[1] == keys[2] and keys[3] == keys[4] and len(set(keys)) == 3
    assert direct.get_lease(k).state == "released"


def test_async_a_release_whose_answer_is_lost_happens_once(proxy: Proxy, url: str, key) -> None:
    async def main() -> None:
        async with snapfence.AsyncClient(proxy.url, retry=FAST) as c:
            k = key()
            g = await c.acquire(k, "w", 30)
            await c.put_snapshot(k, g.token, b"x")
            proxy.cut_answers(1)
            await c.delete_snapshot(k, g.token)
            assert proxy.cut_done == 1
            with pytest.raises(snapfence.NotFound):
                await c.get_snapshot(k)
            # The rejected audit log has nothing: the retry was a replay, not a second delete.
            assert (await c.rejections(key=k)).items == []
            await c.release(k, g.token)

    asyncio.run(main())


def test_indeterminate_when_the_answer_is_lost_and_the_retries_cannot_connect(proxy: Proxy, key) -> None:
    def close_proxy(e: snapfence.SnapfenceError, pause: float) -> None:
        proxy.close()  # every later attempt: connection refused, so it says nothing changed

    c = snapfence.Client(proxy.url, retry=FAST, on_retry=close_proxy)
    proxy.cut_answers(1)
    with pytest.raises(snapfence.Indeterminate) as e:
        c.acquire(key(), "w", 30)
    assert e.value.is_indeterminate and "may have taken effect" in str(e.value)
    assert isinstance(e.value.__cause__, snapfence.TransportError) and not e.value.__cause__.may_have_reached


def test_a_read_that_cannot_connect_is_not_indeterminate(key) -> None:
    from conftest import free_port

    c = snapfence.Client(f"http://127.0.0.1:{free_port()}", retry=FAST)
    with pytest.raises(snapfence.TransportError) as e:
        c.get_lease(key())
    assert not e.value.may_have_reached and not e.value.is_indeterminate


def test_a_waiting_acquire_cut_while_it_waits_is_granted_once(proxy: Proxy, url: str, key) -> None:
    import threading
    import time

    direct = snapfence.Client(url)
    retries: list[snapfence.SnapfenceError] = []
    c = snapfence.Client(
        proxy.url,
        retry=snapfence.RetryPolicy(max_attempts=20, initial_backoff=0.05, max_backoff=0.5),
        on_retry=lambda e, p: retries.append(e),
    )
    k = key()
    watch = direct.watch(prefix=k).open()
    holder = direct.acquire(k, "holder", 60)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(c.acquire(k, "waiter", 60, wait=30)))
    t.start()
    deadline = time.monotonic() + 30
    while not proxy.idempotency_keys():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)  # setup, not an assertion: lets the waiter reach the key's queue
    assert proxy.cut_connections() == 1
    deadline = time.monotonic() + 30
    while len(proxy.idempotency_keys()) < 2:  # the retry is sent, with the same key
        assert time.monotonic() < deadline
        time.sleep(0.02)
    direct.release(k, holder.token)
    t.join(60)
    assert got and isinstance(got[0], snapfence.Grant), (got, retries)
    grant = got[0]
    keys = proxy.idempotency_keys()
    assert len(set(keys)) == 1 and len(keys) >= 2
    assert isinstance(retries[0], snapfence.TransportError) and retries[0].may_have_reached
    status = direct.get_lease(k)
    assert status.lease.owner == "waiter" and status.newest_token == grant.token
    direct.release(k, grant.token)
    # Exactly two grants of the key, the holder's and the waiter's: none was made and lost.
    granted = []
    with watch:
        for ev in watch:
            if ev.key != k:
                continue
            if ev.kind == "lease.granted":
                granted.append((ev.owner, ev.token))
            if ev.kind == "lease.released" and ev.token == grant.token:
                break
    assert granted == [("holder", holder.token), ("waiter", grant.token)]
