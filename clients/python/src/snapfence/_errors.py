"""Every way a call can fail: one exception per code of the contract, plus the failures of the
transport and of answers that are not the contract's.

Every class answered by the server has a ``code`` (the contract's machine-readable name) and the
``status`` it is answered with; :data:`ERRORS` maps each code to its class. A test of the package
reads the server's code table (``crates/snapfence-types/src/error.rs``) and ``openapi.yaml`` and
fails if a code has no class here, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, Literal, Optional, Type

from ._types import Holder, RecoveryRecord


class SnapfenceError(Exception):
    """A failed call. ``detail`` is the server's explanation (what happened, what to do next)."""

    #: The contract's code; ``None`` for failures that are not an answer with a code.
    code: ClassVar[Optional[str]] = None
    #: The HTTP status the code is answered with.
    status: ClassVar[Optional[int]] = None

    def __init__(
        self,
        detail: str,
        *,
        request_id: Optional[str] = None,
        problem: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        #: The answer's ``x-request-id``, to find the server's log of it.
        self.request_id = request_id
        #: The problem+json body as sent, when there was one.
        self.problem: Dict[str, Any] = problem or {}

    @property
    def is_transient(self) -> bool:
        """Whether the same call may succeed later without anything else changing (the network,
        a 5xx, a limit of the server): the client retries these, writes included."""
        return False

    @property
    def is_indeterminate(self) -> bool:
        """Whether a write that failed this way may still have been applied. Always ``False``
        for an answer with a contract code other than ``indeterminate``: those changed nothing."""
        return False


class InvalidRequest(SnapfenceError):
    """``400 invalid_request``: malformed input (a bad key, a TTL out of the server's bounds...).
    Also raised without sending anything for input the client can tell is invalid."""

    code = "invalid_request"
    status = 400


class TokenRequired(SnapfenceError):
    """``428 token_required``: a fenced call without a ``Fencing-Token``."""

    code = "token_required"
    status = 428


class LeaseHeld(SnapfenceError):
    """``409 lease_held``: another lease on the key is live; ``holder`` says whose, until when.

    ``state`` is the key's state as the acquire found it: ``"held"``, or the free state of a key
    that goes to the ``waiters`` waiting acquires queued first (``holder`` is then the last
    holder). Both are ``None`` from a server that does not say."""

    code = "lease_held"
    status = 409

    def __init__(
        self,
        detail: str,
        *,
        holder: Optional[Holder] = None,
        state: Optional[str] = None,
        waiters: Optional[int] = None,
        **kw: Any,
    ) -> None:
        super().__init__(detail, **kw)
        self.holder = holder
        self.state = state
        self.waiters = waiters


class RecoveryRequired(SnapfenceError):
    """``409 recovery_required``: a recovery record blocks the grant until it is reconciled."""

    code = "recovery_required"
    status = 409

    def __init__(self, detail: str, *, recovery: Optional[RecoveryRecord] = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.recovery = recovery


#: Why a lease was lost: the server answered ``lease_lost``; renewals kept failing (or the
#: process did not run) until less than the margin was left before the deadline; or a renewal
#: was refused in a way retrying cannot change.
LossReason = Literal["lease_lost", "lapsing", "refused"]


class LeaseLost(SnapfenceError):
    """``409 lease_lost``: the token is not the key's live lease, and also a keeper's loss of
    its lease (:meth:`~snapfence.LeaseKeeper.raise_if_lost`, leaving its block, ``run``). Either
    way: stop the work the lease guards.

    ``reason`` is ``"lease_lost"`` for the server's answer (and a renewal that got it),
    ``"lapsing"`` when the keeper could not prove the lease live before the deadline minus the
    margin (renewals kept failing, or the process was paused), ``"refused"`` when a renewal was
    refused for good; ``cause`` is the failure behind it, if any. ``LostLease`` is another name
    of this class."""

    code = "lease_lost"
    status = 409

    def __init__(
        self,
        detail: str,
        *,
        reason: LossReason = "lease_lost",
        cause: Optional[BaseException] = None,
        **kw: Any,
    ) -> None:
        super().__init__(detail, **kw)
        self.reason: LossReason = reason
        self.cause = cause
        #: For a loss ``run`` reports after its work ended: whether the work returned, and what.
        self.work_completed = False
        self.work_result: Any = None


class _Refused(SnapfenceError):
    """A refused fenced write, recorded in the audit log."""

    def __init__(
        self,
        detail: str,
        *,
        presented_token: Optional[int] = None,
        highest_token: Optional[int] = None,
        audit_id: Optional[int] = None,
        key: Optional[str] = None,
        fencing_key: Optional[str] = None,
        **kw: Any,
    ) -> None:
        super().__init__(detail, **kw)
        self.presented_token = presented_token
        self.highest_token = highest_token
        self.audit_id = audit_id
        #: The key the write failed on and the fence it named (contract v1.3), when sent.
        self.key = key
        self.fencing_key = fencing_key


class StaleToken(_Refused):
    """``409 stale_token``: a fenced write with a superseded token, or the token of a lease its
    holder released or abandoned. ``presented_token``, ``highest_token``, ``audit_id``."""

    code = "stale_token"
    status = 409


class UnknownToken(_Refused):
    """``409 unknown_token``: a fenced write with a token never issued for the key
    (``highest_token`` is ``None`` for a key that never had a lease)."""

    code = "unknown_token"
    status = 409


class PreconditionFailed(SnapfenceError):
    """``412 precondition_failed``: ``If-Match`` did not match the current snapshot; in a
    transaction (v1.3), ``op_index`` is the op whose precondition failed."""

    code = "precondition_failed"
    status = 412

    def __init__(self, detail: str, *, op_index: Optional[int] = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.op_index = op_index


class NotFound(SnapfenceError):
    """``404 not_found``: no such lease, snapshot, version or endpoint."""

    code = "not_found"
    status = 404


class MethodNotAllowed(SnapfenceError):
    """``405 method_not_allowed``: the path exists but does not take this method."""

    code = "method_not_allowed"
    status = 405


class RequestTimeout(SnapfenceError):
    """``408 request_timeout``: the request body did not arrive within the server's timeout."""

    code = "request_timeout"
    status = 408


class PayloadTooLarge(SnapfenceError):
    """``413 payload_too_large``: the body is over the server's limit; nothing was stored."""

    code = "payload_too_large"
    status = 413


class Unauthorized(SnapfenceError):
    """``401 unauthorized``: authentication is configured and the request had no live API key."""

    code = "unauthorized"
    status = 401


class Forbidden(SnapfenceError):
    """``403 forbidden``: the API key may not do this, or not to this key."""

    code = "forbidden"
    status = 403


class Internal(SnapfenceError):
    """``500 internal``: a bug of the server, logged with the request's ``x-request-id``. Its
    outcome is not known, so the client retries it like any 5xx."""

    code = "internal"
    status = 500

    @property
    def is_transient(self) -> bool:
        return True

    @property
    def is_indeterminate(self) -> bool:
        return True


class Unavailable(SnapfenceError):
    """``503 unavailable``: the server cannot reach its database; nothing was changed."""

    code = "unavailable"
    status = 503

    def __init__(self, detail: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.retry_after = retry_after

    @property
    def is_transient(self) -> bool:
        return True


class Indeterminate(SnapfenceError):
    """The outcome of a write is not known: it may or may not have taken effect.

    Either the server said so (``503 indeterminate``: it sent the statement to its database and
    cannot tell whether it committed) on every attempt, or an earlier attempt's answer was lost
    and the later attempts only said that *they* changed nothing (``unavailable``, ``429``, no
    connection). Find out by reading: the snapshot's ``ETag``/``Fencing-Token``/version for a
    put, the key's lease status for an acquire, release or abandon."""

    code = "indeterminate"
    status = 503

    def __init__(self, detail: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.retry_after = retry_after

    @property
    def is_transient(self) -> bool:
        return True

    @property
    def is_indeterminate(self) -> bool:
        return True


class IdempotencyKeyReused(SnapfenceError):
    """``422 idempotency_key_reused``: the call's ``Idempotency-Key`` was used before for
    another request. The client makes a fresh key per call, so this means a bug."""

    code = "idempotency_key_reused"
    status = 422


class RequestInProgress(SnapfenceError):
    """``409 request_in_progress``: an earlier attempt of this call (same ``Idempotency-Key``)
    is still running on the server; the client retries, and gets that attempt's answer."""

    code = "request_in_progress"
    status = 409

    def __init__(self, detail: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.retry_after = retry_after


class TooManyRequests(SnapfenceError):
    """``429 too_many_requests``: the API key is at a limit of the server; nothing changed. The
    client retries after ``retry_after`` seconds."""

    code = "too_many_requests"
    status = 429

    def __init__(self, detail: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.retry_after = retry_after

    @property
    def is_transient(self) -> bool:
        return True


class Compacted(SnapfenceError):
    """``410 compacted``: a watch resumed after a change older than the retained history. Read
    the current state again, then watch without ``since``."""

    code = "compacted"
    status = 410


# ---- Failures that are not an answer with a code -----------------------------------------------


class TransportError(SnapfenceError):
    """The request or its answer did not make it across the network. ``may_have_reached`` is
    ``False`` only when no connection could be made, so nothing was sent."""

    def __init__(self, detail: str, *, may_have_reached: bool, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.may_have_reached = may_have_reached
        #: ``False`` for a failure that will not pass by itself (a certificate not trusted).
        self.retryable = True

    @property
    def is_transient(self) -> bool:
        return self.retryable

    @property
    def is_indeterminate(self) -> bool:
        return self.may_have_reached


class UnexpectedAnswer(SnapfenceError):
    """An answer the contract does not name (a proxy's 502, a code this client does not know)."""

    def __init__(self, detail: str, *, http_status: int, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.http_status = http_status

    @property
    def is_transient(self) -> bool:
        return self.http_status >= 500

    @property
    def is_indeterminate(self) -> bool:
        return self.http_status >= 500


class ProtocolError(SnapfenceError):
    """An answer that should follow the contract but does not (a body that is not the
    contract's JSON, a missing header). Is the URL a snapfence server?"""

    @property
    def is_transient(self) -> bool:
        return True

    @property
    def is_indeterminate(self) -> bool:
        return True


#: The keeper's loss is the contract's ``lease_lost``: one class, two names.
LostLease = LeaseLost


#: Each code of the contract, and the class that stands for it.
ERRORS: Dict[str, Type[SnapfenceError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        TokenRequired,
        LeaseHeld,
        RecoveryRequired,
        LeaseLost,
        StaleToken,
        UnknownToken,
        PreconditionFailed,
        NotFound,
        MethodNotAllowed,
        RequestTimeout,
        PayloadTooLarge,
        Unauthorized,
        Forbidden,
        Internal,
        Unavailable,
        Indeterminate,
        IdempotencyKeyReused,
        RequestInProgress,
        TooManyRequests,
        Compacted,
    )
    if cls.code is not None
}
