import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, NotFound, PreconditionFailed, StaleToken, UnknownToken } from "snapfence";
import { startServer, uniqueKey, type Server } from "./helpers.js";

let server: Server;
let client: Client;
before(async () => {
  server = await startServer(["--keep-versions", "3"]);
  client = new Client({ url: server.url });
});
after(() => server?.stop());

test("a fenced write is stored and read back with its headers, and HEAD and If-None-Match agree", async () => {
  const key = uniqueKey("put");
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  const m = await client.putSnapshot(key, g.token, new Uint8Array([1, 2, 3]));
  assert.equal(m.version, 1);
  assert.equal(m.token, g.token);
  assert.equal(m.size, 3);
  assert.equal(m.contentType, "application/octet-stream");
  const s = await client.getSnapshot(key);
  assert.deepEqual([...s.body], [1, 2, 3]);
  assert.equal(s.etag, m.etag);
  assert.equal(s.version, 1);
  assert.equal(s.token, g.token);
  const h = await client.headSnapshot(key);
  assert.equal(h.size, 3);
  assert.equal(h.body.length, 0);
  assert.equal(await client.getSnapshot(key, { ifNoneMatch: m.etag }), null);
  const t = await client.putSnapshot(key, g.token, '{"step": 2}', { contentType: "application/json" });
  assert.equal(t.version, 2);
  const fresh = await client.getSnapshot(key, { ifNoneMatch: m.etag });
  assert.deepEqual(fresh?.json(), { step: 2 });
});

test("a string body is stored as UTF-8 text", async () => {
  const key = uniqueKey("text");
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  await client.putSnapshot(key, g.token, "grüße");
  const s = await client.getSnapshot(key);
  assert.equal(s.text(), "grüße");
  assert.equal(s.contentType, "text/plain; charset=utf-8");
});

test("versions are listed newest first and pruned to the configured count", async () => {
  const key = uniqueKey("versions");
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  for (let i = 1; i <= 4; i++) await client.putSnapshot(key, g.token, `v${i}`);
  const page = await client.listVersions(key);
  assert.deepEqual(
    page.items.map((v) => v.version),
    [4, 3, 2],
  );
  const all = [];
  for await (const v of client.iterVersions(key, { pageSize: 1 })) all.push(v.version);
  assert.deepEqual(all, [4, 3, 2]);
  assert.equal((await client.getVersion(key, 3)).text(), "v3");
  await assert.rejects(client.getVersion(key, 1), NotFound);
});

test("If-Match makes a write a compare-and-set", async () => {
  const key = uniqueKey("if-match");
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  const first = await client.putSnapshot(key, g.token, "a");
  await client.putSnapshot(key, g.token, "b", { ifMatch: first.etag });
  await assert.rejects(client.putSnapshot(key, g.token, "c", { ifMatch: first.etag }), PreconditionFailed);
  assert.equal((await client.getSnapshot(key)).text(), "b");
});

test("a superseded holder's write is refused stale_token and audited with the holder", async () => {
  const key = uniqueKey("stale");
  const old = await client.acquire(key, { owner: "w1", ttlMs: 60_000 });
  await client.release(key, old.token);
  const cur = await client.acquire(key, { owner: "w2", ttlMs: 60_000 });
  const e = await client.putSnapshot(key, old.token, "late").catch((x: unknown) => x);
  assert.ok(e instanceof StaleToken);
  assert.equal(e.presentedToken, old.token);
  assert.equal(e.highestToken, cur.token);
  const page = await client.listRejections({ key });
  assert.equal(page.items.length, 1);
  const r = page.items[0]!;
  assert.equal(r.id, e.auditId);
  assert.equal(r.reason, "stale_token");
  assert.equal(r.operation, "put");
  assert.equal(r.holder, "w2");
  const since = new Date(r.at.getTime() - 1000);
  const found = [];
  for await (const x of client.iterRejections({ key, reason: "stale_token", since, pageSize: 1 })) found.push(x.id);
  assert.deepEqual(found, [r.id]);
});

test("a token never issued for the key is refused unknown_token", async () => {
  const key = uniqueKey("unknown");
  const e = await client.putSnapshot(key, 999_999_999, "x").catch((x: unknown) => x);
  assert.ok(e instanceof UnknownToken);
  assert.equal(e.highestToken, null);
});

test("a fenced delete removes the snapshot; reads are then NotFound", async () => {
  const key = uniqueKey("delete");
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  await client.putSnapshot(key, g.token, "x");
  await client.deleteSnapshot(key, g.token);
  await assert.rejects(client.getSnapshot(key), NotFound);
});

test("listSnapshots lists the keys holding a snapshot in byte order, and iterSnapshots follows cursors", async () => {
  const prefix = `${uniqueKey("list")}/`;
  for (const k of ["b", "a", "c"]) {
    const g = await client.acquire(prefix + k, { owner: "w", ttlMs: 60_000 });
    await client.putSnapshot(prefix + k, g.token, k);
  }
  const page = await client.listSnapshots({ prefix });
  assert.deepEqual(
    page.items.map((s) => s.key),
    ["a", "b", "c"].map((k) => prefix + k),
  );
  const keys = [];
  for await (const s of client.iterSnapshots({ prefix, pageSize: 1 })) keys.push(s.key);
  assert.deepEqual(
    keys,
    ["a", "b", "c"].map((k) => prefix + k),
  );
});

test("keys with slashes, spaces and non-ASCII characters travel as one path segment", async () => {
  const key = `${uniqueKey("odd")}/a b/ü?#%`;
  const g = await client.acquire(key, { owner: "w", ttlMs: 60_000 });
  await client.putSnapshot(key, g.token, "x");
  assert.equal((await client.getSnapshot(key)).key, key);
  assert.equal((await client.getLease(key)).key, key);
});
