"""The values of the contract, as frozen dataclasses read from its JSON and headers."""

from __future__ import annotations

import json as _json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Generic, List, Literal, Mapping, Optional, Tuple, TypeVar

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


#: A key's state, as ``GET /v1/leases/{key}`` tells it (and ``list_leases(state=)`` selects).
LeaseState = Literal["held", "expired", "released", "recovery_pending"]
#: Why a recovery record was kept.
RecoveryReason = Literal["abandoned", "expired", "recovery_required"]
#: Why a fenced write was refused.
RefusalReason = Literal["stale_token", "unknown_token"]
#: The kinds of change a watch delivers.
ChangeKind = Literal[
    "lease.granted",
    "lease.released",
    "lease.abandoned",
    "lease.expired",
    "lease.recovery_required",
    "lease.reconciled",
    "snapshot.written",
    "snapshot.deleted",
    "write.refused",
]


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp as an aware ``datetime`` (any number of fraction digits)."""
    m = _RFC3339.match(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    y, mo, d, h, mi, s, frac, z, sign, oh, om = m.groups()
    micros = int((frac or "0")[:6].ljust(6, "0"))
    if z:
        tz = timezone.utc
    else:
        offset = timedelta(hours=int(oh), minutes=int(om))
        tz = timezone(offset if sign == "+" else -offset)
    return datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), micros, tzinfo=tz)


def format_time(t: datetime) -> str:
    """An aware ``datetime`` as RFC 3339 in UTC with milliseconds, as the contract writes them."""
    if t.tzinfo is None:
        raise ValueError("a naive datetime has no zone; pass an aware one (e.g. with tzinfo=timezone.utc)")
    u = t.astimezone(timezone.utc)
    return u.strftime("%Y-%m-%dT%H:%M:%S.") + f"{u.microsecond // 1000:03d}Z"


def _opt_time(v: Any) -> Optional[datetime]:
    return None if v is None else parse_time(v)


@dataclass(frozen=True)
class Lease:
    """A lease as granted, renewed or stored. ``token`` is the fencing token to send with every
    fenced write; ``ttl`` is in seconds."""

    key: str
    owner: str
    token: int
    acquired_at: datetime
    expires_at: datetime
    ttl_ms: int
    metadata: Optional[Dict[str, Any]] = None
    crash_recovery: bool = False
    recovery_required: bool = False

    @property
    def ttl(self) -> float:
        """The TTL in seconds."""
        return self.ttl_ms / 1000.0

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Lease:
        return cls(
            key=j["key"],
            owner=j["owner"],
            token=int(j["token"]),
            acquired_at=parse_time(j["acquired_at"]),
            expires_at=parse_time(j["expires_at"]),
            ttl_ms=int(j["ttl_ms"]),
            metadata=j.get("metadata"),
            crash_recovery=bool(j.get("crash_recovery", False)),
            recovery_required=bool(j.get("recovery_required", False)),
        )


@dataclass(frozen=True)
class RecoveryRecord:
    """What a crashed, abandoning or marked holder left behind; ``reason`` is ``abandoned``,
    ``expired`` or ``recovery_required``."""

    owner: str
    token: int
    acquired_at: datetime
    ended_at: datetime
    reason: RecoveryReason
    metadata: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> RecoveryRecord:
        return cls(
            owner=j["owner"],
            token=int(j["token"]),
            acquired_at=parse_time(j["acquired_at"]),
            ended_at=parse_time(j["ended_at"]),
            reason=j["reason"],
            metadata=j.get("metadata"),
        )


def _opt_record(v: Any) -> Optional[RecoveryRecord]:
    return None if v is None else RecoveryRecord.from_json(v)


@dataclass(frozen=True)
class Grant:
    """The answer of a successful acquire: the new ``lease``; ``recovered`` is the recovery
    record a ``reconciled=True`` acquire replaced, ``recovery`` the record a ``reconciling=True``
    acquire (v1.2) keeps while it holds the key."""

    lease: Lease
    recovered: Optional[RecoveryRecord] = None
    recovery: Optional[RecoveryRecord] = None

    @property
    def token(self) -> int:
        return self.lease.token

    @property
    def key(self) -> str:
        return self.lease.key

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Grant:
        return cls(
            lease=Lease.from_json(j),
            recovered=_opt_record(j.get("recovered")),
            recovery=_opt_record(j.get("recovery")),
        )


@dataclass(frozen=True)
class Holder:
    """Who holds a key, as a ``lease_held`` problem tells it (its token is not shown)."""

    owner: str
    acquired_at: datetime
    expires_at: datetime
    metadata: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Holder:
        return cls(
            owner=j["owner"],
            acquired_at=parse_time(j["acquired_at"]),
            expires_at=parse_time(j["expires_at"]),
            metadata=j.get("metadata"),
        )


@dataclass(frozen=True)
class KeyStatus:
    """``GET /v1/leases/{key}``: ``state`` is ``held``, ``expired``, ``released`` or
    ``recovery_pending``; ``lease`` the newest lease (also when it ended)."""

    key: str
    state: LeaseState
    lease: Lease
    recovery: Optional[RecoveryRecord]
    newest_token: int

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> KeyStatus:
        return cls(
            key=j["key"],
            state=j["state"],
            lease=Lease.from_json(j["lease"]),
            recovery=_opt_record(j.get("recovery")),
            newest_token=int(j["newest_token"]),
        )


@dataclass(frozen=True)
class Waiter:
    """One waiting acquire in a key's queue (beyond the contract): ``position`` from 1 (the next
    to be granted the key), counted over the whole queue; ``owner`` the owner it asked for
    (``None`` for a waiter queued by a server too old to keep it); ``since`` when it took its
    place (database clock)."""

    position: int
    owner: Optional[str]
    since: datetime

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Waiter:
        return cls(position=int(j["position"]), owner=j.get("owner"), since=parse_time(j["since"]))


@dataclass(frozen=True)
class SnapshotMeta:
    """One stored version of a snapshot, without its body (``key`` is set in a write's answer and
    in :meth:`~snapfence.Client.list_snapshots`, ``None`` in a versions list)."""

    version: int
    token: int
    etag: str
    size: int
    content_type: str
    updated_at: datetime
    key: Optional[str] = None
    #: The fence the write named (contract v1.3; its own key when it named none).
    fencing_key: Optional[str] = None
    #: The version's ``Snapshot-Metadata`` (contract v1.3), or ``None``.
    metadata: Optional[Dict[str, Any]] = None
    #: In a transaction's result: whether the key had no current snapshot before.
    created: Optional[bool] = None

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> SnapshotMeta:
        return cls(
            version=int(j["version"]),
            token=int(j["token"]),
            etag=j["etag"],
            size=int(j["size"]),
            content_type=j["content_type"],
            updated_at=parse_time(j["updated_at"]),
            key=j.get("key"),
            fencing_key=j.get("fencing_key"),
            metadata=j.get("metadata"),
            created=j.get("created"),
        )


@dataclass(frozen=True)
class Snapshot:
    """A snapshot as read: its body and what the headers say about it (``body`` is empty for a
    ``HEAD``; ``size`` is the stored size either way)."""

    key: str
    body: bytes
    content_type: str
    etag: str
    token: int
    version: int
    last_modified: datetime
    size: int
    #: The ``Fencing-Key`` header: the fence of the write (contract v1.3).
    fencing_key: Optional[str] = None
    #: The ``Snapshot-Metadata`` header (contract v1.3), or ``None``.
    metadata: Optional[Dict[str, Any]] = None

    @property
    def text(self) -> str:
        """The body as UTF-8 text."""
        return self.body.decode("utf-8")

    def json(self) -> Any:
        """The body as JSON."""
        return _json.loads(self.body)


@dataclass(frozen=True)
class Rejection:
    """A refused fenced write or delete, from the audit log."""

    id: int
    at: datetime
    key: str
    reason: RefusalReason
    presented_token: Optional[int]
    highest_token: Optional[int]
    holder: Optional[str]
    operation: str
    request_id: Optional[str]
    remote_addr: Optional[str]
    principal: Optional[str]

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Rejection:
        return cls(
            id=int(j["id"]),
            at=parse_time(j["at"]),
            key=j["key"],
            reason=j["reason"],
            presented_token=j.get("presented_token"),
            highest_token=j.get("highest_token"),
            holder=j.get("holder"),
            operation=j["operation"],
            request_id=j.get("request_id"),
            remote_addr=j.get("remote_addr"),
            principal=j.get("principal"),
        )


@dataclass(frozen=True)
class Recovery:
    """A recovery record replaced by a reconciling acquire (or moved by ``reconciled``), from
    the audit log: the replaced ``recovery`` and who reconciled it."""

    id: int
    at: datetime
    key: str
    reason: str
    highest_token: Optional[int]
    holder: Optional[str]
    operation: str
    request_id: Optional[str]
    remote_addr: Optional[str]
    principal: Optional[str]
    recovery: Optional[RecoveryRecord]
    reconciled_by: Optional[str]

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Recovery:
        return cls(
            id=int(j["id"]),
            at=parse_time(j["at"]),
            key=j["key"],
            reason=j["reason"],
            highest_token=j.get("highest_token"),
            holder=j.get("holder"),
            operation=j["operation"],
            request_id=j.get("request_id"),
            remote_addr=j.get("remote_addr"),
            principal=j.get("principal"),
            recovery=_opt_record(j.get("recovery")),
            reconciled_by=j.get("reconciled_by"),
        )


#: The kinds of change a watch delivers.
CHANGE_KINDS: Tuple[ChangeKind, ...] = (
    "lease.granted",
    "lease.released",
    "lease.abandoned",
    "lease.expired",
    "lease.recovery_required",
    "lease.reconciled",
    "snapshot.written",
    "snapshot.deleted",
    "write.refused",
)


@dataclass(frozen=True)
class ChangeEvent:
    """One change from a watch: ``id`` (strictly increasing over the service), ``kind`` (one of
    :data:`CHANGE_KINDS`), and its data; the members a kind does not have are ``None``."""

    id: int
    kind: ChangeKind
    key: str
    token: int
    at: datetime
    owner: Optional[str] = None
    expires_at: Optional[datetime] = None
    version: Optional[int] = None
    etag: Optional[str] = None
    reason: Optional[str] = None
    audit_id: Optional[int] = None
    operation: Optional[str] = None
    highest_token: Optional[int] = None
    record_token: Optional[int] = None
    #: The fence of a write (contract v1.3).
    fencing_key: Optional[str] = None
    #: The id of the first change of the transaction this change is part of, and how many
    #: changes it made (contract v1.3); ``None`` outside a transaction.
    txn: Optional[int] = None
    txn_size: Optional[int] = None
    data: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, id: int, kind: ChangeKind, j: Mapping[str, Any]) -> ChangeEvent:
        return cls(
            id=id,
            kind=kind,
            key=j["key"],
            token=int(j["token"]),
            at=parse_time(j["at"]),
            owner=j.get("owner"),
            expires_at=_opt_time(j.get("expires_at")),
            version=j.get("version"),
            etag=j.get("etag"),
            reason=j.get("reason"),
            audit_id=j.get("audit_id"),
            operation=j.get("operation"),
            highest_token=j.get("highest_token"),
            record_token=j.get("record_token"),
            fencing_key=j.get("fencing_key"),
            txn=j.get("txn"),
            txn_size=j.get("txn_size"),
            data=dict(j),
        )


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: its ``items`` and the cursor of the next page (``None`` on the last)."""

    items: List[T]
    next_cursor: Optional[str]


