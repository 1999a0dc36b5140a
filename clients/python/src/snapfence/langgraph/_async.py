"""``AsyncSnapfenceSaver``: the asyncio twin of :class:`SnapfenceSaver`, on ``AsyncClient``. The
same keys, bodies and fences (``_layout``); only the I/O differs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, Dict, List, Optional, Set, Tuple, Type, TypeVar

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

from .._async import AsyncClient, AsyncLeaseKeeper
from .._core import Seconds
from .._errors import InvalidRequest, LeaseLost, NotFound, PreconditionFailed
from .._types import Grant, SnapshotMeta, TxnOp
from . import _layout as L
from ._sync import _drop_checkpoint, _listing, default_owner

T = TypeVar("T")


class AsyncThreadHold:
    """A thread held by an async saver (``async with saver.hold(thread_id) as held:``); see
    :class:`ThreadHold`."""

    def __init__(
        self,
        saver: AsyncSnapfenceSaver,
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
        self.keeper: Optional[AsyncLeaseKeeper] = None
        self.grant: Optional[Grant] = None

    @property
    def token(self) -> int:
        """The fencing token every write of the thread carries."""
        if self.keeper is not None:
            return self.keeper.token
        if self.grant is None:
            raise RuntimeError("the thread is not held yet: enter the async with block (or await start())")
        return self.grant.token

    async def start(self) -> AsyncThreadHold:
        """Acquires the thread's lease (waiting up to ``wait`` seconds while another worker
        holds it) and makes the saver write the thread under it."""
        meta = {"thread_id": self.thread_id, "owner": self.owner}
        client = self.saver.client
        if self._renew:
            self.keeper = await client.hold(
                self.key, self.owner, self._ttl, wait=self._wait, metadata=meta
            ).start()
            self.grant = self.keeper.grant
        else:
            self.grant = await client.acquire(self.key, self.owner, self._ttl, wait=self._wait, metadata=meta)
        try:
            self.saver._register(self)
        except BaseException:
            await self._end(None)
            raise
        return self

    async def release(self) -> None:
        """Stops writing the thread and releases its lease."""
        self.saver._unregister(self)
        await self._end(None)

    async def _end(self, exc: Optional[BaseException]) -> None:
        if self.keeper is not None:
            await self.keeper.__aexit__(None if exc is None else type(exc), exc, None)
        elif self.grant is not None:
            try:
                await self.saver.client.release(self.key, self.grant.token)
            except LeaseLost:
                if exc is None:
                    raise

    async def __aenter__(self) -> AsyncThreadHold:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.saver._unregister(self)
        await self._end(exc)


class AsyncSnapfenceSaver(BaseCheckpointSaver[int]):
    """The asyncio form of :class:`SnapfenceSaver` (same options, same keys, same fences): a
    worker runs a thread inside ``async with saver.hold(thread_id, owner=...)``, or the saver
    is made with ``auto_hold=True``. Its blocking methods may be called from another thread
    than the event loop it runs on (as LangGraph's sync APIs do on an async graph)."""

    def __init__(
        self,
        client: AsyncClient,
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
        self._held: Dict[str, AsyncThreadHold] = {}
        self._taking: Dict[str, asyncio.Future[AsyncThreadHold]] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    # ---- Holding threads ---------------------------------------------------------------------

    def hold(
        self,
        thread_id: str,
        *,
        owner: Optional[str] = None,
        ttl: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
        renew: bool = True,
    ) -> AsyncThreadHold:
        """``async with saver.hold(thread_id, owner=...):`` the saver writes the thread under its
        lease while the block runs (acquired at entry, waiting up to ``wait`` seconds, renewed
        by the client's keeper unless ``renew=False``, released at the end)."""
        return AsyncThreadHold(
            self,
            thread_id,
            owner or self.owner,
            self.ttl if ttl is None else ttl,
            self.wait if wait is None else wait,
            renew,
        )

    def held(self, thread_id: str) -> Optional[AsyncThreadHold]:
        """How this saver holds ``thread_id``, if it does."""
        return self._held.get(thread_id)

    async def release(self, thread_id: str) -> None:
        """Releases a thread the saver holds (a lost lease included)."""
        h = self._held.get(thread_id)
        if h is not None:
            await h.release()

    async def aclose(self) -> None:
        """Releases every thread the saver holds."""
        for h in list(self._held.values()):
            try:
                await h.release()
            except LeaseLost:
                pass

    async def __aenter__(self) -> AsyncSnapfenceSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _register(self, h: AsyncThreadHold) -> None:
        if h.thread_id in self._held:
            raise InvalidRequest(f"this saver holds thread {h.thread_id!r} already")
        self._held[h.thread_id] = h

    def _unregister(self, h: AsyncThreadHold) -> None:
        if self._held.get(h.thread_id) is h:
            del self._held[h.thread_id]

    async def _fence(self, thread_id: str) -> Tuple[str, int]:
        """The lease key and token a write of the thread presents."""
        h = self._held.get(thread_id)
        if h is None:
            if not self.auto_hold:
                raise L.ThreadNotHeld(thread_id, self.layout.thread(thread_id))
            taking = self._taking.get(thread_id)
            if taking is None:
                taking = asyncio.ensure_future(self.hold(thread_id).start())
                self._taking[thread_id] = taking
                taking.add_done_callback(lambda _: self._taking.pop(thread_id, None))
            h = await asyncio.shield(taking)
        return h.key, h.token

    # ---- Reading ------------------------------------------------------------------------------

    async def _body(self, key: str) -> Optional[bytes]:
        try:
            return (await self.client.get_snapshot(key)).body
        except NotFound:
            return None

    async def _writes(self, thread_id: str, ns: str, checkpoint_id: str) -> List[PendingWrite]:
        prefix = self.layout.writes(thread_id, ns, checkpoint_id)
        keys = [str(i.key) async for i in self.client.iter_snapshots(prefix=prefix, page_size=self.page_size)]
        bodies = await asyncio.gather(*(self._body(k) for k in keys))
        return L.pending_writes(self.serde, [b for b in bodies if b is not None])

    async def _tuple(self, thread_id: str, ns: str, checkpoint_id: str) -> Optional[CheckpointTuple]:
        body, writes = await asyncio.gather(
            self._body(self.layout.checkpoint(thread_id, ns, checkpoint_id)),
            self._writes(thread_id, ns, checkpoint_id),
        )
        if body is None:
            return None
        stored = L.read_checkpoint(self.serde, body)
        return L.make_tuple(thread_id, ns, checkpoint_id, stored, writes)

    async def aget_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        self._bind()
        thread_id, ns, checkpoint_id = L.target(config)
        if checkpoint_id is not None:
            return await self._tuple(thread_id, ns, checkpoint_id)
        async for item in self._newest_first(self.layout.checkpoints(thread_id, ns), page_size=1):
            parsed = self.layout.parse_checkpoint(str(item.key))
            if parsed is not None:
                return await self._tuple(*parsed)
        return None

    async def _newest_first(
        self, prefix: str, *, start_after: Optional[str] = None, page_size: Optional[int] = None
    ) -> AsyncIterator[SnapshotMeta]:
        """The keys under ``prefix`` in ``desc`` order, with their metadata."""
        try:
            async for item in self.client.iter_snapshots(
                prefix=prefix,
                start_after=start_after,
                order="desc",
                include_metadata=True,
                page_size=page_size or self.page_size,
            ):
                yield item
        except InvalidRequest as e:
            plain = L.before_v13(e)
            if plain is None:
                raise
            raise plain from e

    async def alist(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[Dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> AsyncIterator[CheckpointTuple]:
        self._bind()
        prefix, start_after, only, below = _listing(self.layout, config, before)
        left = limit
        async for item in self._newest_first(prefix, start_after=start_after):
            if left is not None and left <= 0:
                return
            parsed = self.layout.parse_checkpoint(str(item.key))
            if (
                parsed is None
                or (only is not None and parsed[2] != only)
                or (below is not None and parsed[2] >= below)
            ):
                continue
            md = L.head_metadata(item)
            if md is not None and not L.matches(md, filter):
                continue
            tup = await self._tuple(*parsed)
            if tup is None or not L.matches(tup.metadata, filter):
                continue
            if left is not None:
                left -= 1
            yield tup

    # ---- Writing ------------------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._bind()
        thread_id, ns, parent = L.target(config)
        md = get_checkpoint_metadata(config, metadata)
        body = L.checkpoint_body(self.serde, checkpoint, md, parent)
        fence, token = await self._fence(thread_id)
        await self.client.put_snapshot(
            self.layout.checkpoint(thread_id, ns, checkpoint["id"]),
            token,
            body,
            content_type=L.CHECKPOINT_TYPE,
            fencing_key=fence,
            metadata=L.checkpoint_head(md, parent),
        )
        return L.config_of(thread_id, ns, checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[Tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._bind()
        thread_id = L.target(config)[0]
        ops = L.write_ops(self.layout, self.serde, config, writes, task_id, task_path)
        if not ops:
            return
        fence, token = await self._fence(thread_id)
        for chunk in L.chunks(ops, self.max_txn_ops):
            await self._txn_new(fence, token, chunk)

    async def _txn_new(self, fence: str, token: int, ops: List[TxnOp]) -> None:
        """Commits ``ops``, leaving out the create-only puts whose key exists already."""
        while ops:
            try:
                await self.client.txn(fence, token, ops)
                return
            except PreconditionFailed as e:
                if e.op_index is None or not 0 <= e.op_index < len(ops):
                    raise
                ops = ops[: e.op_index] + ops[e.op_index + 1 :]

    async def _commit(self, fence: str, token: int, ops: List[TxnOp]) -> None:
        for chunk in L.chunks(ops, self.max_txn_ops):
            await self.client.txn(fence, token, chunk)

    async def _has_any(self, prefix: str) -> bool:
        return bool((await self.client.list_snapshots(prefix=prefix, limit=1)).items)

    async def adelete_thread(self, thread_id: str) -> None:
        self._bind()
        thread = self.layout.thread(thread_id)
        if not await self._has_any(thread + "/"):
            return
        fence, token = await self._fence(thread_id)
        try:
            await self.client.txn(fence, token, [TxnOp.delete_prefix(thread + "/")])
        except InvalidRequest:
            # More keys than one transaction may delete: page through them.
            while True:
                page = await self.client.list_snapshots(prefix=thread + "/", limit=self.max_txn_ops)
                if not page.items:
                    return
                await self.client.txn(fence, token, [TxnOp.delete(str(i.key)) for i in page.items])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._bind()
        runs = set(run_ids)
        if not runs:
            return
        doomed: Dict[str, List[TxnOp]] = {}
        async for item in self.client.iter_snapshots(
            prefix=self.layout.prefix + "/", include_metadata=True, page_size=self.page_size
        ):
            parsed = self.layout.parse_checkpoint(str(item.key))
            if parsed is None:
                continue
            md = L.head_metadata(item)
            if md is None:
                tup = await self._tuple(*parsed)
                md = None if tup is None else dict(tup.metadata)
            if md is not None and md.get("run_id") in runs:
                doomed.setdefault(parsed[0], []).extend(_drop_checkpoint(self.layout, *parsed))
        for thread_id, ops in doomed.items():
            fence, token = await self._fence(thread_id)
            await self._commit(fence, token, ops)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._bind()
        src = self.layout.thread(source_thread_id) + "/"
        dst = self.layout.thread(target_thread_id) + "/"
        ops: List[TxnOp] = []
        async for item in self.client.iter_snapshots(prefix=src, page_size=self.page_size):
            try:
                snap = await self.client.get_snapshot(str(item.key))
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
            fence, token = await self._fence(target_thread_id)
            await self._commit(fence, token, ops)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._bind()
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                await self.adelete_thread(thread_id)
                continue
            seen: Set[str] = set()
            ops: List[TxnOp] = []
            async for item in self._newest_first(self.layout.checkpoints(thread_id)):
                parsed = self.layout.parse_checkpoint(str(item.key))
                if parsed is None:
                    continue
                if parsed[1] in seen:
                    ops.extend(_drop_checkpoint(self.layout, *parsed))
                else:
                    seen.add(parsed[1])
            if ops:
                fence, token = await self._fence(thread_id)
                await self._commit(fence, token, ops)

    # ---- The blocking forms: the async ones, on the saver's loop --------------------------------

    def _bind(self) -> None:
        # The loop the saver was last used on: where the blocking methods send their work.
        self._loop = asyncio.get_running_loop()

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or not loop.is_running():
            coro.close()
            raise asyncio.InvalidStateError(
                "AsyncSnapfenceSaver's blocking methods run on the event loop the saver is used on, from "
                "another thread; use the async methods (ainvoke, aget_state...) in that loop, "
                "or SnapfenceSaver for blocking code"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def get_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        return self._on_loop(self.aget_tuple(config))

    def list(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[Dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> List[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._on_loop(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._on_loop(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[Tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._on_loop(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._on_loop(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._on_loop(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._on_loop(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._on_loop(self.aprune(thread_ids, strategy=strategy))
