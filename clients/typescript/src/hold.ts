/**
 * Holding a lease while work runs, as redlock's `using`: the keeper renews in the background and
 * aborts the work's signal *before* the lease can lapse on the server.
 *
 * The lease is dated from the request that last proved it live: the moment a successful renewal
 * was sent (the server started its TTL later, when the request arrived, so `sent + ttl` is never
 * after the server's expiry, whatever the clocks say). A grant that did not wait is dated from
 * its request's sending too; a grant that waited in the key's queue is dated from its answer
 * (the server granted it during the wait, not at its start) and renewed at once, which dates it
 * from a send again. Deadlines are on `performance.now()`, a monotonic clock, so a process that
 * was frozen finds at its next check (`throwIfLost`) that its time ran out.
 */

import type { AcquireOptions, Client } from "./client.js";
import { InvalidRequest, LeaseLost, LostLease, SnapfenceError, type LostReason } from "./errors.js";
import { sleep } from "./transport.js";
import type { Grant, Lease } from "./types.js";

export interface KeepOptions {
  /** How long before the deadline the lease is declared lost when renewals keep failing: the
   * time the work needs to stop. Default a fifth of the TTL. */
  marginMs?: number;
  /** Time between renewals; default a third of the TTL (less if the margin leaves less than two). */
  renewEveryMs?: number;
}

export interface HoldOptions extends AcquireOptions, KeepOptions {}

/** A lease being held. */
export interface HeldLease {
  readonly key: string;
  /** The fencing token to send with every write the lease guards. */
  readonly token: number;
  /** The grant, as acquired. */
  readonly grant: Grant;
  /** The lease as last renewed. */
  readonly lease: Lease;
  /** Aborted (with the `LostLease` as its reason) when the work must stop. */
  readonly signal: AbortSignal;
  /** The loss, once declared. */
  readonly lost: LostLease | undefined;
  /** The latest the lease can end unless renewed again, on `performance.now()`'s clock. */
  readonly deadline: number;
  /** Milliseconds left before the keeper would declare the lease lost (the deadline less the margin). */
  remainingMs(): number;
  /** Throws the `LostLease` if the lease was lost, or if its time ran out unnoticed (the process
   * was frozen): call it before each step of the work. */
  throwIfLost(): void;
}

/** @internal */
export function resolveTiming(ttlMs: number, o: KeepOptions): { marginMs: number; everyMs: number } {
  if (!(ttlMs > 0)) throw new InvalidRequest(`a TTL of ${ttlMs} ms cannot be kept`);
  const marginMs = o.marginMs ?? ttlMs / 5;
  const window = ttlMs - marginMs;
  if (!(marginMs >= 0) || window <= 0) {
    throw new InvalidRequest(
      `a keeper margin of ${marginMs} ms leaves no time to renew a lease of ${ttlMs} ms; use a longer TTL or a shorter margin`,
    );
  }
  const everyMs = o.renewEveryMs ?? Math.min(ttlMs / 3, window / 2);
  if (!(everyMs > 0) || everyMs >= window) {
    throw new InvalidRequest(
      `renewing every ${everyMs} ms is too rare for a lease of ${ttlMs} ms with a margin of ${marginMs} ms: it would lapse first`,
    );
  }
  return { marginMs, everyMs };
}

/** A pause shortened by a random part of up to a quarter, so that keepers do not renew in step. */
function jitter(ms: number): number {
  return ms - Math.random() * (ms / 4);
}

/** Whether retrying a renewal cannot change its failure: a contract code other than the retried ones. */
function permanent(e: SnapfenceError): boolean {
  return e.code !== undefined && !e.isTransient && e.code !== "request_in_progress";
}

/** @internal Renews a granted lease until stopped or lost. */
export class Keeper implements HeldLease {
  readonly grant: Grant;
  readonly #client: Client;
  readonly #marginMs: number;
  readonly #everyMs: number;
  readonly #lost = new AbortController();
  readonly #stop = new AbortController();
  readonly #loop: Promise<void>;
  #lease: Lease;
  #datedFrom: number;
  #loss: LostLease | undefined;

  /** `datedFrom`: the `performance.now()` the grant is dated from; `renewAtOnce` for a grant that
   * waited, to date it from a renewal's sending. */
  constructor(
    client: Client,
    grant: Grant,
    datedFrom: number,
    timing: { marginMs: number; everyMs: number },
    renewAtOnce: boolean,
  ) {
    this.#client = client;
    this.grant = grant;
    this.#lease = grant;
    this.#datedFrom = datedFrom;
    this.#marginMs = timing.marginMs;
    this.#everyMs = timing.everyMs;
    this.#loop = this.#run(renewAtOnce ? datedFrom : datedFrom + jitter(this.#everyMs));
  }

