"""The protocol without I/O: how each call is written, which failed attempts are retried and
after how long, how answers and their errors are read, and how a watch's event stream is parsed.
:class:`~snapfence.Client` and :class:`~snapfence.AsyncClient` are thin drivers of this module:
they only send what it builds and sleep for as long as it says."""

from __future__ import annotations

import base64
import json
import random
import ssl
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Dict, Generic, List, Literal, Mapping, Optional, Tuple, TypeVar, Union
from urllib.parse import quote, unquote

import httpx

from ._errors import (
    ERRORS,
    Indeterminate,
    InvalidRequest,
    LeaseHeld,
    PreconditionFailed,
    ProtocolError,
    RecoveryRequired,
    RequestInProgress,
    SnapfenceError,
    TooManyRequests,
    TransportError,
    Unavailable,
    UnexpectedAnswer,
    _Refused,
)
from ._trace import trace_headers
from ._types import (
    CHANGE_KINDS,
    ChangeEvent,
    Grant,
    Holder,
    KeyStatus,
    Lease,
    LeaseState,
    Page,
    Recovery,
    RecoveryRecord,
    Rejection,
    Snapshot,
    SnapshotMeta,
    TxnAnswer,
    TxnOp,
    TxnResult,
    Waiter,
    format_time,
    parse_time,
)

T = TypeVar("T")

#: Seconds, as a number or a ``timedelta``.
Seconds = Union[float, int, timedelta]

READ = "read"
CHANGE = "change"


def seconds(v: Seconds) -> float:
    return v.total_seconds() if isinstance(v, timedelta) else float(v)


def millis(v: Seconds) -> int:
    return int(round(seconds(v) * 1000))


# ---- Retries ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How failed attempts are retried: ``max_attempts`` in all (the first included; 1 never
    retries); the pause before retry *n* is ``initial_backoff * 2**(n-1)`` capped at
    ``max_backoff``, of which a random part of up to a half is taken off so that many clients
    failing together do not retry together. Seconds."""

    max_attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 2.0

    def backoff(self, n: int) -> float:
        full = min(self.initial_backoff * (2.0 ** max(n - 1, 0)), self.max_backoff)
        return full * random.uniform(0.5, 1.0)


def jittered(d: float) -> float:
    return d * random.uniform(0.5, 1.0)


def may_retry(kind: str, e: SnapfenceError) -> bool:
    """Whether a failed attempt of a call of ``kind`` may be tried again: whenever the same call
    may succeed later, and for a change also while the server still runs an earlier attempt."""
    return e.is_transient or (kind == CHANGE and isinstance(e, RequestInProgress))


def after_unknown_attempt(e: SnapfenceError, call: str) -> SnapfenceError:
    """The last attempt's failure as it reads for the whole call when an earlier attempt's outcome
    was unknown: an answer that only says *this* attempt changed nothing leaves the call
    :class:`Indeterminate`; any other answer settles it and is kept."""
    this_attempt_only = isinstance(e, (Unavailable, TooManyRequests, RequestInProgress)) or (
        isinstance(e, TransportError) and not e.may_have_reached
    )
    if not this_attempt_only:
        return e
    out = Indeterminate(
        f"an earlier attempt of {call} may have taken effect (its answer was lost), and the last "
        f"attempt said only that it changed nothing itself ({e}); check what happened before you retry",
        request_id=e.request_id,
    )
    out.__cause__ = e
    return out


# ---- Calls ------------------------------------------------------------------------------------


@dataclass
class Answer:
    """A buffered answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass
class Call(Generic[T]):
    """One call of the contract: what to send, which statuses succeed, how to read the answer."""

    kind: str
    method: str
    path: str
    ok: Tuple[int, ...]
    parse: Callable[[Answer], T]
    params: List[Tuple[str, str]] = field(default_factory=list)
    headers: Dict[str, str] = field(default_factory=dict)
    content: Optional[bytes] = None
    #: Seconds the server may take on purpose beyond the usual bound (a waiting acquire's wait).
    extra_time: float = 0.0

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


