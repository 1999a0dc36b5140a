/**
 * Leader election on one key, the recipe of etcd's `concurrency.Election` and client-go's
 * `leaderelection`: `campaign()` waits in the key's queue (candidates lead in the order they
 * asked) and returns the kept lease of the leader, whose token fences the leader's writes;
 * `resign()` hands leadership to the next candidate at once; `observe()` yields the current
 * leader and then every change, from the watch.
 */

import type { CallOptions, Client } from "./client.js";
import { LeaseHeld, NotFound } from "./errors.js";
import { keep, resolveTiming, type HeldLease, type KeepOptions, type Keeper } from "./hold.js";
import type { JsonObject } from "./types.js";

export interface ElectionOptions extends KeepOptions {
  /** This candidate's name: the lease's owner. */
  candidate: string;
  /** The leader's lease TTL: how long a crashed leader blocks the next. */
  ttlMs: number;
  metadata?: JsonObject;
}

/** Who leads: the owner of the key's live lease, and its token (the fence of its writes). */
export interface Leader {
  owner: string;
  token: number;
}

/** A won election: the held lease, and `resign()`. */
export interface Leadership extends HeldLease {
  /** Stops renewing and releases the key, so the next candidate leads at once. */
  resign(o?: CallOptions): Promise<void>;
}

const MAX_WAIT_MS = 300_000;

export class Election {
  readonly client: Client;
  readonly key: string;
  readonly #o: ElectionOptions;

  constructor(client: Client, key: string, o: ElectionOptions) {
    resolveTiming(o.ttlMs, o);
    this.client = client;
    this.key = key;
    this.#o = o;
  }

  /** Waits until this candidate leads (or `signal` aborts): the leader's kept lease. */
  async campaign(o: CallOptions = {}): Promise<Leadership> {
    for (;;) {
      try {
        const grant = await this.client.acquire(this.key, {
          owner: this.#o.candidate,
          ttlMs: this.#o.ttlMs,
          waitMs: MAX_WAIT_MS,
          ...(this.#o.metadata === undefined ? {} : { metadata: this.#o.metadata }),
          signal: o.signal,
        });
        // A grant that waited is dated from its answer, and renewed at once.
        const keeper = keep(this.client, grant, performance.now(), true, this.#o);
        return leadership(this.client, keeper);
      } catch (e) {
        // The wait's bound passed (or a server with a shorter --max-wait): queue again.
        if (!(e instanceof LeaseHeld)) throw e;
      }
    }
  }

  /** The current leader, or `null` while no lease on the key is live. */
  async leader(o: CallOptions = {}): Promise<Leader | null> {
    try {
      const s = await this.client.getLease(this.key, o);
      return s.state === "held" ? { owner: s.lease.owner, token: s.lease.token } : null;
    } catch (e) {
      if (e instanceof NotFound) return null;
      throw e;
    }
  }

  /**
   * The current leader, then each change of leader (`null` while there is none), read from the
   * watch: a leader that crashed shows as `null` when its lease expires, then the next candidate.
   */
  async *observe(o: CallOptions = {}): AsyncGenerator<Leader | null, void, undefined> {
    const watch = this.client.watch({ prefix: this.key, signal: o.signal });
    await watch.open();
    let current = await this.leader(o);
    yield current;
    for await (const ev of watch) {
      if (ev.key !== this.key) continue;
      let next: Leader | null = current;
      if (ev.kind === "lease.granted") {
        if (current === null || ev.token > current.token) next = { owner: ev.owner ?? "", token: ev.token };
      } else if (
        ev.kind.startsWith("lease.") &&
        ev.kind !== "lease.reconciled" &&
        ev.kind !== "lease.recovery_required"
      ) {
        if (current !== null && ev.token === current.token) next = null;
      }
      if (next !== current) {
        current = next;
        yield current;
      }
    }
  }
}

function leadership(client: Client, keeper: Keeper): Leadership {
  const resign = async (o: CallOptions = {}): Promise<void> => {
    await keeper.stop();
    if (keeper.lost?.reason === "lease_lost") return;
    try {
      await client.release(keeper.key, keeper.token, o);
    } catch (e) {
      if (!(e instanceof Error && e.name === "LeaseLost")) throw e;
    }
  };
  return Object.assign(keeper, { resign });
}
