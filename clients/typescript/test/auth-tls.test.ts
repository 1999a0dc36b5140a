// API keys (bearer) and TLS from a private CA, against a server of their own: HTTPS with a
// throwaway CA (openssl), four API keys, a small body limit and one request in flight per key.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { chmodSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import {
  Client,
  Forbidden,
  LeaseHeld,
  PayloadTooLarge,
  TooManyRequests,
  TransportError,
  Unauthorized,
  type SnapfenceError,
} from "snapfence";
import { createKey, startServer, tempDir, uniqueKey, type Server } from "./helpers.js";

/** A CA and a certificate for 127.0.0.1 it signed: the CA's PEM file, the chain, the key. */
function makeCa(d: string): { ca: string; chain: string; key: string } {
  const p = (n: string) => join(d, n);
  const openssl = (...args: string[]) => execFileSync("openssl", args, { stdio: "pipe", timeout: 60_000 });
  openssl(
    "req",
    "-x509",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
    "-keyout",
    p("ca.key"),
    "-out",
    p("ca.pem"),
    "-days",
    "2",
    "-subj",
    "/CN=snapfence typescript tests CA",
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,keyCertSign,cRLSign",
  );
  openssl(
    "req",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
    "-keyout",
    p("server.key"),
    "-out",
    p("server.csr"),
    "-subj",
    "/CN=127.0.0.1",
  );
  writeFileSync(
    p("ext"),
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n",
  );
  openssl(
    "x509",
    "-req",
    "-in",
    p("server.csr"),
    "-CA",
    p("ca.pem"),
    "-CAkey",
    p("ca.key"),
    "-CAcreateserial",
    "-out",
    p("server.crt"),
    "-days",
    "2",
    "-extfile",
    p("ext"),
  );
  writeFileSync(p("chain.pem"), readFileSync(p("server.crt"), "utf8") + readFileSync(p("ca.pem"), "utf8"));
  for (const f of ["ca.pem", "chain.pem", "server.key"]) chmodSync(p(f), 0o644);
  return { ca: p("ca.pem"), chain: p("chain.pem"), key: p("server.key") };
}

let server: Server;
let ca: string;
const tokens: Record<string, string> = {};
before(async () => {
  const dir = tempDir();
  const made = makeCa(dir);
  ca = made.ca;
  server = await startServer(
    ["--tls-cert", made.chain, "--tls-key", made.key, "--max-snapshot-bytes", "1024", "--max-in-flight-per-key", "1"],
    {
      dir,
      scheme: "https",
      prepare: (bin, data) => {
        for (const [name, scope, prefix] of [
          ["ops", "admin", ""],
          ["worker", "write", "jobs/"],
          ["viewer", "read", ""],
          ["narrow", "read", "jobs/"],
        ] as const) {
          tokens[name] = createKey(bin, data, name, scope, prefix);
        }
      },
    },
  );
});
after(() => server?.stop());

const jobKey = () => `jobs/${uniqueKey("tls").replaceAll("/", "_")}`;

test("a server whose CA is not trusted fails at once, and is not retried", async () => {
  const retries: SnapfenceError[] = [];
  const c = new Client({ url: server.url, apiKey: tokens["ops"]!, onRetry: (e) => retries.push(e) });
  const e = await c.getLease("jobs/1").catch((x: unknown) => x);
  assert.ok(e instanceof TransportError, String(e));
  assert.equal(e.mayHaveReached, false);
  assert.equal(e.isTransient, false);
  assert.match(e.message, /not trusted/);
  assert.deepEqual(retries, []);
});

test("API keys are sent as bearer tokens and their scopes hold, over TLS from a private CA", async () => {
  await assert.rejects(new Client({ url: server.url, caFile: ca }).getLease("jobs/1"), Unauthorized);
  await assert.rejects(
    new Client({ url: server.url, caFile: ca, apiKey: "sf_nope_nope" }).getLease("jobs/1"),
    Unauthorized,
  );
  const worker = new Client({ url: server.url, caFile: ca, apiKey: tokens["worker"]! });
  const k = jobKey();
  const g = await worker.acquire(k, { owner: "w", ttlMs: 30_000 });
  assert.equal((await worker.putSnapshot(k, g.token, "x")).version, 1);
  await assert.rejects(worker.acquire(`other/${k}`, { owner: "w", ttlMs: 30_000 }), Forbidden);
  await assert.rejects(worker.listRejections(), Forbidden);
  await assert.rejects(worker.putSnapshot(k, g.token, new Uint8Array(2048)), PayloadTooLarge);
  const viewer = new Client({ url: server.url, ca: readFileSync(ca, "utf8"), apiKey: tokens["viewer"]! });
  assert.equal((await viewer.getSnapshot(k)).text(), "x");
  await assert.rejects(viewer.release(k, g.token), Forbidden);
  await worker.release(k, g.token);
});

