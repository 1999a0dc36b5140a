/**
 * The values of the contract as this client hands them out: camelCase, times as `Date`, and
 * tokens as numbers (checked to be safe integers). `parse*` functions read the contract's JSON
 * and throw `TypeError` for anything else, which the transport reports as a `ProtocolError`.
 */

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** A lease as granted, renewed or stored. `token` is the fencing token of its writes. */
export interface Lease {
  key: string;
  owner: string;
  token: number;
  acquiredAt: Date;
  expiresAt: Date;
  ttlMs: number;
  metadata: JsonObject | null;
  crashRecovery: boolean;
}

/** What a crashed, abandoning or marked holder left behind. */
export interface RecoveryRecord {
  owner: string;
  token: number;
  acquiredAt: Date;
  endedAt: Date;
  reason: "abandoned" | "expired" | "recovery_required" | (string & {});
  metadata: JsonObject | null;
}

/**
 * A successful acquire: the `lease`, and `recovered` (the record a `reconciled` acquire replaced)
 * or `recovery` (the record a `reconciling` acquire keeps while it holds the key).
 */
export interface Grant extends Lease {
  recovered: RecoveryRecord | null;
  recovery: RecoveryRecord | null;
}

/** Who holds a key, as a `lease_held` refusal tells it. */
export interface Holder {
  owner: string;
  acquiredAt: Date;
  expiresAt: Date;
  metadata: JsonObject | null;
}

export type LeaseState = "held" | "expired" | "released" | "recovery_pending";

/** `GET /v1/leases/{key}`: the key's state, its newest lease, its recovery record. */
export interface KeyStatus {
  key: string;
  state: LeaseState;
  lease: Lease;
  recovery: RecoveryRecord | null;
  newestToken: number;
}

/** One waiting acquire in a key's queue (beyond the contract): `position` 1 is next. */
export interface Waiter {
  position: number;
  owner: string | null;
  since: Date;
}

/** A stored version of a snapshot, without its body. */
export interface SnapshotMeta {
  /** Set in a write's answer and in listings. */
  key?: string;
  version: number;
  token: number;
  etag: string;
  size: number;
  contentType: string;
  updatedAt: Date;
  /** The lease whose token fenced the write (v1.3), when the server says. */
  fencingKey?: string;
  /** The version's `Snapshot-Metadata` (v1.3), when the server says. */
  metadata?: JsonObject | null;
}

/** A snapshot as read: its body and what the headers say about it. */
export interface Snapshot {
  key: string;
  /** The stored bytes (empty for `headSnapshot`). */
  body: Uint8Array;
  contentType: string;
  etag: string;
  token: number;
  version: number;
  lastModified: Date;
  size: number;
  /** The `Fencing-Key` header (v1.3), when sent. */
  fencingKey?: string;
  /** The `Snapshot-Metadata` header (v1.3), when sent. */
  metadata?: JsonObject;
  /** The body as UTF-8 text. */
  text(): string;
  /** The body parsed as JSON. */
  json<T = unknown>(): T;
}

/** A refused fenced write, from the audit log. */
export interface Rejection {
  id: number;
  at: Date;
  key: string;
  reason: "stale_token" | "unknown_token" | (string & {});
  presentedToken: number | null;
  highestToken: number | null;
  holder: string | null;
  operation: string;
  requestId: string | null;
  remoteAddr: string | null;
  principal: string | null;
  fencingKey?: string;
}

/** A recovery record replaced or reconciled, from the audit log. */
export interface Recovery {
  id: number;
  at: Date;
  key: string;
  reason: string;
  holder: string | null;
  operation: string;
  requestId: string | null;
  remoteAddr: string | null;
  principal: string | null;
  recovery: RecoveryRecord | null;
  reconciledBy: string | null;
}

/** One page of a list; `nextCursor` is `null` on the last. */
export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

export const CHANGE_KINDS = [
  "lease.granted",
  "lease.released",
  "lease.abandoned",
  "lease.expired",
  "lease.recovery_required",
  "lease.reconciled",
  "snapshot.written",
  "snapshot.deleted",
  "write.refused",
] as const;
export type ChangeKind = (typeof CHANGE_KINDS)[number];

