"""The keeper: renews in the background and signals loss before the deadline, when the service
stops answering (SIGSTOP of the serve process), when the lease is taken over, and when the
holder's own process is paused past its lease."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import Server

import snapfence


def wait_until(what: str, cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def test_the_keeper_renews(url: str, key) -> None:
    c = snapfence.Client(url)
    with c.hold(key(), owner="w", ttl=1.5, renew_every=0.2) as lease:
        first = lease.lease
        wait_until("a renewal", lambda: lease.lease.expires_at > first.expires_at)
        # Well past the TTL, the lease is still held, by the same token.
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            assert not lease.lost
            time.sleep(0.1)
        status = c.get_lease(lease.key)
        assert status.state == "held" and status.lease.token == first.token
        k = lease.key
    assert c.get_lease(k).state == "released"


def test_the_keeper_declares_loss_before_the_deadline_when_the_service_is_frozen(server: Server, key) -> None:
    c = snapfence.Client(server.url, timeout=30)
    k = key()
    with pytest.raises(snapfence.LostLease) as exc:
        with c.hold(k, owner="w", ttl=6, margin=3, renew_every=0.5) as lease:
            granted = lease.lease
            wait_until("a renewal", lambda: lease.lease.expires_at > granted.expires_at)
            server.freeze()
            try:
                assert lease.wait_lost(60), "the keeper did not fire within a minute of the freeze"
                lost_wall, lost_mono = time.time(), time.monotonic()
                # The server's expiry as of the newest renewal the keeper saw answered: a renewal
                # the frozen server applies later can only move it on.
                server_expiry = lease.lease.expires_at.timestamp()
                deadline = lease.deadline
            finally:
                server.thaw()
            assert lease.lost_reason == "lapsing"
            assert lost_wall < server_expiry, (lost_wall, server_expiry)
            assert lost_mono < deadline
            with pytest.raises(snapfence.LostLease):
                lease.raise_if_lost()
    assert exc.value.reason == "lapsing"


def test_the_keeper_declares_loss_when_the_lease_is_taken_over(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    losses: list[snapfence.LostLease] = []
    with pytest.raises(snapfence.LostLease):
        with c.hold(k, owner="w", ttl=3, renew_every=0.3, on_lost=losses.append) as lease:
            held = lease.lease
            # An operator ends the lease with its token, and another worker takes the key.
            c.release(k, held.token)
            usurper = c.acquire(k, "usurper", 60)
            assert lease.wait_lost(60)
            assert lease.lost_reason == "lease_lost" and losses and losses[0].reason == "lease_lost"
            with pytest.raises(snapfence.StaleToken):
                c.put_snapshot(k, lease.token, b"late")
    status = c.get_lease(k)
    assert status.state == "held" and status.lease.token == usurper.token


CHILD = textwrap.dedent(
    """
    import json, sys
    import snapfence

    url, key = sys.argv[1], sys.argv[2]
    c = snapfence.Client(url)
    lease = c.hold(key, owner="paused", ttl=1.5, margin=0.5, renew_every=0.2).start()
    print(json.dumps({"token": lease.token}), flush=True)
    sys.stdin.readline()  # meanwhile the parent stops this process, takes the key, resumes it
    try:
        c.put_snapshot(key, lease.token, b"written after the pause")
        write = "written"
    except snapfence.StaleToken as e:
        write = "stale_token"
    lost = lease.wait_lost(10)
    try:
        lease.release()
    except snapfence.LeaseLost:
        pass
    print(json.dumps({"write": write, "lost": lost, "reason": lease.lost_reason}), flush=True)
    """
)


def test_a_paused_holder_loses_its_lease_and_its_late_write_is_refused(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, k], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        token = json.loads(child.stdout.readline())["token"]
        child.send_signal(signal.SIGSTOP)
        try:
            # The holder is paused (a GC pause, a swapped-out VM): its lease expires, and a
            # waiting acquire takes the key over.
            usurper = c.acquire(k, "usurper", 60, wait=30)
            assert usurper.token > token
            c.put_snapshot(k, usurper.token, b"the usurper's")
        finally:
            child.send_signal(signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        result = json.loads(child.stdout.readline())
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert result["write"] == "stale_token"
    assert result["lost"] and result["reason"] in ("lapsing", "lease_lost")
    assert c.get_snapshot(k).body == b"the usurper's"
    status = c.get_lease(k)
    assert status.lease.token == usurper.token and status.state == "held"


def test_async_keeper_run_lets_the_work_end_and_reports_its_refused_write(url: str, key) -> None:
    async def main() -> None:
        async with snapfence.AsyncClient(url) as c:
            k = key()
            steps: list[str] = []

            with pytest.raises(snapfence.LeaseLost):
                async with c.hold(k, owner="w", ttl=3, renew_every=0.2) as lease:
                    lost = asyncio.Event()

                    async def work() -> None:
                        await lost.wait()
                        # The lease is lost while this write is about to go: it is not
                        # cancelled, it is sent, and its refusal is what the caller sees.
                        steps.append("writing")
                        await c.put_snapshot(k, lease.token, b"late")
                        steps.append("written")

                    async def take_over() -> snapfence.Grant:
                        await c.release(k, lease.token)
                        g = await c.acquire(k, "usurper", 60)
                        await asyncio.wait_for(lease.lost_event.wait(), 60)
                        lost.set()
                        return g

                    taker = asyncio.ensure_future(take_over())
                    with pytest.raises(snapfence.StaleToken):
                        await asyncio.wait_for(lease.run(work()), 60)
                    usurper = await taker
                    assert steps == ["writing"]
                    assert lease.lost_reason == "lease_lost"
            assert (await c.get_lease(k)).lease.token == usurper.token
            rejected = [r async for r in c.iter_rejections(key=k)]
            assert [r.presented_token for r in rejected] == [lease.token]

    asyncio.run(main())


def test_async_keeper_run_reports_a_loss_after_work_that_completed(url: str, key) -> None:
    async def main() -> None:
        async with snapfence.AsyncClient(url) as c:
            k = key()
            with pytest.raises(snapfence.LeaseLost):
                async with c.hold(k, owner="w", ttl=3, renew_every=0.2) as lease:

                    async def work() -> str:
                        await c.release(k, lease.token)
                        await asyncio.wait_for(lease.lost_event.wait(), 60)
                        return "done"

                    with pytest.raises(snapfence.LeaseLost) as e:
                        await lease.run(work())
                    assert e.value.work_completed and e.value.work_result == "done"

    asyncio.run(main())


def test_the_keepers_loss_is_the_contracts_lease_lost() -> None:
    assert snapfence.LostLease is snapfence.LeaseLost
    assert snapfence.ERRORS["lease_lost"] is snapfence.LeaseLost


def _hold_for(c: snapfence.Client, k: str, seconds: float) -> snapfence.Grant:
    """Another holder takes ``k`` now and releases it after ``seconds``."""
    g = c.acquire(k, "first", 60)
    t = threading.Timer(seconds, lambda: c.release(k, g.token))
    t.daemon = True
    t.start()
    return g


def test_a_grant_after_a_long_wait_runs_its_work_to_the_end(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    first = _hold_for(c, k, 4.0)
    losses: list[snapfence.LeaseLost] = []
    started = time.monotonic()
    with c.hold(k, owner="waiter", ttl=2, wait=20, on_lost=losses.append) as lease:
        waited = time.monotonic() - started
        assert waited >= 3.5, waited
        assert lease.token > first.token
        # Work of 1.5 TTLs, checking often: nothing says the lease is lost.
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            lease.raise_if_lost()
            time.sleep(0.05)
        c.put_snapshot(k, lease.token, b"finished")
        assert not lease.lost
    assert not losses
    assert c.get_snapshot(k).body == b"finished"
    assert c.get_lease(k).state == "released"


def test_an_async_grant_after_a_long_wait_runs_its_work_to_the_end(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    first = _hold_for(c, k, 4.0)
    losses: list[snapfence.LeaseLost] = []

    async def main() -> None:
        async with snapfence.AsyncClient(url) as ac:
            started = time.monotonic()
            async with ac.hold(k, owner="waiter", ttl=2, wait=20, on_lost=losses.append) as lease:
                assert time.monotonic() - started >= 3.5
                assert lease.token > first.token

                async def work() -> str:
                    end = time.monotonic() + 3.0
                    while time.monotonic() < end:
                        lease.raise_if_lost()
                        await asyncio.sleep(0.05)
                    await ac.put_snapshot(k, lease.token, b"finished")
                    return "finished"

                assert await lease.run(work()) == "finished"
                assert not lease.lost

    asyncio.run(main())
    assert not losses
    assert c.get_snapshot(k).body == b"finished"


def test_an_adopted_lease_is_kept_from_its_first_renewal(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "w", 2)
    time.sleep(1.0)  # half the TTL gone before the keeper adopts it
    with c.keep(g, renew_every=0.3) as lease:
        assert lease.token == g.token
        assert lease.deadline > time.monotonic() + 1.5
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            lease.raise_if_lost()
            time.sleep(0.1)
        c.put_snapshot(k, lease.token, b"kept")
    assert c.get_lease(k).state == "released"


def test_adopting_a_lease_that_ended_is_lease_lost(url: str, key) -> None:
    c = snapfence.Client(url)
    k = key()
    g = c.acquire(k, "w", 30)
    c.release(k, g.token)
    with pytest.raises(snapfence.LeaseLost):
        c.keep(g).start()


FROZEN_CHILD = textwrap.dedent(
    """
    import json, sys
    import snapfence

    url, key, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    c = snapfence.Client(url)
    out = {}
    if kind == "sync":
        lease = c.hold(key, owner="frozen", ttl=2, renew_every=0.3).start()
    else:
        import asyncio
        loop = asyncio.new_event_loop()
        ac = snapfence.AsyncClient(url)
        lease = loop.run_until_complete(ac.hold(key, owner="frozen", ttl=2, renew_every=0.3).start())
    c.put_snapshot(key, lease.token, b"before the freeze")
    print(json.dumps({"token": lease.token}), flush=True)
    sys.stdin.readline()  # the parent stops this process past its TTL here, then resumes it
    try:
        lease.raise_if_lost()
        c.put_snapshot(key, lease.token, b"after the freeze")
        out["write"] = "sent"
    except snapfence.LeaseLost as e:
        out["write"] = "not sent"
        out["reason"] = e.reason
    print(json.dumps(out), flush=True)
    """
)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_frozen_holder_learns_of_the_loss_at_its_next_check_before_writing(url: str, key, kind: str) -> None:
    c = snapfence.Client(url)
    k = key()
    child = subprocess.Popen(
        [sys.executable, "-c", FROZEN_CHILD, url, k, kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        token = json.loads(child.stdout.readline())["token"]
        child.send_signal(signal.SIGSTOP)
        try:
            time.sleep(3.0)  # past the TTL of 2 s
        finally:
            child.send_signal(signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        result = json.loads(child.stdout.readline())
        child.stdin.close()
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert result["write"] == "not sent", result
    assert result["reason"] in ("lapsing", "lease_lost"), result
    snap = c.get_snapshot(k)
    assert snap.body == b"before the freeze" and snap.version == 1 and snap.token == token
    assert list(c.iter_rejections(key=k)) == []


def test_async_keeper_declares_loss_before_the_deadline_when_the_service_is_frozen(server: Server, key) -> None:
    async def main() -> None:
        async with snapfence.AsyncClient(server.url, timeout=30) as c:
            with pytest.raises(snapfence.LostLease):
                async with c.hold(key(), owner="w", ttl=6, margin=3, renew_every=0.5) as lease:
                    first = lease.lease
                    while lease.lease.expires_at <= first.expires_at:
                        await asyncio.sleep(0.05)
                    server.freeze()
                    try:
                        await asyncio.wait_for(lease.lost_event.wait(), 60)
                        lost_wall = time.time()
                        expiry = lease.lease.expires_at.timestamp()
                    finally:
                        server.thaw()
                    assert lease.lost_reason == "lapsing" and lost_wall < expiry

    asyncio.run(main())


def test_a_margin_that_leaves_no_time_to_renew_is_refused(url: str, key) -> None:
    c = snapfence.Client(url)
    with pytest.raises(snapfence.InvalidRequest):
        c.hold(key(), owner="w", ttl=10, margin=10)
    with pytest.raises(snapfence.InvalidRequest):
        c.hold(key(), owner="w", ttl=10, margin=5, renew_every=5)


def test_a_released_lease_is_not_reported_lost_when_its_ttl_passes(url: str, key) -> None:
    c = snapfence.Client(url)
    losses: list[snapfence.LeaseLost] = []
    with c.hold(key(), owner="w", ttl=1, on_lost=losses.append) as lease:
        pass
    time.sleep(1.2)
    assert not lease.lost and lease.error is None and not losses


def test_async_keeper_run_reports_the_loss_behind_a_failing_work(url: str, key) -> None:
    async def main() -> None:
        async with snapfence.AsyncClient(url) as c:
            k = key()
            with pytest.raises(snapfence.LeaseLost):
                async with c.hold(k, owner="w", ttl=3, renew_every=0.2) as lease:

                    async def work() -> None:
                        await c.release(k, lease.token)
                        await asyncio.wait_for(lease.lost_event.wait(), 60)
                        raise RuntimeError("the work broke after the loss")

                    with pytest.raises(snapfence.LeaseLost) as e:
                        await lease.run(work())
                    assert isinstance(e.value.__cause__, RuntimeError)

    asyncio.run(main())