@dataclass(frozen=True)
class TxnOp:
    """One operation of a transaction (contract v1.3): make them with :meth:`put`,
    :meth:`delete` and :meth:`delete_prefix`."""

    op: Literal["put", "delete", "delete_prefix"]
    key: Optional[str] = None
    prefix: Optional[str] = None
    body: Optional[bytes] = None
    content_type: Optional[str] = None
    metadata: Optional[Mapping[str, Any]] = None
    if_match: Optional[str] = None
    create_only: bool = False

    @classmethod
    def put(
        cls,
        key: str,
        body: bytes,
        *,
        content_type: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        if_match: Optional[str] = None,
        create_only: bool = False,
    ) -> TxnOp:
        """Writes ``body`` to ``key``; ``if_match`` depends on its current ETag,
        ``create_only`` on it having no current snapshot (``if_none_match: "*"``)."""
        return cls(
            "put",
            key=key,
            body=bytes(body),
            content_type=content_type,
            metadata=metadata,
            if_match=if_match,
            create_only=create_only,
        )

    @classmethod
    def delete(cls, key: str) -> TxnOp:
        """Deletes ``key``'s snapshot (no error when it has none)."""
        return cls("delete", key=key)

    @classmethod
    def delete_prefix(cls, prefix: str) -> TxnOp:
        """Deletes every snapshot under ``prefix``."""
        return cls("delete_prefix", prefix=prefix)


@dataclass(frozen=True)
class TxnResult:
    """One operation's outcome: a put's :class:`SnapshotMeta` (``put``), a delete's ``deleted``
    (``True``/``False``) or a delete_prefix's count."""

    op: Literal["put", "delete", "delete_prefix"]
    key: Optional[str]
    prefix: Optional[str]
    put: Optional[SnapshotMeta]
    deleted: int


@dataclass(frozen=True)
class TxnAnswer:
    """A committed transaction: its fence and one result per op, in order."""

    token: int
    fencing_key: str
    results: List[TxnResult]
