import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, InvalidRequest, LeaseHeld, LeaseLost, NotFound, RecoveryRequired } from "snapfence";
import { startServer, uniqueKey, type Server } from "./helpers.js";

let server: Server;
let client: Client;
before(async () => {
  server = await startServer();
  client = new Client({ url: server.url });
});
after(() => server?.stop());

test("acquire grants a lease with a fresh token, and a second acquire is refused lease_held naming the holder", async () => {
  const key = uniqueKey("acquire");
  const g = await client.acquire(key, { owner: "w1", ttlMs: 30_000, metadata: { pid: 42 } });
  assert.equal(g.key, key);
  assert.equal(g.owner, "w1");
  assert.ok(g.token >= 1);
  assert.deepEqual(g.metadata, { pid: 42 });
  assert.ok(g.expiresAt.getTime() - g.acquiredAt.getTime() === 30_000);
  const e = await client.acquire(key, { owner: "w2", ttlMs: 30_000 }).catch((x: unknown) => x);
  assert.ok(e instanceof LeaseHeld);
  assert.equal(e.code, "lease_held");
  assert.equal(e.status, 409);
  assert.equal(e.holder?.owner, "w1");
  assert.ok(e.requestId);
});

test("renew keeps the token and moves the expiry; release frees the key; a stale renew is lease_lost", async () => {
  const key = uniqueKey("renew");
  const g = await client.acquire(key, { owner: "w", ttlMs: 1000 });
  const r = await client.renew(key, g.token, { ttlMs: 60_000 });
  assert.equal(r.token, g.token);
  assert.ok(r.expiresAt > g.expiresAt);
  await client.release(key, g.token);
  const s = await client.getLease(key);
  assert.equal(s.state, "released");
  assert.equal(s.newestToken, g.token);
  await assert.rejects(client.renew(key, g.token), LeaseLost);
  await assert.rejects(client.release(key, g.token), LeaseLost);
  const again = await client.acquire(key, { owner: "w", ttlMs: 1000 });
  assert.ok(again.token > g.token);
  await client.release(key, again.token);
});

test("getLease of a key never leased is NotFound", async () => {
  await assert.rejects(client.getLease(uniqueKey("never")), NotFound);
});

test("listLeases pages by prefix and state, and iterLeases follows the cursors", async () => {
  const prefix = `${uniqueKey("list")}/`;
  for (let i = 0; i < 5; i++) await client.acquire(`${prefix}${i}`, { owner: "w", ttlMs: 60_000 });
  const page = await client.listLeases({ prefix, limit: 2 });
  assert.equal(page.items.length, 2);
  assert.ok(page.nextCursor);
  const all = [];
  for await (const s of client.iterLeases({ prefix, state: "held", pageSize: 2 })) all.push(s.key);
  assert.deepEqual(
    all,
    [0, 1, 2, 3, 4].map((i) => `${prefix}${i}`),
  );
});

test("abandon keeps a recovery record that blocks acquire until a reconciled acquire replaces it, audited", async () => {
  const key = uniqueKey("abandon");
  const g = await client.acquire(key, { owner: "w1", ttlMs: 60_000 });
  await client.abandon(key, g.token);
  const e = await client.acquire(key, { owner: "w2", ttlMs: 60_000 }).catch((x: unknown) => x);
  assert.ok(e instanceof RecoveryRequired);
  assert.equal(e.recovery?.reason, "abandoned");
  assert.equal(e.recovery?.token, g.token);
  const r = await client.acquire(key, { owner: "w2", ttlMs: 60_000, reconciled: true });
  assert.equal(r.recovered?.owner, "w1");
  const audit = await client.listRecoveries({ key });
  assert.equal(audit.items.length, 1);
  assert.equal(audit.items[0]?.recovery?.token, g.token);
  const all = [];
  for await (const r of client.iterRecoveries({ key, pageSize: 1 })) all.push(r.id);
  assert.deepEqual(all, [audit.items[0]?.id]);
  await client.release(key, r.token);
});

