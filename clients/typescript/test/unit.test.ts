// What needs no server: the SSE parser, the error table against the server's, the options.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { test } from "node:test";

import { Client, ERRORS, InvalidRequest, SnapfenceError, SseParser, type SseEvent } from "snapfence";
import { PACKAGE } from "./helpers.js";

const enc = new TextEncoder();

function parseChunks(chunks: (string | Uint8Array)[]): SseEvent[] {
  const p = new SseParser();
  return chunks.flatMap((c) => p.push(typeof c === "string" ? enc.encode(c) : c));
}

test("the SSE parser gives an event at each blank line, with its id, name and data lines joined", () => {
  const evs = parseChunks(['id: 7\nevent: lease.granted\ndata: {"a":\ndata: 1}\n\n: heartbeat\n\ndata: x\n\n']);
  assert.deepEqual(evs, [
    { id: "7", event: "lease.granted", data: '{"a":\n1}' },
    { id: undefined, event: "message", data: "x" },
  ]);
});

test("the SSE parser dispatches a block of an id alone, so that the id counts", () => {
  assert.deepEqual(parseChunks(["id: 42\n\n"]), [{ id: "42", event: "message", data: "" }]);
});

test("the SSE parser reads CRLF, CR and LF line ends, also split across chunks", () => {
  const whole = "id: 1\r\nevent: e\rdata: d\n\r\n";
  const one = parseChunks([whole]);
  assert.deepEqual(one, [{ id: "1", event: "e", data: "d" }]);
  for (let cut = 1; cut < whole.length; cut++) {
    assert.deepEqual(parseChunks([whole.slice(0, cut), whole.slice(cut)]), one, `cut at ${cut}`);
  }
});

test("the SSE parser reassembles a UTF-8 character split across chunks, and drops a leading BOM", () => {
  const bytes = enc.encode("\uFEFFdata: grüße\n\n");
  const evs = parseChunks([bytes.subarray(0, 11), bytes.subarray(11)]);
  assert.deepEqual(evs, [{ id: undefined, event: "message", data: "grüße" }]);
});

test("the SSE parser ignores comments and unknown fields, and takes a field without a colon as empty", () => {
  assert.deepEqual(parseChunks([":c\nretry: 5\nfoo: bar\ndata\n\n"]), [{ id: undefined, event: "message", data: "" }]);
});

test("every code of the server's error table has its class, with the same status", () => {
  const table = readFileSync(resolve(PACKAGE, "../../crates/snapfence-types/src/error.rs"), "utf8");
  const rows = [...table.matchAll(/^\s*\w+ = "(\w+)", (\d{3}),/gm)].map((m) => [m[1]!, Number(m[2])] as const);
  assert.ok(rows.length >= 20, `only ${rows.length} codes read from the server's table`);
  for (const [code, status] of rows) {
    const cls = ERRORS[code];
    assert.ok(cls, `no class for ${code}`);
    const e = new cls("x");
    assert.ok(e instanceof SnapfenceError);
    assert.equal(e.code, code);
    assert.equal(e.status, status, code);
  }
});

test("a URL that is not http(s) without a query is refused at construction", () => {
  assert.throws(() => new Client({ url: "ftp://x" }), InvalidRequest);
  assert.throws(() => new Client({ url: "http://x:1/?a=b" }), InvalidRequest);
  assert.throws(() => new Client({ url: "not a url" }), InvalidRequest);
  assert.equal(new Client({ url: "http://127.0.0.1:1/prefix/" }).url, "http://127.0.0.1:1/prefix");
});

test("an API key a header cannot carry is refused at construction", () => {
  assert.throws(() => new Client({ apiKey: "sf_a b" }), /exactly as `snapfence keys create` showed it/);
});

test("a CA file that does not exist is refused at the first call, naming the file", async () => {
  const c = new Client({ url: "https://127.0.0.1:1", caFile: "/nonexistent/ca.pem" });
  await assert.rejects(c.getLease("k"), /\/nonexistent\/ca.pem/);
});
