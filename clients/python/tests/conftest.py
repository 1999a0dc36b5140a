"""The tests run against a real ``snapfence serve``: one for the session (from $SNAPFENCE_BIN,
else the repository's target/debug/snapfence) with an embedded PostgreSQL in a temporary
directory that is removed afterwards; tests that need a server of their own (TLS and API keys)
start one with :func:`start_server`. :class:`Proxy` plays the network between a client and the
service: it drops answers, stalls and cuts connections."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[3]
READY_TIMEOUT = 120.0


def binary() -> str:
    bin_ = os.environ.get("SNAPFENCE_BIN") or str(ROOT / "target" / "debug" / "snapfence")
    if not os.access(bin_, os.X_OK):
        pytest.exit(
            f"no snapfence binary at {bin_}: run `cargo build --bin snapfence` at the repository root "
            "(or set SNAPFENCE_BIN)",
            returncode=1,
        )
    return bin_


def new_temp_dir() -> str:
    """A directory (prefix sf-tmp-py.) that the postgres user can enter: as root the embedded
    PostgreSQL runs as postgres."""
    d = tempfile.mkdtemp(prefix="sf-tmp-py.")
    os.chmod(d, 0o755)
    return d


def _die_with_parent() -> None:
    # If the test process dies (killed), the server is told to stop.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, dir_: str, log: str) -> None:
        self.proc = proc
        self.url = url
        self.dir = dir_
        self.log = log
        self.host, port = url.split("://", 1)[1].split(":")
        self.port = int(port)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self) -> str:
        try:
            return Path(self.log).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _ready(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2, context=ctx) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def start_server(
    args: Optional[List[str]] = None,
    prepare: Optional[Callable[[str, str], None]] = None,
    scheme: str = "http",
    dir_: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
) -> Server:
    """Starts ``snapfence serve`` on a free port and waits for /readyz; ``prepare(bin, data_dir)``
    runs first (e.g. to make API keys); ``env`` is added to the environment it inherits."""
    bin_ = binary()
    d = dir_ or new_temp_dir()
    data = os.path.join(d, "data")
    try:
        if prepare is not None:
            prepare(bin_, data)
        last = ""
        for _ in range(3):
            port = free_port()
            log = os.path.join(d, f"serve-{port}.log")
            with open(log, "wb") as f:
                proc = subprocess.Popen(
                    [bin_, "serve", "--data-dir", data, "--listen", f"127.0.0.1:{port}", *(args or [])],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,
                    env=None if env is None else {**os.environ, **env},
                )
            url = f"{scheme}://127.0.0.1:{port}"
            deadline = time.monotonic() + READY_TIMEOUT
            while time.monotonic() < deadline and proc.poll() is None:
                if _ready(url):
                    return Server(proc, url, d, log)
                time.sleep(0.2)
            last = Path(log).read_text(errors="replace")[-3000:]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        raise RuntimeError(f"snapfence serve did not become ready; its log:\n{last}")
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise


def create_key(bin_: str, data_dir: str, name: str, scope: str, prefix: str = "") -> str:
    out = subprocess.run(
        [bin_, "--output", "json", "keys", "create", "--data-dir", data_dir, "--name", name, "--scope", scope,
         "--prefix", prefix],
        check=True,
        capture_output=True,
        timeout=180,
    )
    token = json.loads(out.stdout)["token"]
    assert isinstance(token, str) and token
    return token


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = start_server()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def url(server: Server) -> str:
    return server.url


_counter = [0]


@pytest.fixture
def key(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Keys no other test (or earlier run) has used: ``key("name")``."""

    def make(name: str = "k") -> str:
        _counter[0] += 1
        return f"py-tests/{request.node.name}/{name}-{time.time_ns()}-{_counter[0]}"

    return make


class Proxy:
    """A loopback TCP proxy in front of a server."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.ln = socket.socket()
        self.ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ln.bind(("127.0.0.1", 0))
        self.ln.listen(128)
        self.url = f"http://127.0.0.1:{self.ln.getsockname()[1]}"
        self.mu = threading.Condition()
        self.cuts = 0
        self.cut_done = 0
        self.stalled = False
        self.closed = False
        self.sent = bytearray()
        self.conns: Dict[socket.socket, socket.socket] = {}
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_answers(self, n: int) -> None:
        """Drops the next ``n`` answers: when an answer's first byte arrives from the server (so
        it handled the request), the connection is closed without passing it on."""
        with self.mu:
            self.cuts = n

    def stall(self) -> None:
        with self.mu:
            self.stalled = True

    def unstall(self) -> None:
        with self.mu:
            self.stalled = False
            self.mu.notify_all()

    def cut_connections(self) -> int:
        """Closes every open connection (both sides); how many client connections were cut."""
        with self.mu:
            pairs = list(self.conns.items())
            self.conns.clear()
        for c, s in pairs:
            for x in (c, s):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                x.close()
        return len(pairs)

    def idempotency_keys(self) -> List[str]:
        with self.mu:
            text = bytes(self.sent).decode("latin-1")
        return re.findall(r"(?mi)^idempotency-key:[ \t]*([^\r\n]*?)[ \t]*\r?$", text)

    def close(self) -> None:
        with self.mu:
            self.closed = True
            self.stalled = False
            self.mu.notify_all()
        self.cut_connections()
        self.ln.close()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.ln.accept()
            except OSError:
                return
            try:
                host, port = self.target.rsplit(":", 1)
                s = socket.create_connection((host, int(port)))
            except OSError:
                c.close()
                continue
            with self.mu:
                if self.closed:
                    c.close()
                    s.close()
                    return
                self.conns[c] = s
                self.accepted += 1
            threading.Thread(target=self._pipe, args=(c, s, c, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(s, c, c, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, client: socket.socket, from_client: bool) -> None:
        try:
            while True:
                try:
                    data = src.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                with self.mu:
                    while self.stalled and not self.closed:
                        self.mu.wait()
                    if from_client:
                        self.sent += data
                    elif self.cuts > 0:
                        self.cuts -= 1
                        self.cut_done += 1
                        return
                try:
                    dst.sendall(data)
                except OSError:
                    return
        finally:
            with self.mu:
                other = self.conns.pop(client, None)
            for x in (src, dst):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                x.close()
            del other


@pytest.fixture
def proxy(server: Server) -> Iterator[Proxy]:
    p = Proxy(server.addr)
    try:
        yield p
    finally:
        p.close()
