"""The blocking client: :class:`Client`, its :class:`Watch` and its :class:`LeaseKeeper`."""

from __future__ import annotations

import ssl
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from types import TracebackType
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

import httpx

from . import _core
from ._config import OnRetry, from_env, make_config
from ._core import Answer, Attempts, Call, RetryPolicy, Seconds, WatchState, jittered, transport_error
from ._errors import LeaseLost, LossReason, SnapfenceError
from ._keeper import KeeperState, slow_grant
from ._trace import trace_headers
from ._types import (
    ChangeEvent,
    Grant,
    KeyStatus,
    Lease,
    LeaseState,
    Page,
    Recovery,
    Rejection,
    Snapshot,
    SnapshotMeta,
    TxnAnswer,
    TxnOp,
    Waiter,
)

T = TypeVar("T")


class Client:
    """A blocking client of a snapfence service at ``base_url`` (``http://host:port``). Safe to
    share between threads.

    Every changing call (acquire, renew, release, abandon, require-recovery, reconciled, put,
    delete) carries a fresh ``Idempotency-Key``, the same on every attempt, so the server does it
    at most once and a retry after a lost answer is answered with what happened. Failed attempts
    are retried (transport failures, ``503``, ``429`` after its ``Retry-After``, and for changes
    ``request_in_progress``) with jittered exponential backoff, up to ``retry.max_attempts``.

    ``api_key`` is sent as ``Authorization: Bearer``; ``ca_file`` / ``ca_pem`` add private CA
    roots for ``https`` URLs (besides the public ones), ``verify`` takes an ``ssl.SSLContext`` (or
    ``False``). Times are seconds (or ``timedelta``): ``timeout`` bounds one attempt (a waiting
    acquire gets its wait on top), ``watch_idle_timeout`` how long a watch may hear nothing,
    heartbeats included, before it resumes on a new connection.

    Every request carries the caller's trace context: the one :func:`snapfence.trace_context`
    set, else the current OpenTelemetry span's, else none.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: Optional[str] = None,
        timeout: Seconds = 10.0,
        connect_timeout: Seconds = 3.0,
        watch_idle_timeout: Seconds = 45.0,
        retry: Optional[RetryPolicy] = None,
        on_retry: Optional[OnRetry] = None,
        ca_file: Optional[str] = None,
        ca_pem: Optional[Union[str, bytes]] = None,
        verify: Union[bool, ssl.SSLContext] = True,
        max_connections: Optional[int] = 1024,
    ) -> None:
        self._cfg = make_config(
            base_url,
            api_key=api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            watch_idle_timeout=watch_idle_timeout,
            retry=retry,
            on_retry=on_retry,
            ca_file=ca_file,
            ca_pem=ca_pem,
            verify=verify,
            max_connections=max_connections,
        )
        self._http = httpx.Client(headers=self._cfg.headers, verify=self._cfg.verify, limits=self._cfg.limits)

    @classmethod
    def from_env(cls, **options: Any) -> Client:
        """A client of ``$SNAPFENCE_URL`` (default ``http://127.0.0.1:7878``) with the API key of
        ``$SNAPFENCE_API_KEY`` and the CA roots of ``$SNAPFENCE_CA_CERT``, when set; ``options``
        are the constructor's and win over the environment."""
        url, opts = from_env(options)
        return cls(url, **opts)  # type: ignore[arg-type]

    @property
    def base_url(self) -> str:
        return self._cfg.base

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- The driver ------------------------------------------------------------------------

    def _run(
        self, call: Call[T], policy: Optional[RetryPolicy] = None, trace: Optional[Dict[str, str]] = None
    ) -> T:
        # ``trace``: the trace headers to send instead of the caller's current ones (a keeper's).
        attempts = Attempts(call, policy or self._cfg.retry, trace)
        url = self._cfg.base + call.path
        while True:
            got: Union[Answer, SnapfenceError]
            try:
                r = self._http.request(
                    call.method,
                    url,
                    params=httpx.QueryParams(tuple(call.params)) if call.params else None,
                    headers=attempts.headers(),
                    content=call.content,
                    timeout=self._cfg.timeout_for(call.extra_time),
                )
                got = Answer(r.status_code, r.headers, r.content)
            except httpx.HTTPError as e:
                got = transport_error(e, str(call))
            verdict, value = attempts.outcome(got)
            if verdict == "done":
                result: T = value
                return result
            if verdict == "fail":
                raise value
            error, pause = value
            if self._cfg.on_retry is not None:
                self._cfg.on_retry(error, pause)
            time.sleep(pause)

    def _pages(self, make: Callable[[Optional[str]], Call[Page[T]]]) -> Iterator[T]:
        # Every page is asked for in the trace context of the call that made the iterator.
        return self._pages_in(make, trace_headers())

    def _pages_in(self, make: Callable[[Optional[str]], Call[Page[T]]], trace: Dict[str, str]) -> Iterator[T]:
        cursor: Optional[str] = None
        while True:
            page = self._run(make(cursor), trace=trace)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    # ---- Leases ------------------------------------------------------------------------------

    def acquire(
        self,
        key: str,
        owner: str,
        ttl: Seconds,
        *,
        wait: Optional[Seconds] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        crash_recovery: bool = False,
        reconciled: bool = False,
        reconciling: bool = False,
    ) -> Grant:
        """``POST /v1/leases/{key}``: a lease of ``ttl`` seconds with a new fencing token. With
        ``wait``, waits in the key's queue up to that long (at most 300 s) while it is held.
        Raises :class:`LeaseHeld` (with ``holder``) or :class:`RecoveryRequired` (with
        ``recovery``); ``reconciled=True`` replaces a retained recovery record,
        ``reconciling=True`` (v1.2) holds the key while keeping it (see :meth:`reconciled`)."""
        return self._run(
            _core.acquire(
                key,
                owner,
                ttl,
                wait=wait,
                metadata=metadata,
                crash_recovery=crash_recovery,
                reconciled=reconciled,
                reconciling=reconciling,
            )
        )

    def renew(self, key: str, token: int, ttl: Optional[Seconds] = None) -> Lease:
        """``POST /v1/leases/{key}/renew``: the same token, a new ``expires_at``. Raises
        :class:`LeaseLost` once the token is not the key's live lease: stop working then."""
        return self._run(_core.renew(key, token, ttl))

    def release(self, key: str, token: int) -> None:
        """``DELETE /v1/leases/{key}``: frees the key at once (a waiter gets it)."""
        self._run(_core.release(key, token))

    def abandon(self, key: str, token: int) -> None:
        """``POST /v1/leases/{key}/abandon``: unlocks, keeping a recovery record."""
        self._run(_core.abandon(key, token))

    def require_recovery(self, key: str, token: int) -> None:
        """``POST /v1/leases/{key}/require-recovery``: marks cleanup incomplete while holding."""
        self._run(_core.require_recovery(key, token))

    def reconciled(self, key: str, token: int) -> Lease:
        """``POST /v1/leases/{key}/reconciled`` (v1.2): the holder of a ``reconciling`` grant
        says the leftovers no longer conflict; the record moves to the audit log."""
        return self._run(_core.reconciled(key, token))

    def get_lease(self, key: str) -> KeyStatus:
        """``GET /v1/leases/{key}``: its state, newest lease, recovery record, newest token."""
        return self._run(_core.get_lease(key))

    def list_leases(
        self,
        *,
        prefix: Optional[str] = None,
        state: Optional[LeaseState] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> Page[KeyStatus]:
        """``GET /v1/leases``: one page of keys in byte order."""
        return self._run(_core.list_leases(prefix, state, limit, cursor))

    def iter_leases(
        self,
        *,
        prefix: Optional[str] = None,
        state: Optional[LeaseState] = None,
        page_size: Optional[int] = None,
    ) -> Iterator[KeyStatus]:
        """Every key of :meth:`list_leases`, page after page."""
        return self._pages(lambda c: _core.list_leases(prefix, state, page_size, c))

    def lease_waiters(
        self, key: str, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> Page[Waiter]:
        """``GET /v1/leases/{key}/waiters`` (beyond the contract): one page of the key's queue of
        waiting acquires (``wait=``), first to be granted first, each a :class:`Waiter` with its
        ``position`` in the whole queue (from 1), ``owner`` and ``since``. A key no one waits
        for, leased or not, has an empty page."""
        return self._run(_core.lease_waiters(key, limit, cursor))

    def iter_lease_waiters(self, key: str, *, page_size: Optional[int] = None) -> Iterator[Waiter]:
        """Every waiter of :meth:`lease_waiters`, first to be granted first, page after page."""
        return self._pages(lambda c: _core.lease_waiters(key, page_size, c))

    def hold(
        self,
        key: str,
        owner: str,
        ttl: Seconds,
        *,
        wait: Optional[Seconds] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        crash_recovery: bool = False,
        reconciled: bool = False,
        reconciling: bool = False,
        margin: Optional[Seconds] = None,
        renew_every: Optional[Seconds] = None,
        on_lost: Optional[Callable[[LeaseLost], None]] = None,
    ) -> LeaseKeeper:
        """A :class:`LeaseKeeper`: ``with client.hold(key, owner=..., ttl=...) as lease:``
        acquires the key (as :meth:`acquire`, with the same options), renews it in the
        background, and releases it at the end. With ``reconciling=True`` the grant's
        ``lease.grant.recovery`` is the record to examine, and ``lease.reconciled()`` clears it."""
        return LeaseKeeper(
            self,
            key,
            owner,
            ttl,
            wait=wait,
            metadata=metadata,
            crash_recovery=crash_recovery,
            reconciled=reconciled,
            reconciling=reconciling,
            margin=margin,
            renew_every=renew_every,
            on_lost=on_lost,
        )

    def keep(
        self,
        lease: Union[Lease, Grant],
        *,
        ttl: Optional[Seconds] = None,
        margin: Optional[Seconds] = None,
        renew_every: Optional[Seconds] = None,
        on_lost: Optional[Callable[[LeaseLost], None]] = None,
    ) -> LeaseKeeper:
        """A :class:`LeaseKeeper` that adopts a lease granted earlier (by :meth:`acquire`, or
        another process that handed it over) instead of acquiring one: starting it renews the
        lease at once (with ``ttl``, default the lease's) and dates the deadline from that
        renewal; :class:`LeaseLost` if the lease is no longer live."""
        held = lease.lease if isinstance(lease, Grant) else lease
        return LeaseKeeper(
            self,
            held.key,
            held.owner,
            held.ttl if ttl is None else ttl,
            margin=margin,
            renew_every=renew_every,
            on_lost=on_lost,
            adopt=held,
        )

    # ---- Snapshots ---------------------------------------------------------------------------

    def put_snapshot(
        self,
        key: str,
        token: int,
        body: Union[bytes, str],
        *,
        content_type: Optional[str] = None,
        if_match: Optional[str] = None,
        fencing_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> SnapshotMeta:
        """``PUT /v1/snapshots/{key}``: a fenced write, accepted only with the fence's newest
        token (else :class:`StaleToken` / :class:`UnknownToken`, audited); ``if_match`` adds a
        compare-and-set on the current ETag (:class:`PreconditionFailed`). A ``str`` body is sent
        as ``text/plain``; use :meth:`put_json` for JSON. v1.3: ``fencing_key`` names the lease
        that fences the write (a key whose namespace holds ``key``), ``metadata`` a JSON object
        stored with the version."""
        return self._run(
            _core.put_snapshot(
                key,
                token,
                body,
                content_type=content_type,
                if_match=if_match,
                fencing_key=fencing_key,
                metadata=metadata,
            )
        )

    def put_json(
        self,
        key: str,
        token: int,
        value: Any,
        *,
        if_match: Optional[str] = None,
        fencing_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> SnapshotMeta:
        """:meth:`put_snapshot` of ``value`` as JSON (``application/json``)."""
        return self._run(
            _core.put_json(key, token, value, if_match=if_match, fencing_key=fencing_key, metadata=metadata)
        )

    def get_json(self, key: str) -> Any:
        """The current snapshot of ``key``, read as JSON."""
        return (self.get_snapshot(key)).json()

    def txn(self, fencing_key: str, token: int, ops: Sequence[TxnOp]) -> TxnAnswer:
        """``POST /v1/txn`` (v1.3): ``ops`` (:class:`TxnOp`) commit as one, fenced by the lease on
        ``fencing_key`` with ``token``: every key must be in its namespace, the fence rules hold
        for each and every precondition holds, or nothing is written (:class:`StaleToken`,
        :class:`UnknownToken`, :class:`PreconditionFailed` with ``op_index``)."""
        return self._run(_core.txn(fencing_key, token, list(ops)))

    def get_snapshot(self, key: str) -> Snapshot:
        """``GET /v1/snapshots/{key}``: the body and its ETag, token and version."""
        return self._run(_core.get_snapshot(key))

    def get_snapshot_if_none_match(self, key: str, etag: str) -> Optional[Snapshot]:
        """The snapshot, or ``None`` while its ETag still matches ``etag`` (``304``)."""
        return self._run(_core.get_snapshot_if_none_match(key, etag))

    def head_snapshot(self, key: str) -> Snapshot:
        """``HEAD /v1/snapshots/{key}``: what the headers say, without the body."""
        return self._run(_core.head_snapshot(key))

    def get_version(self, key: str, version: int) -> Snapshot:
        """``GET /v1/snapshots/{key}/versions/{version}``; :class:`NotFound` once pruned."""
        return self._run(_core.get_version(key, version))

    def list_versions(
        self, key: str, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> Page[SnapshotMeta]:
        """``GET /v1/snapshots/{key}/versions``: retained versions, newest first."""
        return self._run(_core.list_versions(key, limit, cursor))

    def iter_versions(self, key: str, *, page_size: Optional[int] = None) -> Iterator[SnapshotMeta]:
        return self._pages(lambda c: _core.list_versions(key, page_size, c))

    def list_snapshots(
        self,
        *,
        prefix: Optional[str] = None,
        start_after: Optional[str] = None,
        order: Optional[Literal["asc", "desc"]] = None,
        include_metadata: bool = False,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> Page[SnapshotMeta]:
        """``GET /v1/snapshots``: one page of the keys that have a current snapshot, in byte
        order of their UTF-8 (``order="desc"``: reversed), each with its current version's
        :class:`SnapshotMeta` (``key`` set, no body); ``prefix`` selects keys that start with it.
        v1.3: ``start_after`` is exclusive in the order asked for, ``include_metadata`` adds each
        version's ``metadata``."""
        return self._run(
            _core.list_snapshots(
                prefix,
                limit,
                cursor,
                start_after=start_after,
                order=order,
                include_metadata=include_metadata,
            )
        )

    def iter_snapshots(
        self,
        *,
        prefix: Optional[str] = None,
        start_after: Optional[str] = None,
        order: Optional[Literal["asc", "desc"]] = None,
        include_metadata: bool = False,
        page_size: Optional[int] = None,
    ) -> Iterator[SnapshotMeta]:
        """Every key of :meth:`list_snapshots`, page after page."""
        return self._pages(
            lambda c: _core.list_snapshots(
                prefix,
                page_size,
                c,
                start_after=start_after,
                order=order,
                include_metadata=include_metadata,
            )
        )

    def delete_snapshot(
        self, key: str, token: int, *, if_match: Optional[str] = None, fencing_key: Optional[str] = None
    ) -> None:
        """``DELETE /v1/snapshots/{key}``: a fenced delete, same token rule as a put."""
        self._run(_core.delete_snapshot(key, token, if_match=if_match, fencing_key=fencing_key))

    # ---- Operations -------------------------------------------------------------------------

    def health(self) -> None:
        """``GET /healthz``: raises unless the process is up."""
        self._run(_core.health())

    def ready(self) -> None:
        """``GET /readyz``: raises (:class:`Unavailable`, after the retries) unless the database
        is reachable and migrated."""
        self._run(_core.ready())

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        return self._run(_core.metrics())

    # ---- Audit ---------------------------------------------------------------------------------

    def rejections(
        self,
        *,
        key: Optional[str] = None,
        reason: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> Page[Rejection]:
        """``GET /v1/audit/rejections``: one page of refused writes, newest first."""
        return self._run(_core.rejections(key, reason, since, until, limit, cursor))

    def iter_rejections(
        self,
        *,
        key: Optional[str] = None,
        reason: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        page_size: Optional[int] = None,
    ) -> Iterator[Rejection]:
        """Every refused write that matches, newest first, page after page."""
        return self._pages(lambda c: _core.rejections(key, reason, since, until, page_size, c))

    def recoveries(
        self,
        *,
        key: Optional[str] = None,
        reason: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> Page[Recovery]:
        """``GET /v1/audit/recoveries``: one page of reconciled recovery records."""
        return self._run(_core.recoveries(key, reason, since, until, limit, cursor))

    def iter_recoveries(
        self,
        *,
        key: Optional[str] = None,
        reason: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        page_size: Optional[int] = None,
    ) -> Iterator[Recovery]:
        return self._pages(lambda c: _core.recoveries(key, reason, since, until, page_size, c))

    # ---- Watch ---------------------------------------------------------------------------------

    def watch(self, *, prefix: Optional[str] = None, since: Optional[int] = None) -> Watch:
        """``GET /v1/watch``: the changes to the keys under ``prefix``, in id order, each once.
        See :class:`Watch`."""
        return Watch(self, prefix, since)


class Watch:
    """An iterator of :class:`ChangeEvent` that outlives its connections: when a stream ends or
    breaks (or goes silent for longer than ``watch_idle_timeout``) it reconnects by itself with
    ``Last-Event-ID`` set to the last event received, so nothing is missed and nothing comes
    twice. It raises (ending the iteration) when resuming is impossible (:class:`Compacted`),
    when the server refuses it (:class:`Unauthorized`, :class:`Forbidden`,
    :class:`InvalidRequest`), or after ``retry.max_attempts`` failed connections in a row.
    :meth:`close` (also from another thread) or leaving a ``with`` block ends it."""

    def __init__(self, client: Client, prefix: Optional[str], since: Optional[int]) -> None:
        self._client = client
        self._state = WatchState(prefix, since, client._cfg.retry)
        self._resp: Optional[httpx.Response] = None
        self._lines: Optional[Iterator[str]] = None
        self._closed = threading.Event()
        self._ended = False

    @property
    def last_id(self) -> Optional[int]:
        """The id of the last change received (or where the stream started): pass it as
        ``since`` to a later watch to go on from there."""
        return self._state.last

    def __iter__(self) -> Watch:
        return self

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._drop()

    def open(self) -> Watch:
        """Connects now rather than at the first ``next()``, so that every change from this
        moment on is delivered (what a reader that reads the current state next needs)."""
        while self._lines is None and not self._ended and not self._closed.is_set():
            self._connect()
        return self

    def _drop(self) -> None:
        resp, self._resp, self._lines = self._resp, None, None
        if resp is not None:
            try:
                resp.close()
            except Exception:
                pass

    def _pause(self, pause: float) -> None:
        if self._closed.wait(pause):
            raise StopIteration

    def _fail(self, error: SnapfenceError) -> None:
        self._drop()
        try:
            pause = self._state.failed(error)
        except SnapfenceError:
            self._ended = True
            raise
        if self._client._cfg.on_retry is not None:
            self._client._cfg.on_retry(error, pause)
        self._pause(pause)

    def _connect(self) -> None:
        cfg = self._client._cfg
        params, headers = self._state.request()
        request = self._client._http.build_request(
            "GET",
            cfg.base + "/v1/watch",
            params=httpx.QueryParams(tuple(params)) if params else None,
            headers=headers,
            timeout=cfg.watch_timeout(),
        )
        try:
            resp = self._client._http.send(request, stream=True)
        except httpx.HTTPError as e:
            self._fail(transport_error(e, "GET /v1/watch"))
            return
        if resp.status_code != 200:
            try:
                body = resp.read()
            except httpx.HTTPError as e:
                resp.close()
                self._fail(transport_error(e, "GET /v1/watch"))
                return
            resp.close()
            self._fail(_core.error_of(Answer(resp.status_code, resp.headers, body), "GET /v1/watch"))
            return
        try:
            self._state.connected(resp.headers)
        except SnapfenceError:
            resp.close()
            self._ended = True
            raise
        self._resp = resp
        self._lines = resp.iter_lines()

    def __next__(self) -> ChangeEvent:
        while not self._ended and not self._closed.is_set():
            if self._lines is None:
                self._connect()
                continue
            try:
                line = next(self._lines)
            except StopIteration:
                self._drop()
                self._pause(self._state.ended())
                continue
            except httpx.HTTPError as e:
                if self._closed.is_set():
                    break
                self._fail(transport_error(e, "GET /v1/watch"))
                continue
            try:
                change = self._state.line(line)
            except SnapfenceError:
                self._ended = True
                self._drop()
                raise
            if change is not None:
                return change
        raise StopIteration


class LeaseKeeper:
    """Holds a lease and renews it in the background until it is released or lost.

    Use it as a context manager: ``with client.hold("jobs/42", owner="w1", ttl=15) as lease:``
    acquires the key (waiting up to ``wait`` seconds if given), renews every ``renew_every``
    seconds (default a third of the TTL), and releases the key when the block ends.
    ``client.keep(lease)`` adopts a lease granted earlier instead.

    The deadline is the send time of the request that last proved the lease live (the acquire,
    a renewal) plus the TTL, on the monotonic clock: never later than the server's expiry. A
    grant that waited in the queue is renewed at once, and dated from that renewal. The lease is
    *lost* when a renewal answers ``lease_lost`` or is refused for good, or when less than
    ``margin`` (default a fifth of the TTL) is left before the deadline: renewals kept failing,
    or the process did not run (paused, swapped out). :attr:`lost` and :meth:`raise_if_lost`
    read the clock themselves, so a process that wakes from a pause past its TTL learns at its
    next check, before its next write. ``lease.lost_event`` is set and ``on_lost`` called (from
    the thread that noticed) once. Stop within the margin and no other holder can have started;
    send :attr:`token` with every write.

    If the lease was lost and the block ended without an exception, leaving the block raises
    :class:`LeaseLost`, so work that never checked does not pass for protected work.
    """

    def __init__(
        self,
        client: Client,
        key: str,
        owner: str,
        ttl: Seconds,
        *,
        wait: Optional[Seconds] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        crash_recovery: bool = False,
        reconciled: bool = False,
        reconciling: bool = False,
        margin: Optional[Seconds] = None,
        renew_every: Optional[Seconds] = None,
        on_lost: Optional[Callable[[LeaseLost], None]] = None,
        adopt: Optional[Lease] = None,
    ) -> None:
        self._client = client
        self._adopt = adopt
        self._acquire = (
            None
            if adopt is not None
            else _core.acquire(
                key,
                owner,
                ttl,
                wait=wait,
                metadata=metadata,
                crash_recovery=crash_recovery,
                reconciled=reconciled,
                reconciling=reconciling,
            )
        )
        self._ttl = _core.seconds(ttl)
        self._periods = _core.keeper_periods(
            self._ttl,
            None if margin is None else _core.seconds(margin),
            None if renew_every is None else _core.seconds(renew_every),
        )
        self._on_lost = on_lost
        self._state: Optional[KeeperState] = None
        self._grant: Optional[Grant] = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.lost_event = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pool: Optional[ThreadPoolExecutor] = None
        self._inflight: Optional[Future[Lease]] = None
        self._released = False
        #: The trace context of the caller that started the keeper, which it acts for.
        self._trace: Dict[str, str] = {}

    # ---- Starting and stopping ------------------------------------------------------------------

    def start(self) -> LeaseKeeper:
        """Acquires the key (or renews the adopted lease) and starts renewing (what entering the
        ``with`` block does). Raises :class:`LeaseLost` if an adopted lease, or a grant that
        waited, ended before it could be renewed."""
        if self._state is not None:
            raise RuntimeError("this keeper was started already")
        margin, every = self._periods
        self._trace = trace_headers()
        if self._adopt is not None:
            sent = time.monotonic()
            lease = self._client._run(
                _core.renew(self._adopt.key, self._adopt.token, self._ttl), trace=self._trace
            )
            self._grant = Grant(lease=lease)
        else:
            assert self._acquire is not None
            sent = time.monotonic()
            self._grant = self._client._run(self._acquire, trace=self._trace)
            lease = self._grant.lease
            if slow_grant(sent, time.monotonic(), lease.ttl):
                # The grant came long after the request was sent (it waited in the queue): date
                # the lease from a renewal sent now, not from the start of the wait.
                again = time.monotonic()
                try:
                    lease = self._client._run(_core.renew(lease.key, lease.token), trace=self._trace)
                    sent = again
                except LeaseLost:
                    raise
                except SnapfenceError:
                    pass  # dated from the acquire: the loop renews, or declares the lapse
        self._state = KeeperState(lease, sent, margin, every)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapfence-renew")
        self._thread = threading.Thread(target=self._keep, name=f"snapfence-keeper {self.key}", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> LeaseKeeper:
        # A keeper started already (e.g. by Election.campaign) is entered as it is.
        return self if self._state is not None else self.start()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LeaseLost:
            if self.lost or exc is not None:
                pass
            else:
                raise
        except SnapfenceError:
            if exc is None:
                raise
        if exc is None and self.error is not None:
            raise self.error

    def release(self) -> None:
        """Stops renewing (waiting for a renewal in flight, so none lands after the release) and
        releases the lease. After a loss the release is still sent (a lapsing lease is often
        still live, and releasing it frees the key sooner); it then raises :class:`LeaseLost` if
        the lease had already ended."""
        if self._released or self._state is None:
            return
        self._released = True
        self._stop_renewing()
        lease = self._state.lease
        self._client.release(lease.key, lease.token)

    def _stop_renewing(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        inflight = self._inflight
        if inflight is not None:
            try:
                inflight.result(timeout=self._client._cfg.timeout + 1)
            except Exception:
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    # ---- What the holder reads -------------------------------------------------------------------

    def _st(self) -> KeeperState:
        if self._state is None:
            raise RuntimeError("the keeper holds no lease yet: enter its with block (or call start())")
        return self._state

    @property
    def grant(self) -> Grant:
        """The acquire's answer (for an adopted lease, its first renewal's)."""
        self._st()
        assert self._grant is not None
        return self._grant

    @property
    def lease(self) -> Lease:
        """The lease as last granted or renewed."""
        return self._st().lease

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def token(self) -> int:
        """The fencing token, to send with every fenced write."""
        return self.lease.token

    @property
    def deadline(self) -> float:
        """The latest the lease can end unless renewed again, on ``time.monotonic()``'s clock."""
        return self._st().deadline

    @property
    def lost(self) -> bool:
        """Whether the lease was lost: stop the work it guards. Reads the clock too."""
        return self._check() is not None

    @property
    def lost_reason(self) -> Optional[LossReason]:
        """``"lease_lost"``, ``"lapsing"`` or ``"refused"`` once lost."""
        self._check()
        return self._st().reason

    @property
    def error(self) -> Optional[LeaseLost]:
        """The :class:`LeaseLost` that says why, once lost."""
        return self._check()

    def raise_if_lost(self) -> None:
        """Raises :class:`LeaseLost` if the lease was lost, or if the deadline minus the margin
        has passed on the monotonic clock (the process was paused, renewals are late)."""
        e = self._check()
        if e is not None:
            raise e

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lease is lost (``True``) or ``timeout`` passes (``False``)."""
        return self.lost_event.wait(timeout) or self.lost

    def reconciled(self) -> Lease:
        """``POST /v1/leases/{key}/reconciled`` (v1.2) for a lease held with ``reconciling=True``:
        the leftovers of the previous holder no longer conflict; the record goes to the audit
        log and the lease goes on."""
        lease = self.lease
        out = self._client.reconciled(lease.key, lease.token)
        self._st().replaced(out)
        return out

    # ---- The renewal loop ------------------------------------------------------------------------

    def _check(self) -> Optional[LeaseLost]:
        st = self._state
        if st is None:
            return None
        if self._released:
            # Released (or being released): the clock says nothing about a lease given up.
            return st.error
        e, first = st.check()
        if e is not None and first:
            self._declared(e)
        return e

    def _declared(self, e: LeaseLost) -> None:
        self.lost_event.set()
        self._wake.set()
        if self._on_lost is not None:
            try:
                self._on_lost(e)
            except Exception:
                pass

    def _declare(self, loss: Tuple[LeaseLost, bool]) -> None:
        e, first = loss
        if first:
            self._declared(e)

    def _renew_once(self, key: str, token: int) -> Lease:
        # The keeper retries on its own schedule, against the deadline; its thread has no
        # context of the caller's: the trace context is the one it started in.
        return self._client._run(_core.renew(key, token, self._ttl), RetryPolicy(max_attempts=1), self._trace)

    def _keep(self) -> None:
        st = self._st()
        assert self._pool is not None
        backoff = RetryPolicy(max_attempts=1 << 30, initial_backoff=0.05, max_backoff=st.every / 2)
        failures = 0
        last_error: Optional[SnapfenceError] = None
        _, sent0 = st.held()
        nxt = sent0 + jittered(st.every)
        while not self._stop.is_set() and st.error is None:
            lapse = st.lapse()
            now = time.monotonic()
            if now >= lapse:
                self._declare(st.lapsing(last_error))
                return
            if now < nxt:
                self._wake.wait(min(nxt, lapse) - now)
                self._wake.clear()
                continue
            lease = st.lease
            sent = time.monotonic()
            fut = self._pool.submit(self._renew_once, lease.key, lease.token)
            self._inflight = fut
            fut.add_done_callback(lambda _: self._wake.set())
            # A renewal in flight never delays the lapse: it is raced against it.
            while not fut.done() and not self._stop.is_set() and st.error is None:
                left = lapse - time.monotonic()
                if left <= 0:
                    break
                self._wake.wait(left)
                self._wake.clear()
            if self._stop.is_set() or st.error is not None:
                return
            if not fut.done():
                self._declare(st.lapsing(last_error))
                return
            self._inflight = None
            try:
                renewed = fut.result()
            except SnapfenceError as e:
                if e.is_transient:
                    failures += 1
                    last_error = e
                    nxt = time.monotonic() + backoff.backoff(failures)
                    continue
                reason, detail = st.lost_by(e)
                self._declare(st.declare(reason, detail, e))
                return
            except Exception as e:  # a bug of ours: the lease cannot be kept
                self._declare(st.declare("refused", f"a renewal failed: {e!r}", e))
                return
            st.renewed(renewed, sent)
            failures = 0
            last_error = None
            nxt = sent + jittered(st.every)