  get key(): string {
    return this.grant.key;
  }
  get token(): number {
    return this.grant.token;
  }
  get lease(): Lease {
    return this.#lease;
  }
  get signal(): AbortSignal {
    return this.#lost.signal;
  }
  get lost(): LostLease | undefined {
    return this.#loss;
  }
  get deadline(): number {
    return this.#datedFrom + this.#lease.ttlMs;
  }
  #lapse(): number {
    return this.deadline - this.#marginMs;
  }
  remainingMs(): number {
    return Math.max(0, this.#lapse() - performance.now());
  }

  throwIfLost(): void {
    if (this.#loss === undefined && !this.#stop.signal.aborted && performance.now() >= this.#lapse()) {
      this.#declare("lapsing", "the lease's time ran out before it could be renewed (was the process paused?)");
    }
    if (this.#loss !== undefined) throw this.#loss;
  }

  #declare(reason: LostReason, detail: string, cause?: unknown): void {
    if (this.#loss !== undefined) return;
    this.#loss = new LostLease(
      `lease of ${JSON.stringify(this.key)} (token ${this.token}) lost: ${detail}`,
      reason,
      cause,
    );
    this.#stop.abort();
    this.#lost.abort(this.#loss);
  }

  /** Ends the renewals (waiting for one in flight); the lease is left as it is. */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#loop;
  }

  async #run(first: number): Promise<void> {
    const stop = this.#stop.signal;
    let next = first;
    let last: SnapfenceError | undefined;
    try {
      for (;;) {
        const wake = Math.min(next, this.#lapse());
        await sleep(wake - performance.now(), stop);
        // Timers fire late after a freeze: the clock, not the timer, says whether time is left.
        if (performance.now() >= this.#lapse()) {
          this.#declare(
            "lapsing",
            last === undefined
              ? "the lease is about to lapse before it could be renewed (was the process paused?)"
              : `renewals kept failing and the lease is about to lapse (last failure: ${last.message})`,
            last,
          );
          return;
        }
        // A renewal may run until the lapse, and no longer; stop() ends it at once.
        const bound = new AbortController();
        const onStop = () => bound.abort(stop.reason);
        stop.addEventListener("abort", onStop, { once: true });
        const timer = setTimeout(
          () => bound.abort(new Error("the renewal ran into the lapse")),
          this.#lapse() - performance.now(),
        );
        const sent = performance.now();
        try {
          this.#lease = await this.#client.renew(this.key, this.token, {
            ttlMs: this.#lease.ttlMs,
            signal: bound.signal,
          });
          this.#datedFrom = sent;
          last = undefined;
          next = sent + jitter(this.#everyMs);
        } catch (e) {
          if (stop.aborted) return;
          if (e instanceof LeaseLost) {
            this.#declare(
              "lease_lost",
              "the server answered lease_lost: the lease expired, was released or was superseded",
              e,
            );
            return;
          }
          if (e instanceof SnapfenceError && permanent(e)) {
            this.#declare("refused", `a renewal was refused: ${e.message}`, e);
            return;
          }
          if (e instanceof SnapfenceError) last = e;
          next = performance.now() + Math.max(this.#everyMs / 8, 20);
        } finally {
          clearTimeout(timer);
          stop.removeEventListener("abort", onStop);
        }
      }
    } catch (e) {
      // Only a bug gets here; the work must not go on believing it is protected.
      if (!stop.aborted) this.#declare("refused", `the keeper failed: ${String(e)}`, e);
    }
  }
}

/** @internal Starts keeping a granted lease (a lease acquired elsewhere, as `Election` does). */
export function keep(client: Client, grant: Grant, datedFrom: number, waited: boolean, o: KeepOptions = {}): Keeper {
  return new Keeper(client, grant, datedFrom, resolveTiming(grant.ttlMs, o), waited);
}

/** @internal `Client.hold`. */
export async function hold<R>(
  client: Client,
  key: string,
  o: HoldOptions,
  fn: (lease: HeldLease, signal: AbortSignal) => Promise<R>,
): Promise<R> {
  const { marginMs, renewEveryMs, ...acquire } = o;
  const timing: KeepOptions = {};
  if (marginMs !== undefined) timing.marginMs = marginMs;
  if (renewEveryMs !== undefined) timing.renewEveryMs = renewEveryMs;
  resolveTiming(o.ttlMs, timing);
  const waits = (o.waitMs ?? 0) > 0;
  const sent = performance.now();
  const grant = await client.acquire(key, acquire);
  const keeper = keep(client, grant, waits ? performance.now() : sent, waits, timing);
  // The work stops when the lease is lost, and when the caller says so.
  const signal = o.signal ? AbortSignal.any([keeper.signal, o.signal]) : keeper.signal;
  let result: R;
  try {
    result = await fn(keeper, signal);
  } catch (e) {
    // The work's own failure (or the loss) says more than a failed release.
    await finish(client, keeper).catch(() => {});
    throw keeper.lost ?? e;
  }
  await finish(client, keeper);
  if (keeper.lost) throw keeper.lost;
  return result;
}

/** Stops renewing and releases, unless the server already said the lease is gone. */
async function finish(client: Client, keeper: Keeper): Promise<void> {
  await keeper.stop();
  if (keeper.lost?.reason === "lease_lost") return;
  try {
    await client.release(keeper.key, keeper.token);
  } catch (e) {
    // A lease that ended meanwhile needs no release; after a loss the loss is what counts.
    if (e instanceof LeaseLost || keeper.lost !== undefined) return;
    throw e;
  }
}
