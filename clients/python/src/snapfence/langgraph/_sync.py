"""``SnapfenceSaver``: LangGraph's checkpointer on the blocking client. Reads need nothing; every
write names the thread's lease as its fence, so a worker superseded on its thread is refused by
the server (``StaleToken``, audited) however late it wakes up."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple, Type, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .._core import Seconds
from .._errors import InvalidRequest, LeaseLost, NotFound, PreconditionFailed
from .._sync import Client, LeaseKeeper
from .._types import Grant, SnapshotMeta, TxnOp
from . import _layout as L

T = TypeVar("T")


def _in_executor(fn: Callable[..., T], *args: Any) -> Awaitable[T]:
    """``fn(*args)`` in the loop's executor, in a copy of the caller's context (as
    ``asyncio.to_thread`` runs it), so its calls carry the caller's trace context."""
    ctx = contextvars.copy_context()
    return asyncio.get_running_loop().run_in_executor(None, functools.partial(ctx.run, fn, *args))


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class ThreadHold:
    """A thread held by a saver (``with saver.hold(thread_id) as held:``): the lease on the
    thread's key, renewed in the background by a :class:`~snapfence.LeaseKeeper` (``keeper``),
    or for ``renew=False`` held for ``ttl`` seconds only. ``token`` fences every write."""

    def __init__(
        self,
        saver: SnapfenceSaver,
        thread_id: str,
        owner: str,
        ttl: Seconds,
        wait: Optional[Seconds],
        renew: bool,
    ) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.key = saver.layout.thread(thread_id)
        self.owner = owner
        self._ttl = ttl
        self._wait = wait
        self._renew = renew
        self.keeper: Optional[LeaseKeeper] = None
        self.grant: Optional[Grant] = None

    @property
    def token(self) -> int:
        """The fencing token every write of the thread carries."""
        if self.keeper is not None:
            return self.keeper.token
        if self.grant is None:
            raise RuntimeError("the thread is not held yet: enter the with block (or call start())")
        return self.grant.token

    def start(self) -> ThreadHold:
        """Acquires the thread's lease (waiting up to ``wait`` seconds while another worker
        holds it) and makes the saver write the thread under it."""
        meta = {"thread_id": self.thread_id, "owner": self.owner}
        client = self.saver.client
        if self._renew:
            self.keeper = client.hold(self.key, self.owner, self._ttl, wait=self._wait, metadata=meta).start()
            self.grant = self.keeper.grant
        else:
            self.grant = client.acquire(self.key, self.owner, self._ttl, wait=self._wait, metadata=meta)
        try:
            self.saver._register(self)
        except BaseException:
            self._end(None)
            raise
        return self

    def release(self) -> None:
        """Stops writing the thread and releases its lease."""
        self.saver._unregister(self)
        self._end(None)

    def _end(self, exc: Optional[BaseException]) -> None:
        if self.keeper is not None:
            self.keeper.__exit__(None if exc is None else type(exc), exc, None)
        elif self.grant is not None:
            try:
                self.saver.client.release(self.key, self.grant.token)
            except LeaseLost:
                if exc is None:
                    raise

    def __enter__(self) -> ThreadHold:
        return self.start()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.saver._unregister(self)
        self._end(exc)


class SnapfenceSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer whose writes a superseded worker cannot make.

    A thread's checkpoints and pending writes are keys under its lease key
    (``<prefix>/<thread_id>``); every write presents that lease as its fence, and the writes of
    one ``put_writes`` commit as one transaction. A worker runs a thread inside
    ``with saver.hold(thread_id, owner=...)``; a write for a thread the saver does not hold
    raises :class:`ThreadNotHeld` before anything is sent. With ``auto_hold=True`` the saver
    instead takes a thread's lease at its first write and keeps it (renewed) until
    :meth:`release` or :meth:`close`; a lease it lost is never taken again behind the caller's
    back: its writes are refused (``StaleToken``) until the thread is released.

    The ``a*`` methods run the blocking ones in the event loop's default executor; for asyncio
    use :class:`AsyncSnapfenceSaver`.
    """

    def __init__(
        self,
        client: Client,
        *,
        prefix: str = "langgraph",
        owner: Optional[str] = None,
        ttl: Seconds = 30.0,
        wait: Optional[Seconds] = None,
        auto_hold: bool = False,
        serde: Optional[SerializerProtocol] = None,
        max_txn_ops: int = L.MAX_TXN_OPS,
        page_size: int = 1000,
    ) -> None:
        super().__init__(serde=serde)
        self.client = client
        self.layout = L.Layout(L.check_prefix(prefix))
        self.owner = owner or default_owner()
        self.ttl = ttl
        self.wait = wait
        self.auto_hold = auto_hold
        self.max_txn_ops = max_txn_ops
        self.page_size = page_size
        self._mu = threading.Lock()
        self._held: Dict[str, ThreadHold] = {}
        self._taking = threading.Lock()

    # ---- Holding threads ---------------------------------------------------------------------

    def hold(
        self,
        thread_id: str,
        *,
        owner: Optional[str] = None,
        ttl: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
        renew: bool = True,
    ) -> ThreadHold:
        """``with saver.hold(thread_id, owner=...):`` the saver writes the thread under its
        lease while the block runs (acquired at entry, waiting up to ``wait`` seconds, renewed
        by the client's keeper unless ``renew=False``, released at the end)."""
        return ThreadHold(
            self,
            thread_id,
            owner or self.owner,
            self.ttl if ttl is None else ttl,
            self.wait if wait is None else wait,
            renew,
        )

    def held(self, thread_id: str) -> Optional[ThreadHold]:
        """How this saver holds ``thread_id``, if it does."""
        with self._mu:
            return self._held.get(thread_id)

    def release(self, thread_id: str) -> None:
        """Releases a thread the saver holds (a lost lease included)."""
        h = self.held(thread_id)
        if h is not None:
            h.release()

    def close(self) -> None:
        """Releases every thread the saver took by itself (``auto_hold``)."""
        with self._mu:
            held = list(self._held.values())
        for h in held:
            try:
                h.release()
            except LeaseLost:
                pass

    def __enter__(self) -> SnapfenceSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _register(self, h: ThreadHold) -> None:
        with self._mu:
            if h.thread_id in self._held:
                raise InvalidRequest(f"this saver holds thread {h.thread_id!r} already")
            self._held[h.thread_id] = h

    def _unregister(self, h: ThreadHold) -> None:
        with self._mu:
            if self._held.get(h.thread_id) is h:
                del self._held[h.thread_id]

    def _fence(self, thread_id: str) -> Tuple[str, int]:
        """The lease key and token a write of the thread presents."""
        with self._mu:
            h = self._held.get(thread_id)
        if h is None:
            if not self.auto_hold:
                raise L.ThreadNotHeld(thread_id, self.layout.thread(thread_id))
            with self._taking:  # one acquire at a time: LangGraph writes from several threads
                h = self.held(thread_id)
                if h is None:
                    h = self.hold(thread_id).start()
        return h.key, h.token

    # ---- Reading ------------------------------------------------------------------------------

    def _body(self, key: str) -> Optional[bytes]:
        try:
            return self.client.get_snapshot(key).body
        except NotFound:
            return None

    def _writes(self, thread_id: str, ns: str, checkpoint_id: str) -> List[PendingWrite]:
        prefix = self.layout.writes(thread_id, ns, checkpoint_id)
        bodies = []
        for item in self.client.iter_snapshots(prefix=prefix, page_size=self.page_size):
            assert item.key is not None
            body = self._body(item.key)
            if body is not None:
                bodies.append(body)
        return L.pending_writes(self.serde, bodies)

    def _tuple(self, thread_id: str, ns: str, checkpoint_id: str) -> Optional[CheckpointTuple]:
        body = self._body(self.layout.checkpoint(thread_id, ns, checkpoint_id))
        if body is None:
            return None
        stored = L.read_checkpoint(self.serde, body)
        return L.make_tuple(thread_id, ns, checkpoint_id, stored, self._writes(thread_id, ns, checkpoint_id))

    def get_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        thread_id, ns, checkpoint_id = L.target(config)
        if checkpoint_id is not None:
            return self._tuple(thread_id, ns, checkpoint_id)
        for item in self._newest_first(self.layout.checkpoints(thread_id, ns), page_size=1):
            parsed = self.layout.parse_checkpoint(str(item.key))
            if parsed is not None:
                return self._tuple(*parsed)
        return None

    def _newest_first(
        self, prefix: str, *, start_after: Optional[str] = None, page_size: Optional[int] = None
    ) -> Iterator[SnapshotMeta]:
        """The keys under ``prefix`` in ``desc`` order, with their metadata."""
        try:
            yield from self.client.iter_snapshots(
                prefix=prefix,
                start_after=start_after,
                order="desc",
                include_metadata=True,
                page_size=page_size or self.page_size,
            )
        except InvalidRequest as e:
            plain = L.before_v13(e)
            if plain is None:
                raise
            raise plain from e

    def list(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[Dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> Iterator[CheckpointTuple]:
        prefix, start_after, only, below = _listing(self.layout, config, before)
        left = limit
        for item in self._newest_first(prefix, start_after=start_after):
            if left is not None and left <= 0:
                return
            assert item.key is not None
            parsed = self.layout.parse_checkpoint(item.key)
            if (
                parsed is None
                or (only is not None and parsed[2] != only)
                or (below is not None and parsed[2] >= below)
            ):
                continue
            md = L.head_metadata(item)
            if md is not None and not L.matches(md, filter):
                continue
            tup = self._tuple(*parsed)
            if tup is None or not L.matches(tup.metadata, filter):
                continue
            if left is not None:
                left -= 1
            yield tup

    # ---- Writing ------------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns, parent = L.target(config)
        md = get_checkpoint_metadata(config, metadata)
        key = self.layout.checkpoint(thread_id, ns, checkpoint["id"])
        body = L.checkpoint_body(self.serde, checkpoint, md, parent)
        fence, token = self._fence(thread_id)
        # One key: a plain fenced PUT (no base64 as in a transaction, so the server's whole
        # body limit is the checkpoint's).
        self.client.put_snapshot(
            key,
            token,
            body,
            content_type=L.CHECKPOINT_TYPE,
            fencing_key=fence,
            metadata=L.checkpoint_head(md, parent),
        )
        return L.config_of(thread_id, ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[Tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread_id = L.target(config)[0]
        ops = L.write_ops(self.layout, self.serde, config, writes, task_id, task_path)
        if not ops:
            return
        fence, token = self._fence(thread_id)
        for chunk in L.chunks(ops, self.max_txn_ops):
            self._txn_new(fence, token, chunk)

    def _txn_new(self, fence: str, token: int, ops: List[TxnOp]) -> None:
        """Commits ``ops``, leaving out the create-only puts whose key exists already."""
        while ops:
            try:
                self.client.txn(fence, token, ops)
                return
            except PreconditionFailed as e:
                if e.op_index is None or not 0 <= e.op_index < len(ops):
                    raise
                ops = ops[: e.op_index] + ops[e.op_index + 1 :]

    def _delete(self, fence: str, token: int, ops: List[TxnOp]) -> None:
        for chunk in L.chunks(ops, self.max_txn_ops):
            self.client.txn(fence, token, chunk)

    def _has_any(self, prefix: str) -> bool:
        return bool(self.client.list_snapshots(prefix=prefix, limit=1).items)

    def delete_thread(self, thread_id: str) -> None:
        thread = self.layout.thread(thread_id)
        if not self._has_any(thread + "/"):
            return
        fence, token = self._fence(thread_id)
        try:
            self.client.txn(fence, token, [TxnOp.delete_prefix(thread + "/")])
        except InvalidRequest:
            # More keys than one transaction may delete: page through them.
            while True:
                page = self.client.list_snapshots(prefix=thread + "/", limit=self.max_txn_ops)
                if not page.items:
                    return
                self.client.txn(fence, token, [TxnOp.delete(str(i.key)) for i in page.items])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = set(run_ids)
        if not runs:
            return
        doomed: Dict[str, List[TxnOp]] = {}
        for item in self.client.iter_snapshots(
            prefix=self.layout.prefix + "/", include_metadata=True, page_size=self.page_size
        ):
            parsed = self.layout.parse_checkpoint(str(item.key))
            if parsed is None:
                continue
            md = L.head_metadata(item)
            if md is None:
                tup = self._tuple(*parsed)
                md = None if tup is None else dict(tup.metadata)
            if md is not None and md.get("run_id") in runs:
                doomed.setdefault(parsed[0], []).extend(_drop_checkpoint(self.layout, *parsed))
        for thread_id, ops in doomed.items():
            fence, token = self._fence(thread_id)
            self._delete(fence, token, ops)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        src = self.layout.thread(source_thread_id) + "/"
        dst = self.layout.thread(target_thread_id) + "/"
        ops: List[TxnOp] = []
        for item in self.client.iter_snapshots(prefix=src, page_size=self.page_size):
            try:
                snap = self.client.get_snapshot(str(item.key))
            except NotFound:
                continue
            ops.append(
                TxnOp.put(
                    dst + snap.key[len(src) :],
                    snap.body,
                    content_type=snap.content_type,
                    metadata=snap.metadata,
                )
            )
        if ops:
            fence, token = self._fence(target_thread_id)
            self._delete(fence, token, ops)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            ops = _older(
                self.layout,
                self._newest_first(self.layout.checkpoints(thread_id)),
            )
            if ops:
                fence, token = self._fence(thread_id)
                self._delete(fence, token, ops)

    # ---- The async forms: the blocking ones, in the loop's executor ----------------------------

    async def aget_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        return await _in_executor(self.get_tuple, config)

    async def alist(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[Dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await _in_executor(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await _in_executor(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[Tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await _in_executor(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await _in_executor(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await _in_executor(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await _in_executor(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await _in_executor(lambda: self.prune(thread_ids, strategy=strategy))


def _listing(
    layout: L.Layout, config: Optional[RunnableConfig], before: Optional[RunnableConfig]
) -> Tuple[str, Optional[str], Optional[str], Optional[str]]:
    """What ``list`` asks the server for: ``(prefix, start_after)``, and what it filters itself:
    ``(only this checkpoint id, ids below this one)``."""
    below = L.before_id(before)
    if config is None:
        return layout.prefix + "/", None, None, below
    c = config.get("configurable") or {}
    thread_id = str(c["thread_id"])
    only = c.get("checkpoint_id")
    ns = c.get("checkpoint_ns")
    if ns is None:
        return layout.checkpoints(thread_id), None, only, below
    prefix = layout.checkpoints(thread_id, str(ns))
    start_after = None if below is None else layout.checkpoint(thread_id, str(ns), below)
    return prefix, start_after, only, below


def _drop_checkpoint(layout: L.Layout, thread_id: str, ns: str, checkpoint_id: str) -> List[TxnOp]:
    return [
        TxnOp.delete(layout.checkpoint(thread_id, ns, checkpoint_id)),
        TxnOp.delete_prefix(layout.writes(thread_id, ns, checkpoint_id)),
    ]


def _older(layout: L.Layout, newest_first: Iterable[SnapshotMeta]) -> List[TxnOp]:
    """The deletes of ``prune(keep_latest)``: every checkpoint but the latest of each namespace,
    with its writes."""
    seen: Set[Tuple[str, str]] = set()
    ops: List[TxnOp] = []
    for item in newest_first:
        parsed = layout.parse_checkpoint(str(item.key))
        if parsed is None:
            continue
        if (parsed[0], parsed[1]) in seen:
            ops.extend(_drop_checkpoint(layout, *parsed))
        else:
            seen.add((parsed[0], parsed[1]))
    return ops