test("require-recovery marks a held lease so that its release leaves a record; reconciling then reconciled clears it", async () => {
  const key = uniqueKey("require-recovery");
  const g = await client.acquire(key, { owner: "w1", ttlMs: 60_000 });
  await client.requireRecovery(key, g.token);
  await client.release(key, g.token);
  assert.equal((await client.getLease(key)).state, "recovery_pending");
  const r = await client.acquire(key, { owner: "w2", ttlMs: 60_000, reconciling: true });
  assert.equal(r.recovery?.reason, "recovery_required");
  await assert.rejects(client.acquire(key, { owner: "w3", ttlMs: 60_000 }), LeaseHeld);
  const l = await client.reconciled(key, r.token);
  assert.equal(l.token, r.token);
  assert.equal((await client.getLease(key)).recovery, null);
  await client.release(key, r.token);
  assert.equal((await client.getLease(key)).state, "released");
});

test("crash recovery: a lease that expires leaves a record with reason expired", async () => {
  const key = uniqueKey("crash");
  await client.acquire(key, { owner: "w1", ttlMs: 200, crashRecovery: true });
  await new Promise((ok) => setTimeout(ok, 600));
  const s = await client.getLease(key);
  assert.equal(s.state, "recovery_pending");
  assert.equal(s.recovery?.reason, "expired");
});

test("a waiting acquire is granted when the holder releases, and the queue is listed meanwhile", async () => {
  const key = uniqueKey("wait");
  const g = await client.acquire(key, { owner: "w1", ttlMs: 60_000 });
  const waiting = client.acquire(key, { owner: "w2", ttlMs: 60_000, waitMs: 30_000 });
  let waiters = await client.listLeaseWaiters(key);
  for (let i = 0; i < 50 && waiters.items.length === 0; i++) {
    await new Promise((ok) => setTimeout(ok, 50));
    waiters = await client.listLeaseWaiters(key);
  }
  assert.equal(waiters.items[0]?.owner, "w2");
  assert.equal(waiters.items[0]?.position, 1);
  await client.release(key, g.token);
  const w = await waiting;
  assert.equal(w.owner, "w2");
  assert.ok(w.token > g.token);
});

test("an aborted waiting acquire rejects with the signal's reason at once and leaves the queue", async () => {
  const key = uniqueKey("abort");
  const g = await client.acquire(key, { owner: "w1", ttlMs: 60_000 });
  const ctl = new AbortController();
  const started = performance.now();
  const waiting = client.acquire(key, { owner: "w2", ttlMs: 60_000, waitMs: 60_000, signal: ctl.signal });
  setTimeout(() => ctl.abort(new Error("shutting down")), 300);
  await assert.rejects(waiting, /shutting down/);
  assert.ok(performance.now() - started < 5000);
  // The server sees the client go away and drops its waiter.
  let waiters = (await client.listLeaseWaiters(key)).items;
  for (let i = 0; i < 100 && waiters.length > 0; i++) {
    await new Promise((ok) => setTimeout(ok, 50));
    waiters = (await client.listLeaseWaiters(key)).items;
  }
  assert.deepEqual(waiters, []);
  await client.release(key, g.token);
  const next = await client.acquire(key, { owner: "w3", ttlMs: 60_000 });
  assert.equal(next.owner, "w3");
});

test("input the client can tell is invalid is refused before sending, the rest by the server", async () => {
  await assert.rejects(client.acquire("", { owner: "w", ttlMs: 1000 }), InvalidRequest);
  await assert.rejects(client.release("k", 0), InvalidRequest);
  const e = await client.acquire(uniqueKey("ttl"), { owner: "w", ttlMs: 1 }).catch((x: unknown) => x);
  assert.ok(e instanceof InvalidRequest);
  assert.ok(e.requestId, "a server's refusal carries its request id");
});

test("ready() says whether the service can reach its database", async () => {
  assert.equal(await client.ready(), true);
});
