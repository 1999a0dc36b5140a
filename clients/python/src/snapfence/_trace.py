"""The caller's trace context (W3C Trace Context), passed on with every request a call makes, so
the server's span of the request is a child of the caller's span. Two sources, the first that
says anything wins:

1. the one set with :func:`trace_context` around the calls (a context variable: it follows the
   code into the tasks it starts, as any ``contextvars`` value does);
2. else, when OpenTelemetry's API is in use (``pip install 'snapfence[otel]'``) and there is a
   current valid span, what ``opentelemetry.propagate.inject`` writes for it (``traceparent``,
   ``tracestate``, and whatever else the application's propagators carry).

Without either, no trace header is sent. Tracing never fails a call."""

from __future__ import annotations

import importlib
import re
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Dict, Iterator, Optional, Union

#: version-trace_id-parent_id-flags, lowercase hex; a later version may add fields after a dash.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[!-~]*)?")

#: The headers of the trace context set by :func:`trace_context` (empty: set, but to nothing
#: that can be sent), or ``None`` outside any.
_EXPLICIT: ContextVar[Optional[Dict[str, str]]] = ContextVar("snapfence_trace_context", default=None)

Header = Union[str, bytes, None]


def _text(name: str, v: Header) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bytes):
        v = v.decode("latin-1")
    if not isinstance(v, str):
        raise TypeError(f"{name} is a header value (str, bytes or None), got {type(v).__name__}")
    # Optional whitespace around a header's value is not part of it.
    return v.strip(" \t")


def valid_traceparent(traceparent: str) -> bool:
    """Whether ``traceparent`` is a W3C ``traceparent`` a server can parent its span by: version
    ``00`` (or a later one, not ``ff``), a trace id and a parent id of lowercase hex, not all
    zeros, and the flags."""
    m = _TRACEPARENT.fullmatch(traceparent)
    if m is None:
        return False
    version, trace_id, parent_id, _flags, more = m.groups()
    if version == "ff" or (version == "00" and more):
        return False
    return trace_id != "0" * 32 and parent_id != "0" * 16


def _headers(traceparent: Header, tracestate: Header) -> Dict[str, str]:
    tp = _text("traceparent", traceparent)
    ts = _text("tracestate", tracestate)
    if tp is None or not valid_traceparent(tp):
        # The W3C rule: no tracestate without a valid traceparent.
        return {}
    out = {"traceparent": tp}
    if ts and all(0x20 <= ord(c) <= 0x7E for c in ts):
        out["tracestate"] = ts
    return out


@contextmanager
def trace_context(traceparent: Header, tracestate: Header = None) -> Iterator[bool]:
    """Sends ``traceparent`` (and ``tracestate``) with every request of the calls made in the
    block, by either client, instead of the current OpenTelemetry span's: retries, the
    connections of a watch opened in it, and the renewals of a keeper started in it included.
    It follows the block's code into the asyncio tasks started in it (a ``contextvars`` value;
    a thread starts without it: run it in ``contextvars.copy_context()``). Blocks nest; the
    innermost wins.

    The value is passed on as it came (the headers of a request being served, say), so a value
    that is not a valid W3C ``traceparent`` (``None`` included) does not raise: nothing is sent
    in the block, which is what the server would make of it anyway (its span a root), and the
    current OpenTelemetry span is not sent either. A ``tracestate`` that a header cannot carry
    is left out. The block's value says whether a ``traceparent`` is sent in it."""
    headers = _headers(traceparent, tracestate)
    token = _EXPLICIT.set(headers)
    try:
        yield "traceparent" in headers
    finally:
        _EXPLICIT.reset(token)


def trace_headers() -> Dict[str, str]:
    """The trace headers a call made now sends (see the module's doc)."""
    explicit = _EXPLICIT.get()
    if explicit is not None:
        return dict(explicit)
    return _from_opentelemetry()


def _from_opentelemetry() -> Dict[str, str]:
    # No span can be current unless the application imported OpenTelemetry's trace API: without
    # it, nothing of OpenTelemetry is imported here (its package need not even be installed).
    trace: Any = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return {}
    try:
        if not trace.get_current_span().get_span_context().is_valid:
            return {}
        propagate: Any = importlib.import_module("opentelemetry.propagate")
        carrier: Dict[str, str] = {}
        propagate.inject(carrier)
    except Exception:
        # A broken propagator leaves the call untraced rather than failed.
        return {}
    return {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}
