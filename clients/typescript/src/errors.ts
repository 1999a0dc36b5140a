/**
 * Every way a call can fail: one class per code of the contract (each with `code`, `status` and
 * the problem's members), and the failures that are not an answer with a code (the transport,
 * answers that are not the contract's, a lost lease). `ERRORS` maps each code to its class.
 */

import type { Holder, RecoveryRecord } from "./types.js";

/** The problem+json body of an error answer (RFC 9457), as sent. */
export type Problem = Record<string, unknown>;

export interface ErrorFields {
  requestId?: string | undefined;
  problem?: Problem | undefined;
  retryAfterMs?: number | undefined;
  cause?: unknown;
}

/** A failed call. `detail` is the server's explanation: what happened, what to do next. */
export class SnapfenceError extends Error {
  /** The contract's code; `undefined` for failures that are not an answer with a code. */
  readonly code: string | undefined = undefined;
  /** The HTTP status the code is answered with. */
  readonly status: number | undefined = undefined;
  readonly detail: string;
  /** The answer's `x-request-id`, to find the server's log of it. */
  readonly requestId: string | undefined;
  /** The problem+json body as sent (empty when there was none). */
  readonly problem: Problem;
  /** How long the server asked the client to wait before a retry (`Retry-After`), if it said. */
  readonly retryAfterMs: number | undefined;