/** One change from a watch. `data` is the event's JSON as sent (snake_case). */
export interface ChangeEvent {
  /** Strictly increasing over the whole service: where a later watch can resume. */
  id: number;
  kind: ChangeKind;
  key: string;
  token: number;
  at: Date;
  owner?: string;
  /** A grant's expiry. */
  expiresAt?: Date;
  version?: number;
  etag?: string;
  reason?: string;
  auditId?: number;
  fencingKey?: string;
  /** The transaction's first change id and size (v1.3), for changes of a transaction. */
  txn?: number;
  txnSize?: number;
  data: JsonObject;
}

/** One operation of a transaction (v1.3). Bodies are bytes or text. */
export type TxnOp =
  | {
      op: "put";
      key: string;
      body: Uint8Array | string;
      contentType?: string;
      metadata?: JsonObject;
      ifMatch?: string;
      /** Only `"*"`: create only. */
      ifNoneMatch?: "*";
    }
  | { op: "delete"; key: string }
  | { op: "delete_prefix"; prefix: string };

export type TxnResult =
  | (SnapshotMeta & { op: "put"; key: string; created: boolean })
  | { op: "delete"; key: string; deleted: boolean }
  | { op: "delete_prefix"; prefix: string; deleted: number };

/** The answer of a transaction: one result per operation, in order. */
export interface Txn {
  token: number;
  fencingKey: string;
  results: TxnResult[];
}

// ---- Reading the contract's JSON ----------------------------------------------------------------

type Obj = Record<string, unknown>;

function fail(what: string): never {
  throw new TypeError(what);
}

export function obj(v: unknown, what = "an object"): Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Obj) : fail(`expected ${what}`);
}

export function str(o: Obj, k: string): string {
  const v = o[k];
  return typeof v === "string" ? v : fail(`"${k}" is not a string`);
}

export function optStr(o: Obj, k: string): string | null {
  const v = o[k];
  return v === undefined || v === null ? null : typeof v === "string" ? v : fail(`"${k}" is not a string`);
}

export function int(o: Obj, k: string): number {
  const v = o[k];
  return typeof v === "number" && Number.isSafeInteger(v) ? v : fail(`"${k}" is not a safe integer`);
}

export function optInt(o: Obj, k: string): number | null {
  const v = o[k];
  return v === undefined || v === null ? null : int(o, k);
}

export function time(o: Obj, k: string): Date {
  const d = new Date(str(o, k));
  return Number.isNaN(d.getTime()) ? fail(`"${k}" is not an RFC 3339 time`) : d;
}

function optObj(o: Obj, k: string): JsonObject | null {
  const v = o[k];
  return v === undefined || v === null ? null : (obj(v, `"${k}" as an object`) as JsonObject);
}

export function parseLease(j: unknown): Lease {
  const o = obj(j);
  return {
    key: str(o, "key"),
    owner: str(o, "owner"),
    token: int(o, "token"),
    acquiredAt: time(o, "acquired_at"),
    expiresAt: time(o, "expires_at"),
    ttlMs: int(o, "ttl_ms"),
    metadata: optObj(o, "metadata"),
    crashRecovery: o["crash_recovery"] === true,
  };
}

export function parseRecord(j: unknown): RecoveryRecord {
  const o = obj(j);
  return {
    owner: str(o, "owner"),
    token: int(o, "token"),
    acquiredAt: time(o, "acquired_at"),
    endedAt: time(o, "ended_at"),
    reason: str(o, "reason"),
    metadata: optObj(o, "metadata"),
  };
}

function optRecord(o: Obj, k: string): RecoveryRecord | null {
  const v = o[k];
  return v === undefined || v === null ? null : parseRecord(v);
}

export function parseGrant(j: unknown): Grant {
  const o = obj(j);
  return { ...parseLease(o), recovered: optRecord(o, "recovered"), recovery: optRecord(o, "recovery") };
}

export function parseHolder(j: unknown): Holder {
  const o = obj(j);
  return {
    owner: str(o, "owner"),
    acquiredAt: time(o, "acquired_at"),
    expiresAt: time(o, "expires_at"),
    metadata: optObj(o, "metadata"),
  };
}

export function parseKeyStatus(j: unknown): KeyStatus {
  const o = obj(j);
  return {
    key: str(o, "key"),
    state: str(o, "state") as LeaseState,
    lease: parseLease(o["lease"]),
    recovery: optRecord(o, "recovery"),
    newestToken: int(o, "newest_token"),
  };
}

