"""What the sync and async keepers share: the lease as last proved live, when it lapses, and why
it was lost. The deadline is dated from the request that last proved the lease live: a grant
that waited in the queue is renewed at once, so a long wait does not read as a lapsing lease."""

from __future__ import annotations

import threading
import time
from typing import Optional, Tuple

from ._errors import LeaseLost, LossReason, SnapfenceError
from ._types import Lease

LEASE_LOST: LossReason = "lease_lost"
LAPSING: LossReason = "lapsing"
REFUSED: LossReason = "refused"

#: An acquire whose answer took longer than this part of the TTL (a grant that waited in the
#: queue, a slow network) is renewed at once: its send time is too far from the grant to date
#: the lease from it.
SLOW_GRANT = 0.1


class KeeperState:
    """The keeper's view of its lease: the newest answer and when the request that proved it
    live was *sent*. The server measured the TTL from a later moment (when it received it), so
    ``sent + ttl`` is never after the server's expiry, whatever the clocks say; the lease is lost
    ``margin`` before that, on the monotonic clock, whoever looks first (the keeper's loop or a
    holder's check after a pause)."""

    def __init__(self, lease: Lease, sent: float, margin: float, every: float) -> None:
        self._mu = threading.Lock()
        self._lease = lease
        self._sent = sent
        self.margin = margin
        self.every = every
        self.reason: Optional[LossReason] = None
        self.error: Optional[LeaseLost] = None

    def held(self) -> Tuple[Lease, float]:
        with self._mu:
            return self._lease, self._sent

    def renewed(self, lease: Lease, sent: float) -> None:
        """A renewal sent at ``sent`` answered ``lease``. Never moves the deadline back (an
        answer to an older request arriving late), and a lost lease stays lost."""
        with self._mu:
            if self.error is None and sent >= self._sent:
                self._lease, self._sent = lease, sent

    def replaced(self, lease: Lease) -> None:
        """The lease as a call that did not renew it answered (``reconciled``)."""
        with self._mu:
            if lease.token == self._lease.token:
                self._lease = lease

    @property
    def lease(self) -> Lease:
        return self.held()[0]

    @property
    def deadline(self) -> float:
        """The latest the lease can end unless renewed again: the send time of the request that
        last proved it live plus the TTL, on ``time.monotonic()``'s clock."""
        lease, sent = self.held()
        return sent + lease.ttl

    def lapse(self) -> float:
        return self.deadline - self.margin

    def lost_by(self, error: SnapfenceError) -> Tuple[LossReason, str]:
        if isinstance(error, LeaseLost):
            return (
                LEASE_LOST,
                "the server answered lease_lost: the lease expired, was released or was superseded",
            )
        return REFUSED, f"a renewal was refused: {error}"

    def declare(
        self, reason: LossReason, detail: str, cause: Optional[BaseException]
    ) -> Tuple[LeaseLost, bool]:
        """The loss, and whether this call declared it (only the first does: the loop and a
        holder's check may both see it)."""
        with self._mu:
            if self.error is not None:
                return self.error, False
            lease = self._lease
            e = LeaseLost(
                f"lease of {lease.key!r} (token {lease.token}) lost: {detail}", reason=reason, cause=cause
            )
            self.reason = reason
            self.error = e
            return e, True

    def lapsing(self, last_error: Optional[SnapfenceError]) -> Tuple[LeaseLost, bool]:
        if last_error is None:
            detail = (
                "the lease is about to lapse and no renewal proved it live in time "
                "(was the process paused or starved past its TTL?)"
            )
        else:
            detail = f"renewals kept failing and the lease is about to lapse (last failure: {last_error})"
        return self.declare(LAPSING, detail, last_error)

    def check(self, last_error: Optional[SnapfenceError] = None) -> Tuple[Optional[LeaseLost], bool]:
        """The loss if the lease is lost, by an earlier declaration or by the clock now (the
        deadline minus the margin has passed), and whether this call declared it."""
        if self.error is not None:
            return self.error, False
        if time.monotonic() >= self.lapse():
            return self.lapsing(last_error)
        return None, False

    @staticmethod
    def now() -> float:
        return time.monotonic()


def slow_grant(sent: float, received: float, ttl: float) -> bool:
    """Whether a grant's answer came too long after its request was sent to date it from that."""
    return received - sent > ttl * SLOW_GRANT
