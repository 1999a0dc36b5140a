"""The caller's trace context on every request a call makes, as a real ``snapfence serve`` sees it:
the server exports its spans over OTLP/HTTP (JSON) to a receiver in this module, and a server span
whose parent is the caller's span proves the context arrived. The sources: an explicit
``snapfence.trace_context``, the current OpenTelemetry span (with the SDK installed), or neither
(the server's span a root). What the client sent is read off httpx's event hooks."""

from __future__ import annotations

import asyncio
import contextvars
import gzip
import json
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest
from conftest import Proxy, Server, start_server

import snapfence

#: How long the spans of a call may take to reach the receiver (the server flushes every 100 ms).
SPAN_WAIT = 30.0
SERVER = 2  # SpanKind.SERVER on the wire


# ---- A tiny OTLP/HTTP receiver (JSON) ------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    #: ``""`` for a root span.
    parent_span_id: str
    kind: int


_KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}


def decode_spans(request: Dict[str, Any]) -> List[ReceivedSpan]:
    """The spans of an ``ExportTraceServiceRequest`` in OTLP/JSON (ids in hex)."""
    out = []
    for rs in request.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            for s in ss.get("spans") or []:
                kind = s.get("kind", 0)
                out.append(
                    ReceivedSpan(
                        name=s["name"],
                        trace_id=s["traceId"].lower(),
                        span_id=s["spanId"].lower(),
                        parent_span_id=(s.get("parentSpanId") or "").lower(),
                        kind=_KINDS[kind] if isinstance(kind, str) else int(kind),
                    )
                )
    return out


