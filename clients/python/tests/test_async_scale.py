"""One process's AsyncClient serving 1,000 concurrent waiting acquires."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Dict, List

import httpx

import snapfence

WAITERS = 1000
KEYS = 10


def waiters_on_server(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(r"^\w*lease_waiters(?:\{[^}]*\})? (\d+(?:\.\d+)?)$", text, re.M)
    assert m, "no lease_waiters gauge in /metrics"
    return int(float(m.group(1)))


def test_one_async_client_serves_1000_concurrent_waiting_acquires(url: str, key) -> None:
    prefix = key("many")

    async def main() -> None:
        async with snapfence.AsyncClient(url, timeout=30, max_connections=WAITERS + 50) as c:
            keys = [f"{prefix}/{i}" for i in range(KEYS)]
            holders = [await c.acquire(k, "holder", 120) for k in keys]
            grants: Dict[str, List[snapfence.Grant]] = {k: [] for k in keys}

            async def waiter(i: int) -> None:
                k = keys[i % KEYS]
                g = await c.acquire(k, f"w{i}", 60, wait=240)
                grants[k].append(g)
                await c.release(k, g.token)

            tasks = [asyncio.ensure_future(waiter(i)) for i in range(WAITERS)]
            deadline = time.monotonic() + 240
            while True:
                n = await asyncio.get_running_loop().run_in_executor(None, waiters_on_server, url)
                if n >= WAITERS:
                    break
                assert time.monotonic() < deadline, f"only {n} of {WAITERS} acquires waiting on the server"
                assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()][:3]
                await asyncio.sleep(0.2)
            # All 1,000 wait at once; releasing the holders hands each key down its queue.
            for h in holders:
                await c.release(h.key, h.token)
            await asyncio.wait_for(asyncio.gather(*tasks), 240)
            owners = sorted(g.lease.owner for gs in grants.values() for g in gs)
            assert owners == sorted(f"w{i}" for i in range(WAITERS))
            for k, gs in grants.items():
                tokens = [g.token for g in gs]
                assert len(gs) == WAITERS // KEYS and tokens == sorted(tokens)
                assert tokens[0] > holders[keys.index(k)].token

    asyncio.run(main())
