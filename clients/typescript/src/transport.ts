/**
 * Sending one call of the contract: its attempts, each with the same `Idempotency-Key` for a
 * change, which failures are retried and after how long, and how an answer turns into a value
 * or the error it stands for. The client's methods only describe calls; this runs them.
 */

import {
  ERRORS,
  Indeterminate,
  LeaseHeld,
  ProtocolError,
  RecoveryRequired,
  RequestInProgress,
  SnapfenceError,
  StaleToken,
  TooManyRequests,
  TransportError,
  Unavailable,
  UnexpectedAnswer,
  UnknownToken,
  type ErrorFields,
  type Problem,
} from "./errors.js";
import { obj, parseHolder, parseRecord } from "./types.js";

/** How failed attempts are retried (times in milliseconds). */
export interface RetryPolicy {
  /** Attempts in all, the first included; 1 never retries. Default 4. */
  maxAttempts: number;
  /** The pause before the first retry, doubled for each later one. Default 100. */
  initialBackoffMs: number;
  /** The longest pause. Default 2000. */
  maxBackoffMs: number;
}

export const DEFAULT_RETRY: Readonly<RetryPolicy> = Object.freeze({
  maxAttempts: 4,
  initialBackoffMs: 100,
  maxBackoffMs: 2000,
});

/** A random part of up to a half taken off, so that clients failing together do not retry together. */
export function jittered(ms: number): number {
  return ms * (0.5 + Math.random() * 0.5);
}

export function backoff(policy: RetryPolicy, retry: number): number {
  return jittered(Math.min(policy.initialBackoffMs * 2 ** Math.max(retry - 1, 0), policy.maxBackoffMs));
}

export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface Answer {
  status: number;
  headers: Headers;
  body: Uint8Array;
}

/** One call of the contract: what to send, which statuses succeed, how to read the answer. */
export interface Call<T> {
  kind: "read" | "change";
  method: string;
  path: string;
  query?: Record<string, string | number | undefined>;
  headers?: Record<string, string>;
  body?: Uint8Array | string;
  ok: readonly number[];
  parse: (a: Answer) => T;
  /** Time the server may take on purpose beyond an attempt's timeout (a waiting acquire's wait). */
  extraMs?: number;
}

export interface TransportConfig {
  base: string;
  headers: Record<string, string>;
  fetch: () => Promise<FetchLike>;
  timeoutMs: number;
  retry: RetryPolicy;
  onRetry: ((error: SnapfenceError, pauseMs: number) => void) | undefined;
}

export function describe(call: Pick<Call<unknown>, "method" | "path">): string {
  return `${call.method} ${call.path}`;
}

export function url(base: string, path: string, query?: Record<string, string | number | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) q.append(k, String(v));
  const s = q.toString();
  return base + path + (s ? `?${s}` : "");
}

export function newIdempotencyKey(): string {
  const c = globalThis.crypto;
  if (typeof c?.randomUUID === "function") return c.randomUUID();
  const b = c.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(
      () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      },
      Math.max(0, ms),
    );
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

const NOT_SENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

function causeCodes(e: unknown): string[] {
  const out: string[] = [];
  let c: unknown = e;
  for (let i = 0; i < 6 && typeof c === "object" && c !== null; i++) {
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string") out.push(code);
    const errors = (c as { errors?: unknown }).errors;
    if (Array.isArray(errors)) out.push(...errors.flatMap(causeCodes));
    c = (c as { cause?: unknown }).cause;
  }
  return out;
}

/**
 * A failed `fetch`, classified by whether anything can have reached the server: only a failure
 * to connect proves that nothing did. A certificate not trusted is not retried: it will not pass.
 */
export function transportError(e: unknown, what: string): TransportError {
  const codes = causeCodes(e);
  const untrusted = codes.some((c) => /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS/.test(c));
  const reached = !untrusted && !codes.some((c) => NOT_SENT.has(c));
  const why = codes.length ? `${String(e)} (${codes.join(", ")})` : String(e);
  const detail = untrusted
    ? `${what}: the server's certificate is not trusted (${why}); give its CA with the \`ca\` option or SNAPFENCE_CA_CERT`
    : reached
      ? `${what}: the connection failed after the request was sent, so it may or may not have taken effect (${why})`
      : `${what}: could not connect to the server, so nothing was sent (${why})`;
  return new TransportError(detail, { mayHaveReached: reached, retryable: !untrusted, cause: e });
}

