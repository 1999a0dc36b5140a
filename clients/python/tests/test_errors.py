"""The exceptions mirror the server's codes one to one: read from its code table and from
openapi.yaml, so a code added to the server without an exception here fails this test."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

import snapfence
from snapfence import _core

ERROR_RS = ROOT / "crates" / "snapfence-types" / "src" / "error.rs"
OPENAPI = ROOT / "openapi.yaml"


def server_codes() -> dict[str, int]:
    text = ERROR_RS.read_text()
    table = text[text.index("codes! {") :]
    found = re.findall(r'^\s*[A-Z][A-Za-z]* = "([a-z_]+)", (\d{3}),', table, re.M)
    assert len(found) >= 20, f"the code table of {ERROR_RS} was not read: {found}"
    return {name: int(status) for name, status in found}


def openapi_codes() -> list[str]:
    text = OPENAPI.read_text()
    block = text[text.index("    ProblemCode:") :]
    block = block[block.index("enum:") : block.index("description:")]
    codes = re.findall(r"^\s*- ([a-z_]+)$", block, re.M)
    assert len(codes) >= 20, f"the ProblemCode enum of {OPENAPI} was not read"
    return codes


def test_every_code_of_the_server_has_an_exception_with_its_status() -> None:
    codes = server_codes()
    missing = sorted(set(codes) - set(snapfence.ERRORS))
    assert not missing, f"codes of {ERROR_RS} without an exception in snapfence: {missing}"
    for code, status in codes.items():
        cls = snapfence.ERRORS[code]
        assert cls.code == code and cls.status == status, (code, cls, status)
        assert issubclass(cls, snapfence.SnapfenceError)
        assert getattr(snapfence, cls.__name__) is cls, f"{cls.__name__} is not exported"
    extra = sorted(set(snapfence.ERRORS) - set(codes))
    assert not extra, f"exceptions for codes the server does not have: {extra}"


def test_every_code_of_openapi_has_an_exception() -> None:
    missing = sorted(set(openapi_codes()) - set(snapfence.ERRORS))
    assert not missing, f"codes of openapi.yaml's ProblemCode without an exception: {missing}"


def test_an_answer_becomes_the_exception_of_its_code() -> None:
    for code, cls in snapfence.ERRORS.items():
        body = f'{{"code":"{code}","detail":"d","status":{cls.status}}}'.encode()
        if code == "lease_held":
            body = (
                b'{"code":"lease_held","detail":"d","holder":{"owner":"o","acquired_at":"2026-12-02T13:05:00.123Z",'
                b'"expires_at":"2026-12-02T13:05:30.123Z","metadata":null}}'
            )
        elif code == "recovery_required":
            body = (
                b'{"code":"recovery_required","detail":"d","recovery":{"owner":"o","token":3,'
                b'"acquired_at":"2026-12-02T13:05:00Z","ended_at":"2026-12-02T13:06:00Z","reason":"expired",'
                b'"metadata":null}}'
            )
        elif code in ("stale_token", "unknown_token"):
            body = f'{{"code":"{code}","detail":"d","presented_token":3,"highest_token":5,"audit_id":9}}'.encode()
        answer = _core.Answer(
            int(cls.status or 0), {"content-type": "application/problem+json", "x-request-id": "r1"}, body
        )
        e = _core.error_of(answer, "GET /x")
        assert type(e) is cls and e.detail == "d" and e.request_id == "r1", (code, e)


def test_lease_held_on_a_free_key_says_its_state_and_the_waiters_queued_first() -> None:
    body = (
        b'{"code":"lease_held","detail":"d","holder":{"owner":"o","acquired_at":"2026-12-02T13:05:00.123Z",'
        b'"expires_at":"2026-12-02T13:05:30.123Z","metadata":null},"state":"released","waiters":2}'
    )
    answer = _core.Answer(409, {"content-type": "application/problem+json"}, body)
    e = _core.error_of(answer, "POST /v1/leases/k")
    assert isinstance(e, snapfence.LeaseHeld) and (e.state, e.waiters) == ("released", 2), e


@pytest.mark.parametrize(
    ("first", "last", "indeterminate"),
    [
        # The first answer was lost; the last attempt only says it changed nothing itself.
        (snapfence.TransportError("cut", may_have_reached=True), snapfence.Unavailable("u"), True),
        (
            snapfence.TransportError("cut", may_have_reached=True),
            snapfence.TransportError("refused", may_have_reached=False),
            True,
        ),
        # A definite answer settles the call.
        (snapfence.TransportError("cut", may_have_reached=True), snapfence.LeaseHeld("held"), False),
        # Nothing can have landed before: no Indeterminate.
        (snapfence.TransportError("refused", may_have_reached=False), snapfence.Unavailable("u"), False),
    ],
)
def test_a_change_is_indeterminate_only_when_an_earlier_attempt_may_have_landed(
    first: snapfence.SnapfenceError, last: snapfence.SnapfenceError, indeterminate: bool
) -> None:
    call = _core.release("k", 1)
    attempts = _core.Attempts(call, snapfence.RetryPolicy(max_attempts=2, initial_backoff=0.001))
    verdict, (error, _) = attempts.outcome(first)
    assert verdict == "retry" and error is first
    verdict, error = attempts.outcome(last)
    assert verdict == "fail"
    assert isinstance(error, snapfence.Indeterminate) == indeterminate
    if not indeterminate:
        assert error is last


def test_reads_do_not_retry_request_in_progress_but_changes_do() -> None:
    policy = snapfence.RetryPolicy(max_attempts=3, initial_backoff=0.001)
    read = _core.Attempts(_core.get_lease("k"), policy)
    assert read.idempotency_key is None
    assert read.outcome(snapfence.RequestInProgress("p"))[0] == "fail"
    change = _core.Attempts(_core.release("k", 1), policy)
    assert change.idempotency_key is not None
    assert change.outcome(snapfence.RequestInProgress("p"))[0] == "retry"
    assert change.headers()["Idempotency-Key"] == change.idempotency_key


def test_retry_after_is_believed_over_the_backoff() -> None:
    policy = snapfence.RetryPolicy(max_attempts=3, initial_backoff=0.01)
    e = snapfence.TooManyRequests("t", retry_after=2.0)
    assert _core.pause_before_retry(policy, e, 1) == 2.0
    for n, full in [(1, 0.01), (2, 0.02), (10, 2.0)]:
        assert full / 2 <= policy.backoff(n) <= full
