"""The asyncio client: :class:`AsyncClient`, its :class:`AsyncWatch` and its
:class:`AsyncLeaseKeeper`. Calls are written and answers read by the same code as the blocking
client's (``_core``); only the sending and the sleeping differ."""

from __future__ import annotations

import asyncio
import ssl
import time
from datetime import datetime
from types import TracebackType
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
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


class AsyncClient:
    """An asyncio client of a snapfence service at ``base_url`` (``http://host:port``). Safe to
    share between the tasks of one event loop.

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
        self._http = httpx.AsyncClient(
            headers=self._cfg.headers, verify=self._cfg.verify, limits=self._cfg.limits
        )

    @classmethod
    def from_env(cls, **options: Any) -> AsyncClient:
        """A client of ``$SNAPFENCE_URL`` (default ``http://127.0.0.1:7878``) with the API key of
        ``$SNAPFENCE_API_KEY`` and the CA roots of ``$SNAPFENCE_CA_CERT``, when set; ``options``
        are the constructor's and win over the environment."""
        url, opts = from_env(options)
        return cls(url, **opts)  # type: ignore[arg-type]

    @property
    def base_url(self) -> str:
        return self._cfg.base

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- The driver ------------------------------------------------------------------------

    async def _run(
        self, call: Call[T], policy: Optional[RetryPolicy] = None, trace: Optional[Dict[str, str]] = None
    ) -> T:
        # ``trace``: the trace headers to send instead of the caller's current ones (a keeper's).
        attempts = Attempts(call, policy or self._cfg.retry, trace)
        url = self._cfg.base + call.path
        while True:
            got: Union[Answer, SnapfenceError]
            try:
                r = await self._http.request(
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
            await asyncio.sleep(pause)

    def _pages(self, make: Callable[[Optional[str]], Call[Page[T]]]) -> AsyncIterator[T]:
        # Every page is asked for in the trace context of the call that made the iterator.
        return self._pages_in(make, trace_headers())

    async def _pages_in(
        self, make: Callable[[Optional[str]], Call[Page[T]]], trace: Dict[str, str]
    ) -> AsyncIterator[T]:
        cursor: Optional[str] = None
        while True:
            page = await self._run(make(cursor), trace=trace)
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    # ---- Leases ------------------------------------------------------------------------------

    async def acquire(
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
        return await self._run(
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

    async def renew(self, key: str, token: int, ttl: Optional[Seconds] = None) -> Lease:
        """``POST /v1/leases/{key}/renew``: the same token, a new ``expires_at``. Raises
        :class:`LeaseLost` once the token is not the key's live lease: stop working then."""
        return await self._run(_core.renew(key, token, ttl))

    async def release(self, key: str, token: int) -> None:
        """``DELETE /v1/leases/{key}``: frees the key at once (a waiter gets it)."""
        await self._run(_core.release(key, token))

    async def abandon(self, key: str, token: int) -> None:
        """``POST /v1/leases/{key}/abandon``: unlocks, keeping a recovery record."""
        await self._run(_core.abandon(key, token))

    async def require_recovery(self, key: str, token: int) -> None:
        """``POST /v1/leases/{key}/require-recovery``: marks cleanup incomplete while holding."""
        await self._run(_core.require_recovery(key, token))

    async def reconciled(self, key: str, token: int) -> Lease:
        """``POST /v1/leases/{key}/reconciled`` (v1.2): the holder of a ``reconciling`` grant
        says the leftovers no longer conflict; the record moves to the audit log."""
        return await self._run(_core.reconciled(key, token))

    async def get_lease(self, key: str) -> KeyStatus:
        """``GET /v1/leases/{key}``: its state, newest lease, recovery record, newest token."""
        return await self._run(_core.get_lease(key))

    async def list_leases(
        self,
        *,
        prefix: Optional[str] = None,
        state: Optional[LeaseState] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> Page[KeyStatus]:
        """``GET /v1/leases``: one page of keys in byte order."""
        return await self._run(_core.list_leases(prefix, state, limit, cursor))

    def iter_leases(
        self,
        *,
        prefix: Optional[str] = None,
        state: Optional[LeaseState] = None,
        page_size: Optional[int] = None,
    ) -> AsyncIterator[KeyStatus]:
        """Every key of :meth:`list_leases`, page after page."""
        return self._pages(lambda c: _core.list_leases(prefix, state, page_size, c))

    async def lease_waiters(
        self, key: str, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> Page[Waiter]:
        """``GET /v1/leases/{key}/waiters`` (beyond the contract): one page of the key's queue of
        waiting acquires (``wait=``), first to be granted first, each a :class:`Waiter` with its
        ``position`` in the whole queue (from 1), ``owner`` and ``since``. A key no one waits
        for, leased or not, has an empty page."""
        return await self._run(_core.lease_waiters(key, limit, cursor))

    def iter_lease_waiters(self, key: str, *, page_size: Optional[int] = None) -> AsyncIterator[Waiter]:
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
    ) -> AsyncLeaseKeeper:
        """An :class:`AsyncLeaseKeeper`: ``async with client.hold(key, owner=..., ttl=...) as lease:``
        acquires the key (as :meth:`acquire`), renews it in the background, and releases it at
        the end."""
        return AsyncLeaseKeeper(
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
    ) -> AsyncLeaseKeeper:
        """An :class:`AsyncLeaseKeeper` that adopts a lease granted earlier: starting it renews
        the lease at once and dates the deadline from that renewal (see ``Client.keep``)."""
        held = lease.lease if isinstance(lease, Grant) else lease
        return AsyncLeaseKeeper(
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

    async def put_snapshot(
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
        return await self._run(
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

    async def put_json(
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
        return await self._run(
            _core.put_json(key, token, value, if_match=if_match, fencing_key=fencing_key, metadata=metadata)
        )

    async def get_json(self, key: str) -> Any:
        """The current snapshot of ``key``, read as JSON."""
        return (await self.get_snapshot(key)).json()

    async def txn(self, fencing_key: str, token: int, ops: Sequence[TxnOp]) -> TxnAnswer:
        """``POST /v1/txn`` (v1.3): ``ops`` (:class:`TxnOp`) commit as one, fenced by the lease on
        ``fencing_key`` with ``token``: every key must be in its namespace, the fence rules hold
        for each and every precondition holds, or nothing is written (:class:`StaleToken`,
        :class:`UnknownToken`, :class:`PreconditionFailed` with ``op_index``)."""
        return await self._run(_core.txn(fencing_key, token, list(ops)))

    async def get_snapshot(self, key: str) -> Snapshot:
        """``GET /v1/snapshots/{key}``: the body and its ETag, token and version."""
        return await self._run(_core.get_snapshot(key))

    async def get_snapshot_if_none_match(self, key: str, etag: str) -> Optional[Snapshot]:
        """The snapshot, or ``None`` while its ETag still matches ``etag`` (``304``)."""
        return await self._run(_core.get_snapshot_if_none_match(key, etag))

    async def head_snapshot(self, key: str) -> Snapshot:
        """``HEAD /v1/snapshots/{key}``: what the headers say, without the body."""
        return await self._run(_core.head_snapshot(key))

    async def get_version(self, key: str, version: int) -> Snapshot:
        """``GET /v1/snapshots/{key}/versions/{version}``; :class:`NotFound` once pruned."""
        return await self._run(_core.get_version(key, version))

    async def list_versions(
        self, key: str, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> Page[SnapshotMeta]:
        """``GET /v1/snapshots/{key}/versions``: retained versions, newest first."""
        return await self._run(_core.list_versions(key, limit, cursor))

    def iter_versions(self, key: str, *, page_size: Optional[int] = None) -> AsyncIterator[SnapshotMeta]:
        return self._pages(lambda c: _core.list_versions(key, page_size, c))

    async def list_snapshots(
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
        return await self._run(
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
    ) -> AsyncIterator[SnapshotMeta]:
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

    async def delete_snapshot(
        self, key: str, token: int, *, if_match: Optional[str] = None, fencing_key: Optional[str] = None
    ) -> None:
        """``DELETE /v1/snapshots/{key}``: a fenced delete, same token rule as a put."""
        await self._run(_core.delete_snapshot(key, token, if_match=if_match, fencing_key=fencing_key))

    # ---- Operations -------------------------------------------------------------------------

    async def health(self) -> None:
        """``GET /healthz``: raises unless the process is up."""
        await self._run(_core.health())

    async def ready(self) -> None:
        """``GET /readyz``: raises (:class:`Unavailable`, after the retries) unless the database
        is reachable and migrated."""
        await self._run(_core.ready())

    async def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        return await self._run(_core.metrics())

    # ---- Audit ---------------------------------------------------------------------------------

    async def rejections(
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
        return await self._run(_core.rejections(key, reason, since, until, limit, cursor))

    def iter_rejections(
        self,
        *,
        key: Optional[str] = None,
        reason: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        page_size: Optional[int] = None,
    ) -> AsyncIterator[Rejection]:
        """Every refused write that matches, newest first, page after page."""
        return self._pages(lambda c: _core.rejections(key, reason, since, until, page_size, c))

    async def recoveries(
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
        return await self._run(_core.recoveries(key, reason, since, until, limit, cursor))

    def iter_recoveries(
        self,
        *,
        key: Optional[str] = None,
        reason: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        page_size: Optional[int] = None,
    ) -> AsyncIterator[Recovery]:
        return self._pages(lambda c: _core.recoveries(key, reason, since, until, page_size, c))

    # ---- Watch ---------------------------------------------------------------------------------

    def watch(self, *, prefix: Optional[str] = None, since: Optional[int] = None) -> AsyncWatch:
        """``GET /v1/watch``: the changes to the keys under ``prefix``, in id order, each once.
        See :class:`AsyncWatch`."""
        return AsyncWatch(self, prefix, since)


class AsyncWatch:
    """An async iterator of :class:`ChangeEvent` that outlives its connections (see
    :class:`~snapfence.Watch`: the same rules, awaited). ``async for change in client.watch():``;
    :meth:`aclose` (or leaving ``async with``) ends it."""

    def __init__(self, client: AsyncClient, prefix: Optional[str], since: Optional[int]) -> None:
        self._client = client
        self._state = WatchState(prefix, since, client._cfg.retry)
        self._resp: Optional[httpx.Response] = None
        self._lines: Optional[AsyncIterator[str]] = None
        self._closed = False
        self._ended = False

    @property
    def last_id(self) -> Optional[int]:
        """The id of the last change received (or where the stream started)."""
        return self._state.last

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._drop()

    async def open(self) -> AsyncWatch:
        """Connects now rather than at the first ``anext()`` (see :meth:`Watch.open`)."""
        while self._lines is None and not self._ended and not self._closed:
            await self._connect()
        return self

    async def _drop(self) -> None:
        resp, self._resp, self._lines = self._resp, None, None
        if resp is not None:
            try:
                await resp.aclose()
            except Exception:
                pass

    async def _fail(self, error: SnapfenceError) -> None:
        await self._drop()
        try:
            pause = self._state.failed(error)
        except SnapfenceError:
            self._ended = True
            raise
        if self._client._cfg.on_retry is not None:
            self._client._cfg.on_retry(error, pause)
        await asyncio.sleep(pause)

    async def _connect(self) -> None:
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
            resp = await self._client._http.send(request, stream=True)
        except httpx.HTTPError as e:
            await self._fail(transport_error(e, "GET /v1/watch"))
            return
        if resp.status_code != 200:
            try:
                body = await resp.aread()
            except httpx.HTTPError as e:
                await resp.aclose()
                await self._fail(transport_error(e, "GET /v1/watch"))
                return
            await resp.aclose()
            await self._fail(_core.error_of(Answer(resp.status_code, resp.headers, body), "GET /v1/watch"))
            return
        try:
            self._state.connected(resp.headers)
        except SnapfenceError:
            await resp.aclose()
            self._ended = True
            raise
        self._resp = resp
        self._lines = resp.aiter_lines()

    async def __anext__(self) -> ChangeEvent:
        while not self._ended and not self._closed:
            if self._lines is None:
                await self._connect()
                continue
            try:
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                await self._drop()
                await asyncio.sleep(self._state.ended())
                continue
            except httpx.HTTPError as e:
                if self._closed:
                    break
                await self._fail(transport_error(e, "GET /v1/watch"))
                continue
            try:
                change = self._state.line(line)
            except SnapfenceError:
                self._ended = True
                await self._drop()
                raise
            if change is not None:
                return change
        raise StopAsyncIteration


class AsyncLeaseKeeper:
    """Holds a lease and renews it in a background task until it is released or lost: the
    asyncio form of :class:`~snapfence.LeaseKeeper`, with the same rules (the deadline dated from
    the request that last proved the lease live; :attr:`lost` and :meth:`raise_if_lost` read
    the clock). ``async with client.hold("jobs/42", owner="w1", ttl=15) as lease:``.
    ``lease.lost_event`` is an ``asyncio.Event`` set on loss. :meth:`run` runs a coroutine and
    never cancels it: a write in flight finishes or fails, and its outcome is reported."""

    def __init__(
        self,
        client: AsyncClient,
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
        self._stop = asyncio.Event()
        self.lost_event = asyncio.Event()
        self._task: Optional[asyncio.Task[None]] = None
        self._released = False
        #: The trace context of the caller that started the keeper, which it acts for.
        self._trace: Dict[str, str] = {}

    async def start(self) -> AsyncLeaseKeeper:
        """Acquires the key (or renews the adopted lease) and starts renewing (what entering
        ``async with`` does); a grant that waited is renewed at once and dated from that."""
        if self._state is not None:
            raise RuntimeError("this keeper was started already")
        margin, every = self._periods
        self._trace = trace_headers()
        if self._adopt is not None:
            sent = time.monotonic()
            lease = await self._client._run(
                _core.renew(self._adopt.key, self._adopt.token, self._ttl), trace=self._trace
            )
            self._grant = Grant(lease=lease)
        else:
            assert self._acquire is not None
            sent = time.monotonic()
            self._grant = await self._client._run(self._acquire, trace=self._trace)
            lease = self._grant.lease
            if slow_grant(sent, time.monotonic(), lease.ttl):
                again = time.monotonic()
                try:
                    lease = await self._client._run(_core.renew(lease.key, lease.token), trace=self._trace)
                    sent = again
                except LeaseLost:
                    raise
                except SnapfenceError:
                    pass  # dated from the acquire: the loop renews, or declares the lapse
        self._state = KeeperState(lease, sent, margin, every)
        self._task = asyncio.ensure_future(self._keep())
        return self

    async def __aenter__(self) -> AsyncLeaseKeeper:
        # A keeper started already (e.g. by AsyncElection.campaign) is entered as it is.
        return self if self._state is not None else await self.start()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LeaseLost:
            if not (self.lost or exc is not None):
                raise
        except SnapfenceError:
            if exc is None:
                raise
        if exc is None and self.error is not None:
            raise self.error

    async def release(self) -> None:
        """Stops renewing (waiting for a renewal in flight) and releases the lease; raises
        :class:`LeaseLost` if it had already ended."""
        if self._released or self._state is None:
            return
        self._released = True
        self._stop.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                pass
        lease = self._state.lease
        await self._client.release(lease.key, lease.token)

    def _st(self) -> KeeperState:
        if self._state is None:
            raise RuntimeError("the keeper holds no lease yet: enter its async with block (or await start())")
        return self._state

    @property
    def grant(self) -> Grant:
        self._st()
        assert self._grant is not None
        return self._grant

    @property
    def lease(self) -> Lease:
        return self._st().lease

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def token(self) -> int:
        return self.lease.token

    @property
    def deadline(self) -> float:
        return self._st().deadline

    @property
    def lost(self) -> bool:
        """Whether the lease was lost; reads the clock too."""
        return self._check() is not None

    @property
    def lost_reason(self) -> Optional[LossReason]:
        self._check()
        return self._st().reason

    @property
    def error(self) -> Optional[LeaseLost]:
        return self._check()

    def raise_if_lost(self) -> None:
        """Raises :class:`LeaseLost` if the lease was lost, or if the deadline minus the margin
        has passed on the monotonic clock."""
        e = self._check()
        if e is not None:
            raise e

    async def reconciled(self) -> Lease:
        """``POST /v1/leases/{key}/reconciled`` (v1.2) for a ``reconciling`` grant."""
        lease = self.lease
        out = await self._client.reconciled(lease.key, lease.token)
        self._st().replaced(out)
        return out

    async def run(self, work: Awaitable[T]) -> T:
        """Runs ``work`` while the lease is held and returns its result. ``work`` is never
        cancelled: a write in flight when the lease is lost finishes or fails, and the caller
        learns which. If the lease was lost while it ran, :class:`LeaseLost` is raised once it
        ends: from the work's own failure (e.g. :class:`StaleToken`, or the :class:`LeaseLost`
        of its ``raise_if_lost()``), as its ``__cause__`` when the work failed otherwise, or with
        ``work_completed`` and ``work_result`` set when it returned. Call ``raise_if_lost()``
        between the work's steps so it stops at the next one."""
        try:
            result = await work
        except SnapfenceError:
            # The work's own outcome: a refused write, or the loss its own check raised.
            raise
        except Exception as failure:
            e = self._check()
            if e is None:
                raise
            raise e from failure
        e = self._check()
        if e is not None:
            e.work_completed = True
            e.work_result = result
            raise e
        return result

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
        if self._on_lost is not None:
            try:
                self._on_lost(e)
            except Exception:
                pass

    def _declare(self, loss: Tuple[LeaseLost, bool]) -> None:
        e, first = loss
        if first:
            self._declared(e)

    async def _keep(self) -> None:
        st = self._st()
        backoff = RetryPolicy(max_attempts=1 << 30, initial_backoff=0.05, max_backoff=st.every / 2)
        failures = 0
        last_error: Optional[SnapfenceError] = None
        _, sent0 = st.held()
        nxt = sent0 + jittered(st.every)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            while not self._stop.is_set() and st.error is None:
                lapse = st.lapse()
                now = time.monotonic()
                if now >= lapse:
                    self._declare(st.lapsing(last_error))
                    return
                if now < nxt:
                    await asyncio.wait({stop}, timeout=min(nxt, lapse) - now)
                    continue
                lease = st.lease
                sent = time.monotonic()
                renewal = asyncio.ensure_future(
                    self._client._run(
                        _core.renew(lease.key, lease.token, self._ttl),
                        RetryPolicy(max_attempts=1),
                        self._trace,
                    )
                )
                # A renewal in flight never delays the lapse: it is raced against it.
                await asyncio.wait({renewal, stop}, timeout=max(lapse - time.monotonic(), 0))
                if not renewal.done():
                    renewal.cancel()
                    if self._stop.is_set():
                        return
                    self._declare(st.lapsing(last_error))
                    return
                try:
                    renewed = renewal.result()
                except SnapfenceError as e:
                    if e.is_transient:
                        failures += 1
                        last_error = e
                        nxt = time.monotonic() + backoff.backoff(failures)
                        continue
                    reason, detail = st.lost_by(e)
                    self._declare(st.declare(reason, detail, e))
                    return
                except Exception as e:
                    self._declare(st.declare("refused", f"a renewal failed: {e!r}", e))
                    return
                st.renewed(renewed, sent)
                failures = 0
                last_error = None
                nxt = sent + jittered(st.every)
        finally:
            stop.cancel()