test("a watch the service refuses ends by throwing the refusal, without retrying", async () => {
  const retries: SnapfenceError[] = [];
  const narrow = new Client({
    url: server.url,
    caFile: ca,
    apiKey: tokens["narrow"]!,
    onRetry: (e) => retries.push(e),
  });
  await assert.rejects(
    (async () => {
      for await (const _ of narrow.watch({ prefix: "other/" })) void _;
    })(),
    Forbidden,
  );
  const nobody = new Client({ url: server.url, caFile: ca, apiKey: "sf_nope_nope" });
  await assert.rejects(
    (async () => {
      for await (const _ of nobody.watch({ prefix: "jobs/" })) void _;
    })(),
    Unauthorized,
  );
  assert.deepEqual(retries, []);
});

test("a watch over TLS delivers changes", async () => {
  // Each key has one request in flight: the watch is the viewer's, the changes the worker's.
  const viewer = new Client({ url: server.url, caFile: ca, apiKey: tokens["viewer"]! });
  const worker = new Client({ url: server.url, caFile: ca, apiKey: tokens["worker"]! });
  const k = jobKey();
  const watch = await viewer.watch({ prefix: k }).open();
  try {
    const g = await worker.acquire(k, { owner: "w", ttlMs: 30_000 });
    for await (const ev of watch) {
      assert.equal(ev.kind, "lease.granted");
      assert.equal(ev.token, g.token);
      break;
    }
    await worker.release(k, g.token);
  } finally {
    watch.close();
  }
});

test("429 too_many_requests carries Retry-After and is retried after it", async () => {
  const ops = new Client({ url: server.url, caFile: ca, apiKey: tokens["ops"]! });
  const k = jobKey();
  const held = await ops.acquire(k, { owner: "ops", ttlMs: 30_000 });
  // The worker's one request in flight: an acquire that waits for the held key.
  const worker = new Client({ url: server.url, caFile: ca, apiKey: tokens["worker"]! });
  const waiting = worker.acquire(k, { owner: "w", ttlMs: 30_000, waitMs: 4000 }).catch((e: unknown) => e);
  const once = new Client({ url: server.url, caFile: ca, apiKey: tokens["worker"]!, retry: { maxAttempts: 1 } });
  let refused: TooManyRequests | undefined;
  // The waiting acquire reaches the server when it does (later on a loaded machine): ask until it has.
  const until = performance.now() + 20_000;
  while (refused === undefined && performance.now() < until) {
    const e = await once.getLease(k).catch((x: unknown) => x);
    if (e instanceof TooManyRequests) refused = e;
    else await new Promise((r) => setTimeout(r, 5));
  }
  assert.ok(refused, "the worker's waiting acquire never took its one request in flight");
  assert.equal(refused.status, 429);
  assert.ok(refused.retryAfterMs !== undefined && refused.retryAfterMs >= 0);
  const retries: SnapfenceError[] = [];
  const patient = new Client({
    url: server.url,
    caFile: ca,
    apiKey: tokens["worker"]!,
    retry: { maxAttempts: 30, initialBackoffMs: 50, maxBackoffMs: 500 },
    onRetry: (e) => retries.push(e),
  });
  const status = await patient.getLease(k);
  assert.equal(status.lease.owner, "ops");
  assert.ok((await waiting) instanceof LeaseHeld);
  assert.ok(retries.length > 0 && retries.every((e) => e instanceof TooManyRequests));
  await ops.release(k, held.token);
});

test("fromEnv reads SNAPFENCE_URL, SNAPFENCE_API_KEY and SNAPFENCE_CA_CERT, and explicit options win", async () => {
  const saved = { ...process.env };
  try {
    process.env["SNAPFENCE_URL"] = server.url;
    process.env["SNAPFENCE_API_KEY"] = tokens["ops"]!;
    process.env["SNAPFENCE_CA_CERT"] = ca;
    const c = Client.fromEnv();
    assert.equal(c.url, server.url);
    const k = jobKey();
    const g = await c.acquire(k, { owner: "w", ttlMs: 30_000 });
    assert.equal((await c.getLease(k)).newestToken, g.token);
    await assert.rejects(Client.fromEnv({ apiKey: "sf_nope_nope" }).getLease(k), Unauthorized);
    await c.release(k, g.token);
  } finally {
    process.env = saved;
  }
});
