#!/usr/bin/env bash
# CI of the TypeScript client (clients/typescript), run from the repository root (by .ci/run, or
# by hand): the dev tools from package-lock.json (`npm ci`), prettier --check, tsc in strict mode
# (the package, then the tests), publint and attw on the packed package, then `node --test`.
# The tests start `snapfence serve` themselves, from target/debug/snapfence (built here when
# missing) with an embedded PostgreSQL, so the PostgreSQL server binaries must be there too; the
# TLS test makes its CA with openssl.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

step() { printf '\n==> %s\n' "$*"; }

step "Node.js and npm (Node >= 20)"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
node -e 'const [major] = process.versions.node.split(".").map(Number); if (major < 20) { console.error(`Node ${process.version} is too old: the client needs Node 20 or later`); process.exit(1); } console.log(`node ${process.version}`)'
echo "npm $(npm --version)"

step "PostgreSQL server binaries (for the embedded cluster of snapfence serve), openssl"
if command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  echo "found"
else
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi
if ! command -v openssl >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi

export SNAPFENCE_BIN="${SNAPFENCE_BIN:-$root/target/debug/snapfence}"
step "snapfence binary ($SNAPFENCE_BIN)"
if [ ! -x "$SNAPFENCE_BIN" ]; then
  cargo build --locked --bin snapfence
fi
ls -l "$SNAPFENCE_BIN"

cd "$root/clients/typescript"
# npm's cache and logs stay out of the source tree; the tests' build output is removed after.
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

step "npm ci (the dev tools, exactly as package-lock.json has them)"
npm ci --no-progress

step "prettier --check"
npx --no-install prettier --check src test

step "tsc (strict): the package into dist/, then the tests into build/"
rm -rf dist build
npx --no-install tsc -p tsconfig.json
npx --no-install tsc -p tsconfig.test.json

step "publint --strict, attw (the packed package, ESM only)"
npx --no-install publint --strict
npx --no-install attw --pack . --profile esm-only

step "node --test (against snapfence serve)"
log=$(mktemp)
set +e
node --test --test-concurrency=1 --test-timeout=300000 build/test/*.test.js 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
pass=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$log" | tail -n 1)
fail=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$log" | tail -n 1)
rm -f "$log"
rm -rf build
printf '\ntypescript-client: %s passed, %s failed\n' "${pass:-0}" "${fail:-?}"
exit "$rc"