class Attempts(Generic[T]):
    """The attempts of one call: the headers of each, and after each its outcome (a value, a
    pause before the next attempt, or the error that ends the call)."""

    def __init__(self, call: Call[T], policy: RetryPolicy, trace: Optional[Dict[str, str]] = None) -> None:
        self.call = call
        self.policy = policy
        #: One fresh key per changing call, the same on every attempt.
        self.idempotency_key = str(uuid.uuid4()) if call.kind == CHANGE else None
        #: The caller's trace context, as it is when the call is made (or as a keeper took it
        #: when it started, for the renewals it makes on its own), on every attempt.
        self.trace = trace_headers() if trace is None else trace
        self.attempt = 1
        self.earlier_unknown = False

    def headers(self) -> Dict[str, str]:
        h = dict(self.trace)
        h.update(self.call.headers)
        if self.idempotency_key is not None:
            h["Idempotency-Key"] = self.idempotency_key
        return h

    def outcome(self, answer: Union[Answer, SnapfenceError]) -> Tuple[str, Any]:
        """``("done", value)``, ``("retry", (error, pause))`` or ``("fail", error)``."""
        if isinstance(answer, Answer):
            if answer.status in self.call.ok:
                try:
                    return ("done", self.call.parse(answer))
                except SnapfenceError as e:
                    error: SnapfenceError = e
                except (KeyError, TypeError, ValueError) as e:
                    error = ProtocolError(f"the answer to {self.call} is not the contract's: {e!r}")
            else:
                error = error_of(answer, str(self.call))
        else:
            error = answer
        if self.attempt >= self.policy.max_attempts or not may_retry(self.call.kind, error):
            if self.earlier_unknown:
                error = after_unknown_attempt(error, str(self.call))
            return ("fail", error)
        if self.call.kind == CHANGE and (error.is_indeterminate or isinstance(error, RequestInProgress)):
            self.earlier_unknown = True
        pause = pause_before_retry(self.policy, error, self.attempt)
        self.attempt += 1
        return ("retry", (error, pause))


def pause_before_retry(policy: RetryPolicy, error: SnapfenceError, attempt: int) -> float:
    """The backoff of retry ``attempt``; a server that said when to come back is believed."""
    pause = policy.backoff(attempt)
    asked = getattr(error, "retry_after", None)
    if isinstance(asked, (int, float)):
        pause = max(pause, float(asked))
    return pause


def transport_error(e: BaseException, what: str) -> TransportError:
    """An ``httpx`` failure, classified by whether anything can have reached the server: only a
    failure to connect proves that nothing did. A certificate the client does not trust is not
    retried: it will not pass by itself."""
    reached = not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
    cause: Optional[BaseException] = e
    untrusted = False
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            untrusted = True
        cause = cause.__cause__ or cause.__context__
    if reached:
        msg = f"{what}: the connection failed after the request was sent, so it may or may not have taken effect ({e!r})"
    else:
        msg = f"{what}: could not connect to the server, so nothing was sent ({e!r})"
    out = TransportError(msg, may_have_reached=reached)
    out.retryable = not untrusted
    out.__cause__ = e
    return out


# ---- Errors from answers -------------------------------------------------------------------------


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    v = headers.get("retry-after")
    if v is None:
        return None
    try:
        return float(v.strip())
    except ValueError:
        try:
            when = parsedate_to_datetime(v)
            return max(0.0, (when - datetime.now(when.tzinfo)).total_seconds())
        except (TypeError, ValueError):
            return None


def _snippet(body: bytes) -> Optional[str]:
    try:
        text = body.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    line = text.splitlines()[0].strip() if text else ""
    return line[:200] or None


def error_of(answer: Answer, what: str) -> SnapfenceError:
    """The error a non-success answer stands for."""
    status, headers, body = answer.status, answer.headers, answer.body
    request_id = headers.get("x-request-id")
    ctype = headers.get("content-type", "")
    if ctype.startswith("application/problem+json") and body:
        try:
            problem = json.loads(body)
            if not isinstance(problem, dict):
                raise ValueError("not an object")
        except ValueError as e:
            return ProtocolError(f"the {status} answer to {what} is not a problem of the contract: {e}")
        code = problem.get("code")
        if isinstance(code, str):
            detail = str(problem.get("detail") or problem.get("title") or code)
            cls = ERRORS.get(code)
            if cls is None:
                return UnexpectedAnswer(detail, http_status=status, request_id=request_id, problem=problem)
            try:
                return _decode(cls, detail, problem, headers, request_id)
            except (KeyError, TypeError, ValueError) as e:
                return ProtocolError(
                    f"a {code} problem without the members of the contract ({e!r}): {detail}"
                )
    snippet = _snippet(body)
    detail = f"{status} to {what}" + (f": {snippet}" if snippet else "")
    by_status = {404: "not_found", 401: "unauthorized", 403: "forbidden", 413: "payload_too_large"}
    if status in by_status:
        return ERRORS[by_status[status]](detail, request_id=request_id)
    return UnexpectedAnswer(detail, http_status=status, request_id=request_id)


