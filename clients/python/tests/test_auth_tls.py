"""API keys (bearer) and TLS from a private CA, against a server of their own: HTTPS with a
throwaway CA, three API keys, a small body limit and one request in flight per key."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from typing import Dict, Iterator, Tuple

import pytest
from conftest import Server, create_key, new_temp_dir, start_server

import snapfence


def make_ca(d: str) -> Tuple[str, str, str]:
    """A CA and a certificate for 127.0.0.1 it signed: (ca.pem, server chain, server key)."""
    ca_key, ca, key, csr, cert, chain, ext = (
        os.path.join(d, n) for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.crt", "chain.pem", "ext")
    )

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", ca_key,
        "-out", ca, "-days", "2", "-subj", "/CN=snapfence python tests CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
        "-subj", "/CN=127.0.0.1")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
        "-extfile", ext)
    with open(chain, "wb") as out:
        for p in (cert, ca):
            with open(p, "rb") as f:
                out.write(f.read())
    for p in (ca, chain, key):
        os.chmod(p, 0o644)
    return ca, chain, key


@pytest.fixture(scope="module")
def tls_server() -> Iterator[Tuple[Server, str, Dict[str, str]]]:
    d = new_temp_dir()
    ca, chain, key = make_ca(d)
    tokens: Dict[str, str] = {}

    def prepare(bin_: str, data_dir: str) -> None:
        for name, scope, prefix in (("ops", "admin", ""), ("worker", "write", "jobs/"), ("viewer", "read", "")):
            tokens[name] = create_key(bin_, data_dir, name, scope, prefix)

    s = start_server(
        ["--tls-cert", chain, "--tls-key", key, "--max-snapshot-bytes", "1024", "--max-in-flight-per-key", "1"],
        prepare=prepare,
        scheme="https",
        dir_=d,
    )
    try:
        yield s, ca, tokens
    finally:
        s.stop()


def test_an_unknown_ca_fails_at_once_and_is_not_retried(tls_server) -> None:
    s, _, tokens = tls_server
    retries: list[object] = []
    c = snapfence.Client(s.url, api_key=tokens["ops"], on_retry=lambda e, p: retries.append(e))
    with pytest.raises(snapfence.TransportError) as e:
        c.get_lease("jobs/1")
    assert not e.value.may_have_reached and not e.value.is_transient and retries == []


def test_api_keys_and_scopes(tls_server, key) -> None:
    s, ca, tokens = tls_server
    with pytest.raises(snapfence.Unauthorized):
        snapfence.Client(s.url, ca_file=ca).get_lease("jobs/1")
    with pytest.raises(snapfence.Unauthorized):
        snapfence.Client(s.url, ca_file=ca, api_key="sf_nope_nope").get_lease("jobs/1")
    worker = snapfence.Client(s.url, ca_file=ca, api_key=tokens["worker"])
    k = "jobs/" + key().replace("/", "_")
    g = worker.acquire(k, "w", 30)
    assert worker.put_snapshot(k, g.token, b"x").version == 1
    with pytest.raises(snapfence.Forbidden):
        worker.acquire("other/" + key().replace("/", "_"), "w", 30)
    with pytest.raises(snapfence.Forbidden):
        worker.rejections()
    with pytest.raises(snapfence.PayloadTooLarge):
        worker.put_snapshot(k, g.token, b"y" * 2048)
    with open(ca) as f:
        viewer = snapfence.Client(s.url, ca_pem=f.read(), api_key=tokens["viewer"])
    assert viewer.get_snapshot(k).body == b"x"
    with pytest.raises(snapfence.Forbidden):
        viewer.release(k, g.token)
    ops = snapfence.Client(s.url, ca_file=ca, api_key=tokens["ops"])
    assert ops.rejections(key=k).items == []
    worker.release(k, g.token)


def test_async_client_over_tls(tls_server, key) -> None:
    s, ca, tokens = tls_server

    async def main() -> None:
        async with snapfence.AsyncClient(s.url, ca_file=ca, api_key=tokens["ops"]) as c:
            k = key()
            g = await c.acquire(k, "w", 30)
            assert (await c.get_lease(k)).newest_token == g.token
            await c.release(k, g.token)

    asyncio.run(main())


def test_too_many_requests_is_retried_after_retry_after(tls_server, key) -> None:
    s, ca, tokens = tls_server
    ops = snapfence.Client(s.url, ca_file=ca, api_key=tokens["ops"])
    k = "jobs/" + key().replace("/", "_")
    held = ops.acquire(k, "ops", 30)
    # The worker's one request in flight: an acquire that waits for the held key.
    worker = snapfence.Client(s.url, ca_file=ca, api_key=tokens["worker"])
    waited: list[BaseException] = []

    def wait() -> None:
        try:
            worker.acquire(k, "w", 30, wait=4)
        except snapfence.LeaseHeld as e:
            waited.append(e)

    t = threading.Thread(target=wait)
    t.start()
    once = snapfence.Client(s.url, ca_file=ca, api_key=tokens["worker"], retry=snapfence.RetryPolicy(max_attempts=1))
    for _ in range(200):
        try:
            once.get_lease(k)
        except snapfence.TooManyRequests as e:
            # The contract: Retry-After says when to retry.
            assert e.status == 429 and e.retry_after is not None and e.retry_after >= 0
            break
    else:
        pytest.fail("the worker's waiting acquire never took its one request in flight")
    retries: list[snapfence.SnapfenceError] = []
    patient = snapfence.Client(
        s.url,
        ca_file=ca,
        api_key=tokens["worker"],
        retry=snapfence.RetryPolicy(max_attempts=30, initial_backoff=0.05, max_backoff=0.5),
        on_retry=lambda e, p: retries.append(e),
    )
    status = patient.get_lease(k)
    t.join(30)
    assert status.lease.owner == "ops" and waited
    assert retries and all(isinstance(e, snapfence.TooManyRequests) for e in retries)
    ops.release(k, held.token)


def test_from_env_reads_the_url_the_api_key_and_the_ca(tls_server, key, monkeypatch) -> None:
    s, ca, tokens = tls_server
    monkeypatch.setenv("SNAPFENCE_URL", s.url)
    monkeypatch.setenv("SNAPFENCE_API_KEY", tokens["ops"])
    monkeypatch.setenv("SNAPFENCE_CA_CERT", ca)
    k = key()
    c = snapfence.Client.from_env()
    g = c.acquire(k, "w", 30)
    assert c.base_url == s.url and c.get_lease(k).newest_token == g.token
    with pytest.raises(snapfence.Unauthorized):
        snapfence.Client.from_env(api_key="sf_nope_nope").get_lease(k)

    async def main() -> None:
        async with snapfence.AsyncClient.from_env() as ac:
            await ac.release(k, g.token)

    asyncio.run(main())
    assert c.get_lease(k).state == "released"