class OtlpReceiver:
    """``POST /v1/traces`` with OTLP/JSON bodies on a loopback port, in a thread."""

    def __init__(self) -> None:
        self.mu = threading.Condition()
        self.spans: List[ReceivedSpan] = []
        self.refused: List[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._export(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()

    def _answer(self, h: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _export(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            if h.path != "/v1/traces":
                raise ValueError(f"a POST to {h.path}")
            ctype = h.headers.get("Content-Type", "")
            if not ctype.startswith("application/json"):
                raise ValueError(f"OTLP/HTTP as {ctype!r}, not JSON (OTEL_EXPORTER_OTLP_PROTOCOL=http/json)")
            if h.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            spans = decode_spans(json.loads(body))
        except (ValueError, KeyError, TypeError, OSError) as e:
            with self.mu:
                self.refused.append(repr(e))
            self._answer(h, 400, json.dumps({"message": repr(e)}).encode())
            return
        with self.mu:
            self.spans.extend(spans)
            self.mu.notify_all()
        self._answer(h, 200, b"{}")

    def wait_for(self, done: Callable[[List[ReceivedSpan]], bool], what: str) -> List[ReceivedSpan]:
        """Every span received, once ``done`` holds of them."""
        deadline = time.monotonic() + SPAN_WAIT
        with self.mu:
            while not done(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no {what} after {SPAN_WAIT}s; received {len(self.spans)} spans: "
                        f"{self.spans[-20:]}; refused: {self.refused}"
                    )
                self.mu.wait(left)
            return list(self.spans)

    def spans_with_ids(self, ids: List[str]) -> Dict[str, ReceivedSpan]:
        """The spans of these span ids (each answer's), once all arrived."""
        want = set(ids)
        spans = self.wait_for(lambda got: want <= {s.span_id for s in got}, f"spans {sorted(want)}")
        return {s.span_id: s for s in spans if s.span_id in want}

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(10)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def traced(receiver: OtlpReceiver) -> Iterator[Server]:
    """A server that exports its spans to ``receiver``."""
    s = start_server(
        args=["--watch-heartbeat", "1s"],
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )
    try:
        yield s
    finally:
        s.stop()


# ---- What the client sent and what the server answered -------------------------------------------


@dataclass
class Exchange:
    method: str
    path: str
    #: The request's headers (names in lowercase).
    sent: Dict[str, str]
    #: The answer's ``traceparent`` and ``tracestate`` (the server span's), when it came.
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None

    @property
    def server_span(self) -> str:
        """The span id of the server's span for this request, from its answer."""
        assert self.traceparent is not None, f"{self.method} {self.path} was answered without a traceparent"
        return self.traceparent.split("-")[2]


class Seen:
    """Every request a client sends, with its answer's trace headers (httpx's event hooks; they
    run in whatever thread sends, the keepers' included)."""

    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.exchanges: List[Exchange] = []
        self._by_request: Dict[int, Exchange] = {}

    def request(self, r: httpx.Request) -> None:
        ex = Exchange(r.method, r.url.path, {k.lower(): v for k, v in r.headers.items()})
        with self.mu:
            self.exchanges.append(ex)
            self._by_request[id(r)] = ex

    def response(self, r: httpx.Response) -> None:
        with self.mu:
            ex = self._by_request.get(id(r.request))
        if ex is not None:
            ex.traceparent = r.headers.get("traceparent")
            ex.tracestate = r.headers.get("tracestate")

    def of(self, method: str, path_part: str) -> List[Exchange]:
        with self.mu:
            return [e for e in self.exchanges if e.method == method and path_part in e.path]


def seen_by(client: Any) -> Seen:
    seen = Seen()
    if isinstance(client, snapfence.AsyncClient):

        async def request(r: httpx.Request) -> None:
            seen.request(r)

        async def response(r: httpx.Response) -> None:
            seen.response(r)

        client._http.event_hooks = {"request": [request], "response": [response]}
    else:
        client._http.event_hooks = {"request": [seen.request], "response": [seen.response]}
    return seen


def caller() -> Tuple[str, str, str]:
    """A caller's span, made up: its trace id, span id and ``traceparent``."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def sdk_tracer() -> Any:
    """A tracer of the OpenTelemetry SDK (spans with real ids, exported nowhere)."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK is not installed")
    return sdk.TracerProvider().get_tracer("snapfence-python-tests")


def ids_of(span: Any) -> Tuple[str, str]:
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


ACQUIRE = "POST /v1/leases/{key}"
PUT = "PUT /v1/snapshots/{key}"
RELEASE = "DELETE /v1/leases/{key}"
RENEW = "POST /v1/leases/{key}/renew"
WATCH = "GET /v1/watch"


def assert_child_of(span: ReceivedSpan, name: str, trace_id: str, parent_id: str) -> None:
    assert span.name == name, span
    assert span.kind == SERVER, span
    assert span.trace_id == trace_id, f"{name} is not in the caller's trace: {span}"
    assert span.parent_span_id == parent_id, f"{name} is not a child of the caller's span: {span}"


def assert_root(span: ReceivedSpan, name: str) -> None:
    assert span.name == name, span
    assert span.parent_span_id == "", f"{name} has a parent, but the caller had no trace context: {span}"


# ---- An explicit trace context -----------------------------------------------------------------


def test_an_explicit_traceparent_parents_the_server_spans_of_an_acquire_and_a_fenced_put(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    trace_id, parent_id, traceparent = caller()
    k = key("k")
    with snapfence.Client(traced.url) as c:
        seen = seen_by(c)
        with snapfence.trace_context(traceparent) as sending:
            grant = c.acquire(k, "w", 30)
            c.put_snapshot(k, grant.token, b"state")
        c.release(k, grant.token)  # after the block: no trace context
    assert sending is True
    (acquire,), (put,), (release,) = seen.of("POST", "/v1/leases/"), seen.of("PUT", ""), seen.of("DELETE", "")
    assert acquire.sent.get("traceparent") == traceparent
    assert put.sent.get("traceparent") == traceparent
    assert "traceparent" not in release.sent
    spans = receiver.spans_with_ids([acquire.server_span, put.server_span, release.server_span])
    assert_child_of(spans[acquire.server_span], ACQUIRE, trace_id, parent_id)
    assert_child_of(spans[put.server_span], PUT, trace_id, parent_id)
    assert_root(spans[release.server_span], RELEASE)
    assert spans[release.server_span].trace_id != trace_id


def test_an_explicit_traceparent_parents_the_server_spans_of_the_async_client(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    trace_id, parent_id, traceparent = caller()
    k = key("k")

    async def main() -> Seen:
        async with snapfence.AsyncClient(traced.url) as c:
            seen = seen_by(c)
            with snapfence.trace_context(traceparent):
                grant = await c.acquire(k, "w", 30)
                await asyncio.sleep(0)
                await c.put_json(k, grant.token, {"step": 1})
            await c.release(k, grant.token)
            return seen

    seen = asyncio.run(main())
    (acquire,), (put,), (release,) = seen.of("POST", "/v1/leases/"), seen.of("PUT", ""), seen.of("DELETE", "")
    spans = receiver.spans_with_ids([acquire.server_span, put.server_span, release.server_span])
    assert_child_of(spans[acquire.server_span], ACQUIRE, trace_id, parent_id)
    assert_child_of(spans[put.server_span], PUT, trace_id, parent_id)
    assert_root(spans[release.server_span], RELEASE)


def test_a_tracestate_goes_with_its_traceparent_and_one_a_header_cannot_carry_is_left_out(
    traced: Server, key: Callable[[str], str]
) -> None:
    _, _, traceparent = caller()
    with snapfence.Client(traced.url) as c:
        seen = seen_by(c)
        with snapfence.trace_context(traceparent, "vendor=abc,other=1"):
            c.health()
        with snapfence.trace_context(traceparent, "vendor=caf\u00e9"):
            c.health()
        with snapfence.trace_context(traceparent, "vendor=a\r\nx-injected: 1"):
            c.health()
    kept, non_ascii, broken = seen.of("GET", "/healthz")
    assert kept.sent.get("tracestate") == "vendor=abc,other=1"
    # The server took it: its span's context, in the answer, carries the caller's trace state.
    assert kept.tracestate == "vendor=abc,other=1"
    for dropped in (non_ascii, broken):
        assert dropped.sent.get("traceparent") == traceparent
        assert "tracestate" not in dropped.sent
        assert "x-injected" not in dropped.sent


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "",
        "garbage",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # uppercase
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # no trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # no parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the version that is never valid
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more",  # version 00 has 4 fields
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # a short trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx-injected: 1",
    ],
)
def test_a_malformed_traceparent_sends_no_trace_context_not_even_the_current_spans(
    url: str, bad: Optional[str]
) -> None:
    tracer = None
    try:
        tracer = sdk_tracer()
    except pytest.skip.Exception:
        pass  # the rule holds without OpenTelemetry too; the SDK only adds a span it must not send
    with snapfence.Client(url) as c:
        seen = seen_by(c)
        if tracer is not None:
            with tracer.start_as_current_span("caller"):
                with snapfence.trace_context(bad, "vendor=abc") as sending:
                    c.health()
        else:
            with snapfence.trace_context(bad, "vendor=abc") as sending:
                c.health()
    assert sending is False
    (health,) = seen.of("GET", "/healthz")
    assert "traceparent" not in health.sent and "tracestate" not in health.sent
    assert "x-injected" not in health.sent


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",) * 2,  # not sampled
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03",) * 2,  # sampled, random
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more",) * 2,  # a later version
        (
            b" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\t",  # a raw header (ASGI)
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
    ],
)
def test_a_valid_traceparent_is_sent_as_it_came(url: str, given: Any, sent: str) -> None:
    with snapfence.Client(url) as c:
        seen = seen_by(c)
        with snapfence.trace_context(given) as sending:
            c.health()
    assert sending is True
    (health,) = seen.of("GET", "/healthz")
    assert health.sent.get("traceparent") == sent


def test_a_trace_context_that_is_not_a_header_value_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        with snapfence.trace_context(42):  # type: ignore[arg-type]
            pass


# ---- The current OpenTelemetry span ------------------------------------------------------------


def test_a_call_inside_an_active_opentelemetry_span_is_its_child(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    tracer = sdk_tracer()
    k = key("k")
    with snapfence.Client(traced.url) as c:
        seen = seen_by(c)
        with tracer.start_as_current_span("caller") as span:
            grant = c.acquire(k, "w", 30)
            c.put_snapshot(k, grant.token, b"state")
        c.release(k, grant.token)  # the span ended: no current span
    trace_id, parent_id = ids_of(span)
    (acquire,), (put,), (release,) = seen.of("POST", "/v1/leases/"), seen.of("PUT", ""), seen.of("DELETE", "")
    # The flags are the SDK's (sampled, and random since 1.4x): the ids are the span's.
    assert acquire.sent.get("traceparent", "").startswith(f"00-{trace_id}-{parent_id}-")
    assert "traceparent" not in release.sent
    spans = receiver.spans_with_ids([acquire.server_span, put.server_span, release.server_span])
    assert_child_of(spans[acquire.server_span], ACQUIRE, trace_id, parent_id)
    assert_child_of(spans[put.server_span], PUT, trace_id, parent_id)
    assert_root(spans[release.server_span], RELEASE)


def test_an_async_call_inside_an_active_opentelemetry_span_is_its_child(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    tracer = sdk_tracer()
    k = key("k")

    async def main() -> Tuple[Seen, Any]:
        async with snapfence.AsyncClient(traced.url) as c:
            seen = seen_by(c)
            with tracer.start_as_current_span("caller") as span:
                grant = await c.acquire(k, "w", 30)
                await c.put_snapshot(k, grant.token, b"state")
            await c.release(k, grant.token)
            return seen, span

    seen, span = asyncio.run(main())
    trace_id, parent_id = ids_of(span)
    (acquire,), (put,), (release,) = seen.of("POST", "/v1/leases/"), seen.of("PUT", ""), seen.of("DELETE", "")
    spans = receiver.spans_with_ids([acquire.server_span, put.server_span, release.server_span])
    assert_child_of(spans[acquire.server_span], ACQUIRE, trace_id, parent_id)
    assert_child_of(spans[put.server_span], PUT, trace_id, parent_id)
    assert_root(spans[release.server_span], RELEASE)


def test_an_explicit_trace_context_wins_over_the_current_opentelemetry_span(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    tracer = sdk_tracer()
    trace_id, parent_id, traceparent = caller()
    k = key("k")
    with snapfence.Client(traced.url) as c:
        seen = seen_by(c)
        with tracer.start_as_current_span("caller") as span:
            with snapfence.trace_context(traceparent):
                grant = c.acquire(k, "w", 30)
            c.release(k, grant.token)  # the explicit block ended: the span's again
    span_trace, span_id = ids_of(span)
    (acquire,), (release,) = seen.of("POST", "/v1/leases/"), seen.of("DELETE", "")
    spans = receiver.spans_with_ids([acquire.server_span, release.server_span])
    assert_child_of(spans[acquire.server_span], ACQUIRE, trace_id, parent_id)
    assert_child_of(spans[release.server_span], RELEASE, span_trace, span_id)


# ---- Neither ---------------------------------------------------------------------------------


def test_without_a_trace_context_each_server_span_is_the_root_of_a_trace_of_its_own(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    try:
        import opentelemetry.trace  # noqa: F401  (in use, with no current span)
    except ImportError:
        pass
    k = key("k")
    with snapfence.Client(traced.url) as c:
        seen = seen_by(c)
        grant = c.acquire(k, "w", 30)
        c.put_snapshot(k, grant.token, b"state")
    (acquire,), (put,) = seen.of("POST", "/v1/leases/"), seen.of("PUT", "")
    for ex in (acquire, put):
        assert not {"traceparent", "tracestate", "baggage"} & set(ex.sent), ex.sent
    spans = receiver.spans_with_ids([acquire.server_span, put.server_span])
    assert_root(spans[acquire.server_span], ACQUIRE)
    assert_root(spans[put.server_span], PUT)
    assert spans[acquire.server_span].trace_id != spans[put.server_span].trace_id


def test_the_client_works_without_opentelemetry_and_sends_no_trace_context_by_itself(url: str) -> None:
    _, _, traceparent = caller()
    script = f"""
import json, sys

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError("opentelemetry is not installed here")
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
import snapfence

sent = []
c = snapfence.Client({url!r})
c._http.event_hooks = {{"request": [lambda r: sent.append(r.headers.get("traceparent"))]}}
c.health()
with snapfence.trace_context({traceparent!r}):
    c.health()
print(json.dumps(sent))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [None, traceparent]


# ---- Every request a call makes ------------------------------------------------------------------


def test_every_attempt_of_a_retried_call_carries_the_callers_trace_context(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    trace_id, parent_id, traceparent = caller()
    k = key("k")
    proxy = Proxy(traced.addr)
    try:
        with snapfence.Client(proxy.url, retry=snapfence.RetryPolicy(initial_backoff=0.05)) as c:
            grant = c.acquire(k, "w", 30)
            seen = seen_by(c)
            proxy.cut_answers(1)  # the first attempt's answer is lost: the put is sent again
            with snapfence.trace_context(traceparent):
                c.put_snapshot(k, grant.token, b"state")
            c.release(k, grant.token)
    finally:
        proxy.close()
    puts = seen.of("PUT", "")
    assert len(puts) == 2, puts
    assert [p.sent.get("traceparent") for p in puts] == [traceparent] * 2
    assert puts[0].sent["idempotency-key"] == puts[1].sent["idempotency-key"]
    spans = receiver.wait_for(
        lambda got: len([s for s in got if s.trace_id == trace_id and s.name == PUT]) >= 2,
        "both attempts' server spans",
    )
    for s in [s for s in spans if s.trace_id == trace_id]:
        assert_child_of(s, PUT, trace_id, parent_id)


def test_a_keepers_background_renewals_carry_the_trace_context_it_started_in(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    trace_id, parent_id, traceparent = caller()
    k = key("k")
    with snapfence.Client(traced.url) as c:
        seen = seen_by(c)
        with snapfence.trace_context(traceparent):
            keeper = c.hold(k, "w", ttl=1.5).start()
        # Outside the block: the keeper renews (every half second) for the caller that started it.
        time.sleep(1.4)
        keeper.release()
    renewals = seen.of("POST", "/renew")
    assert renewals, "the keeper never renewed"
    assert {r.sent.get("traceparent") for r in renewals} == {traceparent}
    spans = receiver.spans_with_ids([r.server_span for r in renewals])
    for s in spans.values():
        assert_child_of(s, RENEW, trace_id, parent_id)


def test_an_async_keepers_renewals_carry_the_trace_context_it_started_in(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    trace_id, parent_id, traceparent = caller()
    k = key("k")

    async def main() -> Seen:
        async with snapfence.AsyncClient(traced.url) as c:
            seen = seen_by(c)
            with snapfence.trace_context(traceparent):
                keeper = await c.hold(k, "w", ttl=1.5).start()
            await asyncio.sleep(1.4)
            await keeper.release()
            return seen

    seen = asyncio.run(main())
    renewals = seen.of("POST", "/renew")
    assert renewals, "the keeper never renewed"
    spans = receiver.spans_with_ids([r.server_span for r in renewals])
    for s in spans.values():
        assert_child_of(s, RENEW, trace_id, parent_id)


def test_a_watch_carries_the_trace_context_it_was_made_in_on_every_connection(
    traced: Server, receiver: OtlpReceiver, key: Callable[[str], str]
) -> None:
    trace_id, parent_id, traceparent = caller()
    k = key("k")
    proxy = Proxy(traced.addr)
    writer = snapfence.Client(traced.url)
    try:
        with snapfence.Client(proxy.url, retry=snapfence.RetryPolicy(initial_backoff=0.05)) as c:
            seen = seen_by(c)
            with snapfence.trace_context(traceparent):
                watch = c.watch(prefix=k)
            # Connected and read outside the block: the watch was made in it.
            with watch.open():
                grant = writer.acquire(k, "w", 30)
                assert next(watch).kind == "lease.granted"
                assert proxy.cut_connections() >= 1  # the watch resumes on a new connection
                writer.release(k, grant.token)
                assert next(watch).kind == "lease.released"
    finally:
        writer.close()
        proxy.close()
    connections = seen.of("GET", "/v1/watch")
    assert len(connections) >= 2, connections
    assert {w.sent.get("traceparent") for w in connections} == {traceparent}
    spans = receiver.wait_for(
        lambda got: len([s for s in got if s.trace_id == trace_id and s.name == WATCH]) >= 2,
        "the server spans of both connections of the watch",
    )
    for s in [s for s in spans if s.trace_id == trace_id]:
        assert_child_of(s, WATCH, trace_id, parent_id)


def test_an_iterator_asks_for_every_page_in_the_trace_context_it_was_made_in(
    url: str, key: Callable[[str], str]
) -> None:
    _, _, traceparent = caller()
    prefix = key("pages") + "/"
    with snapfence.Client(url) as c:
        fence = c.acquire(prefix + "fence", "w", 30)
        for i in range(3):
            c.put_snapshot(f"{prefix}{i}", c.acquire(f"{prefix}{i}", "w", 30).token, b"x")
        seen = seen_by(c)
        with snapfence.trace_context(traceparent):
            pages = c.iter_snapshots(prefix=prefix, page_size=1)
        assert len(list(pages)) == 3
        c.release(prefix + "fence", fence.token)
    listed = seen.of("GET", "/v1/snapshots")
    assert len(listed) >= 3, listed
    assert {e.sent.get("traceparent") for e in listed} == {traceparent}


def test_the_trace_context_follows_asyncio_tasks_and_each_task_keeps_its_own(
    url: str, key: Callable[[str], str]
) -> None:
    contexts = {name: caller()[2] for name in ("a", "b", "spawned")}
    keys = {name: key(name) for name in contexts}

    async def one(c: snapfence.AsyncClient, name: str) -> None:
        with snapfence.trace_context(contexts[name]):
            for _ in range(3):
                await asyncio.sleep(0)  # the tasks interleave
                try:
                    await c.get_lease(keys[name])
                except snapfence.NotFound:
                    pass

    async def main() -> Seen:
        async with snapfence.AsyncClient(url) as c:
            seen = seen_by(c)
            await asyncio.gather(one(c, "a"), one(c, "b"))
            with snapfence.trace_context(contexts["spawned"]):
                task = asyncio.ensure_future(c.health())
            await task  # started in the block: its context was copied then
            return seen

    seen = asyncio.run(main())
    for name in ("a", "b"):
        got = [e.sent.get("traceparent") for e in seen.of("GET", keys[name].split("/")[-1])]
        assert got == [contexts[name]] * 3, (name, got)
    (health,) = seen.of("GET", "/healthz")
    assert health.sent.get("traceparent") == contexts["spawned"]


def test_a_thread_started_in_the_block_has_no_trace_context_unless_given_the_callers(url: str) -> None:
    _, _, traceparent = caller()
    with snapfence.Client(url) as c:
        seen = seen_by(c)
        with snapfence.trace_context(traceparent):
            plain = threading.Thread(target=c.health)
            carried = threading.Thread(target=contextvars.copy_context().run, args=(c.health,))
        plain.start()
        plain.join()
        carried.start()
        carried.join()
    first, second = seen.of("GET", "/healthz")
    assert "traceparent" not in first.sent
    assert second.sent.get("traceparent") == traceparent


def test_the_langgraph_savers_async_forms_carry_the_callers_trace_context(
    url: str, key: Callable[[str], str]
) -> None:
    pytest.importorskip("langgraph.checkpoint.base", reason="the langgraph extra is not installed")
    from snapfence.langgraph import SnapfenceSaver

    _, _, traceparent = caller()
    with snapfence.Client(url) as c:
        seen = seen_by(c)
        saver = SnapfenceSaver(c, prefix=key("lg"))
        config: Any = {"configurable": {"thread_id": "t1"}}

        async def main() -> None:
            with snapfence.trace_context(traceparent):
                assert await saver.aget_tuple(config) is None
                assert [t async for t in saver.alist(config)] == []

        asyncio.run(main())
    assert len(seen.exchanges) >= 2
    assert {e.sent.get("traceparent") for e in seen.exchanges} == {traceparent}