def _decode(
    cls: type, detail: str, p: Dict[str, Any], headers: Mapping[str, str], request_id: Optional[str]
) -> SnapfenceError:
    kw: Dict[str, Any] = {"request_id": request_id, "problem": p}
    if cls is LeaseHeld:
        kw["holder"] = Holder.from_json(p["holder"])
        kw["state"] = p.get("state")
        kw["waiters"] = p.get("waiters")
    elif cls is RecoveryRequired:
        kw["recovery"] = RecoveryRecord.from_json(p["recovery"])
    elif issubclass(cls, _Refused):
        kw["presented_token"] = int(p["presented_token"])
        ht = p.get("highest_token")
        kw["highest_token"] = None if ht is None else int(ht)
        kw["audit_id"] = int(p["audit_id"])
        kw["key"] = p.get("key")
        kw["fencing_key"] = p.get("fencing_key")
    elif cls is PreconditionFailed:
        oi = p.get("op_index")
        kw["op_index"] = None if oi is None else int(oi)
    elif cls in (TooManyRequests, Unavailable, Indeterminate, RequestInProgress):
        kw["retry_after"] = _retry_after(headers)
    e: SnapfenceError = cls(detail, **kw)
    return e


# ---- Keys and bodies ------------------------------------------------------------------------------


def check_key(key: str) -> None:
    if not isinstance(key, str):
        raise InvalidRequest(f"a key is text, got {type(key).__name__}")
    n = len(key.encode("utf-8"))
    if n == 0 or n > 512:
        raise InvalidRequest(f"a key is 1 to 512 bytes of UTF-8, {key!r} is {n}")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in key):
        raise InvalidRequest(f"a key has no control characters: {key!r}")


def segment(key: str) -> str:
    """A key as one percent-encoded path segment (everything but RFC 3986's unreserved
    characters). ``.`` and ``..`` cannot be sent: URLs resolve them as dot segments."""
    check_key(key)
    if key in (".", ".."):
        raise InvalidRequest(f"key {key!r} cannot be sent in a URL path, where it means a directory")
    return quote(key, safe="")


def _json_body(obj: Dict[str, Any]) -> Tuple[bytes, Dict[str, str]]:
    return json.dumps(obj, separators=(",", ":")).encode(), {"Content-Type": "application/json"}


def _json(answer: Answer) -> Any:
    try:
        return json.loads(answer.body)
    except ValueError as e:
        raise ProtocolError(f"the answer is not JSON: {e}") from e


