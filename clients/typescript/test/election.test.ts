import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, Election, StaleToken, type Leader } from "snapfence";
import { Child, startServer, uniqueKey, type Server } from "./helpers.js";

let server: Server;
let client: Client;
before(async () => {
  server = await startServer();
  client = new Client({ url: server.url });
});
after(() => server?.stop());

/** The first of `children` to print a line (each prints one when it leads). */
async function firstLeader(children: Child[], ms: number): Promise<{ c: Child; line: Record<string, unknown> }> {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    for (const c of children) {
      const line = c.poll();
      if (line !== undefined) return { c, line };
    }
    await sleep(20);
  }
  throw new Error(`no candidate led within ${ms} ms`);
}

test("campaign leads, leader() names the leader, and resign hands over to the next candidate at once", async () => {
  const key = uniqueKey("resign");
  const a = new Election(client, key, { candidate: "a", ttlMs: 10_000 });
  const b = new Election(client, key, { candidate: "b", ttlMs: 10_000 });
  const la = await a.campaign();
  assert.deepEqual(await b.leader(), { owner: "a", token: la.token });
  const pending = b.campaign();
  await sleep(200);
  const resigned = performance.now();
  await la.resign();
  const lb = await pending;
  assert.ok(performance.now() - resigned < 2000, "b led only when a's lease would have expired");
  assert.ok(lb.token > la.token);
  assert.deepEqual(await a.leader(), { owner: "b", token: lb.token });
  await assert.rejects(client.putSnapshot(key, la.token, "a's late write"), StaleToken);
  await lb.resign();
  assert.equal(await a.leader(), null);
});

test("an election with the leader killed has exactly one new leader, seen through observe()", async () => {
  const key = uniqueKey("killed");
  const observer = new Election(client, key, { candidate: "observer", ttlMs: 2000 });
  const ctl = new AbortController();
  const observed: (Leader | null)[] = [];
  const observing = (async () => {
    for await (const l of observer.observe({ signal: ctl.signal })) observed.push(l);
  })().catch(() => {});
  while (observed.length === 0) await sleep(20);
  const children = ["c1", "c2", "c3"].map(
    (name) => new Child("candidate", { SNAPFENCE_URL: server.url, KEY: key, NAME: name }),
  );
  try {
    for (const c of children) assert.ok((await c.next())["campaigning"]);
    const firstLine = await firstLeader(children, 10_000);
    const leader = firstLine.c;
    const oldToken = firstLine.line["token"] as number;
    await leader.kill("SIGKILL");
    const rest = children.filter((c) => c !== leader);
    // The killed leader's lease expires after its 2 s TTL; then the first in the queue leads.
    const { line: next } = await firstLeader(rest, 6000);
    // ... and only it: the other stays in the queue.
    await sleep(2000);
    const again = rest.map((c) => c.poll()).filter((l) => l !== undefined);
    assert.deepEqual(again, [], "a second new leader");
    assert.ok((next["token"] as number) > oldToken);
    await sleep(300);
    const s = await client.getSnapshot(key);
    assert.equal(s.text(), next["leader"]);
    assert.equal(s.token, next["token"]);
    const owners = observed.map((l) => l?.owner ?? null);
    assert.deepEqual(owners, [null, firstLine.line["leader"], null, next["leader"]]);
  } finally {
    ctl.abort();
    await Promise.all(children.map((c) => c.kill()));
    await observing;
  }
});
