/**
 * snapfence for TypeScript and JavaScript: leases with fencing tokens, fenced snapshot writes,
 * transactions, the audit log of refused writes, the watch, a keeper (`client.hold`) and leader
 * election, over `fetch` (Node 20+ and browsers).
 */

export {
  Client,
  type AcquireOptions,
  type AuditListOptions,
  type CallOptions,
  type FenceOptions,
  type IterOptions,
  type LeaseListOptions,
  type ListOptions,
  type PutOptions,
  type SnapshotListOptions,
} from "./client.js";
export { DEFAULT_URL, VERSION, type ClientOptions } from "./config.js";
export { Election, type ElectionOptions, type Leader, type Leadership } from "./election.js";
export * from "./errors.js";
export type { HeldLease, HoldOptions, KeepOptions } from "./hold.js";
export { SseParser, type SseEvent } from "./sse.js";
export { DEFAULT_RETRY, type FetchLike, type RetryPolicy } from "./transport.js";
export {
  CHANGE_KINDS,
  type ChangeEvent,
  type ChangeKind,
  type Grant,
  type Holder,
  type Json,
  type JsonObject,
  type KeyStatus,
  type Lease,
  type LeaseState,
  type Page,
  type Recovery,
  type RecoveryRecord,
  type Rejection,
  type Snapshot,
  type SnapshotMeta,
  type Txn,
  type TxnOp,
  type TxnResult,
  type Waiter,
} from "./types.js";
export { Watch, type WatchOptions } from "./watch.js";
