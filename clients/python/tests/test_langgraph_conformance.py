"""LangGraph's own conformance suite (langgraph-checkpoint-conformance, through its ``validate``)
against both savers on a real server: every base capability (put, put_writes, get_tuple, list,
delete_thread) and the optional ones the savers implement (delete_for_runs, copy_thread, prune).
With ``$SNAPFENCE_LANGGRAPH_REPORT`` set, the suite's report is appended to that file (ci.sh
prints it)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import uuid
from typing import Any, AsyncIterator

import pytest

pytest.importorskip("langgraph.checkpoint.conformance", reason="the langgraph extra is not installed")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import CapabilityReport, ProgressCallbacks
from test_v13 import v13  # noqa: F401  (the probe fixture: the savers need contract v1.3)

import snapfence
from snapfence.langgraph import AsyncSnapfenceSaver, SnapfenceSaver

pytestmark = pytest.mark.usefixtures("v13")
EVERY_CAPABILITY = {
    "put",
    "put_writes",
    "get_tuple",
    "list",
    "delete_thread",
    "delete_for_runs",
    "copy_thread",
    "prune",
}
BASE_TESTS = 58


def run(registered: Any) -> CapabilityReport:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        report: CapabilityReport = asyncio.run(validate(registered, progress=ProgressCallbacks.verbose()))
        report.print_report()
    path = os.environ.get("SNAPFENCE_LANGGRAPH_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(out.getvalue())
    return report


def check(report: CapabilityReport) -> None:
    failures = {cap: r.failures for cap, r in report.results.items() if r.failures}
    assert not failures, failures
    assert {cap for cap, r in report.results.items() if r.detected and r.passed} == EVERY_CAPABILITY
    base = sum(
        report.results[c].tests_passed for c in ("put", "put_writes", "get_tuple", "list", "delete_thread")
    )
    assert base == BASE_TESTS
    assert report.passed_all_base() and report.passed_all()


def test_the_async_saver_passes_langgraphs_conformance_suite(url: str) -> None:
    @checkpointer_test(name="AsyncSnapfenceSaver")
    async def saver() -> AsyncIterator[AsyncSnapfenceSaver]:
        async with snapfence.AsyncClient(url) as client:
            async with AsyncSnapfenceSaver(
                client, prefix=f"lg-conformance-{uuid.uuid4().hex[:10]}", auto_hold=True
            ) as s:
                yield s

    check(run(saver))


def test_the_blocking_saver_passes_langgraphs_conformance_suite(url: str) -> None:
    @checkpointer_test(name="SnapfenceSaver")
    async def saver() -> AsyncIterator[SnapfenceSaver]:
        with snapfence.Client(url) as client:
            with SnapfenceSaver(
                client, prefix=f"lg-conformance-{uuid.uuid4().hex[:10]}", auto_hold=True
            ) as s:
                yield s

    check(run(saver))
