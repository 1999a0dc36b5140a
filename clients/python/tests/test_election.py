"""Leader election with three contenders: one leader at a time, each in turn as the others
resign, the leader's token fences its writes, and an observer sees every change of leader."""

from __future__ import annotations

import queue
import threading
from typing import List, Optional

import snapfence
from snapfence import Election, Leader


def test_three_contenders_lead_one_at_a_time(url: str, key) -> None:
    name = key("election")
    c = snapfence.Client(url)
    observed: List[Optional[Leader]] = []
    observing = threading.Event()

    def observe() -> None:
        seen = 0
        for leader in Election(c, name, candidate="observer").observe():
            observed.append(leader)
            observing.set()
            if leader is not None:
                seen += 1
            elif seen == 3:
                return

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    assert observing.wait(60)
    elected: queue.Queue[tuple[str, int]] = queue.Queue()
    resign = {name_: threading.Event() for name_ in ("a", "b", "c")}
    errors: List[BaseException] = []

    def contender(me: str) -> None:
        try:
            e = Election(snapfence.Client(url), name, candidate=me, ttl=5, renew_every=0.5)
            leadership = e.campaign(timeout=120)
            # The leader's token is its fencing token.
            e.client.put_snapshot(name, leadership.token, f"{me} leads")
            elected.put((me, leadership.token))
            assert resign[me].wait(120)
            assert not leadership.lost
            e.resign()
        except BaseException as ex:  # reported by the test below
            errors.append(ex)
            elected.put((me, -1))

    threads = [threading.Thread(target=contender, args=(me,)) for me in ("a", "b", "c")]
    for t in threads:
        t.start()
    order: List[tuple[str, int]] = []
    for _ in range(3):
        me, token = elected.get(timeout=120)
        assert token > 0, errors
        # Exactly one leader: the service says so, and it is the one that was elected.
        assert Election(c, name, candidate="x").leader() == Leader(me, token)
        assert c.get_snapshot(name).text == f"{me} leads"
        if order:
            # The deposed leader's token is refused now that a newer leader holds the key.
            prev_me, prev_token = order[-1]
            assert token > prev_token
            try:
                c.put_snapshot(name, prev_token, f"{prev_me} still thinks it leads")
                raise AssertionError("a deposed leader's write was accepted")
            except snapfence.StaleToken as e:
                assert e.highest_token == token
        order.append((me, token))
        resign[me].set()
    for t in threads:
        t.join(60)
    observer.join(60)
    assert not errors, errors
    assert sorted(me for me, _ in order) == ["a", "b", "c"]
    leaders = [leader for leader in observed if leader is not None]
    assert leaders == [Leader(me, token) for me, token in order], observed
    assert observed[0] is None and observed[-1] is None
    assert Election(c, name, candidate="x").leader() is None


def test_an_async_standby_elected_after_a_wait_keeps_its_leadership(url: str, key) -> None:
    import asyncio

    name = key("election")

    async def main() -> None:
        async with snapfence.AsyncClient(url) as c:
            a = snapfence.AsyncElection(c, name, candidate="a", ttl=2, renew_every=0.3)
            b = snapfence.AsyncElection(c, name, candidate="b", ttl=2, renew_every=0.3)
            leading = await a.campaign()
            standby = asyncio.ensure_future(b.campaign())
            await asyncio.sleep(3.0)  # b waits longer than its TTL
            await a.resign()
            leadership = await asyncio.wait_for(standby, 30)
            # Well past the TTL after the grant, b still leads with the token it was granted.
            for _ in range(30):
                leadership.raise_if_lost()
                await asyncio.sleep(0.1)
            assert leadership.token > leading.token
            assert await b.leader() == Leader("b", leadership.token)
            await c.put_snapshot(name, leadership.token, b"b leads")
            await b.resign()

    asyncio.run(main())
