#!/usr/bin/env bash
# CI of the Go client (clients/go), run from the repository root (by .ci/run, or by hand):
# Debian's golang-go when `go` is missing, then gofmt (must list nothing), go vet (also for macOS
# and Windows) and go test.
# The tests start `snapfence serve` themselves, from target/debug/snapfence (built here when
# missing) with an embedded PostgreSQL, so the PostgreSQL server binaries must be there too.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

step() { printf '\n==> %s\n' "$*"; }

step "Go toolchain"
if ! command -v go >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
fi
go version

step "PostgreSQL server binaries (for the embedded cluster of snapfence serve)"
if command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  echo "found"
else
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi

export SNAPFENCE_BIN="${SNAPFENCE_BIN:-$root/target/debug/snapfence}"
step "snapfence binary ($SNAPFENCE_BIN)"
if [ ! -x "$SNAPFENCE_BIN" ]; then
  cargo build --locked --bin snapfence
fi
ls -l "$SNAPFENCE_BIN"

cd "$root/clients/go"

step "gofmt -l ."
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "not gofmt-formatted (run gofmt -w on them):"
  echo "$unformatted"
  exit 1
fi

step "go vet ./..."
go vet ./...

step "go vet ./... for macOS and Windows (the packages and test helpers build off Linux: Linux- and unix-only calls are behind build tags)"
GOOS=darwin go vet ./...
GOOS=windows go vet ./...

step "go test ./... (against snapfence serve; -count=1: the server binary is not in Go's test cache key)"
go test -count=1 ./...