  constructor(detail: string, fields: ErrorFields = {}) {
    super(detail, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = new.target.name;
    this.detail = detail;
    this.requestId = fields.requestId;
    this.problem = fields.problem ?? {};
    this.retryAfterMs = fields.retryAfterMs;
  }

  /** Whether the same call may succeed later without anything else changing: retried. */
  get isTransient(): boolean {
    return false;
  }

  /** Whether a change that failed this way may still have been applied. */
  get isIndeterminate(): boolean {
    return false;
  }
}

function coded<C extends string, S extends number>(code: C, status: S) {
  return class extends SnapfenceError {
    override readonly code: C = code;
    override readonly status: S = status;
  };
}

/** `400 invalid_request`; also thrown before sending for input the client can tell is invalid. */
export class InvalidRequest extends coded("invalid_request", 400) {}
/** `428 token_required`: a fenced call without a `Fencing-Token`. */
export class TokenRequired extends coded("token_required", 428) {}

/** `409 lease_held`: another lease on the key is live; `holder` says whose, until when. */
export class LeaseHeld extends coded("lease_held", 409) {
  readonly holder: Holder | undefined;
  /** `held`, or the free state of a key that goes to the `waiters` queued first. */
  readonly state: string | undefined;
  readonly waiters: number | undefined;
  constructor(detail: string, fields: ErrorFields & { holder?: Holder; state?: string; waiters?: number } = {}) {
    super(detail, fields);
    this.holder = fields.holder;
    this.state = fields.state;
    this.waiters = fields.waiters;
  }
}

/** `409 recovery_required`: a recovery record blocks the grant until it is reconciled. */
export class RecoveryRequired extends coded("recovery_required", 409) {
  readonly recovery: RecoveryRecord | undefined;
  constructor(detail: string, fields: ErrorFields & { recovery?: RecoveryRecord } = {}) {
    super(detail, fields);
    this.recovery = fields.recovery;
  }
}

/** `409 lease_lost`: the token is not the key's live lease. Stop working on the key. */
export class LeaseLost extends coded("lease_lost", 409) {}

interface RefusalFields extends ErrorFields {
  presentedToken?: number;
  highestToken?: number | null;
  auditId?: number;
  fencingKey?: string;
}

function refused<C extends string>(code: C) {
  return class extends coded(code, 409) {
    readonly presentedToken: number | undefined;
    /** The newest token of the key (`null` for a key that never had a lease). */
    readonly highestToken: number | null | undefined;
    /** The refusal's row in the audit log (`client.listRejections()`). */
    readonly auditId: number | undefined;
    /** The fence the write named (v1.3), when the server says. */
    readonly fencingKey: string | undefined;
    constructor(detail: string, fields: RefusalFields = {}) {
      super(detail, fields);
      this.presentedToken = fields.presentedToken;
      this.highestToken = fields.highestToken;
      this.auditId = fields.auditId;
      this.fencingKey = fields.fencingKey;
    }
  };
}

/** `409 stale_token`: a fenced write with a superseded token, or of a released lease; audited. */
export class StaleToken extends refused("stale_token") {}
/** `409 unknown_token`: a fenced write with a token never issued for the key; audited. */
export class UnknownToken extends refused("unknown_token") {}

/** `412 precondition_failed`: `If-Match` did not hold (for a transaction: `opIndex`). */
export class PreconditionFailed extends coded("precondition_failed", 412) {
  get opIndex(): number | undefined {
    const v = this.problem["op_index"];
    return typeof v === "number" ? v : undefined;
  }
}
/** `404 not_found`: no such lease, snapshot, version or endpoint. */
export class NotFound extends coded("not_found", 404) {}
/** `405 method_not_allowed`. */
export class MethodNotAllowed extends coded("method_not_allowed", 405) {}
/** `408 request_timeout`: the body did not arrive in time. */
export class RequestTimeout extends coded("request_timeout", 408) {}
/** `413 payload_too_large`: nothing was stored. */
export class PayloadTooLarge extends coded("payload_too_large", 413) {}
/** `401 unauthorized`: no live API key. */
export class Unauthorized extends coded("unauthorized", 401) {}
/** `403 forbidden`: the API key may not do this, or not to this key. */
export class Forbidden extends coded("forbidden", 403) {}

/** `500 internal`: a bug of the server. Its outcome is unknown: retried like any 5xx. */
export class Internal extends coded("internal", 500) {
  override get isTransient(): boolean {
    return true;
  }
  override get isIndeterminate(): boolean {
    return true;
  }
}

/** `503 unavailable`: the database cannot be reached; nothing was changed. Retried. */
export class Unavailable extends coded("unavailable", 503) {
  override get isTransient(): boolean {
    return true;
  }
}

/**
 * The outcome of a change is not known. Either the server said so (`503 indeterminate`) on every
 * attempt, or an earlier attempt's answer was lost and the later ones only said that *they*
 * changed nothing. Find out by reading: the snapshot's etag or version, the key's lease.
 */
export class Indeterminate extends coded("indeterminate", 503) {
  override get isTransient(): boolean {
    return true;
  }
  override get isIndeterminate(): boolean {
    return true;
  }
}

/** `422 idempotency_key_reused`: the client makes a fresh key per call, so this is a bug. */
export class IdempotencyKeyReused extends coded("idempotency_key_reused", 422) {}
/** `409 request_in_progress`: an earlier attempt of this call still runs; retried for changes. */
export class RequestInProgress extends coded("request_in_progress", 409) {}

/** `429 too_many_requests`: a limit of the API key; nothing changed. Retried after `retryAfterMs`. */
export class TooManyRequests extends coded("too_many_requests", 429) {
  override get isTransient(): boolean {
    return true;
  }
}

/** `410 compacted`: a watch resumed from a change older than the retained history. */
export class Compacted extends coded("compacted", 410) {}

/**
 * The request or its answer did not make it across the network. `mayHaveReached` is `false`
 * only when no connection was made, so nothing was sent.
 */
export class TransportError extends SnapfenceError {
  readonly mayHaveReached: boolean;
  readonly retryable: boolean;
  constructor(detail: string, fields: ErrorFields & { mayHaveReached: boolean; retryable?: boolean }) {
    super(detail, fields);
    this.mayHaveReached = fields.mayHaveReached;
    this.retryable = fields.retryable ?? true;
  }
  override get isTransient(): boolean {
    return this.retryable;
  }
  override get isIndeterminate(): boolean {
    return this.mayHaveReached;
  }
}

/** An answer the contract does not name (a proxy's 502, a code this client does not know). */
export class UnexpectedAnswer extends SnapfenceError {
  readonly httpStatus: number;
  constructor(detail: string, fields: ErrorFields & { httpStatus: number }) {
    super(detail, fields);
    this.httpStatus = fields.httpStatus;
  }
  override get isTransient(): boolean {
    return this.httpStatus >= 500;
  }
  override get isIndeterminate(): boolean {
    return this.httpStatus >= 500;
  }
}

/** An answer that should follow the contract and does not. Is the URL a snapfence server? */
export class ProtocolError extends SnapfenceError {
  override get isTransient(): boolean {
    return true;
  }
  override get isIndeterminate(): boolean {
    return true;
  }
}

/** Why a held lease was declared lost. */
export type LostReason =
  /** A renewal answered `lease_lost`: the lease expired, was released or was superseded. */
  | "lease_lost"
  /** Renewals kept failing (or the process was frozen) and less than the margin was left. */
  | "lapsing"
  /** A renewal was refused in a way retrying cannot change (e.g. `401 unauthorized`). */
  | "refused";

/** Thrown by `lease.throwIfLost()`, and by `hold` once its lease was lost: stop the work. */
export class LostLease extends SnapfenceError {
  readonly reason: LostReason;
  constructor(detail: string, reason: LostReason, cause?: unknown) {
    super(detail, { cause });
    this.reason = reason;
  }
}

type CodedClass = typeof InvalidRequest | typeof LeaseHeld | typeof RecoveryRequired | typeof StaleToken;

/** Each code of the contract, and the class that stands for it. */
export const ERRORS: Readonly<Record<string, new (detail: string, fields?: ErrorFields) => SnapfenceError>> =
  Object.freeze(
    Object.fromEntries(
      (
        [
          InvalidRequest,
          TokenRequired,
          LeaseHeld,
          RecoveryRequired,
          LeaseLost,
          StaleToken,
          UnknownToken,
          PreconditionFailed,
          NotFound,
          MethodNotAllowed,
          RequestTimeout,
          PayloadTooLarge,
          Unauthorized,
          Forbidden,
          Internal,
          Unavailable,
          Indeterminate,
          IdempotencyKeyReused,
          RequestInProgress,
          TooManyRequests,
          Compacted,
        ] as CodedClass[]
      ).map((cls) => [new cls("").code as string, cls]),
    ),
  );
