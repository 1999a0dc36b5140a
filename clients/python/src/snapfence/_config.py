"""What both clients are made of: the base URL, the API key, TLS, timeouts and retries."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union
from urllib.parse import urlsplit

import httpx

from ._core import RetryPolicy, Seconds, seconds
from ._errors import InvalidRequest, SnapfenceError

__version__ = "0.1.0"

#: Called before each retry with the failure and the pause (seconds) before the next attempt.
OnRetry = Callable[[SnapfenceError, float], None]


@dataclass
class Config:
    base: str
    headers: Dict[str, str]
    verify: Union[bool, ssl.SSLContext]
    timeout: float
    connect_timeout: float
    watch_idle_timeout: float
    retry: RetryPolicy
    on_retry: Optional[OnRetry]
    limits: httpx.Limits

    def timeout_for(self, extra: float = 0.0) -> httpx.Timeout:
        t = self.timeout + extra
        return httpx.Timeout(t, connect=self.connect_timeout, pool=t)

    def watch_timeout(self) -> httpx.Timeout:
        # A watch's answer never ends by itself: each read is bounded instead, which the
        # server's heartbeats keep short.
        return httpx.Timeout(
            self.timeout, connect=self.connect_timeout, read=self.watch_idle_timeout, pool=self.timeout
        )


def from_env(overrides: Dict[str, object]) -> Tuple[str, Dict[str, object]]:
    """The base URL and options the environment names, as the Go and Rust clients read it:
    ``SNAPFENCE_URL`` (default ``http://127.0.0.1:7878``), ``SNAPFENCE_API_KEY``,
    ``SNAPFENCE_CA_CERT`` (a PEM file of private CA roots). Explicit options win."""
    url = os.environ.get("SNAPFENCE_URL") or "http://127.0.0.1:7878"
    opts: Dict[str, object] = {}
    if os.environ.get("SNAPFENCE_API_KEY"):
        opts["api_key"] = os.environ["SNAPFENCE_API_KEY"]
    if os.environ.get("SNAPFENCE_CA_CERT"):
        opts["ca_file"] = os.environ["SNAPFENCE_CA_CERT"]
    opts.update(overrides)
    return url, opts


def make_config(
    base_url: str,
    *,
    api_key: Optional[str],
    timeout: Seconds,
    connect_timeout: Seconds,
    watch_idle_timeout: Seconds,
    retry: Optional[RetryPolicy],
    on_retry: Optional[OnRetry],
    ca_file: Optional[str],
    ca_pem: Optional[Union[str, bytes]],
    verify: Union[bool, ssl.SSLContext],
    max_connections: Optional[int],
) -> Config:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise InvalidRequest(
            f"{base_url!r} is not an http(s) URL without a query; write it as http://host:port"
        )
    headers = {"User-Agent": f"snapfence-python/{__version__}"}
    if api_key is not None:
        if not api_key or any(not (0x21 <= ord(c) <= 0x7E) for c in api_key):
            raise InvalidRequest(
                "the API key holds characters a header cannot carry; pass it exactly as `snapfence keys create` showed it"
            )
        headers["Authorization"] = f"Bearer {api_key}"
    v: Union[bool, ssl.SSLContext] = verify
    if ca_file is not None or ca_pem is not None:
        if isinstance(verify, ssl.SSLContext):
            ctx = verify
        elif verify is False:
            raise InvalidRequest("ca_file/ca_pem add trusted roots, which verify=False would ignore")
        else:
            # The usual public roots (httpx's), plus the private ones.
            ctx = httpx.create_ssl_context()
        try:
            if ca_file is not None:
                ctx.load_verify_locations(cafile=ca_file)
            if ca_pem is not None:
                ctx.load_verify_locations(cadata=ca_pem.decode() if isinstance(ca_pem, bytes) else ca_pem)
        except (ssl.SSLError, OSError, ValueError) as e:
            raise InvalidRequest(f"a root certificate is not readable PEM: {e}") from e
        v = ctx
    return Config(
        base=base_url.rstrip("/"),
        headers=headers,
        verify=v,
        timeout=seconds(timeout),
        connect_timeout=seconds(connect_timeout),
        watch_idle_timeout=seconds(watch_idle_timeout),
        retry=retry or RetryPolicy(),
        on_retry=on_retry,
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
    )
