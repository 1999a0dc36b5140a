"""Where a thread's checkpoints and writes live, and how they are encoded (shared by both savers).

A thread is the lease key ``<prefix>/<thread>``; its checkpoints are ``<thread key>/c/<ns>/<id>``
and the pending writes of a checkpoint ``<thread key>/w/<ns>/<id>/<task>/<idx>``, so the thread's
lease fences every one of them (contract v1.3) and one ``delete_prefix`` removes the thread.
Checkpoint ids sort in time order, so the listing in ``desc`` order finds the latest; the
``Snapshot-Metadata`` of a checkpoint carries its LangGraph metadata (``m``) and its parent
(``p``), so ``list(filter=...)`` reads only the checkpoints it returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import unquote

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .._errors import InvalidRequest, SnapfenceError
from .._types import SnapshotMeta, TxnOp

CHECKPOINT_TYPE = "application/vnd.snapfence.langgraph-checkpoint"
WRITE_TYPE = "application/vnd.snapfence.langgraph-write"
#: The contract's bound on ``Snapshot-Metadata`` (bytes of ASCII JSON).
METADATA_LIMIT = 4096
#: The contract's default bound on the operations of one transaction.
MAX_TXN_OPS = 128


def esc(s: str) -> str:
    """A name as one segment of a key: ``/`` (and ``%``) percent-encoded, nothing else."""
    return s.replace("%", "%25").replace("/", "%2F")


def check_prefix(prefix: str) -> str:
    if not prefix or prefix.startswith("/") or prefix.endswith("/"):
        raise ValueError(
            f"a saver's prefix is a non-empty key without a leading or trailing '/', got {prefix!r}"
        )
    return prefix


@dataclass(frozen=True)
class Layout:
    prefix: str

    def thread(self, thread_id: str) -> str:
        """The thread's lease key: its fence."""
        return f"{self.prefix}/{esc(thread_id)}"

    def checkpoints(self, thread_id: str, ns: Optional[str] = None) -> str:
        """The prefix of a thread's checkpoints (of one namespace when ``ns`` is given)."""
        base = f"{self.thread(thread_id)}/c/"
        return base if ns is None else f"{base}_{esc(ns)}/"

    def checkpoint(self, thread_id: str, ns: str, checkpoint_id: str) -> str:
        return f"{self.checkpoints(thread_id, ns)}{esc(checkpoint_id)}"

    def writes(self, thread_id: str, ns: str, checkpoint_id: str) -> str:
        """The prefix of a checkpoint's pending writes."""
        return f"{self.thread(thread_id)}/w/_{esc(ns)}/{esc(checkpoint_id)}/"

    def write(self, thread_id: str, ns: str, checkpoint_id: str, task_id: str, idx: int) -> str:
        return f"{self.writes(thread_id, ns, checkpoint_id)}{esc(task_id)}/{idx}"

    def parse_checkpoint(self, key: str) -> Optional[Tuple[str, str, str]]:
        """``(thread_id, ns, checkpoint_id)`` of a checkpoint key, ``None`` for any other key."""
        if not key.startswith(self.prefix + "/"):
            return None
        parts = key[len(self.prefix) + 1 :].split("/")
        if len(parts) != 4 or parts[1] != "c" or not parts[2].startswith("_"):
            return None
        return unquote(parts[0]), unquote(parts[2][1:]), unquote(parts[3])


