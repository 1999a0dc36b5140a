/**
 * The watch as an async iterator. Each connection asks for the changes after the last one it
 * delivered (`Last-Event-ID`), so a stream that ends, breaks or goes silent is resumed with no
 * change missed or repeated. A refusal (`Compacted`, `Unauthorized`, `Forbidden`, ...) ends the
 * iteration by throwing it; transient failures are retried for up to `reconnectForMs` in a row.
 */

import type { Client, CallOptions } from "./client.js";
import { checkKey } from "./client.js";
import { ProtocolError, SnapfenceError, TransportError, Unauthorized } from "./errors.js";
import { backoff, errorOf, failure, pauseBeforeRetry, send, sleep } from "./transport.js";
import { CHANGE_KINDS, parseChange, type ChangeEvent, type ChangeKind } from "./types.js";
import { SseParser } from "./sse.js";

export interface WatchOptions extends CallOptions {
  /** Only keys that begin with it. */
  prefix?: string;
  /** Only changes after this id (a `ChangeEvent.id`, or `watch.lastId` of an earlier watch). */
  since?: number;
  /** How long transient failures (the service restarting, unreachable) are retried in a row
   * before the iteration throws the last one. Default 60000. */
  reconnectForMs?: number;
}

const kinds: ReadonlySet<string> = new Set(CHANGE_KINDS);

export class Watch implements AsyncIterable<ChangeEvent> {
  readonly #client: Client;
  readonly #prefix: string | undefined;
  readonly #since: number | undefined;
  readonly #signal: AbortSignal | undefined;
  readonly #reconnectForMs: number;
  readonly #closed = new AbortController();
  #last: number | undefined;
  #it: AsyncGenerator<ChangeEvent, void, undefined> | undefined;
  #pending: Promise<IteratorResult<ChangeEvent, void>> | undefined;
  #connected: (() => void) | undefined;
  /** How many connections were opened (for a reader curious about resumptions). */
  connections = 0;

  constructor(client: Client, o: WatchOptions) {
    if (o.prefix !== undefined && o.prefix !== "") checkKey(o.prefix, "a prefix");
    this.#client = client;
    this.#prefix = o.prefix || undefined;
    this.#since = o.since;
    this.#signal = o.signal;
    this.#reconnectForMs = o.reconnectForMs ?? 60_000;
  }

  /** The id of the last change delivered, or where the first stream started: a later
   * `client.watch({ since: watch.lastId })` goes on from here. */
  get lastId(): number | undefined {
    return this.#last;
  }

  /** Ends the iteration (a `for await` over it returns). */
  close(): void {
    this.#closed.abort();
  }

