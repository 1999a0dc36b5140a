/**
 * What the tests run against: a real `snapfence serve` (from $SNAPFENCE_BIN, else the
 * repository's target/debug/snapfence) with its embedded PostgreSQL in a temporary directory
 * that `stop()` removes; a loopback TCP proxy that can drop answers; child processes that speak
 * lines of JSON.
 */

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, openSync, closeSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";

/** The package's directory (this file runs from build/test/). */
export const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

export function binary(): string {
  const bin = process.env["SNAPFENCE_BIN"] || resolve(PACKAGE, "../../target/debug/snapfence");
  if (!existsSync(bin)) {
    throw new Error(
      `no snapfence binary at ${bin}: run \`cargo build --bin snapfence\` at the repository root (or set SNAPFENCE_BIN)`,
    );
  }
  return bin;
}

export async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = net.createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => ok(port));
    });
  });
}

async function ready(url: string): Promise<boolean> {
  // The port answering is enough for TLS (whose CA this fetch does not trust); /readyz for HTTP.
  try {
    const r = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) });
    await r.arrayBuffer();
    return r.status === 200;
  } catch (e) {
    const code = (e as { cause?: { code?: string } }).cause?.code ?? "";
    return url.startsWith("https:") && /CERT|SELF_SIGNED|UNABLE_TO_VERIFY/.test(code);
  }
}

/** An API key made with `snapfence keys create` (before the server starts). */
export function createKey(bin: string, dataDir: string, name: string, scope: string, prefix = ""): string {
  const out = execFileSync(
    bin,
    ["--output", "json", "keys", "create", "--data-dir", dataDir, "--name", name, "--scope", scope, "--prefix", prefix],
    { timeout: 180_000 },
  );
  return (JSON.parse(out.toString()) as { token: string }).token;
}

export interface Server {
  url: string;
  port: number;
  dir: string;
  proc: ChildProcess;
  /** Stops the process (SIGTERM) and keeps its data directory, for `restart()`. */
  halt(): Promise<void>;
  /** Starts the server again on the same port and data. */
  restart(): Promise<void>;
  /** Stops it and removes its directory. */
  stop(): Promise<void>;
  log(): string;
}

// Servers and children still running when this test process ends are told to stop (a killed
// test run would otherwise leave them, with their PostgreSQL, behind).
const running = new Set<ChildProcess>();
process.once("exit", () => {
  for (const p of running) p.kill("SIGTERM");
});
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.once(sig, () => process.exit(130));
}

function track(p: ChildProcess): ChildProcess {
  running.add(p);
  p.once("exit", () => running.delete(p));
  return p;
}

function exited(p: ChildProcess): Promise<void> {
  return p.exitCode !== null || p.signalCode !== null
    ? Promise.resolve()
    : new Promise((ok) => p.once("exit", () => ok()));
}

/** A directory (prefix sf-tmp-ts.) that the postgres user can enter: as root the embedded
 * PostgreSQL runs as postgres. */
export function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "sf-tmp-ts."));
  chmodSync(dir, 0o755);
  return dir;
}

export interface ServerOptions {
  /** Runs first, with the binary and the data directory (e.g. to make API keys). */
  prepare?: (bin: string, dataDir: string) => void;
  scheme?: "http" | "https";
  /** The directory to use (and remove at `stop()`); a new one by default. */
  dir?: string;
}

/** Starts `snapfence serve` on a free port and waits for /readyz. */
export async function startServer(args: string[] = [], o: ServerOptions = {}): Promise<Server> {
  const bin = binary();
  const dir = o.dir ?? tempDir();
  o.prepare?.(bin, join(dir, "data"));
  const port = await freePort();
  const url = `${o.scheme ?? "http"}://127.0.0.1:${port}`;
  let logNo = 0;
  const launch = async (): Promise<ChildProcess> => {
    const logPath = join(dir, `serve-${++logNo}.log`);
    const fd = openSync(logPath, "w");
    const proc = spawn(bin, ["serve", "--data-dir", join(dir, "data"), "--listen", `127.0.0.1:${port}`, ...args], {
      stdio: ["ignore", fd, fd],
    });
    track(proc);
    closeSync(fd);
    const until = performance.now() + 120_000;
    while (performance.now() < until && proc.exitCode === null) {
      if (await ready(url)) return proc;
      await sleep(100);
    }
    proc.kill("SIGKILL");
    throw new Error(`snapfence serve did not become ready; its log:\n${readFileSync(logPath, "utf8").slice(-3000)}`);
  };
  const server: Server = {
    url,
    port,
    dir,
    proc: await launch().catch((e: unknown) => {
      rmSync(dir, { recursive: true, force: true });
      throw e;
    }),
    async halt() {
      this.proc.kill("SIGCONT");
      this.proc.kill("SIGTERM");
      const t = setTimeout(() => this.proc.kill("SIGKILL"), 30_000);
      await exited(this.proc);
      clearTimeout(t);
    },
    async restart() {
      this.proc = await launch();
    },
    async stop() {
      await this.halt();
      rmSync(dir, { recursive: true, force: true });
    },
    log() {
      return readFileSync(join(dir, `serve-${logNo}.log`), "utf8");
    },
  };
  return server;
}