def config_of(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def target(config: RunnableConfig) -> Tuple[str, str, Optional[str]]:
    """``(thread_id, ns, checkpoint_id)`` that a config names."""
    c = config.get("configurable") or {}
    if "thread_id" not in c:
        raise ValueError('a checkpointer config names its thread: {"configurable": {"thread_id": ...}}')
    return str(c["thread_id"]), str(c.get("checkpoint_ns") or ""), c.get("checkpoint_id")


# ---- Bodies ------------------------------------------------------------------------------------


def pack(serde: SerializerProtocol, value: Any) -> bytes:
    """LangGraph's own serializer, its type name first (``<type>\\n<bytes>``)."""
    kind, data = serde.dumps_typed(value)
    return kind.encode("utf-8") + b"\n" + data


def unpack(serde: SerializerProtocol, body: bytes) -> Any:
    kind, _, data = body.partition(b"\n")
    return serde.loads_typed((kind.decode("utf-8"), data))


def checkpoint_head(metadata: Mapping[str, Any], parent: Optional[str]) -> Dict[str, Any]:
    """The ``Snapshot-Metadata`` of a checkpoint: its metadata as JSON when it fits (else read
    from the body), and its parent."""
    head: Dict[str, Any] = {"p": parent}
    try:
        m = json.loads(json.dumps(dict(metadata), ensure_ascii=True, allow_nan=False))
        if len(json.dumps({"p": parent, "m": m}, separators=(",", ":"), ensure_ascii=True)) <= METADATA_LIMIT:
            head["m"] = m
    except (TypeError, ValueError):
        pass
    return head


def matches(metadata: Mapping[str, Any], filter: Optional[Mapping[str, Any]]) -> bool:
    return not filter or all(metadata.get(k) == v for k, v in filter.items())


@dataclass(frozen=True)
class Stored:
    """A checkpoint as its body holds it."""

    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    parent: Optional[str]


def checkpoint_body(
    serde: SerializerProtocol, checkpoint: Checkpoint, metadata: CheckpointMetadata, parent: Optional[str]
) -> bytes:
    return pack(serde, {"checkpoint": checkpoint, "metadata": metadata, "parent": parent})


def read_checkpoint(serde: SerializerProtocol, body: bytes) -> Stored:
    v = unpack(serde, body)
    return Stored(checkpoint=v["checkpoint"], metadata=v["metadata"], parent=v["parent"])


def write_ops(
    layout: Layout,
    serde: SerializerProtocol,
    config: RunnableConfig,
    writes: Sequence[Tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> List[TxnOp]:
    """The puts of ``put_writes``: a regular write (index >= 0) only if its key is new, as every
    saver does (a task's retry must not change what it wrote); a special one (error, interrupt...)
    replaces the last."""
    thread_id, ns, checkpoint_id = target(config)
    if checkpoint_id is None:
        raise ValueError("put_writes needs the config of a stored checkpoint (with its checkpoint_id)")
    ops: Dict[str, TxnOp] = {}
    for i, (channel, value) in enumerate(writes):
        idx = WRITES_IDX_MAP.get(channel, i)
        key = layout.write(thread_id, ns, checkpoint_id, task_id, idx)
        body = pack(
            serde, {"task_id": task_id, "channel": channel, "value": value, "path": task_path, "idx": idx}
        )
        if idx >= 0 and key in ops:
            continue
        ops[key] = TxnOp.put(key, body, content_type=WRITE_TYPE, create_only=idx >= 0)
    return list(ops.values())


def pending_writes(serde: SerializerProtocol, bodies: Sequence[bytes]) -> List[PendingWrite]:
    """The pending writes of a checkpoint, in ``writes_sort_key`` order."""
    rows = [unpack(serde, b) for b in bodies]
    rows.sort(key=lambda r: writes_sort_key(r["path"], r["task_id"], r["idx"]))
    return [(r["task_id"], r["channel"], r["value"]) for r in rows]


def make_tuple(
    thread_id: str, ns: str, checkpoint_id: str, stored: Stored, writes: List[PendingWrite]
) -> CheckpointTuple:
    return CheckpointTuple(
        config=config_of(thread_id, ns, checkpoint_id),
        checkpoint=stored.checkpoint,
        metadata=stored.metadata,
        parent_config=None if stored.parent is None else config_of(thread_id, ns, stored.parent),
        pending_writes=writes,
    )


def head_metadata(item: SnapshotMeta) -> Optional[Dict[str, Any]]:
    """The LangGraph metadata a listed checkpoint carries in its head, ``None`` when it did not
    fit (then the body has it)."""
    m = (item.metadata or {}).get("m")
    return m if isinstance(m, dict) else None


def chunks(ops: Sequence[TxnOp], size: int) -> List[List[TxnOp]]:
    return [list(ops[i : i + size]) for i in range(0, len(ops), size)]


def before_id(before: Optional[RunnableConfig]) -> Optional[str]:
    if before is None:
        return None
    cid = (before.get("configurable") or {}).get("checkpoint_id")
    return None if cid is None else str(cid)


class ThreadNotHeld(SnapfenceError):
    """A write for a thread this saver does not hold: nothing was sent. Run the graph inside
    ``with saver.hold(thread_id, ...)``, or make the saver with ``auto_hold=True``."""

    def __init__(self, thread_id: str, key: str) -> None:
        super().__init__(
            f"this saver does not hold thread {thread_id!r} (lease key {key!r}), so it may not write it: "
            f"run the graph inside `with saver.hold({thread_id!r}, owner=...)`, "
            "or make the saver with auto_hold=True to take a thread's lease at its first write"
        )
        self.thread_id = thread_id
        self.key = key


def before_v13(e: InvalidRequest) -> Optional[InvalidRequest]:
    """A server before contract v1.3 refusing the ordered listing, said plainly (``None`` for
    any other invalid request)."""
    if not any(word in e.detail for word in ("order", "include", "start_after")):
        return None
    return InvalidRequest(
        "snapfence.langgraph needs a server with contract v1.3 (the ordered listing, namespace "
        f"fences, transactions); this one refused the ordered listing ({e.detail}): upgrade it",
        request_id=e.request_id,
        problem=e.problem,
    )
