"""Leader election across three processes: the leader is SIGKILLed and one standby takes over
within the TTL plus the hand-off, with no token granted and dropped on the way; a leader paused
past its TTL (SIGSTOP) is deposed, and its write after it resumes is refused."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest

import snapfence

TTL = 2.0

CANDIDATE = textwrap.dedent(
    """
    import json, sys, threading, time
    import snapfence

    url, name, me, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    out = threading.Lock()

    def say(**event):
        with out:
            print(json.dumps(event), flush=True)

    c = snapfence.Client(url)
    e = snapfence.Election(
        c, name, candidate=me, ttl=ttl, renew_every=ttl / 6,
        on_lost=lambda err: say(event="lost", reason=err.reason),
    )
    say(event="campaigning")
    leadership = e.campaign()
    say(event="leader", token=leadership.token)
    c.put_snapshot(name, leadership.token, me.encode())
    say(event="wrote")
    for line in sys.stdin:
        # The parent asks for a write as a deposed leader would make it: without checking.
        try:
            c.put_snapshot(name, leadership.token, (me + " again").encode())
            say(event="write", result="accepted")
        except snapfence.SnapfenceError as err:
            say(event="write", result=err.code)
    """
)

Line = Tuple[str, Dict[str, Any], float]


class Candidate:
    def __init__(self, url: str, name: str, me: str, lines: queue.Queue[Line]) -> None:
        self.me = me
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CANDIDATE, url, name, me, str(TTL)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, args=(lines,), daemon=True).start()

    def _read(self, lines: queue.Queue[Line]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            lines.put((self.me, json.loads(line), time.monotonic()))

    def ask_write(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("write\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)


def next_line(lines: queue.Queue[Line], want: str, timeout: float = 60.0) -> Line:
    """The next line with ``event == want``; any ``lost`` line before it fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"no {want!r} from any candidate within {timeout} s")
        who, ev, at = lines.get(timeout=left)
        if ev["event"] == want:
            return who, ev, at
        assert ev["event"] != "lost", f"{who} lost its leadership: {ev}"


def test_a_killed_leader_is_replaced_once_and_a_paused_one_is_fenced(url: str, key) -> None:
    name = key("election")
    c = snapfence.Client(url)
    lines: queue.Queue[Line] = queue.Queue()
    candidates: Dict[str, Candidate] = {}
    watch = c.watch(prefix=name).open()
    events: List[snapfence.ChangeEvent] = []

    def follow() -> None:
        for ev in watch:
            if ev.key == name and ev.kind.startswith("lease."):
                events.append(ev)

    threading.Thread(target=follow, daemon=True).start()
    try:
        candidates["a"] = Candidate(url, name, "a", lines)
        leader, ev, _ = next_line(lines, "leader")
        assert leader == "a"
        first_token = ev["token"]
        next_line(lines, "wrote")
        for me in ("b", "c"):
            candidates[me] = Candidate(url, name, me, lines)
            next_line(lines, "campaigning")
        # Both standbys are queued behind the leader.
        deadline = time.monotonic() + 30
        while len(c.lease_waiters(name).items) < 2:
            assert time.monotonic() < deadline, "the standbys did not queue"
            time.sleep(0.05)

        # The leader dies: exactly one standby takes over.
        killed_at = time.monotonic()
        candidates["a"].proc.kill()
        new, ev, elected_at = next_line(lines, "leader", timeout=TTL * 5)
        new_token = ev["token"]
        assert new in ("b", "c") and new_token > first_token
        _, _, wrote_at = next_line(lines, "wrote")
        failover = wrote_at - killed_at
        print(f"failover after SIGKILL: elected in {elected_at - killed_at:.2f} s, first write in {failover:.2f} s")
        assert failover < TTL + 2.0, failover
        assert c.get_snapshot(name).body == new.encode()

        # Over the hand-off and two more TTLs: nobody else is elected, nobody loses.
        time.sleep(2 * TTL)
        assert lines.empty(), list(lines.queue)
        status = c.get_lease(name)
        assert status.state == "held" and status.lease.token == new_token and status.lease.owner == new
        granted = [e.token for e in events if e.kind == "lease.granted"]
        assert granted == [first_token, new_token], events
        dropped = [e for e in events if e.kind != "lease.granted" and e.token != first_token]
        assert dropped == [], dropped

        # The new leader is paused past its TTL: the last standby takes over, and the paused
        # leader's write after it resumes is refused by the fence.
        third = "c" if new == "b" else "b"
        candidates[new].proc.send_signal(signal.SIGSTOP)
        try:
            who, ev, _ = next_line(lines, "leader", timeout=TTL * 5)
            assert who == third and ev["token"] > new_token
            third_token = ev["token"]
            next_line(lines, "wrote")
        finally:
            candidates[new].proc.send_signal(signal.SIGCONT)
        candidates[new].ask_write()
        refused: List[Dict[str, Any]] = []
        seen_lost = False
        deadline = time.monotonic() + 30
        while not refused:
            who, ev, _ = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            assert who == new, (who, ev)
            if ev["event"] == "lost":
                seen_lost = True
            elif ev["event"] == "write":
                refused.append(ev)
        assert refused == [{"event": "write", "result": "stale_token"}]
        assert c.get_snapshot(name).body == third.encode()
        assert c.get_lease(name).lease.token == third_token
        rejection = next(c.iter_rejections(key=name))
        assert rejection.presented_token == new_token and rejection.highest_token == third_token
        # The paused leader's keeper says it lost (at once, or at the latest by its next check).
        if not seen_lost:
            who, ev, _ = lines.get(timeout=10)
            assert (who, ev["event"]) == (new, "lost"), (who, ev)
    finally:
        watch.close()
        for cand in candidates.values():
            cand.stop()
