import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, LostLease } from "snapfence";
import { Child, Proxy, startServer, uniqueKey, type Server } from "./helpers.js";

let server: Server;
let client: Client;
before(async () => {
  server = await startServer();
  client = new Client({ url: server.url });
});
after(() => server?.stop());

test("hold renews past the TTL, releases at the end and returns the work's value", async () => {
  const key = uniqueKey("hold");
  const out = await client.hold(key, { owner: "w", ttlMs: 600 }, async (lease, signal) => {
    for (let i = 0; i < 6; i++) {
      lease.throwIfLost();
      await client.putSnapshot(key, lease.token, `step ${i}`);
      await sleep(250);
    }
    assert.equal(signal.aborted, false);
    return lease.token;
  });
  const s = await client.getLease(key);
  assert.equal(s.state, "released");
  assert.equal(s.lease.token, out);
  assert.equal((await client.getSnapshot(key)).text(), "step 5");
});

test("a grant after a long wait (TTL 2 s, queued 4 s behind a holder) is not reported lost", async () => {
  const key = uniqueKey("long-wait");
  const first = await client.acquire(key, { owner: "first", ttlMs: 30_000 });
  setTimeout(() => void client.release(key, first.token), 4000);
  const asked = performance.now();
  let waitedMs = 0;
  await client.hold(key, { owner: "second", ttlMs: 2000, waitMs: 20_000 }, async (lease, signal) => {
    waitedMs = performance.now() - asked;
    lease.throwIfLost();
    assert.ok(lease.remainingMs() > 1000, `only ${lease.remainingMs()} ms left right after the grant`);
    for (let i = 0; i < 6; i++) {
      await sleep(500);
      lease.throwIfLost();
      await client.putSnapshot(key, lease.token, `step ${i}`);
    }
    assert.equal(signal.aborted, false);
  });
  assert.ok(waitedMs >= 3900, `the grant came after ${waitedMs} ms, not after the 4 s wait`);
});

test("a SIGSTOPped holder's signal aborts before its lease's expiry on the server", async () => {
  const key = uniqueKey("frozen");
  const child = new Child("holder", { SNAPFENCE_URL: server.url, KEY: key });
  try {
    const granted = await child.next();
    assert.equal(granted["granted"], true);
    // Frozen before its first renewal (after 1.5 s at the earliest), thawed 2.8 s later: past
    // its lapse (TTL 4 s less the 1.5 s margin) but before the server's expiry.
    child.proc.kill("SIGSTOP");
    await sleep(2800);
    child.proc.kill("SIGCONT");
    const aborted = await child.next(5000);
    assert.equal(aborted["aborted"], true);
    assert.equal(aborted["reason"], "lapsing");
    const s = await client.getLease(key);
    assert.equal(s.state, "held", "the server still holds the lease when the holder has stopped");
    assert.equal(s.lease.token, granted["token"]);
    assert.ok(
      s.lease.expiresAt.getTime() > (aborted["at"] as number),
      `aborted at ${aborted["at"]}, the server's expiry is ${s.lease.expiresAt.getTime()}`,
    );
    child.send("go");
    const thrown = await child.next();
    assert.deepEqual(thrown, { thrown: "LostLease", reason: "lapsing" });
  } finally {
    await child.kill();
  }
});

test("a lease released behind the holder's back aborts the signal, and hold throws LostLease", async () => {
  const key = uniqueKey("lost");
  const e = await client
    .hold(key, { owner: "w", ttlMs: 900 }, async (lease, signal) => {
      await client.release(key, lease.token);
      await new Promise((ok) => signal.addEventListener("abort", ok, { once: true }));
      assert.ok(signal.reason instanceof LostLease);
      assert.throws(() => lease.throwIfLost(), LostLease);
      return "done";
    })
    .catch((x: unknown) => x);
  assert.ok(e instanceof LostLease);
  assert.equal(e.reason, "lease_lost");
});

test("renewals that keep failing (the service unreachable) abort the signal while the server still holds the lease", async () => {
  const key = uniqueKey("unreachable");
  const proxy = await new Proxy(server.port).listen();
  const via = new Client({ url: proxy.url, timeoutMs: 500 });
  const e = await via
    .hold(key, { owner: "w", ttlMs: 3000, marginMs: 1000 }, async (lease, signal) => {
      await proxy.close();
      await new Promise((ok) => signal.addEventListener("abort", ok, { once: true }));
      const s = await client.getLease(key);
      assert.equal(s.state, "held");
      assert.ok(s.lease.expiresAt.getTime() > Date.now());
      assert.equal(lease.lost?.reason, "lapsing");
    })
    .catch((x: unknown) => x);
  assert.ok(e instanceof LostLease);
  assert.equal(e.reason, "lapsing");
});

test("work that throws is released and its own error comes out", async () => {
  const key = uniqueKey("throws");
  await assert.rejects(
    client.hold(key, { owner: "w", ttlMs: 5000 }, async () => {
      throw new Error("the work failed");
    }),
    /the work failed/,
  );
  assert.equal((await client.getLease(key)).state, "released");
});

test("a margin that leaves no time to renew is refused before acquiring", async () => {
  const key = uniqueKey("margin");
  await assert.rejects(
    client.hold(key, { owner: "w", ttlMs: 1000, marginMs: 1000 }, async () => {}),
    /leaves no time to renew/,
  );
  await assert.rejects(client.getLease(key), /not_found|never|no/i);
});

test("a holder whose event loop was frozen past the lapse learns it at its next throwIfLost, before any timer runs", async () => {
  const key = uniqueKey("busy");
  const e = await client
    .hold(key, { owner: "w", ttlMs: 1500, marginMs: 500 }, async (lease) => {
      lease.throwIfLost();
      // The process is stuck (a long synchronous computation, a GC pause): no timer can fire.
      const until = performance.now() + 1100;
      while (performance.now() < until);
      assert.throws(() => lease.throwIfLost(), LostLease);
      const s = await client.getLease(key);
      assert.equal(s.state, "held", "the server still holds the lease");
    })
    .catch((x: unknown) => x);
  assert.ok(e instanceof LostLease);
  assert.equal(e.reason, "lapsing");
});

test("the caller's signal aborts the work's signal too, and the lease is released", async () => {
  const key = uniqueKey("caller-abort");
  const ctl = new AbortController();
  await assert.rejects(
    client.hold(key, { owner: "w", ttlMs: 5000, signal: ctl.signal }, async (_lease, signal) => {
      setTimeout(() => ctl.abort(new Error("shutting down")), 100);
      await new Promise((_ok, fail) => signal.addEventListener("abort", () => fail(signal.reason), { once: true }));
    }),
    /shutting down/,
  );
  assert.equal((await client.getLease(key)).state, "released");
});
