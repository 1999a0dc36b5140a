"""A LangGraph worker process for tests/test_langgraph.py: it holds one thread through a
snapfence saver and runs a graph on it, printing what happens as JSON lines.

    python langgraph_worker.py URL PREFIX THREAD NAME [--async] [--ttl S] [--wait S]
        [--graph steps|approval] [--pause-at NODE --go-file PATH] [--resume VALUE]

``steps`` runs s1, s2, s3, each appending "<node>:<worker>" to the state's log; ``approval`` runs
s1, then ``ask`` (an interrupt), then s3. With ``--pause-at`` the node prints ``paused`` and waits
for ``--go-file`` to exist (the test stops the process meanwhile). A thread with a checkpoint
left to run is resumed (``invoke(None)``), else started; ``--resume`` resumes an interrupt.
Checkpoints are written with ``durability="sync"``: each is stored before the next step runs, so
a successor resumes from the last step this worker finished. Exit 0 when the graph returned, 3
when the server refused a write (StaleToken).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import sys
import time
from typing import Annotated, Any, Dict, List, Optional, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import snapfence
from snapfence.langgraph import AsyncSnapfenceSaver, SnapfenceSaver


class State(TypedDict):
    log: Annotated[List[str], operator.add]


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def build(kind: str, name: str, pause_at: Optional[str], go_file: Optional[str]) -> StateGraph:
    def step(node: str) -> Any:
        def run(state: State) -> Dict[str, List[str]]:
            if node == pause_at:
                say(event="paused", node=node)
                while go_file is not None and not os.path.exists(go_file):
                    time.sleep(0.02)
            return {"log": [f"{node}:{name}"]}

        return run

    def ask(state: State) -> Dict[str, List[str]]:
        answer = interrupt({"question": "ship it?", "asked_by": name})
        return {"log": [f"ask:{answer}:{name}"]}

    g = StateGraph(State)
    nodes = ["s1", "s2", "s3"] if kind == "steps" else ["s1", "ask", "s3"]
    for n in nodes:
        g.add_node(n, ask if n == "ask" else step(n))
    g.add_edge(START, nodes[0])
    for a, b in zip(nodes, nodes[1:]):
        g.add_edge(a, b)
    g.add_edge(nodes[-1], END)
    return g


def outcome(result: Dict[str, Any]) -> None:
    interrupts = [i.value for i in result.get("__interrupt__", [])]
    say(event="returned", log=result.get("log"), interrupts=interrupts)


def refused(e: snapfence.StaleToken) -> int:
    say(
        event="refused",
        code=e.code,
        audit_id=e.audit_id,
        presented=e.presented_token,
        highest=e.highest_token,
    )
    return 3


def sync_main(a: argparse.Namespace) -> int:
    client = snapfence.Client(a.url)
    saver = SnapfenceSaver(client, prefix=a.prefix, owner=a.name)
    graph = build(a.graph, a.name, a.pause_at, a.go_file).compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": a.thread}}
    try:
        with saver.hold(a.thread, ttl=a.ttl, wait=a.wait) as held:
            say(event="held", token=held.token)
            if a.resume is not None:
                inp: Any = Command(resume=a.resume)
            else:
                inp = None if graph.get_state(config).next else {"log": []}
            outcome(graph.invoke(inp, config, durability="sync"))
    except snapfence.StaleToken as e:
        return refused(e)
    return 0


async def async_main(a: argparse.Namespace) -> int:
    async with snapfence.AsyncClient(a.url) as client:
        saver = AsyncSnapfenceSaver(client, prefix=a.prefix, owner=a.name)
        graph = build(a.graph, a.name, a.pause_at, a.go_file).compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": a.thread}}
        try:
            async with saver.hold(a.thread, ttl=a.ttl, wait=a.wait) as held:
                say(event="held", token=held.token)
                if a.resume is not None:
                    inp: Any = Command(resume=a.resume)
                else:
                    inp = None if (await graph.aget_state(config)).next else {"log": []}
                outcome(await graph.ainvoke(inp, config, durability="sync"))
        except snapfence.StaleToken as e:
            return refused(e)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    for arg in ("url", "prefix", "thread", "name"):
        p.add_argument(arg)
    p.add_argument("--async", dest="use_async", action="store_true")
    p.add_argument("--ttl", type=float, default=30.0)
    p.add_argument("--wait", type=float, default=None)
    p.add_argument("--graph", choices=["steps", "approval"], default="steps")
    p.add_argument("--pause-at")
    p.add_argument("--go-file")
    p.add_argument("--resume")
    a = p.parse_args()
    return asyncio.run(async_main(a)) if a.use_async else sync_main(a)


if __name__ == "__main__":
    sys.exit(main())