def _check_token(token: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= 2**63 - 1:
        raise InvalidRequest(f"a fencing token is an integer in 1..=2^63-1, got {token!r}")
    return token


def _none(_: Answer) -> None:
    return None


# ---- The calls of the contract ------------------------------------------------------------------


def acquire(
    key: str,
    owner: str,
    ttl: Seconds,
    *,
    wait: Optional[Seconds] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    crash_recovery: bool = False,
    reconciled: bool = False,
    reconciling: bool = False,
) -> Call[Grant]:
    if reconciled and reconciling:
        raise InvalidRequest("reconciled and reconciling exclude each other")
    body: Dict[str, Any] = {"owner": owner, "ttl_ms": millis(ttl)}
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if crash_recovery:
        body["crash_recovery"] = True
    if reconciled:
        body["reconciled"] = True
    if reconciling:
        # Only when set: a server before v1.2 refuses fields it does not know.
        body["reconciling"] = True
    wait_s = 0.0
    if wait is not None and seconds(wait) > 0:
        body["wait_ms"] = min(millis(wait), 300_000)
        wait_s = body["wait_ms"] / 1000.0
    content, headers = _json_body(body)
    return Call(
        CHANGE,
        "POST",
        f"/v1/leases/{segment(key)}",
        (201,),
        lambda a: Grant.from_json(_json(a)),
        headers=headers,
        content=content,
        extra_time=wait_s,
    )


def renew(key: str, token: int, ttl: Optional[Seconds] = None) -> Call[Lease]:
    body: Dict[str, Any] = {"token": _check_token(token)}
    if ttl is not None:
        body["ttl_ms"] = millis(ttl)
    content, headers = _json_body(body)
    return Call(
        CHANGE,
        "POST",
        f"/v1/leases/{segment(key)}/renew",
        (200,),
        lambda a: Lease.from_json(_json(a)),
        headers=headers,
        content=content,
    )


def _fenced(method: str, path: str, token: int) -> Call[None]:
    return Call(CHANGE, method, path, (204,), _none, headers={"Fencing-Token": str(_check_token(token))})


def release(key: str, token: int) -> Call[None]:
    return _fenced("DELETE", f"/v1/leases/{segment(key)}", token)


def abandon(key: str, token: int) -> Call[None]:
    return _fenced("POST", f"/v1/leases/{segment(key)}/abandon", token)


def require_recovery(key: str, token: int) -> Call[None]:
    return _fenced("POST", f"/v1/leases/{segment(key)}/require-recovery", token)


def reconciled(key: str, token: int) -> Call[Lease]:
    return Call(
        CHANGE,
        "POST",
        f"/v1/leases/{segment(key)}/reconciled",
        (200,),
        lambda a: Lease.from_json(_json(a)),
        headers={"Fencing-Token": str(_check_token(token))},
    )


def get_lease(key: str) -> Call[KeyStatus]:
    return Call(READ, "GET", f"/v1/leases/{segment(key)}", (200,), lambda a: KeyStatus.from_json(_json(a)))


def _page(item: Callable[[Any], T]) -> Callable[[Answer], Page[T]]:
    def parse(a: Answer) -> Page[T]:
        j = _json(a)
        return Page(items=[item(x) for x in j["items"]], next_cursor=j.get("next_cursor"))

    return parse


def _params(**kw: Any) -> List[Tuple[str, str]]:
    out = []
    for k, v in kw.items():
        if v is None:
            continue
        if isinstance(v, datetime):
            v = format_time(v)
        out.append((k, str(v)))
    return out


def list_leases(
    prefix: Optional[str] = None,
    state: Optional[LeaseState] = None,
    limit: Optional[int] = None,
    cursor: Optional[str] = None,
) -> Call[Page[KeyStatus]]:
    return Call(
        READ,
        "GET",
        "/v1/leases",
        (200,),
        _page(KeyStatus.from_json),
        params=_params(prefix=prefix, state=state, limit=limit, cursor=cursor),
    )


def lease_waiters(key: str, limit: Optional[int] = None, cursor: Optional[str] = None) -> Call[Page[Waiter]]:
    return Call(
        READ,
        "GET",
        f"/v1/leases/{segment(key)}/waiters",
        (200,),
        _page(Waiter.from_json),
        params=_params(limit=limit, cursor=cursor),
    )


def _fencing_key(headers: Dict[str, str], fencing_key: Optional[str]) -> None:
    if fencing_key is not None:
        headers["Fencing-Key"] = segment(fencing_key)


def metadata_header(metadata: Mapping[str, Any]) -> str:
    """A JSON object as the ``Snapshot-Metadata`` header carries it: compact, ASCII only."""
    if not isinstance(metadata, Mapping):
        raise InvalidRequest(f"snapshot metadata is a JSON object (a mapping), got {type(metadata).__name__}")
    return json.dumps(dict(metadata), separators=(",", ":"), ensure_ascii=True)


def put_snapshot(
    key: str,
    token: int,
    body: Union[bytes, str],
    *,
    content_type: Optional[str] = None,
    if_match: Optional[str] = None,
    fencing_key: Optional[str] = None,
    metadata: Optional[Mapping[str, Any]] = None,
) -> Call[SnapshotMeta]:
    headers = {"Fencing-Token": str(_check_token(token))}
    if isinstance(body, str):
        body = body.encode("utf-8")
        content_type = content_type or "text/plain; charset=utf-8"
    headers["Content-Type"] = content_type or "application/octet-stream"
    if if_match is not None:
        headers["If-Match"] = if_match
    _fencing_key(headers, fencing_key)
    if metadata is not None:
        headers["Snapshot-Metadata"] = metadata_header(metadata)
    return Call(
        CHANGE,
        "PUT",
        f"/v1/snapshots/{segment(key)}",
        (200, 201),
        lambda a: SnapshotMeta.from_json(_json(a)),
        headers=headers,
        content=bytes(body),
    )


def put_json(
    key: str,
    token: int,
    value: Any,
    *,
    if_match: Optional[str] = None,
    fencing_key: Optional[str] = None,
    metadata: Optional[Mapping[str, Any]] = None,
) -> Call[SnapshotMeta]:
    try:
        body = json.dumps(value, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:
        raise InvalidRequest(f"the snapshot of {key!r} cannot be written as JSON: {e}") from e
    return put_snapshot(
        key,
        token,
        body,
        content_type="application/json",
        if_match=if_match,
        fencing_key=fencing_key,
        metadata=metadata,
    )


def delete_snapshot(
    key: str, token: int, *, if_match: Optional[str] = None, fencing_key: Optional[str] = None
) -> Call[None]:
    c = _fenced("DELETE", f"/v1/snapshots/{segment(key)}", token)
    if if_match is not None:
        c.headers["If-Match"] = if_match
    _fencing_key(c.headers, fencing_key)
    return c


def _txn_op(op: TxnOp) -> Dict[str, Any]:
    out: Dict[str, Any] = {"op": op.op}
    if op.op == "delete_prefix":
        if op.prefix is None:
            raise InvalidRequest("a delete_prefix op needs its prefix")
        out["prefix"] = op.prefix
        return out
    if op.key is None:
        raise InvalidRequest(f"a {op.op} op needs its key")
    check_key(op.key)
    out["key"] = op.key
    if op.op == "put":
        out["body"] = base64.b64encode(op.body or b"").decode("ascii")
        if op.content_type is not None:
            out["content_type"] = op.content_type
        if op.metadata is not None:
            out["metadata"] = dict(op.metadata)
        if op.if_match is not None:
            out["if_match"] = op.if_match
        if op.create_only:
            out["if_none_match"] = "*"
    return out


def _txn_answer(ops: List[TxnOp]) -> Callable[[Answer], TxnAnswer]:
    def parse(a: Answer) -> TxnAnswer:
        j = _json(a)
        results = []
        for op, r in zip(ops, j["results"]):
            put = SnapshotMeta.from_json({"token": j["token"], **r}) if op.op == "put" else None
            results.append(
                TxnResult(
                    op=op.op,
                    key=r.get("key"),
                    prefix=r.get("prefix"),
                    put=put,
                    deleted=int(r.get("deleted", 0)),
                )
            )
        return TxnAnswer(token=int(j["token"]), fencing_key=j["fencing_key"], results=results)

    return parse


def txn(fencing_key: str, token: int, ops: List[TxnOp]) -> Call[TxnAnswer]:
    headers = {"Fencing-Token": str(_check_token(token)), "Fencing-Key": segment(fencing_key)}
    content, jh = _json_body({"ops": [_txn_op(op) for op in ops]})
    headers.update(jh)
    return Call(CHANGE, "POST", "/v1/txn", (200,), _txn_answer(list(ops)), headers=headers, content=content)


def _header(a: Answer, name: str) -> str:
    v = a.headers.get(name)
    if v is None:
        raise ProtocolError(f"the answer has no {name} header")
    return v


def _snapshot_of(key: str, head: bool) -> Callable[[Answer], Optional[Snapshot]]:
    def parse(a: Answer) -> Optional[Snapshot]:
        if a.status == 304:
            return None
        lm = parsedate_to_datetime(_header(a, "last-modified"))
        size = int(a.headers.get("content-length", len(a.body)))
        return Snapshot(
            key=key,
            body=b"" if head else a.body,
            content_type=a.headers.get("content-type", "application/octet-stream"),
            etag=_header(a, "etag"),
            token=int(_header(a, "fencing-token")),
            version=int(_header(a, "snapshot-version")),
            last_modified=lm,
            size=size if head else len(a.body),
            fencing_key=_unquote_key(a.headers.get("fencing-key")),
            metadata=_metadata_of(a.headers.get("snapshot-metadata")),
        )

    return parse


def _unquote_key(v: Optional[str]) -> Optional[str]:
    return None if v is None else unquote(v)


def _metadata_of(v: Optional[str]) -> Optional[Dict[str, Any]]:
    if v is None:
        return None
    m = json.loads(v)
    if not isinstance(m, dict):
        raise ProtocolError("the Snapshot-Metadata header is not a JSON object")
    return m


def _some(parse: Callable[[Answer], Optional[Snapshot]]) -> Callable[[Answer], Snapshot]:
    def f(a: Answer) -> Snapshot:
        s = parse(a)
        if s is None:
            raise ProtocolError("a 304 answer to a read without If-None-Match")
        return s

    return f


def get_snapshot(key: str) -> Call[Snapshot]:
    return Call(READ, "GET", f"/v1/snapshots/{segment(key)}", (200,), _some(_snapshot_of(key, False)))


def get_snapshot_if_none_match(key: str, etag: str) -> Call[Optional[Snapshot]]:
    return Call(
        READ,
        "GET",
        f"/v1/snapshots/{segment(key)}",
        (200, 304),
        _snapshot_of(key, False),
        headers={"If-None-Match": etag},
    )


def head_snapshot(key: str) -> Call[Snapshot]:
    return Call(READ, "HEAD", f"/v1/snapshots/{segment(key)}", (200,), _some(_snapshot_of(key, True)))


def get_version(key: str, version: int) -> Call[Snapshot]:
    return Call(
        READ,
        "GET",
        f"/v1/snapshots/{segment(key)}/versions/{int(version)}",
        (200,),
        _some(_snapshot_of(key, False)),
    )


def list_versions(
    key: str, limit: Optional[int] = None, cursor: Optional[str] = None
) -> Call[Page[SnapshotMeta]]:
    return Call(
        READ,
        "GET",
        f"/v1/snapshots/{segment(key)}/versions",
        (200,),
        _page(SnapshotMeta.from_json),
        params=_params(limit=limit, cursor=cursor),
    )


def list_snapshots(
    prefix: Optional[str] = None,
    limit: Optional[int] = None,
    cursor: Optional[str] = None,
    *,
    start_after: Optional[str] = None,
    order: Optional[Literal["asc", "desc"]] = None,
    include_metadata: bool = False,
) -> Call[Page[SnapshotMeta]]:
    return Call(
        READ,
        "GET",
        "/v1/snapshots",
        (200,),
        _page(SnapshotMeta.from_json),
        params=_params(
            prefix=prefix,
            start_after=start_after,
            order=order,
            include="metadata" if include_metadata else None,
            limit=limit,
            cursor=cursor,
        ),
    )


def health() -> Call[None]:
    return Call(READ, "GET", "/healthz", (200,), _none)


def ready() -> Call[None]:
    return Call(READ, "GET", "/readyz", (200,), _none)


def metrics() -> Call[str]:
    return Call(READ, "GET", "/metrics", (200,), lambda a: a.body.decode("utf-8"))


def rejections(
    key: Optional[str] = None,
    reason: Optional[str] = None,
    since: Optional[datetime] = None,
    until: Optional[datetime] = None,
    limit: Optional[int] = None,
    cursor: Optional[str] = None,
) -> Call[Page[Rejection]]:
    return Call(
        READ,
        "GET",
        "/v1/audit/rejections",
        (200,),
        _page(Rejection.from_json),
        params=_params(key=key, reason=reason, since=since, until=until, limit=limit, cursor=cursor),
    )


def recoveries(
    key: Optional[str] = None,
    reason: Optional[str] = None,
    since: Optional[datetime] = None,
    until: Optional[datetime] = None,
    limit: Optional[int] = None,
    cursor: Optional[str] = None,
) -> Call[Page[Recovery]]:
    return Call(
        READ,
        "GET",
        "/v1/audit/recoveries",
        (200,),
        _page(Recovery.from_json),
        params=_params(key=key, reason=reason, since=since, until=until, limit=limit, cursor=cursor),
    )


# ---- The watch ------------------------------------------------------------------------------------


@dataclass
class SSEEvent:
    id: Optional[str]
    event: str
    data: str


class SSEParser:
    """Server-sent events (WHATWG HTML 9.2) from lines: :meth:`line` gives an event at each blank
    line that ends one (also an ``id:`` alone, with empty data, so that its id counts)."""

    def __init__(self) -> None:
        self._id: Optional[str] = None
        self._event = ""
        self._data: List[str] = []
        self._any = False

    def line(self, line: str) -> Optional[SSEEvent]:
        line = line.rstrip("\r\n")
        if line == "":
            if not self._any:
                return None
            ev = SSEEvent(self._id, self._event or "message", "\n".join(self._data))
            self._id, self._event, self._data, self._any = None, "", [], False
            return ev
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "id":
            if "\0" not in value:
                self._id = value
                self._any = True
        elif name == "event":
            self._event = value
            self._any = True
        elif name == "data":
            self._data.append(value)
            self._any = True
        return None


class WatchState:
    """Where a watch is: what each connection asks for, and what each event means. The drivers
    open connections, feed lines, and sleep between failed attempts."""

    def __init__(self, prefix: Optional[str], since: Optional[int], policy: RetryPolicy) -> None:
        if prefix is not None and prefix != "":
            if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in prefix):
                raise InvalidRequest(f"a prefix has no control characters: {prefix!r}")
        self.prefix = prefix
        self.since = since
        #: The id of the last event received: where the next connection resumes.
        self.last: Optional[int] = None
        self.policy = policy
        self.failures = 0
        self.delivered = False
        self.parser = SSEParser()
        #: The trace context of the call that made the watch, on each of its connections.
        self.trace = trace_headers()

    def request(self) -> Tuple[List[Tuple[str, str]], Dict[str, str]]:
        params = _params(prefix=self.prefix or None, since=self.since)
        headers = dict(self.trace)
        headers["Accept"] = "text/event-stream"
        if self.last is not None:
            headers["Last-Event-ID"] = str(self.last)
        return params, headers

    def connected(self, answer_headers: Mapping[str, str]) -> None:
        """A connection opened: before its first event a watch resumes from where the server
        said its stream starts, so a cut then misses nothing either."""
        ctype = answer_headers.get("content-type", "")
        if not ctype.startswith("text/event-stream"):
            raise ProtocolError("the answer to GET /v1/watch is not text/event-stream")
        after = answer_headers.get("watch-after")
        if self.last is None and after is not None and after.strip().isdigit():
            self.last = int(after)
        self.failures = 0
        self.delivered = False
        self.parser = SSEParser()

    def line(self, line: str) -> Optional[ChangeEvent]:
        ev = self.parser.line(line)
        if ev is None:
            return None
        self.delivered = True
        if ev.id is not None and ev.id != "":
            try:
                id_ = int(ev.id)
            except ValueError as e:
                raise ProtocolError(f"a watch event without a change id: {ev.id!r}") from e
            self.last = id_
        else:
            id_ = None
        if ev.data == "" or ev.event not in CHANGE_KINDS:
            # The stream's first block (an id alone), or a kind this client does not know.
            return None
        if id_ is None:
            raise ProtocolError("a watch event without a change id the watch could resume from")
        try:
            return ChangeEvent.from_json(id_, ev.event, json.loads(ev.data))
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(
                f"the data of change {id_} ({ev.event}) is not the contract's JSON: {e!r}"
            ) from e

    def failed(self, error: SnapfenceError) -> float:
        """After a failed attempt: the pause before the next one; raises the failure when it ends
        the watch (it will not pass by itself, or too many attempts failed in a row)."""
        self.failures += 1
        if not error.is_transient or self.failures >= self.policy.max_attempts:
            raise error
        return pause_before_retry(self.policy, error, self.failures)

    def ended(self) -> float:
        """The server ended a stream: go on at once, unless it sent nothing (then back off)."""
        return 0.0 if self.delivered else self.policy.backoff(1)


# ---- Keeper rules ---------------------------------------------------------------------------------


def keeper_periods(ttl: float, margin: Optional[float], renew_every: Optional[float]) -> Tuple[float, float]:
    """The margin and renewal period for a lease of ``ttl`` seconds: by default a fifth of the
    TTL and a third of it (less when the margin leaves less than two of those)."""
    m = ttl / 5 if margin is None else margin
    window = ttl - m
    if window <= 0:
        raise InvalidRequest(
            f"a keeper margin of {m}s leaves no time to renew a lease of {ttl}s; use a longer TTL or a shorter margin"
        )
    every = min(ttl / 3, window / 2) if renew_every is None else renew_every
    if every >= window:
        raise InvalidRequest(
            f"renewing every {every}s is too rare for a lease of {ttl}s with a margin of {m}s: it would lapse first"
        )
    return m, every


def parse_time_or_none(v: Optional[str]) -> Optional[datetime]:
    return None if v is None else parse_time(v)