let counter = 0;
/** A key no other test (or earlier run) has used. */
export function uniqueKey(name: string): string {
  return `ts-tests/${name}-${Date.now()}-${process.pid}-${++counter}`;
}

/**
 * A loopback TCP proxy in front of a server. `dropAnswers(n)` drops the next n answers: when an
 * answer's first bytes arrive from the server (so it handled the request), the connection is
 * closed without passing them on.
 */
export class Proxy {
  readonly #server: net.Server;
  readonly #sockets = new Set<net.Socket>();
  #drops = 0;
  dropped = 0;
  /** Every request head the client sent, in order. */
  readonly sent: string[] = [];
  url = "";

  constructor(readonly targetPort: number) {
    this.#server = net.createServer((client) => {
      const upstream = net.connect(targetPort, "127.0.0.1");
      this.#sockets.add(client).add(upstream);
      const end = () => {
        client.destroy();
        upstream.destroy();
        this.#sockets.delete(client);
        this.#sockets.delete(upstream);
      };
      client.on("data", (d: Buffer) => {
        this.sent.push(d.toString("latin1"));
        upstream.write(d);
      });
      upstream.on("data", (d: Buffer) => {
        if (this.#drops > 0) {
          this.#drops--;
          this.dropped++;
          end();
          return;
        }
        client.write(d);
      });
      client.on("close", end).on("error", end);
      upstream.on("close", end).on("error", end);
    });
  }

  async listen(): Promise<this> {
    await new Promise<void>((ok) => this.#server.listen(0, "127.0.0.1", ok));
    this.url = `http://127.0.0.1:${(this.#server.address() as net.AddressInfo).port}`;
    return this;
  }

  dropAnswers(n: number): void {
    this.#drops = n;
  }

  /** The Idempotency-Key of each request sent through the proxy. */
  idempotencyKeys(): string[] {
    return this.sent.flatMap((h) =>
      [...h.matchAll(/^idempotency-key:[ \t]*([^\r\n]*?)[ \t]*\r?$/gim)].map((m) => m[1] ?? ""),
    );
  }

  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((ok) => this.#server.close(() => ok()));
  }
}

/** A child process running a fixture (build/test/fixtures/NAME.js) that prints JSON lines. */
export class Child {
  readonly proc: ChildProcess;
  readonly #lines: string[] = [];
  readonly #waiters: (() => void)[] = [];
  #stderr = "";

  constructor(fixture: string, env: Record<string, string>) {
    this.proc = spawn(process.execPath, [join(PACKAGE, "build/test/fixtures", `${fixture}.js`)], {
      env: { ...process.env, ...env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    track(this.proc);
    createInterface({ input: this.proc.stdout! }).on("line", (l) => {
      this.#lines.push(l);
      this.#waiters.splice(0).forEach((w) => w());
    });
    this.proc.stderr!.on("data", (d: Buffer) => (this.#stderr += d.toString()));
    this.proc.on("exit", () => this.#waiters.splice(0).forEach((w) => w()));
  }

  /** The next line the child printed, as JSON (waiting up to `ms`). */
  async next(ms = 30_000): Promise<Record<string, unknown>> {
    const until = performance.now() + ms;
    while (this.#lines.length === 0) {
      if (this.proc.exitCode !== null || this.proc.signalCode !== null) {
        throw new Error(
          `the child ended (${this.proc.exitCode ?? this.proc.signalCode}) without a line; stderr:\n${this.#stderr}`,
        );
      }
      const left = until - performance.now();
      if (left <= 0) throw new Error(`no line from the child within ${ms} ms; stderr:\n${this.#stderr}`);
      await new Promise<void>((ok) => {
        const t = setTimeout(ok, left);
        this.#waiters.push(() => {
          clearTimeout(t);
          ok();
        });
      });
    }
    return JSON.parse(this.#lines.shift()!) as Record<string, unknown>;
  }

  /** The next line if the child printed one, without waiting. */
  poll(): Record<string, unknown> | undefined {
    const l = this.#lines.shift();
    return l === undefined ? undefined : (JSON.parse(l) as Record<string, unknown>);
  }

  send(line: string): void {
    this.proc.stdin!.write(`${line}\n`);
  }

  async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    this.proc.kill("SIGCONT");
    this.proc.kill(signal);
    await exited(this.proc);
  }

  exited(): Promise<void> {
    return exited(this.proc);
  }
}
