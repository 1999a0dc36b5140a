// The README's TypeScript examples, as a reader would run them: type-checked together (strict),
// compiled, and each run in a fresh Node with SNAPFENCE_URL set, against a real service, printing
// exactly what its Output block shows.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import ts from "typescript";

import { PACKAGE, startServer, type Server } from "./helpers.js";

const BLOCK = /```ts\n([\s\S]*?)```\s*\n(?:Output:\s*\n\s*```text\n([\s\S]*?)```)?/g;

interface Example {
  where: string;
  code: string;
  output: string;
}

function examples(): Example[] {
  const text = readFileSync(join(PACKAGE, "README.md"), "utf8");
  return [...text.matchAll(BLOCK)].map((m, i) => {
    assert.ok(m[2] !== undefined, `a ts block of the README without an Output block: ${m[1]!.slice(0, 80)}`);
    return { where: `README.md#${i + 1}`, code: m[1]!, output: m[2] };
  });
}

const EXAMPLES = examples();
const dir = join(PACKAGE, "build", "readme");
let server: Server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

test("the README has its examples", () => {
  assert.ok(EXAMPLES.length >= 5, `${EXAMPLES.length} examples`);
});

test("the README's examples type-check in strict mode", () => {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const files = EXAMPLES.map((e, i) => {
    const f = join(dir, `example-${i + 1}.ts`);
    writeFileSync(f, e.code);
    return f;
  });
  const program = ts.createProgram(files, {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    strict: true,
    types: ["node"],
    lib: ["lib.es2022.d.ts", "lib.dom.d.ts"],
    outDir: dir,
    rootDir: dir,
  });
  const diagnostics = [...ts.getPreEmitDiagnostics(program), ...program.emit().diagnostics];
  const text = ts.formatDiagnostics(diagnostics, {
    getCanonicalFileName: (f) => f,
    getCurrentDirectory: () => dir,
    getNewLine: () => "\n",
  });
  assert.equal(text, "");
});

for (const [i, e] of EXAMPLES.entries()) {
  test(`${e.where} prints what the README shows`, async () => {
    const run = await promisify(execFile)(process.execPath, [join(dir, `example-${i + 1}.js`)], {
      env: { ...process.env, SNAPFENCE_URL: server.url },
      timeout: 120_000,
    });
    assert.equal(run.stdout, e.output);
  });
}
