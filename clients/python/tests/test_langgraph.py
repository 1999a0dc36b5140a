"""snapfence.langgraph against a real server, with real worker processes
(tests/langgraph_worker.py): a worker SIGSTOPped past its lease is superseded on its thread, its
next write is refused and audited, and its successor's checkpoint stays the latest; an interrupted
graph resumes on another worker; a saver writes only the threads it holds."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

pytest.importorskip("langgraph.checkpoint.base", reason="the langgraph extra is not installed")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from test_v13 import v13  # noqa: F401  (the probe fixture: the saver needs contract v1.3)

import snapfence
from snapfence.langgraph import AsyncSnapfenceSaver, SnapfenceSaver, ThreadNotHeld

pytestmark = pytest.mark.usefixtures("v13")
WORKER = str(Path(__file__).with_name("langgraph_worker.py"))
TTL = 1.0


class Worker:
    """A worker process and the JSON lines it printed."""

    def __init__(self, url: str, prefix: str, thread: str, name: str, *args: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, url, prefix, thread, name, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: List[Dict[str, Any]] = []

    def next_event(self, timeout: float = 60.0) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line:
                ev: Dict[str, Any] = json.loads(line)
                self.events.append(ev)
                return ev
            if self.proc.poll() is not None:
                break
        raise AssertionError(f"worker {self.name} printed no event; stderr:\n{self.stderr()}")

    def wait_for(self, event: str) -> Dict[str, Any]:
        while True:
            ev = self.next_event()
            if ev["event"] == event:
                return ev

    def finish(self, timeout: float = 60.0) -> int:
        out, _ = self.proc.communicate(timeout=timeout)
        self.events += [json.loads(line) for line in out.splitlines() if line.strip()]
        return int(self.proc.returncode)

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def last(self, event: str) -> Dict[str, Any]:
        found = [e for e in self.events if e["event"] == event]
        assert found, f"worker {self.name} never printed {event!r}: {self.events}; stderr:\n{self.stderr()}"
        return found[-1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def workers() -> Iterator[List[Worker]]:
    started: List[Worker] = []
    yield started
    for w in started:
        w.kill()


def names() -> tuple[str, str]:
    return f"lg-tests-{uuid.uuid4().hex[:10]}", f"thread-{uuid.uuid4().hex[:6]}"


def heads(client: snapfence.Client, prefix: str) -> Dict[str, tuple[int, int, Optional[str]]]:
    """Every key under ``prefix`` with its version, token and fence."""
    return {
        str(m.key): (m.version, m.token, m.fencing_key) for m in client.iter_snapshots(prefix=prefix + "/")
    }


def superseded_worker(url: str, tmp_path: Path, workers: List[Worker], *mode: str) -> None:
    client = snapfence.Client(url)
    prefix, thread = names()
    thread_key = f"{prefix}/{thread}"
    go = tmp_path / "go"
    w1 = Worker(url, prefix, thread, "w1", *mode, "--ttl", str(TTL), "--pause-at", "s2", "--go-file", str(go))
    workers.append(w1)
    token1 = w1.wait_for("held")["token"]
    w1.wait_for("paused")
    w1.proc.send_signal(signal.SIGSTOP)
    time.sleep(TTL + 0.5)

    w2 = Worker(url, prefix, thread, "w2", *mode, "--ttl", "30", "--wait", "30")
    workers.append(w2)
    assert w2.finish() == 0, w2.stderr()
    token2 = w2.last("held")["token"]
    assert token2 > token1
    # The second resumed from w1's last checkpoint (after s1) and ran the rest.
    assert w2.last("returned")["log"] == ["s1:w1", "s2:w2", "s3:w2"]
    before = heads(client, thread_key)

    go.touch()
    w1.proc.send_signal(signal.SIGCONT)
    assert w1.finish() == 3, f"w1 was not refused: {w1.events}\n{w1.stderr()}"
    refusal = w1.last("refused")
    assert (refusal["code"], refusal["presented"], refusal["highest"]) == ("stale_token", token1, token2)

    # Nothing of w1's landed after it was superseded, and the latest checkpoint is w2's.
    assert heads(client, thread_key) == before
    assert all(fence == thread_key for _, _, fence in before.values())
    saver = SnapfenceSaver(client, prefix=prefix)
    latest = saver.get_tuple({"configurable": {"thread_id": thread}})
    assert latest is not None
    assert latest.checkpoint["channel_values"]["log"] == ["s1:w1", "s2:w2", "s3:w2"]
    latest_key = saver.layout.checkpoint(thread, "", latest.checkpoint["id"])
    assert before[latest_key][1] == token2
    # The refusal is in the audit log.
    audited = next((r for r in client.iter_rejections() if r.id == refusal["audit_id"]), None)
    assert audited is not None, f"no audit row {refusal['audit_id']}"
    assert (audited.reason, audited.presented_token, audited.holder) == ("stale_token", token1, "w2")
    assert audited.operation in ("put", "txn")  # a checkpoint, or a task's writes
    assert audited.key.startswith(thread_key + "/")


def test_a_worker_paused_past_its_lease_is_refused_and_its_successor_keeps_the_thread(
    url: str, tmp_path: Path, workers: List[Worker]
) -> None:
    superseded_worker(url, tmp_path, workers)


def test_the_async_saver_refuses_a_worker_paused_past_its_lease_too(
    url: str, tmp_path: Path, workers: List[Worker]
) -> None:
    superseded_worker(url, tmp_path, workers, "--async")


def test_a_graph_interrupted_on_one_worker_resumes_on_another(url: str, workers: List[Worker]) -> None:
    prefix, thread = names()
    a = Worker(url, prefix, thread, "wa", "--graph", "approval")
    workers.append(a)
    assert a.finish() == 0, a.stderr()
    asked = a.last("returned")
    assert asked["log"] == ["s1:wa"]
    assert asked["interrupts"] == [{"question": "ship it?", "asked_by": "wa"}]

    b = Worker(url, prefix, thread, "wb", "--graph", "approval", "--async", "--resume", "yes")
    workers.append(b)
    assert b.finish() == 0, b.stderr()
    assert b.last("returned") == {
        "event": "returned",
        "log": ["s1:wa", "ask:yes:wb", "s3:wb"],
        "interrupts": [],
    }


def counter() -> Any:
    g: Any = StateGraph(int)  # type: ignore[arg-type]
    g.add_node("inc", lambda n: n + 1)
    g.add_edge(START, "inc")
    g.add_edge("inc", END)
    return g


def test_a_saver_refuses_to_write_a_thread_it_does_not_hold(url: str) -> None:
    client = snapfence.Client(url)
    prefix, thread = names()
    saver = SnapfenceSaver(client, prefix=prefix)
    graph = counter().compile(checkpointer=saver)
    with pytest.raises(ThreadNotHeld) as e:
        graph.invoke(1, {"configurable": {"thread_id": thread}})
    assert e.value.thread_id == thread and "saver.hold(" in str(e.value)
    assert heads(client, prefix) == {}


def test_every_write_of_a_held_thread_is_fenced_by_the_thread_lease(url: str) -> None:
    client = snapfence.Client(url)
    prefix, thread = names()
    saver = SnapfenceSaver(client, prefix=prefix)
    graph = counter().compile(checkpointer=saver)
    with saver.hold(thread, owner="w") as held:
        assert graph.invoke(1, {"configurable": {"thread_id": thread}}) == 2
    written = heads(client, prefix)
    assert written, "nothing was written"
    assert {(token, fence) for _, token, fence in written.values()} == {(held.token, f"{prefix}/{thread}")}
    assert client.get_lease(f"{prefix}/{thread}").state == "released"


def test_an_auto_holding_saver_takes_a_thread_at_its_first_write_and_not_again_once_superseded(
    url: str,
) -> None:
    client = snapfence.Client(url)
    prefix, thread = names()
    config: Any = {"configurable": {"thread_id": thread}}
    saver = SnapfenceSaver(client, prefix=prefix, owner="auto", ttl=TTL, auto_hold=True)
    graph = counter().compile(checkpointer=saver)
    assert graph.invoke(1, config) == 2
    first = saver.held(thread)
    assert first is not None and client.get_lease(first.key).lease.owner == "auto"

    # Another worker takes the thread over (the keeper's renewal is refused from then on).
    client.release(first.key, first.token)
    other = SnapfenceSaver(client, prefix=prefix, owner="other")
    with other.hold(thread):
        with pytest.raises(snapfence.StaleToken):
            graph.invoke(5, config)
        assert saver.held(thread) is first
        assert graph.get_state(config).values == 2
    saver.close()
    assert saver.held(thread) is None


def test_the_async_savers_blocking_methods_run_on_its_loop_from_another_thread(url: str) -> None:
    prefix, thread = names()
    config: Any = {"configurable": {"thread_id": thread}}

    async def main() -> None:
        async with snapfence.AsyncClient(url) as client:
            async with AsyncSnapfenceSaver(client, prefix=prefix, auto_hold=True) as saver:
                graph = counter().compile(checkpointer=saver)
                assert await graph.ainvoke(1, config) == 2
                state = await asyncio.to_thread(graph.get_state, config)
                assert state.values == 2
                with pytest.raises(asyncio.InvalidStateError, match="another thread"):
                    saver.get_tuple(config)

    asyncio.run(main())


def test_threads_whose_ids_nest_or_hold_a_slash_are_kept_apart(url: str) -> None:
    client = snapfence.Client(url)
    prefix, _ = names()
    saver = SnapfenceSaver(client, prefix=prefix, auto_hold=True)
    graph = counter().compile(checkpointer=saver)
    for thread, n in (("a", 1), ("a/b", 10), ("a%2Fb", 100)):
        assert graph.invoke(n, {"configurable": {"thread_id": thread}}) == n + 1
    for thread, n in (("a", 1), ("a/b", 10), ("a%2Fb", 100)):
        listed = list(saver.list({"configurable": {"thread_id": thread}}))
        assert listed and {t.config["configurable"]["thread_id"] for t in listed} == {thread}
        assert graph.get_state({"configurable": {"thread_id": thread}}).values == n + 1
    saver.delete_thread("a")
    assert saver.get_tuple({"configurable": {"thread_id": "a"}}) is None
    assert graph.get_state({"configurable": {"thread_id": "a/b"}}).values == 11
    assert graph.get_state({"configurable": {"thread_id": "a%2Fb"}}).values == 101
    saver.close()


def test_list_filters_on_metadata_too_large_for_the_snapshot_head_by_reading_the_body(url: str) -> None:
    client = snapfence.Client(url)
    prefix, thread = names()
    with SnapfenceSaver(client, prefix=prefix, auto_hold=True) as saver:
        big = "x" * 5000
        for step, note in ((0, "small"), (1, big)):
            cp = empty_checkpoint()
            saver.put(
                {"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
                cp,
                {"step": step, "note": note},
                {},
            )
        heads_md = [
            m.metadata
            for m in client.iter_snapshots(prefix=saver.layout.checkpoints(thread), include_metadata=True)
        ]
        assert sum("m" not in (h or {}) for h in heads_md) == 1, (
            "the large metadata should not be in the head"
        )
        found = list(saver.list({"configurable": {"thread_id": thread}}, filter={"note": big}))
        assert [t.metadata["step"] for t in found] == [1]


def test_put_writes_beyond_one_transaction_stores_them_all(url: str) -> None:
    client = snapfence.Client(url)
    prefix, thread = names()
    with SnapfenceSaver(client, prefix=prefix, auto_hold=True, max_txn_ops=8) as saver:
        config = saver.put(
            {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
        )
        saver.put_writes(config, [(f"ch{i}", i) for i in range(20)], "task-1")
        tup = saver.get_tuple(config)
        assert tup is not None and tup.pending_writes == [("task-1", f"ch{i}", i) for i in range(20)]