export function parseWaiter(j: unknown): Waiter {
  const o = obj(j);
  return { position: int(o, "position"), owner: optStr(o, "owner"), since: time(o, "since") };
}

export function parseSnapshotMeta(j: unknown): SnapshotMeta {
  const o = obj(j);
  const m: SnapshotMeta = {
    version: int(o, "version"),
    token: int(o, "token"),
    etag: str(o, "etag"),
    size: int(o, "size"),
    contentType: str(o, "content_type"),
    updatedAt: time(o, "updated_at"),
  };
  const key = optStr(o, "key");
  if (key !== null) m.key = key;
  const fk = optStr(o, "fencing_key");
  if (fk !== null) m.fencingKey = fk;
  if ("metadata" in o) m.metadata = optObj(o, "metadata");
  return m;
}

export function parseRejection(j: unknown): Rejection {
  const o = obj(j);
  const r: Rejection = {
    id: int(o, "id"),
    at: time(o, "at"),
    key: str(o, "key"),
    reason: str(o, "reason"),
    presentedToken: optInt(o, "presented_token"),
    highestToken: optInt(o, "highest_token"),
    holder: optStr(o, "holder"),
    operation: str(o, "operation"),
    requestId: optStr(o, "request_id"),
    remoteAddr: optStr(o, "remote_addr"),
    principal: optStr(o, "principal"),
  };
  const fk = optStr(o, "fencing_key");
  if (fk !== null) r.fencingKey = fk;
  return r;
}

export function parseRecovery(j: unknown): Recovery {
  const o = obj(j);
  return {
    id: int(o, "id"),
    at: time(o, "at"),
    key: str(o, "key"),
    reason: str(o, "reason"),
    holder: optStr(o, "holder"),
    operation: str(o, "operation"),
    requestId: optStr(o, "request_id"),
    remoteAddr: optStr(o, "remote_addr"),
    principal: optStr(o, "principal"),
    recovery: optRecord(o, "recovery"),
    reconciledBy: optStr(o, "reconciled_by"),
  };
}

export function parseChange(id: number, kind: ChangeKind, j: unknown): ChangeEvent {
  const o = obj(j);
  const e: ChangeEvent = {
    id,
    kind,
    key: str(o, "key"),
    token: int(o, "token"),
    at: time(o, "at"),
    data: o as JsonObject,
  };
  const owner = optStr(o, "owner");
  if (owner !== null) e.owner = owner;
  if (typeof o["expires_at"] === "string") e.expiresAt = time(o, "expires_at");
  const version = optInt(o, "version");
  if (version !== null) e.version = version;
  const etag = optStr(o, "etag");
  if (etag !== null) e.etag = etag;
  const reason = optStr(o, "reason");
  if (reason !== null) e.reason = reason;
  const auditId = optInt(o, "audit_id");
  if (auditId !== null) e.auditId = auditId;
  const fk = optStr(o, "fencing_key");
  if (fk !== null) e.fencingKey = fk;
  const txn = optInt(o, "txn");
  if (txn !== null) e.txn = txn;
  const txnSize = optInt(o, "txn_size");
  if (txnSize !== null) e.txnSize = txnSize;
  return e;
}

export function parseTxn(j: unknown): Txn {
  const o = obj(j);
  const results = o["results"];
  if (!Array.isArray(results)) fail(`"results" is not an array`);
  return {
    token: int(o, "token"),
    fencingKey: str(o, "fencing_key"),
    results: results.map((r): TxnResult => {
      const x = obj(r);
      if (typeof x["prefix"] === "string")
        return { op: "delete_prefix", prefix: str(x, "prefix"), deleted: int(x, "deleted") };
      if ("deleted" in x) return { op: "delete", key: str(x, "key"), deleted: x["deleted"] === true };
      return { ...parseSnapshotMeta(x), op: "put", key: str(x, "key"), created: x["created"] === true };
    }),
  };
}

export function parsePage<T>(j: unknown, item: (v: unknown) => T): Page<T> {
  const o = obj(j);
  const items = o["items"];
  if (!Array.isArray(items)) fail(`"items" is not an array`);
  return { items: items.map(item), nextCursor: optStr(o, "next_cursor") };
}
