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

/** `400 invalid_request`; also thrown before sending for input the client can tell is invalid. */
export class InvalidRequest extends SnapfenceError {
  override readonly code = "invalid_request" as const;
  override readonly status = 400 as const;
}

/** `428 token_required`: a fenced call without a `Fencing-Token`. */
export class TokenRequired extends SnapfenceError {
  override readonly code = "token_required" as const;
  override readonly status = 428 as const;
}

/** `409 lease_held`: another lease on the key is live; `holder` says whose, until when. */
export class LeaseHeld extends SnapfenceError {
  override readonly code = "lease_held" as const;
  override readonly status = 409 as const;
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
export class RecoveryRequired extends SnapfenceError {
  override readonly code = "recovery_required" as const;
  override readonly status = 409 as const;
  readonly recovery: RecoveryRecord | undefined;
  constructor(detail: string, fields: ErrorFields & { recovery?: RecoveryRecord } = {}) {
    super(detail, fields);
    this.recovery = fields.recovery;
  }
}

/** `409 lease_lost`: the token is not the key's live lease. Stop working on the key. */
export class LeaseLost extends SnapfenceError {
  override readonly code = "lease_lost" as const;
  override readonly status = 409 as const;
}

interface RefusalFields extends ErrorFields {
  presentedToken?: number;
  highestToken?: number | null;
  auditId?: number;
  fencingKey?: string;
}

/** A refused fenced write, recorded in the audit log. */
export abstract class FencedWriteRefused extends SnapfenceError {
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
}

/** `409 stale_token`: a fenced write with a superseded token, or of a released lease; audited. */
export class StaleToken extends FencedWriteRefused {
  override readonly code = "stale_token" as const;
  override readonly status = 409 as const;
}

/** `409 unknown_token`: a fenced write with a token never issued for the key; audited. */
export class UnknownToken extends FencedWriteRefused {
  override readonly code = "unknown_token" as const;
  override readonly status = 409 as const;
}

/** `412 precondition_failed`: `If-Match` did not hold (for a transaction: `opIndex`). */
export class PreconditionFailed extends SnapfenceError {
  override readonly code = "precondition_failed" as const;
  override readonly status = 412 as const;
  get opIndex(): number | undefined {
    const v = this.problem["op_index"];
    return typeof v === "number" ? v : undefined;
  }
}

/** `404 not_found`: no such lease, snapshot, version or endpoint. */
export class NotFound extends SnapfenceError {
  override readonly code = "not_found" as const;
  override readonly status = 404 as const;
}

/** `405 method_not_allowed`. */
export class MethodNotAllowed extends SnapfenceError {
  override readonly code = "method_not_allowed" as const;
  override readonly status = 405 as const;
}

/** `408 request_timeout`: the body did not arrive in time. */
export class RequestTimeout extends SnapfenceError {
  override readonly code = "request_timeout" as const;
  override readonly status = 408 as const;
}

/** `413 payload_too_large`: nothing was stored. */
export class PayloadTooLarge extends SnapfenceError {
  override readonly code = "payload_too_large" as const;
  override readonly status = 413 as const;
}

/** `401 unauthorized`: no live API key. */
export class Unauthorized extends SnapfenceError {
  override readonly code = "unauthorized" as const;
  override readonly status = 401 as const;
}

/** `403 forbidden`: the API key may not do this, or not to this key. */
export class Forbidden extends SnapfenceError {
  override readonly code = "forbidden" as const;
  override readonly status = 403 as const;
}

/** `500 internal`: a bug of the server. Its outcome is unknown: retried like any 5xx. */
export class Internal extends SnapfenceError {
  override readonly code = "internal" as const;
  override readonly status = 500 as const;
  override get isTransient(): boolean {
    return true;
  }
  override get isIndeterminate(): boolean {
    return true;
  }
}

/** `503 unavailable`: the database cannot be reached; nothing was changed. Retried. */
export class Unavailable extends SnapfenceError {
  override readonly code = "unavailable" as const;
  override readonly status = 503 as const;
  override get isTransient(): boolean {
    return true;
  }
}

/**
 * The outcome of a change is not known. Either the server said so (`503 indeterminate`) on every
 * attempt, or an earlier attempt's answer was lost and the later ones only said that *they*
 * changed nothing. Find out by reading: the snapshot's etag or version, the key's lease.
 */
export class Indeterminate extends SnapfenceError {
  override readonly code = "indeterminate" as const;
  override readonly status = 503 as const;
  override get isTransient(): boolean {
    return true;
  }
  override get isIndeterminate(): boolean {
    return true;
  }
}

/** `422 idempotency_key_reused`: the client makes a fresh key per call, so this is a bug. */
export class IdempotencyKeyReused extends SnapfenceError {
  override readonly code = "idempotency_key_reused" as const;
  override readonly status = 422 as const;
}

/** `409 request_in_progress`: an earlier attempt of this call still runs; retried for changes. */
export class RequestInProgress extends SnapfenceError {
  override readonly code = "request_in_progress" as const;
  override readonly status = 409 as const;
}

/** `429 too_many_requests`: a limit of the API key; nothing changed. Retried after `retryAfterMs`. */
export class TooManyRequests extends SnapfenceError {
  override readonly code = "too_many_requests" as const;
  override readonly status = 429 as const;
  override get isTransient(): boolean {
    return true;
  }
}

/** `410 compacted`: a watch resumed from a change older than the retained history. */
export class Compacted extends SnapfenceError {
  override readonly code = "compacted" as const;
  override readonly status = 410 as const;
}

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

type CodedClass = new (detail: string, fields?: ErrorFields) => SnapfenceError;

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
