/**
 * What a client is made of: the base URL, the API key, TLS and timeouts. `fromEnv` reads the same
 * variables as the CLI and the Go and Python clients: SNAPFENCE_URL (default
 * http://127.0.0.1:7878), SNAPFENCE_API_KEY, SNAPFENCE_CA_CERT (a PEM file of private CA roots,
 * trusted besides the public ones). A private CA needs Node and its `undici` package: a browser
 * trusts what its system trusts.
 */

import { InvalidRequest, type SnapfenceError } from "./errors.js";
import { DEFAULT_RETRY, type FetchLike, type RetryPolicy, type TransportConfig } from "./transport.js";

export const DEFAULT_URL = "http://127.0.0.1:7878";
export const VERSION = "0.1.0";

export interface ClientOptions {
  /** The service, `http(s)://host:port` (a path prefix is kept). Default http://127.0.0.1:7878. */
  url?: string;
  /** Sent as `Authorization: Bearer`, exactly as `snapfence keys create` printed it. */
  apiKey?: string;
  /** PEM certificates of a private CA, trusted besides the public roots (Node, with `undici`). */
  ca?: string | Uint8Array;
  /** A PEM file of private CA roots (Node): what SNAPFENCE_CA_CERT names. */
  caFile?: string;
  /** Bounds one attempt of a call; a waiting acquire gets its wait on top. Default 10000. */
  timeoutMs?: number;
  /** Silence (heartbeats included) after which a watch resumes on a new connection. Default 45000. */
  watchIdleTimeoutMs?: number;
  /** How failed attempts are retried. */
  retry?: Partial<RetryPolicy>;
  /** Called before each retry with the failure and the pause. */
  onRetry?: (error: SnapfenceError, pauseMs: number) => void;
  /** The `fetch` to send with (default: the global one). Not combined with `ca`/`caFile`. */
  fetch?: FetchLike;
}

interface ProcessLike {
  env: Record<string, string | undefined>;
}

function env(name: string): string | undefined {
  const p = (globalThis as { process?: ProcessLike }).process;
  const v = p?.env[name];
  return v === undefined || v === "" ? undefined : v;
}

/** The options the environment names, under the given ones (explicit options win). */
export function optionsFromEnv(overrides: ClientOptions = {}): ClientOptions {
  const out: ClientOptions = { url: env("SNAPFENCE_URL") ?? DEFAULT_URL };
  const apiKey = env("SNAPFENCE_API_KEY");
  if (apiKey !== undefined) out.apiKey = apiKey;
  const ca = env("SNAPFENCE_CA_CERT");
  if (ca !== undefined) out.caFile = ca;
  return { ...out, ...overrides };
}

// A specifier bundlers leave alone: undici and node:* are loaded only for a private CA.
const load = (name: string): Promise<unknown> => import(/* @vite-ignore */ /* webpackIgnore: true */ name);

async function tlsFetch(ca: string | Uint8Array | undefined, caFile: string | undefined): Promise<FetchLike> {
  let pem = typeof ca === "string" ? ca : ca === undefined ? "" : new TextDecoder().decode(ca);
  if (caFile !== undefined) {
    const fs = (await load("node:fs/promises")) as { readFile(p: string, enc: "utf8"): Promise<string> };
    try {
      pem += `\n${await fs.readFile(caFile, "utf8")}`;
    } catch (e) {
      throw new InvalidRequest(`cannot read the CA certificate file ${caFile}: ${String(e)}`, { cause: e });
    }
  }
  if (!pem.includes("-----BEGIN CERTIFICATE-----")) {
    throw new InvalidRequest(`no PEM certificate in ${caFile ?? "the ca option"}`);
  }
  let undici: { Agent: new (o: unknown) => unknown; fetch: (u: string, i: unknown) => Promise<unknown> };
  let tls: { rootCertificates: readonly string[] };
  try {
    [undici, tls] = (await Promise.all([load("undici"), load("node:tls")])) as [typeof undici, typeof tls];
  } catch (e) {
    throw new InvalidRequest(
      "a private CA (the ca/caFile options, SNAPFENCE_CA_CERT) needs Node and the undici package: npm install undici",
      { cause: e },
    );
  }
  const dispatcher = new undici.Agent({ connect: { ca: [...tls.rootCertificates, pem] } });
  return (input, init) => undici.fetch(input, { ...init, dispatcher }) as Promise<Response>;
}

export function makeConfig(o: ClientOptions): TransportConfig & { watchIdleTimeoutMs: number } {
  const raw = o.url ?? DEFAULT_URL;
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new InvalidRequest(`${JSON.stringify(raw)} is not a URL; write it as http://host:port`);
  }
  if ((u.protocol !== "http:" && u.protocol !== "https:") || u.search !== "" || u.hash !== "") {
    throw new InvalidRequest(
      `${JSON.stringify(raw)} is not an http(s) URL without a query; write it as http://host:port`,
    );
  }
  const headers: Record<string, string> = {};
  if (o.apiKey !== undefined) {
    if (!/^[\x21-\x7e]+$/.test(o.apiKey)) {
      throw new InvalidRequest(
        "the API key holds characters a header cannot carry; pass it exactly as `snapfence keys create` showed it",
      );
    }
    headers["Authorization"] = `Bearer ${o.apiKey}`;
  }
  const timeoutMs = o.timeoutMs ?? 10_000;
  if (!(timeoutMs > 0)) throw new InvalidRequest("timeoutMs must be positive");
  const retry = { ...DEFAULT_RETRY, ...o.retry };
  if (!(retry.maxAttempts >= 1)) throw new InvalidRequest("retry.maxAttempts is at least 1");
  const custom = o.fetch;
  const wantsTls = o.ca !== undefined || o.caFile !== undefined;
  if (custom !== undefined && wantsTls) {
    throw new InvalidRequest(
      "the fetch option cannot be combined with ca/caFile; give your fetch its own TLS settings",
    );
  }
  let made: Promise<FetchLike> | undefined;
  const fetch = (): Promise<FetchLike> => {
    if (custom !== undefined) return Promise.resolve(custom);
    if (!wantsTls) return Promise.resolve((input, init) => globalThis.fetch(input, init));
    made ??= tlsFetch(o.ca, o.caFile);
    return made;
  };
  return {
    base: (u.origin + u.pathname).replace(/\/+$/, ""),
    headers,
    fetch,
    timeoutMs,
    retry,
    onRetry: o.onRetry,
    watchIdleTimeoutMs: o.watchIdleTimeoutMs ?? 45_000,
  };
}
