import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, type ChangeEvent } from "snapfence";
import { startServer, uniqueKey, type Server } from "./helpers.js";

let server: Server;
let client: Client;
before(async () => {
  server = await startServer();
  client = new Client({ url: server.url });
});
after(() => server?.stop());

test("a watch delivers a key's changes in order, each with its kind and data", async () => {
  const prefix = `${uniqueKey("watch")}/`;
  const key = `${prefix}job`;
  const old = await client.acquire(`${prefix}other`, { owner: "w", ttlMs: 60_000 });
  const watch = await client.watch({ prefix: key }).open();
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  await client.putSnapshot(key, g.token, "x");
  await client.putSnapshot(key, old.token, "refused").catch(() => {});
  await client.release(key, g.token);
  const seen: ChangeEvent[] = [];
  for await (const ev of watch) {
    seen.push(ev);
    if (ev.kind === "lease.released") break;
  }
  assert.deepEqual(
    seen.map((e) => e.kind),
    ["lease.granted", "snapshot.written", "write.refused", "lease.released"],
  );
  assert.equal(seen[0]?.owner, "w");
  assert.equal(seen[1]?.version, 1);
  assert.equal(seen[2]?.reason, "stale_token");
  assert.ok(seen.every((e, i) => i === 0 || e.id > seen[i - 1]!.id));
  assert.equal(watch.lastId, seen[3]?.id);
});

test("a watch from `since` delivers the changes after that id and no earlier one", async () => {
  const prefix = `${uniqueKey("since")}/`;
  const g = await client.acquire(`${prefix}a`, { owner: "w", ttlMs: 60_000 });
  const first = await client.watch({ prefix, since: 0 }).open();
  let grantedId = 0;
  for await (const ev of first) {
    grantedId = ev.id;
    break;
  }
  await client.putSnapshot(`${prefix}a`, g.token, "1");
  for await (const ev of client.watch({ prefix, since: grantedId })) {
    assert.equal(ev.kind, "snapshot.written");
    assert.ok(ev.id > grantedId);
    break;
  }
});

test("a watch goes on through a server restart with no change missed or repeated", async () => {
  const prefix = `${uniqueKey("restart")}/`;
  const key = `${prefix}k`;
  const watch = await client.watch({ prefix, reconnectForMs: 120_000 }).open();
  const g = await client.acquire(key, { owner: "w", ttlMs: 600_000 });
  const writes = 10;
  const got: ChangeEvent[] = [];
  const reading = (async () => {
    for await (const ev of watch) {
      if (ev.kind !== "snapshot.written") continue;
      got.push(ev);
      if (got.length === writes) break;
    }
  })();
  for (let i = 1; i <= writes / 2; i++) await client.putSnapshot(key, g.token, `v${i}`);
  while (got.length < writes / 2) await new Promise((ok) => setTimeout(ok, 20));
  await server.halt();
  await server.restart();
  for (let i = writes / 2 + 1; i <= writes; i++) await client.putSnapshot(key, g.token, `v${i}`);
  await reading;
  assert.deepEqual(
    got.map((e) => e.version),
    Array.from({ length: writes }, (_, i) => i + 1),
  );
  assert.equal(new Set(got.map((e) => e.id)).size, writes);
  assert.ok(got.every((e, i) => i === 0 || e.id > got[i - 1]!.id));
  assert.ok(watch.connections >= 2, `the watch connected ${watch.connections} time(s)`);
});

test("close() ends a for-await over a watch", async () => {
  const watch = client.watch({ prefix: `${uniqueKey("close")}/` });
  setTimeout(() => watch.close(), 300);
  const seen = [];
  for await (const ev of watch) seen.push(ev);
  assert.deepEqual(seen, []);
});

test("an aborted signal ends a watch with the signal's reason", async () => {
  const ctl = new AbortController();
  const watch = client.watch({ prefix: `${uniqueKey("abort")}/`, signal: ctl.signal });
  setTimeout(() => ctl.abort(new Error("enough")), 300);
  await assert.rejects(
    (async () => {
      for await (const _ of watch) void _;
    })(),
    /enough/,
  );
});

test("a watch that hears nothing for watchIdleTimeoutMs resumes on a new connection and misses nothing", async () => {
  const quiet = new Client({ url: server.url, watchIdleTimeoutMs: 300 });
  const key = `${uniqueKey("idle")}/k`;
  const watch = await quiet.watch({ prefix: key }).open();
  await new Promise((ok) => setTimeout(ok, 1000));
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  for await (const ev of watch) {
    assert.equal(ev.kind, "lease.granted");
    assert.equal(ev.token, g.token);
    break;
  }
  assert.ok(watch.connections >= 3, `${watch.connections} connections`);
});
