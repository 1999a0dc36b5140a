import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, Indeterminate, TransportError, type SnapfenceError } from "snapfence";
import { freePort, Proxy, startServer, uniqueKey, type Server } from "./helpers.js";

let server: Server;
let client: Client;
let proxy: Proxy;
before(async () => {
  server = await startServer();
  client = new Client({ url: server.url });
});
after(() => server?.stop());

async function viaProxy(): Promise<{ via: Client; retries: SnapfenceError[] }> {
  proxy = await new Proxy(server.port).listen();
  const retries: SnapfenceError[] = [];
  return { via: new Client({ url: proxy.url, onRetry: (e) => retries.push(e) }), retries };
}

test("a write whose first answer is dropped is retried with the same Idempotency-Key and happens once", async () => {
  const key = uniqueKey("put-once");
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  const { via, retries } = await viaProxy();
  try {
    proxy.dropAnswers(1);
    const m = await via.putSnapshot(key, g.token, "once");
    assert.equal(proxy.dropped, 1);
    assert.equal(retries.length, 1);
    assert.ok(retries[0] instanceof TransportError && retries[0].mayHaveReached);
    const keys = proxy.idempotencyKeys();
    assert.equal(keys.length, 2);
    assert.equal(keys[0], keys[1]);
    assert.equal(m.version, 1);
    const versions = await client.listVersions(key);
    assert.deepEqual(
      versions.items.map((v) => v.version),
      [1],
    );
  } finally {
    await proxy.close();
  }
});

test("an acquire whose first answer is dropped grants one lease, not two", async () => {
  const key = uniqueKey("acquire-once");
  const { via } = await viaProxy();
  try {
    proxy.dropAnswers(1);
    const g = await via.acquire(key, { owner: "w", ttlMs: 60_000 });
    assert.equal(proxy.dropped, 1);
    const s = await client.getLease(key);
    assert.equal(s.newestToken, g.token);
    assert.equal(s.state, "held");
  } finally {
    await proxy.close();
  }
});

test("every change carries its own Idempotency-Key and reads carry none", async () => {
  const key = uniqueKey("keys");
  const { via } = await viaProxy();
  try {
    const g = await via.acquire(key, { owner: "w", ttlMs: 60_000 });
    await via.putSnapshot(key, g.token, "x");
    await via.getSnapshot(key);
    await via.getLease(key);
    await via.release(key, g.token);
    const keys = proxy.idempotencyKeys();
    assert.equal(keys.length, 3);
    assert.equal(new Set(keys).size, 3);
  } finally {
    await proxy.close();
  }
});

test("a change whose answer was lost and whose retries cannot connect is Indeterminate", async () => {
  const key = uniqueKey("indeterminate");
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  const { via } = await viaProxy();
  proxy.dropAnswers(1);
  const closing = (async () => {
    while (proxy.dropped === 0) await new Promise((ok) => setTimeout(ok, 5));
    await proxy.close();
  })();
  const e = await via.putSnapshot(key, g.token, "x").catch((x: unknown) => x);
  await closing;
  assert.ok(e instanceof Indeterminate, String(e));
  // It did happen: reading tells.
  assert.equal((await client.getSnapshot(key)).text(), "x");
});

test("a service that cannot be reached is a TransportError that says nothing was sent", async () => {
  const port = await freePort();
  const c = new Client({ url: `http://127.0.0.1:${port}`, retry: { maxAttempts: 2, initialBackoffMs: 10 } });
  const e = await c.getLease("k").catch((x: unknown) => x);
  assert.ok(e instanceof TransportError);
  assert.equal(e.mayHaveReached, false);
  assert.match(e.message, /nothing was sent/);
});
