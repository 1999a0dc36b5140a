"""What the sync and async keepers share: the lease as last renewed, when it lapses, and why it
was lost."""

from __future__ import annotations

import threading
import time
from typing import Optional, Tuple

from ._errors import LeaseLost, LostLease, SnapfenceError
from ._types import Lease

LEASE_LOST = "lease_lost"
LAPSING = "lapsing"
REFUSED = "refused"


class KeeperState:
    """The keeper's view of its lease: the newest answer and when its renewal was *sent*. The
    server measured the TTL from a later moment (when it received it), so ``sent + ttl`` is never
    after the server's expiry, whatever the clocks say; the keeper declares the lease lost
    ``margin`` before that, on the monotonic clock."""

    def __init__(self, lease: Lease, sent: float, margin: float, every: float) -> None:
        self._mu = threading.Lock()
        self._lease = lease
        self._sent = sent
        self.margin = margin
        self.every = every
        self.reason: Optional[str] = None
        self.error: Optional[LostLease] = None

    def held(self) -> Tuple[Lease, float]:
        with self._mu:
            return self._lease, self._sent

    def renewed(self, lease: Lease, sent: float) -> None:
        with self._mu:
            self._lease, self._sent = lease, sent

    @property
    def lease(self) -> Lease:
        return self.held()[0]

    @property
    def deadline(self) -> float:
        """The latest the lease can end unless renewed again: the send time of the last
        successful renewal (or the acquire) plus the TTL, on ``time.monotonic()``'s clock."""
        lease, sent = self.held()
        return sent + lease.ttl

    def lapse(self) -> float:
        return self.deadline - self.margin

    def lost_by(self, error: SnapfenceError) -> Tuple[str, str]:
        if isinstance(error, LeaseLost):
            return (
                LEASE_LOST,
                "the server answered lease_lost: the lease expired, was released or was superseded",
            )
        return REFUSED, f"a renewal was refused: {error}"

    def declare(self, reason: str, detail: str, cause: Optional[BaseException]) -> LostLease:
        lease = self.lease
        e = LostLease(
            f"lease of {lease.key!r} (token {lease.token}) lost: {detail}", reason=reason, cause=cause
        )
        self.reason = reason
        self.error = e
        return e

    def lapsing(self, last_error: Optional[SnapfenceError]) -> LostLease:
        if last_error is None:
            detail = "the lease is about to lapse before it could be renewed"
        else:
            detail = f"renewals kept failing and the lease is about to lapse (last failure: {last_error})"
        return self.declare(LAPSING, detail, last_error)

    @staticmethod
    def now() -> float:
        return time.monotonic()