function retryAfterMs(h: Headers): number | undefined {
  const v = h.get("retry-after");
  if (v === null) return undefined;
  const n = Number(v.trim());
  if (Number.isFinite(n)) return Math.max(0, n * 1000);
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

const decoder = new TextDecoder();

/** The error a non-success answer stands for. */
export function errorOf(a: Answer, what: string): SnapfenceError {
  const requestId = a.headers.get("x-request-id") ?? undefined;
  const ctype = a.headers.get("content-type") ?? "";
  const base: ErrorFields = { requestId, retryAfterMs: retryAfterMs(a.headers) };
  if (ctype.startsWith("application/problem+json") && a.body.length > 0) {
    let problem: Problem;
    try {
      problem = obj(JSON.parse(decoder.decode(a.body)));
    } catch (e) {
      return new ProtocolError(
        `the ${a.status} answer to ${what} is not a problem of the contract: ${String(e)}`,
        base,
      );
    }
    const code = problem["code"];
    if (typeof code === "string") {
      const detail = String(problem["detail"] ?? problem["title"] ?? code);
      try {
        return problemError(code, detail, problem, { ...base, problem }, a.status);
      } catch (e) {
        return new ProtocolError(
          `a ${code} problem without the members of the contract (${String(e)}): ${detail}`,
          base,
        );
      }
    }
  }
  const text = decoder.decode(a.body).trim().split("\n")[0]?.slice(0, 200) ?? "";
  const detail = `${a.status} to ${what}${text ? `: ${text}` : ""}`;
  const byStatus: Record<number, string> = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    413: "payload_too_large",
  };
  const code = byStatus[a.status];
  const cls = code === undefined ? undefined : ERRORS[code];
  return cls ? new cls(detail, base) : new UnexpectedAnswer(detail, { ...base, httpStatus: a.status });
}

function problemError(code: string, detail: string, p: Problem, f: ErrorFields, status: number): SnapfenceError {
  switch (code) {
    case "lease_held": {
      const extra: { holder?: ReturnType<typeof parseHolder>; state?: string; waiters?: number } = {};
      if (p["holder"] != null) extra.holder = parseHolder(p["holder"]);
      if (typeof p["state"] === "string") extra.state = p["state"];
      if (typeof p["waiters"] === "number") extra.waiters = p["waiters"];
      return new LeaseHeld(detail, { ...f, ...extra });
    }
    case "recovery_required":
      return new RecoveryRequired(detail, { ...f, recovery: parseRecord(p["recovery"]) });
    case "stale_token":
    case "unknown_token": {
      const cls = code === "stale_token" ? StaleToken : UnknownToken;
      const n = (k: string) => {
        const v = p[k];
        if (typeof v === "number" && Number.isSafeInteger(v)) return v;
        throw new TypeError(`"${k}" is not an integer`);
      };
      const extra: { presentedToken: number; highestToken: number | null; auditId: number; fencingKey?: string } = {
        presentedToken: n("presented_token"),
        highestToken: p["highest_token"] == null ? null : n("highest_token"),
        auditId: n("audit_id"),
      };
      if (typeof p["fencing_key"] === "string") extra.fencingKey = p["fencing_key"];
      return new cls(detail, { ...f, ...extra });
    }
  }
  const cls = ERRORS[code];
  return cls ? new cls(detail, f) : new UnexpectedAnswer(detail, { ...f, httpStatus: status });
}

/** Whether a failed attempt may be tried again: whenever it may pass later, and for a change also
 * while the server still runs an earlier attempt of it. */
function mayRetry(kind: Call<unknown>["kind"], e: SnapfenceError): boolean {
  return e.isTransient || (kind === "change" && e instanceof RequestInProgress);
}

/** The last failure as it reads for the whole call when an earlier attempt's outcome is unknown:
 * an answer that only says *this* attempt changed nothing leaves the call indeterminate. */
function afterUnknownAttempt(e: SnapfenceError, what: string): SnapfenceError {
  const thisAttemptOnly =
    e instanceof Unavailable ||
    e instanceof TooManyRequests ||
    e instanceof RequestInProgress ||
    (e instanceof TransportError && !e.mayHaveReached);
  if (!thisAttemptOnly) return e;
  return new Indeterminate(
    `an earlier attempt of ${what} may have taken effect (its answer was lost), and the last attempt said only that it changed nothing itself (${e.message}); read the key to find out before you retry`,
    { requestId: e.requestId, cause: e },
  );
}

