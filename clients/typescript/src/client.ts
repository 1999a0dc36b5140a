/**
 * `Client`: one method per call of the contract (v1 to v1.3), each taking an options object
 * with an optional `signal`. Every change carries a fresh `Idempotency-Key`, the same on each of
 * its attempts, and the contract's transient failures are retried, so a grant or a write
 * happens once however often its answer is lost.
 */

import { makeConfig, optionsFromEnv, type ClientOptions } from "./config.js";
import { InvalidRequest, ProtocolError } from "./errors.js";
import { hold, type HoldOptions, type HeldLease } from "./hold.js";
import { run, type Answer, type Call, type TransportConfig } from "./transport.js";
import {
  parseGrant,
  parseKeyStatus,
  parseLease,
  parsePage,
  parseRecovery,
  parseRejection,
  parseSnapshotMeta,
  parseTxn,
  parseWaiter,
  type Grant,
  type JsonObject,
  type KeyStatus,
  type Lease,
  type LeaseState,
  type Page,
  type Recovery,
  type Rejection,
  type Snapshot,
  type SnapshotMeta,
  type Txn,
  type TxnOp,
  type Waiter,
} from "./types.js";
import { Watch, type WatchOptions } from "./watch.js";

/** What every call takes. */
export interface CallOptions {
  /** Aborts the call (and its retries); the call then rejects with the signal's reason. */
  signal?: AbortSignal | undefined;
}

export interface AcquireOptions extends CallOptions {
  owner: string;
  ttlMs: number;
  /** Wait in the key's queue up to this long while it is held (at most 300000). */
  waitMs?: number;
  metadata?: JsonObject;
  /** If the lease ends by expiry rather than release, the key keeps a recovery record. */
  crashRecovery?: boolean;
  /** The caller reconciled the previous holder's leftovers: replace a retained record. */
  reconciled?: boolean;
  /** Grant while a record is retained, keeping it until `reconciled` (v1.2). */
  reconciling?: boolean;
}

export interface FenceOptions extends CallOptions {
  /** The lease whose token fences this write, when it is not the written key's own (v1.3). */
  fencingKey?: string;
}

export interface PutOptions extends FenceOptions {
  /** Default `application/octet-stream`, or `text/plain; charset=utf-8` for a string body. */
  contentType?: string;
  /** Compare-and-set on the current ETag. */
  ifMatch?: string;
  /** Stored with the version and sent back with it (v1.3). */
  metadata?: JsonObject;
}

export interface ListOptions extends CallOptions {
  limit?: number;
  cursor?: string;
}

export interface LeaseListOptions extends ListOptions {
  prefix?: string;
  state?: LeaseState;
}

export interface SnapshotListOptions extends ListOptions {
  prefix?: string;
  /** Exclusive, in the order asked for (v1.3). */
  startAfter?: string;
  order?: "asc" | "desc";
  /** List each version's metadata too (v1.3). */
  includeMetadata?: boolean;
}

export interface AuditListOptions extends ListOptions {
  key?: string;
  reason?: string;
  since?: Date;
  until?: Date;
}

/** A list's options for its `iter` form: `pageSize` instead of `limit` and `cursor`. */
export type IterOptions<O> = Omit<O, "cursor" | "limit"> & { pageSize?: number };

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

/** Checks a key as the contract defines it. */
export function checkKey(key: string, what = "a key"): void {
  if (typeof key !== "string") throw new InvalidRequest(`${what} is text, got ${typeof key}`);
  const n = textEncoder.encode(key).length;
  if (n === 0 || n > 512)
    throw new InvalidRequest(`${what} is 1 to 512 bytes of UTF-8, ${JSON.stringify(key)} is ${n}`);
  if (/[\x00-\x1f\x7f-\x9f]/.test(key))
    throw new InvalidRequest(`${what} has no control characters: ${JSON.stringify(key)}`);
}