  /**
   * Connects now and resolves once the first stream is open: every change after this moment
   * will be delivered (for reading the current state after `open()` without a gap).
   */
  async open(): Promise<this> {
    if (this.#it !== undefined) throw new Error("the watch is already open");
    const connected = new Promise<void>((resolve) => (this.#connected = resolve));
    this.#it = this.#run();
    const first = this.#it.next();
    // Kept for the iterator's first next(); its failure is reported there (or by the race below).
    first.catch(() => {});
    this.#pending = first;
    await Promise.race([connected, first]);
    return this;
  }

  [Symbol.asyncIterator](): AsyncIterator<ChangeEvent, void> {
    const it = this.#it ?? (this.#it = this.#run());
    return {
      next: () => {
        const p = this.#pending;
        this.#pending = undefined;
        return p ?? it.next();
      },
      return: async () => {
        this.close();
        await this.#pending?.catch(() => {});
        this.#pending = undefined;
        return it.return(undefined);
      },
    };
  }

  async *#run(): AsyncGenerator<ChangeEvent, void, undefined> {
    const signal =
      this.#signal === undefined ? this.#closed.signal : AbortSignal.any([this.#signal, this.#closed.signal]);
    const cfg = this.#client.config;
    let failingSince: number | undefined;
    let failures = 0;
    const failed = async (e: SnapfenceError): Promise<void> => {
      failures++;
      failingSince ??= performance.now();
      if (!e.isTransient || performance.now() - failingSince > this.#reconnectForMs) throw e;
      await sleep(pauseBeforeRetry(cfg.retry, e, failures), signal);
    };
    try {
      for (;;) {
        const headers: Record<string, string> = { Accept: "text/event-stream" };
        if (this.#last !== undefined) headers["Last-Event-ID"] = String(this.#last);
        const query = { prefix: this.#prefix, since: this.#last === undefined ? this.#since : undefined };
        const call = { method: "GET", path: "/v1/watch", query };
        let opened: Awaited<ReturnType<typeof send>>;
        try {
          opened = await send(cfg, call, headers, signal, cfg.timeoutMs);
        } catch (e) {
          if (signal.aborted || !(e instanceof SnapfenceError)) throw e;
          await failed(e);
          continue;
        }
        const { res, done, abort } = opened;
        // The head arrived: from here only silence bounds the stream.
        done();
        if (res.status !== 200) {
          let body = new Uint8Array(0);
          try {
            body = new Uint8Array(await res.arrayBuffer());
          } catch {
            // The status says enough.
          }
          await failed(errorOf({ status: res.status, headers: res.headers, body }, "GET /v1/watch"));
          continue;
        }
        if (!(res.headers.get("content-type") ?? "").startsWith("text/event-stream") || res.body === null) {
          abort(undefined);
          await failed(new ProtocolError("the answer to GET /v1/watch is not text/event-stream"));
          continue;
        }
        this.connections++;
        this.#connected?.();
        failures = 0;
        failingSince = undefined;
        const after = res.headers.get("watch-after");
        if (this.#last === undefined && after !== null && /^\d+$/.test(after.trim())) this.#last = Number(after);
        const parser = new SseParser();
        const reader = res.body.getReader();
        let delivered = false;
        let idle: ReturnType<typeof setTimeout> | undefined;
        const arm = () => {
          clearTimeout(idle);
          idle = setTimeout(
            () =>
              abort(
                new TransportError(`GET /v1/watch: nothing for ${cfg.watchIdleTimeoutMs} ms`, { mayHaveReached: true }),
              ),
            cfg.watchIdleTimeoutMs,
          );
        };
        const onAbort = () => abort(signal.reason);
        signal.addEventListener("abort", onAbort, { once: true });
        let broke: SnapfenceError | undefined;
        try {
          arm();
          for (;;) {
            let chunk: ReadableStreamReadResult<Uint8Array>;
            try {
              chunk = await reader.read();
            } catch (e) {
              const f = failure(e, "GET /v1/watch", signal, false, opened.attemptSignal);
              if (f instanceof SnapfenceError && !signal.aborted) {
                broke = f;
                break;
              }
              throw f;
            }
            if (chunk.done) break;
            arm();
            for (const ev of parser.push(chunk.value)) {
              if (ev.event === "revoked") {
                throw errorOf(
                  {
                    status: 401,
                    headers: new Headers({ "content-type": "application/problem+json" }),
                    body: new TextEncoder().encode(ev.data),
                  },
                  "GET /v1/watch",
                ) as Unauthorized;
              }
              let id: number | undefined;
              if (ev.id !== undefined && ev.id !== "") {
                id = Number(ev.id);
                if (!Number.isSafeInteger(id))
                  throw new ProtocolError(`a watch event without a change id: ${JSON.stringify(ev.id)}`);
                this.#last = id;
              }
              if (ev.data === "" || !kinds.has(ev.event)) continue;
              if (id === undefined) throw new ProtocolError("a watch event without a change id it could resume from");
              let change: ChangeEvent;
              try {
                change = parseChange(id, ev.event as ChangeKind, JSON.parse(ev.data));
              } catch (e) {
                throw new ProtocolError(
                  `the data of change ${id} (${ev.event}) is not the contract's JSON: ${String(e)}`,
                );
              }
              delivered = true;
              failures = 0;
              failingSince = undefined;
              yield change;
            }
          }
        } finally {
          clearTimeout(idle);
          signal.removeEventListener("abort", onAbort);
          reader.cancel().catch(() => {});
        }
        if (broke !== undefined) {
          await failed(broke);
        } else if (!delivered) {
          // A stream that ended with nothing: do not reconnect in a tight loop.
          await sleep(backoff(cfg.retry, 1), signal);
        }
      }
    } catch (e) {
      if (this.#closed.signal.aborted && (this.#signal === undefined || !this.#signal.aborted)) return;
      throw e;
    }
  }
}