export function pauseBeforeRetry(policy: RetryPolicy, e: SnapfenceError, retry: number): number {
  return Math.max(backoff(policy, retry), e.retryAfterMs ?? 0);
}

/** One attempt's fetch, bounded by `timeoutMs` and by the caller's signal. */
export async function send(
  cfg: TransportConfig,
  call: Pick<Call<unknown>, "method" | "path" | "query" | "headers" | "body">,
  extraHeaders: Record<string, string>,
  signal: AbortSignal | undefined,
  timeoutMs: number | undefined,
): Promise<{
  res: Response;
  done: () => void;
  timedOut: () => boolean;
  attemptSignal: AbortSignal;
  abort: (reason: unknown) => void;
}> {
  const what = describe(call);
  const fetch = await cfg.fetch();
  const ctl = new AbortController();
  let expired = false;
  const timer =
    timeoutMs === undefined
      ? undefined
      : setTimeout(() => {
          expired = true;
          ctl.abort(new TransportError(`${what}: no answer within ${timeoutMs} ms`, { mayHaveReached: true }));
        }, timeoutMs);
  const onAbort = () => ctl.abort(signal?.reason);
  signal?.addEventListener("abort", onAbort, { once: true });
  const done = () => {
    if (timer !== undefined) clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  };
  if (signal?.aborted) {
    done();
    throw signal.reason;
  }
  const init: RequestInit = {
    method: call.method,
    headers: { ...cfg.headers, ...call.headers, ...extraHeaders },
    signal: ctl.signal,
    redirect: "manual",
  };
  if (call.body !== undefined) init.body = call.body as BodyInit;
  try {
    const res = await fetch(url(cfg.base, call.path, call.query), init);
    return { res, done, timedOut: () => expired, attemptSignal: ctl.signal, abort: (r) => ctl.abort(r) };
  } catch (e) {
    done();
    throw failure(e, what, signal, expired, ctl.signal);
  }
}

/** What a rejected fetch or body read stands for: the caller's abort as it is, else a TransportError. */
export function failure(
  e: unknown,
  what: string,
  signal: AbortSignal | undefined,
  expired: boolean,
  own: AbortSignal,
): unknown {
  if (signal?.aborted && !expired) return signal.reason;
  if (expired && own.reason instanceof TransportError) return own.reason;
  return e instanceof SnapfenceError ? e : transportError(e, what);
}

/** Runs a call: its attempts, retried by the policy, with one `Idempotency-Key` for a change. */
export async function run<T>(cfg: TransportConfig, call: Call<T>, signal?: AbortSignal): Promise<T> {
  const what = describe(call);
  const idem: Record<string, string> = call.kind === "change" ? { "Idempotency-Key": newIdempotencyKey() } : {};
  let earlierUnknown = false;
  for (let attempt = 1; ; attempt++) {
    let error: SnapfenceError;
    try {
      const { res, done, timedOut, attemptSignal } = await send(
        cfg,
        call,
        idem,
        signal,
        cfg.timeoutMs + (call.extraMs ?? 0),
      );
      let body: Uint8Array;
      try {
        body = new Uint8Array(await res.arrayBuffer());
      } catch (e) {
        throw failure(e, what, signal, timedOut(), attemptSignal);
      } finally {
        done();
      }
      const answer: Answer = { status: res.status, headers: res.headers, body };
      if (call.ok.includes(res.status)) {
        try {
          return call.parse(answer);
        } catch (e) {
          if (e instanceof SnapfenceError) throw e;
          error = new ProtocolError(`the answer to ${what} is not the contract's: ${String(e)}`, {
            requestId: res.headers.get("x-request-id") ?? undefined,
          });
        }
      } else {
        error = errorOf(answer, what);
      }
    } catch (e) {
      if (!(e instanceof SnapfenceError) || signal?.aborted) throw e;
      error = e;
    }
    if (attempt >= cfg.retry.maxAttempts || !mayRetry(call.kind, error)) {
      throw earlierUnknown ? afterUnknownAttempt(error, what) : error;
    }
    if (call.kind === "change" && (error.isIndeterminate || error instanceof RequestInProgress)) earlierUnknown = true;
    const pause = pauseBeforeRetry(cfg.retry, error, attempt);
    cfg.onRetry?.(error, pause);
    await sleep(pause, signal);
  }
}
