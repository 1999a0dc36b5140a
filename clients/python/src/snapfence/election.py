"""Leader election on a key: the recipe of Curator's ``LeaderLatch``, client-go's
``leaderelection`` and etcd's ``concurrency.Election``, built on the waiting acquire (candidates
are served in the order they asked) and the watch.

- :meth:`Election.campaign` blocks until this candidate leads and returns its
  :class:`~snapfence.LeaseKeeper`: the lease is renewed in the background, ``leadership.token``
  is the leader's fencing token (send it with every write the leader makes, and a deposed
  leader's writes are refused; with contract v1.3, ``fencing_key=name`` fences the keys under
  ``name/`` too), and ``leadership.lost`` says when to stop leading. The grant that ends the
  wait in the queue is renewed at once and dated from that renewal, so a long wait never reads
  as a lapsing lease: one failover grants one token, and it is kept.
- :meth:`Election.resign` (or leaving the keeper's ``with`` block) hands leadership to the next
  candidate at once.
- :meth:`Election.observe` follows who leads: the current leader, then each change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator, Optional

from ._async import AsyncClient, AsyncLeaseKeeper
from ._core import Seconds, seconds
from ._errors import LeaseHeld, LeaseLost, NotFound
from ._sync import Client, LeaseKeeper
from ._types import ChangeEvent, KeyStatus

#: The longest one waiting acquire waits (the contract's bound); a campaign asks again after it.
MAX_WAIT = 300.0


@dataclass(frozen=True)
class Leader:
    """Who leads: the owner (candidate name) and its lease's fencing token."""

    owner: str
    token: int


def _leader_of(status: KeyStatus) -> Optional[Leader]:
    if status.state == "held":
        return Leader(status.lease.owner, status.lease.token)
    return None


class _Follow:
    """Who leads, from a status read and the changes after it (changes the watch delivers that
    the read already saw are recognised by their tokens and passed over)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.current: Optional[Leader] = None
        self.newest = 0

    def read(self, status: Optional[KeyStatus]) -> Optional[Leader]:
        if status is not None:
            self.newest = status.newest_token
            self.current = _leader_of(status)
        return self.current

    def change(self, ev: ChangeEvent) -> bool:
        """Whether ``ev`` changed the leader."""
        if ev.key != self.name:
            return False
        if ev.kind == "lease.granted" and ev.token > self.newest:
            self.newest = ev.token
            self.current = Leader(ev.owner or "", ev.token)
            return True
        if ev.kind in ("lease.released", "lease.expired", "lease.abandoned"):
            if self.current is not None and ev.token == self.current.token:
                self.current = None
                return True
        return False


class Election:
    """An election named ``name`` (a key: use one no lease or snapshot of yours uses), in which
    this process runs as ``candidate`` with leases of ``ttl`` seconds."""

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        candidate: str,
        ttl: Seconds = 15.0,
        margin: Optional[Seconds] = None,
        renew_every: Optional[Seconds] = None,
        on_lost: Optional[Callable[[LeaseLost], None]] = None,
    ) -> None:
        self.client = client
        self.name = name
        self.candidate = candidate
        self.ttl = ttl
        self.margin = margin
        self.renew_every = renew_every
        self.on_lost = on_lost
        self.leadership: Optional[LeaseKeeper] = None

    def campaign(self, timeout: Optional[Seconds] = None) -> LeaseKeeper:
        """Waits until this candidate leads (in the order the candidates asked) and returns its
        running keeper. Raises :class:`~snapfence.LeaseHeld` if ``timeout`` passes first."""
        until = None if timeout is None else time.monotonic() + seconds(timeout)
        while True:
            left = MAX_WAIT if until is None else min(MAX_WAIT, until - time.monotonic())
            keeper = self.client.hold(
                self.name,
                self.candidate,
                self.ttl,
                wait=max(left, 0.0),
                margin=self.margin,
                renew_every=self.renew_every,
                on_lost=self.on_lost,
            )
            try:
                keeper.start()
            except LeaseHeld:
                if until is not None and time.monotonic() >= until:
                    raise
                continue
            except LeaseLost:
                continue  # the grant ended before it could be kept: queue again
            self.leadership = keeper
            return keeper

    def resign(self) -> None:
        """Gives leadership up: the next candidate in line leads at once."""
        keeper, self.leadership = self.leadership, None
        if keeper is not None:
            keeper.release()

    def leader(self) -> Optional[Leader]:
        """Who leads now, or ``None``."""
        try:
            return _leader_of(self.client.get_lease(self.name))
        except NotFound:
            return None

    def observe(self) -> Iterator[Optional[Leader]]:
        """The current leader (``None`` for none), then each change of leader, as it happens."""
        follow = _Follow(self.name)
        with self.client.watch(prefix=self.name).open() as watch:
            try:
                status: Optional[KeyStatus] = self.client.get_lease(self.name)
            except NotFound:
                status = None
            yield follow.read(status)
            for ev in watch:
                if follow.change(ev):
                    yield follow.current


class AsyncElection:
    """The asyncio form of :class:`Election`."""

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        candidate: str,
        ttl: Seconds = 15.0,
        margin: Optional[Seconds] = None,
        renew_every: Optional[Seconds] = None,
        on_lost: Optional[Callable[[LeaseLost], None]] = None,
    ) -> None:
        self.client = client
        self.name = name
        self.candidate = candidate
        self.ttl = ttl
        self.margin = margin
        self.renew_every = renew_every
        self.on_lost = on_lost
        self.leadership: Optional[AsyncLeaseKeeper] = None

    async def campaign(self, timeout: Optional[Seconds] = None) -> AsyncLeaseKeeper:
        until = None if timeout is None else time.monotonic() + seconds(timeout)
        while True:
            left = MAX_WAIT if until is None else min(MAX_WAIT, until - time.monotonic())
            keeper = self.client.hold(
                self.name,
                self.candidate,
                self.ttl,
                wait=max(left, 0.0),
                margin=self.margin,
                renew_every=self.renew_every,
                on_lost=self.on_lost,
            )
            try:
                await keeper.start()
            except LeaseHeld:
                if until is not None and time.monotonic() >= until:
                    raise
                continue
            except LeaseLost:
                continue  # the grant ended before it could be kept: queue again
            self.leadership = keeper
            return keeper

    async def resign(self) -> None:
        keeper, self.leadership = self.leadership, None
        if keeper is not None:
            await keeper.release()

    async def leader(self) -> Optional[Leader]:
        try:
            return _leader_of(await self.client.get_lease(self.name))
        except NotFound:
            return None

    async def observe(self) -> AsyncIterator[Optional[Leader]]:
        follow = _Follow(self.name)
        watch = await self.client.watch(prefix=self.name).open()
        async with watch:
            try:
                status: Optional[KeyStatus] = await self.client.get_lease(self.name)
            except NotFound:
                status = None
            yield follow.read(status)
            async for ev in watch:
                if follow.change(ev):
                    yield follow.current
