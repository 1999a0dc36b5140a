// Contract v1.3: a lease fences its namespace (Fencing-Key), transactions, snapshot metadata and
// ordered listing. They need a server with v1.3, as every other file needs its version.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, InvalidRequest, PreconditionFailed, StaleToken, type ChangeEvent } from "snapfence";
import { startServer, uniqueKey, type Server } from "./helpers.js";

let server: Server;
let client: Client;
before(async () => {
  server = await startServer();
  client = new Client({ url: server.url });
});
after(() => server?.stop());

test("a lease fences the keys of its namespace with Fencing-Key, and the write says its fence", async () => {
  const fence = uniqueKey("ns");
  const g = await client.acquire(fence, { owner: "w", ttlMs: 60_000 });
  const m = await client.putSnapshot(`${fence}/a`, g.token, "x", { fencingKey: fence });
  assert.equal(m.fencingKey, fence);
  const s = await client.getSnapshot(`${fence}/a`);
  assert.equal(s.fencingKey, fence);
  assert.equal(s.token, g.token);
  await client.deleteSnapshot(`${fence}/a`, g.token, { fencingKey: fence });
  await assert.rejects(
    client.putSnapshot(`${uniqueKey("elsewhere")}`, g.token, "x", { fencingKey: fence }),
    InvalidRequest,
  );
});

test("a superseded namespace lease's write is refused stale_token naming its fence", async () => {
  const fence = uniqueKey("ns-stale");
  const old = await client.acquire(fence, { owner: "w1", ttlMs: 60_000 });
  await client.release(fence, old.token);
  await client.acquire(fence, { owner: "w2", ttlMs: 60_000 });
  const e = await client.putSnapshot(`${fence}/a`, old.token, "late", { fencingKey: fence }).catch((x: unknown) => x);
  assert.ok(e instanceof StaleToken);
  assert.equal(e.fencingKey, fence);
});

test("a transaction commits its puts and deletes as one, each op with its result", async () => {
  const fence = uniqueKey("txn");
  const g = await client.acquire(fence, { owner: "w", ttlMs: 60_000 });
  await client.putSnapshot(`${fence}/w/1/a`, g.token, "old", { fencingKey: fence });
  await client.putSnapshot(`${fence}/w/1/b`, g.token, "old", { fencingKey: fence });
  const watch = await client.watch({ prefix: fence }).open();
  const t = await client.txn(fence, g.token, [
    { op: "put", key: `${fence}/c/1`, body: '{"step":1}', contentType: "application/json", metadata: { step: 1 } },
    { op: "put", key: `${fence}/w/2/a`, body: new Uint8Array([1, 2]), ifNoneMatch: "*" },
    { op: "delete", key: `${fence}/nothing` },
    { op: "delete_prefix", prefix: `${fence}/w/1/` },
  ]);
  assert.equal(t.token, g.token);
  assert.equal(t.fencingKey, fence);
  assert.equal(t.results.length, 4);
  const [put, put2, del, delp] = t.results;
  assert.ok(put?.op === "put" && put.created && put.version === 1);
  assert.ok(put2?.op === "put" && put2.size === 2);
  assert.deepEqual(del, { op: "delete", key: `${fence}/nothing`, deleted: false });
  assert.deepEqual(delp, { op: "delete_prefix", prefix: `${fence}/w/1/`, deleted: 2 });
  const s = await client.getSnapshot(`${fence}/c/1`);
  assert.deepEqual(s.json(), { step: 1 });
  assert.deepEqual(s.metadata, { step: 1 });
  const events: ChangeEvent[] = [];
  for await (const ev of watch) {
    events.push(ev);
    if (events.length === 4) break;
  }
  assert.ok(
    events.every((e) => e.txn === events[0]!.txn && e.txnSize === 4),
    JSON.stringify(events.map((e) => e.data)),
  );
});

test("a transaction whose precondition fails writes nothing and names the op", async () => {
  const fence = uniqueKey("txn-412");
  const g = await client.acquire(fence, { owner: "w", ttlMs: 60_000 });
  await client.putSnapshot(`${fence}/a`, g.token, "x", { fencingKey: fence });
  const e = await client
    .txn(fence, g.token, [
      { op: "put", key: `${fence}/b`, body: "b" },
      { op: "put", key: `${fence}/a`, body: "again", ifNoneMatch: "*" },
    ])
    .catch((x: unknown) => x);
  assert.ok(e instanceof PreconditionFailed);
  assert.equal(e.opIndex, 1);
  await assert.rejects(client.getSnapshot(`${fence}/b`), /not_found|404|no snapshot/i);
});

test("Snapshot-Metadata is stored with a version and listed with include=metadata", async () => {
  const key = uniqueKey("meta");
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  await client.putSnapshot(key, g.token, "x", { metadata: { step: 7, note: "grüße" } });
  const s = await client.getSnapshot(key);
  assert.deepEqual(s.metadata, { step: 7, note: "grüße" });
  const v = await client.listVersions(key);
  assert.deepEqual(v.items[0]?.metadata, { step: 7, note: "grüße" });
  const page = await client.listSnapshots({ prefix: key, includeMetadata: true });
  assert.deepEqual(page.items[0]?.metadata, { step: 7, note: "grüße" });
});

test("listSnapshots orders keys ascending or descending, from start_after", async () => {
  const prefix = `${uniqueKey("order")}/`;
  const g = await client.acquire(prefix.slice(0, -1), { owner: "w", ttlMs: 60_000 });
  for (const k of ["a", "b", "c", "d"])
    await client.putSnapshot(prefix + k, g.token, k, { fencingKey: prefix.slice(0, -1) });
  const keys = async (o: { order?: "asc" | "desc"; startAfter?: string }) =>
    (await client.listSnapshots({ prefix, ...o })).items.map((s) => s.key.slice(prefix.length));
  assert.deepEqual(await keys({}), ["a", "b", "c", "d"]);
  assert.deepEqual(await keys({ order: "desc" }), ["d", "c", "b", "a"]);
  assert.deepEqual(await keys({ startAfter: `${prefix}b` }), ["c", "d"]);
  assert.deepEqual(await keys({ order: "desc", startAfter: `${prefix}c` }), ["b", "a"]);
});