/** A key as one percent-encoded path segment (all but RFC 3986's unreserved characters). */
export function segment(key: string, what = "a key"): string {
  checkKey(key, what);
  if (key === "." || key === "..")
    throw new InvalidRequest(`${what} ${JSON.stringify(key)} cannot be sent in a URL path`);
  return encodeURIComponent(key).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

function checkToken(token: number): string {
  if (!Number.isSafeInteger(token) || token < 1) {
    throw new InvalidRequest(`a fencing token is a positive integer, got ${String(token)}`);
  }
  return String(token);
}

function json(a: Answer): unknown {
  try {
    return JSON.parse(textDecoder.decode(a.body));
  } catch (e) {
    throw new ProtocolError(`the answer is not JSON: ${String(e)}`);
  }
}

function jsonBody(o: object): { body: string; headers: Record<string, string> } {
  return { body: JSON.stringify(o), headers: { "Content-Type": "application/json" } };
}

/** JSON as ASCII, for a header: every other character escaped. */
function asciiJson(v: JsonObject): string {
  return JSON.stringify(v).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

function fenceHeaders(token: number, fencingKey?: string): Record<string, string> {
  const h: Record<string, string> = { "Fencing-Token": checkToken(token) };
  if (fencingKey !== undefined) h["Fencing-Key"] = segment(fencingKey, "a fencing key");
  return h;
}

function header(a: Answer, name: string): string {
  const v = a.headers.get(name);
  if (v === null) throw new ProtocolError(`the answer has no ${name} header`);
  return v;
}

function safeInt(v: string, name: string): number {
  const n = Number(v);
  if (!Number.isSafeInteger(n)) throw new ProtocolError(`the ${name} header is not an integer: ${v}`);
  return n;
}

function snapshotOf(key: string, a: Answer, head: boolean): Snapshot {
  const body = head ? new Uint8Array(0) : a.body;
  const s: Snapshot = {
    key,
    body,
    contentType: a.headers.get("content-type") ?? "application/octet-stream",
    etag: header(a, "etag"),
    token: safeInt(header(a, "fencing-token"), "Fencing-Token"),
    version: safeInt(header(a, "snapshot-version"), "Snapshot-Version"),
    lastModified: new Date(header(a, "last-modified")),
    size: head ? Number(a.headers.get("content-length") ?? 0) : a.body.length,
    text: () => textDecoder.decode(body),
    json: <T>() => JSON.parse(textDecoder.decode(body)) as T,
  };
  const fk = a.headers.get("fencing-key");
  if (fk !== null) s.fencingKey = decodeURIComponent(fk);
  const md = a.headers.get("snapshot-metadata");
  if (md !== null) {
    try {
      s.metadata = JSON.parse(md) as JsonObject;
    } catch (e) {
      throw new ProtocolError(`the Snapshot-Metadata header is not JSON: ${String(e)}`);
    }
  }
  return s;
}

function bodyOf(body: Uint8Array | string): { bytes: Uint8Array; text: boolean } {
  return typeof body === "string" ? { bytes: textEncoder.encode(body), text: true } : { bytes: body, text: false };
}

function base64(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(s);
}

function iso(d: Date | undefined): string | undefined {
  return d === undefined ? undefined : d.toISOString();
}

export class Client {
  /** @internal */
  readonly config: TransportConfig & { watchIdleTimeoutMs: number };

  constructor(options: ClientOptions = {}) {
    this.config = makeConfig(options);
  }

  /** A client of the service the environment names (SNAPFENCE_URL, SNAPFENCE_API_KEY,
   * SNAPFENCE_CA_CERT); explicit options win. */
  static fromEnv(options: ClientOptions = {}): Client {
    return new Client(optionsFromEnv(options));
  }

  /** The service's base URL. */
  get url(): string {
    return this.config.base;
  }

  /** @internal Runs one call of the contract. */
  run<T>(call: Call<T>, signal?: AbortSignal): Promise<T> {
    return run(this.config, call, signal);
  }

  async *#pages<T, O extends ListOptions>(list: (o: O) => Promise<Page<T>>, o: O): AsyncGenerator<T, void, undefined> {
    let cursor: string | undefined;
    do {
      const page = await list({ ...o, ...(cursor === undefined ? {} : { cursor }) });
      yield* page.items;
      cursor = page.nextCursor ?? undefined;
    } while (cursor !== undefined);
  }

  #iterOptions<O extends ListOptions>(o: IterOptions<O>): O {
    const { pageSize, ...rest } = o;
    return (pageSize === undefined ? rest : { ...rest, limit: pageSize }) as unknown as O;
  }

  // ---- Leases ----------------------------------------------------------------------------------

  /** `POST /v1/leases/{key}`: a lease with a new fencing token, or `LeaseHeld` while another is live
   * (after waiting up to `waitMs` in the key's queue, if given). */
  async acquire(key: string, o: AcquireOptions): Promise<Grant> {
    if (o.reconciled && o.reconciling) throw new InvalidRequest("reconciled and reconciling exclude each other");
    const b: Record<string, unknown> = { owner: o.owner, ttl_ms: Math.round(o.ttlMs) };
    if (o.metadata !== undefined) b["metadata"] = o.metadata;
    if (o.crashRecovery) b["crash_recovery"] = true;
    if (o.reconciled) b["reconciled"] = true;
    // Only when set: a server before v1.2 refuses fields it does not know.
    if (o.reconciling) b["reconciling"] = true;
    let extraMs = 0;
    if (o.waitMs !== undefined && o.waitMs > 0) {
      extraMs = Math.min(Math.round(o.waitMs), 300_000);
      b["wait_ms"] = extraMs;
    }
    return this.run(
      {
        kind: "change",
        method: "POST",
        path: `/v1/leases/${segment(key)}`,
        ok: [201],
        parse: (a) => parseGrant(json(a)),
        extraMs,
        ...jsonBody(b),
      },
      o.signal,
    );
  }

  /** `POST /v1/leases/{key}/renew`: the same token, a new `expiresAt`; `LeaseLost` once it ended. */
  async renew(key: string, token: number, o: CallOptions & { ttlMs?: number } = {}): Promise<Lease> {
    const b: Record<string, unknown> = { token: Number(checkToken(token)) };
    if (o.ttlMs !== undefined) b["ttl_ms"] = Math.round(o.ttlMs);
    return this.run(
      {
        kind: "change",
        method: "POST",
        path: `/v1/leases/${segment(key)}/renew`,
        ok: [200],
        parse: (a) => parseLease(json(a)),
        ...jsonBody(b),
      },
      o.signal,
    );
  }

  async #fenced(method: string, path: string, token: number, signal?: AbortSignal): Promise<void> {
    return this.run(
      { kind: "change", method, path, ok: [204], parse: () => undefined, headers: fenceHeaders(token) },
      signal,
    );
  }

  /** `DELETE /v1/leases/{key}`: frees the key at once (the first waiter gets it). */
  async release(key: string, token: number, o: CallOptions = {}): Promise<void> {
    return this.#fenced("DELETE", `/v1/leases/${segment(key)}`, token, o.signal);
  }

  /** `POST /v1/leases/{key}/abandon`: frees the key but keeps a recovery record. */
  async abandon(key: string, token: number, o: CallOptions = {}): Promise<void> {
    return this.#fenced("POST", `/v1/leases/${segment(key)}/abandon`, token, o.signal);
  }

  /** `POST /v1/leases/{key}/require-recovery`: the lease's end will leave a recovery record. */
  async requireRecovery(key: string, token: number, o: CallOptions = {}): Promise<void> {
    return this.#fenced("POST", `/v1/leases/${segment(key)}/require-recovery`, token, o.signal);
  }

  /** `POST /v1/leases/{key}/reconciled` (v1.2): the record moves to the audit log; the lease goes on. */
  async reconciled(key: string, token: number, o: CallOptions = {}): Promise<Lease> {
    return this.run(
      {
        kind: "change",
        method: "POST",
        path: `/v1/leases/${segment(key)}/reconciled`,
        ok: [200],
        parse: (a) => parseLease(json(a)),
        headers: fenceHeaders(token),
      },
      o.signal,
    );
  }

  /** `GET /v1/leases/{key}`: the key's state; `NotFound` for a key never leased. */
  async getLease(key: string, o: CallOptions = {}): Promise<KeyStatus> {
    return this.run(
      {
        kind: "read",
        method: "GET",
        path: `/v1/leases/${segment(key)}`,
        ok: [200],
        parse: (a) => parseKeyStatus(json(a)),
      },
      o.signal,
    );
  }

  /** `GET /v1/leases`: one page. */
  async listLeases(o: LeaseListOptions = {}): Promise<Page<KeyStatus>> {
    return this.run(
      {
        kind: "read",
        method: "GET",
        path: "/v1/leases",
        query: { prefix: o.prefix, state: o.state, limit: o.limit, cursor: o.cursor },
        ok: [200],
        parse: (a) => parsePage(json(a), parseKeyStatus),
      },
      o.signal,
    );
  }

  /** Every lease of `listLeases`, page after page. */
  iterLeases(o: IterOptions<LeaseListOptions> = {}): AsyncGenerator<KeyStatus, void, undefined> {
    return this.#pages((x) => this.listLeases(x), this.#iterOptions(o));
  }

  /** `GET /v1/leases/{key}/waiters` (beyond the contract): the key's queue, first to be granted first. */
  async listLeaseWaiters(key: string, o: ListOptions = {}): Promise<Page<Waiter>> {
    return this.run(
      {
        kind: "read",
        method: "GET",
        path: `/v1/leases/${segment(key)}/waiters`,
        query: { limit: o.limit, cursor: o.cursor },
        ok: [200],
        parse: (a) => parsePage(json(a), parseWaiter),
      },
      o.signal,
    );
  }

  /**
   * Holds `key` while `fn` runs, as redlock's `using`: acquires (waiting up to `waitMs`), renews
   * in the background, aborts `signal` before the lease can lapse (or when the caller's `signal`
   * aborts), releases at the end, and throws `LostLease` if the lease was lost, even when `fn`
   * returned.
   */
  hold<R>(key: string, o: HoldOptions, fn: (lease: HeldLease, signal: AbortSignal) => Promise<R>): Promise<R> {
    return hold(this, key, o, fn);
  }

  // ---- Snapshots -------------------------------------------------------------------------------

  /** `PUT /v1/snapshots/{key}`: a fenced write, accepted only with the newest token of its fence. */
  async putSnapshot(key: string, token: number, body: Uint8Array | string, o: PutOptions = {}): Promise<SnapshotMeta> {
    const { bytes, text } = bodyOf(body);
    const headers = fenceHeaders(token, o.fencingKey);
    headers["Content-Type"] = o.contentType ?? (text ? "text/plain; charset=utf-8" : "application/octet-stream");
    if (o.ifMatch !== undefined) headers["If-Match"] = o.ifMatch;
    if (o.metadata !== undefined) headers["Snapshot-Metadata"] = asciiJson(o.metadata);
    return this.run(
      {
        kind: "change",
        method: "PUT",
        path: `/v1/snapshots/${segment(key)}`,
        ok: [200, 201],
        parse: (a) => parseSnapshotMeta(json(a)),
        headers,
        body: bytes,
      },
      o.signal,
    );
  }

  /** `GET /v1/snapshots/{key}`; with `ifNoneMatch`, `null` when it still matches (304). */
  getSnapshot(key: string, o?: CallOptions): Promise<Snapshot>;
  getSnapshot(key: string, o: CallOptions & { ifNoneMatch: string }): Promise<Snapshot | null>;
  async getSnapshot(key: string, o: CallOptions & { ifNoneMatch?: string } = {}): Promise<Snapshot | null> {
    const headers: Record<string, string> = o.ifNoneMatch === undefined ? {} : { "If-None-Match": o.ifNoneMatch };
    return this.run(
      {
        kind: "read",
        method: "GET",
        path: `/v1/snapshots/${segment(key)}`,
        headers,
        ok: o.ifNoneMatch === undefined ? [200] : [200, 304],
        parse: (a) => (a.status === 304 ? null : snapshotOf(key, a, false)),
      },
      o.signal,
    );
  }

  /** `HEAD /v1/snapshots/{key}`: the current version's head, without its body. */
  async headSnapshot(key: string, o: CallOptions = {}): Promise<Snapshot> {
    return this.run(
      {
        kind: "read",
        method: "HEAD",
        path: `/v1/snapshots/${segment(key)}`,
        ok: [200],
        parse: (a) => snapshotOf(key, a, true),
      },
      o.signal,
    );
  }

  /** `GET /v1/snapshots/{key}/versions/{version}`; `NotFound` once pruned. */
  async getVersion(key: string, version: number, o: CallOptions = {}): Promise<Snapshot> {
    if (!Number.isSafeInteger(version) || version < 1)
      throw new InvalidRequest(`a version is a positive integer, got ${version}`);
    return this.run(
      {
        kind: "read",
        method: "GET",
        path: `/v1/snapshots/${segment(key)}/versions/${version}`,
        ok: [200],
        parse: (a) => snapshotOf(key, a, false),
      },
      o.signal,
    );
  }

  /** `GET /v1/snapshots/{key}/versions`: the retained versions, newest first. */
  async listVersions(key: string, o: ListOptions = {}): Promise<Page<SnapshotMeta>> {
    return this.run(
      {
        kind: "read",
        method: "GET",
        path: `/v1/snapshots/${segment(key)}/versions`,
        query: { limit: o.limit, cursor: o.cursor },
        ok: [200],
        parse: (a) => parsePage(json(a), parseSnapshotMeta),
      },
      o.signal,
    );
  }

  iterVersions(key: string, o: IterOptions<ListOptions> = {}): AsyncGenerator<SnapshotMeta, void, undefined> {
    return this.#pages((x) => this.listVersions(key, x), this.#iterOptions(o));
  }

  /** `DELETE /v1/snapshots/{key}`: a fenced delete, same token rule as a write. */
  async deleteSnapshot(key: string, token: number, o: FenceOptions & { ifMatch?: string } = {}): Promise<void> {
    const headers = fenceHeaders(token, o.fencingKey);
    if (o.ifMatch !== undefined) headers["If-Match"] = o.ifMatch;
    return this.run(
      {
        kind: "change",
        method: "DELETE",
        path: `/v1/snapshots/${segment(key)}`,
        ok: [204],
        parse: () => undefined,
        headers,
      },
      o.signal,
    );
  }

  /** `GET /v1/snapshots`: the keys holding a snapshot, in byte order, each its current version's head. */
  async listSnapshots(o: SnapshotListOptions = {}): Promise<Page<SnapshotMeta & { key: string }>> {
    return this.run(
      {
        kind: "read",
        method: "GET",
        path: "/v1/snapshots",
        query: {
          prefix: o.prefix,
          start_after: o.startAfter,
          order: o.order,
          limit: o.limit,
          cursor: o.cursor,
          include: o.includeMetadata ? "metadata" : undefined,
        },
        ok: [200],
        parse: (a) => parsePage(json(a), (v) => parseSnapshotMeta(v) as SnapshotMeta & { key: string }),
      },
      o.signal,
    );
  }

  iterSnapshots(
    o: IterOptions<SnapshotListOptions> = {},
  ): AsyncGenerator<SnapshotMeta & { key: string }, void, undefined> {
    return this.#pages((x) => this.listSnapshots(x), this.#iterOptions(o));
  }

  /**
   * `POST /v1/txn` (v1.3): the operations, all under `fencingKey`'s namespace, commit as one or not
   * at all (`StaleToken`/`UnknownToken` for the fence, `PreconditionFailed` with `opIndex`).
   */
  async txn(fencingKey: string, token: number, ops: readonly TxnOp[], o: CallOptions = {}): Promise<Txn> {
    const wire = ops.map((op) => {
      switch (op.op) {
        case "put": {
          checkKey(op.key);
          const { bytes, text } = bodyOf(op.body);
          const w: Record<string, unknown> = { op: "put", key: op.key, body: base64(bytes) };
          const ct = op.contentType ?? (text ? "text/plain; charset=utf-8" : undefined);
          if (ct !== undefined) w["content_type"] = ct;
          if (op.metadata !== undefined) w["metadata"] = op.metadata;
          if (op.ifMatch !== undefined) w["if_match"] = op.ifMatch;
          if (op.ifNoneMatch !== undefined) w["if_none_match"] = op.ifNoneMatch;
          return w;
        }
        case "delete":
          checkKey(op.key);
          return { op: "delete", key: op.key };
        case "delete_prefix":
          checkKey(op.prefix, "a prefix");
          return { op: "delete_prefix", prefix: op.prefix };
      }
    });
    const { body, headers } = jsonBody({ ops: wire });
    return this.run(
      {
        kind: "change",
        method: "POST",
        path: "/v1/txn",
        headers: { ...headers, ...fenceHeaders(token, fencingKey) },
        body,
        ok: [200],
        parse: (a) => parseTxn(json(a)),
      },
      o.signal,
    );
  }

  // ---- Audit -----------------------------------------------------------------------------------

  #audit<T>(path: string, item: (v: unknown) => T, o: AuditListOptions): Promise<Page<T>> {
    return this.run(
      {
        kind: "read",
        method: "GET",
        path,
        query: {
          key: o.key,
          reason: o.reason,
          since: iso(o.since),
          until: iso(o.until),
          limit: o.limit,
          cursor: o.cursor,
        },
        ok: [200],
        parse: (a) => parsePage(json(a), item),
      },
      o.signal,
    );
  }

  /** `GET /v1/audit/rejections`: refused fenced writes, newest first. */
  async listRejections(o: AuditListOptions = {}): Promise<Page<Rejection>> {
    return this.#audit("/v1/audit/rejections", parseRejection, o);
  }

  iterRejections(o: IterOptions<AuditListOptions> = {}): AsyncGenerator<Rejection, void, undefined> {
    return this.#pages((x) => this.listRejections(x), this.#iterOptions(o));
  }

  /** `GET /v1/audit/recoveries`: recovery records replaced or reconciled, newest first. */
  async listRecoveries(o: AuditListOptions = {}): Promise<Page<Recovery>> {
    return this.#audit("/v1/audit/recoveries", parseRecovery, o);
  }

  iterRecoveries(o: IterOptions<AuditListOptions> = {}): AsyncGenerator<Recovery, void, undefined> {
    return this.#pages((x) => this.listRecoveries(x), this.#iterOptions(o));
  }

  // ---- Watch and operations --------------------------------------------------------------------

  /**
   * `GET /v1/watch`: the changes under `prefix` after `since` (default: from now), as an async
   * iterator that resumes with `Last-Event-ID` when a stream ends or breaks, and ends by throwing
   * when the service refuses it (`Compacted`, `Unauthorized`, ...).
   */
  watch(o: WatchOptions = {}): Watch {
    return new Watch(this, o);
  }

  /** `GET /readyz`: whether the service can reach its database. */
  async ready(o: CallOptions = {}): Promise<boolean> {
    try {
      await this.run({ kind: "read", method: "GET", path: "/readyz", ok: [200], parse: () => undefined }, o.signal);
      return true;
    } catch (e) {
      if (o.signal?.aborted) throw e;
      return false;
    }
  }
}
