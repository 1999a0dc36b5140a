#!/usr/bin/env bash
# CI of the Python client (clients/python), run from the repository root (by .ci/run, or by hand):
# a fresh virtual environment under target/, the package built as a wheel and installed in it
# with its `langgraph` and `otel` extras and the dev tools (pytest, mypy, ruff, LangGraph's
# conformance suite, the OpenTelemetry SDK of the trace tests: in the venv only), then
# `mypy --strict` and `ruff check` on the package, pytest, and the report of LangGraph's
# conformance suite on snapfence.langgraph's savers (run by one of the tests).
# The tests start `snapfence serve` themselves, from target/debug/snapfence (built here when
# missing) with an embedded PostgreSQL, so the PostgreSQL server binaries must be there too; the
# TLS test makes its CA with openssl.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

step() { printf '\n==> %s\n' "$*"; }

python=${PYTHON:-python3}
step "Python ($python)"
"$python" -c 'import sys; assert sys.version_info >= (3, 9), sys.version; print(sys.version)'
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi

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

target=${CARGO_TARGET_DIR:-$root/target}
venv=$target/python-venv
step "virtual environment ($venv), the package as a wheel, the dev tools"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip wheel -q --no-deps -w "$venv/wheels" ./clients/python
# setuptools builds in the source tree: leave it as it was.
rm -rf clients/python/build clients/python/src/snapfence.egg-info
wheel=$(ls "$venv"/wheels/snapfence-*.whl)
langgraph=()
otel=()
if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  # The versions snapfence.langgraph is tested with; the extra itself takes any 1.x / 4.x.
  langgraph=(langgraph==1.2.24 langgraph-checkpoint==4.3.2 langgraph-checkpoint-conformance==0.0.2)
  # The SDK the trace tests make their spans with (it needs 3.10+); the `otel` extra is the API.
  otel=(opentelemetry-sdk==1.45.2)
fi
"$venv/bin/python" -m pip install -q "$wheel[langgraph,otel]" "${langgraph[@]}" "${otel[@]}" \
  pytest==9.2.0 pytest-timeout==2.4.0 mypy==2.4.1 ruff==0.17.6
"$venv/bin/python" -m pip list --format=freeze | grep -iE '^(snapfence|httpx|langgraph[a-z-]*|opentelemetry-(api|sdk))=='
# The core package depends on httpx alone; LangGraph comes with the extra only.
"$venv/bin/python" - <<'PY'
from importlib.metadata import requires
core = [r for r in requires("snapfence") or [] if "extra ==" not in r]
assert [r.split(">")[0].split("<")[0].strip() for r in core] == ["httpx"], core
print("core dependencies:", core)
PY

cd "$root/clients/python"
# The tools' caches go with the venv, not into the source tree.
export MYPY_CACHE_DIR=$venv/mypy-cache RUFF_CACHE_DIR=$venv/ruff-cache

step "mypy --strict (the package)"
if [ ${#langgraph[@]} -gt 0 ]; then
  "$venv/bin/mypy" --strict src/snapfence
else
  "$venv/bin/mypy" --strict --exclude 'src/snapfence/langgraph/' src/snapfence
fi

step "ruff check, ruff format --check"
"$venv/bin/ruff" check src tests
"$venv/bin/ruff" format --check src

step "pytest (against snapfence serve)"
log=$venv/pytest.log
export SNAPFENCE_LANGGRAPH_REPORT=$venv/langgraph-conformance.txt
rm -f "$SNAPFENCE_LANGGRAPH_REPORT"
set +e
# The installed wheel is what is tested (not src/): -p no:cacheprovider keeps the tree clean.
"$venv/bin/python" -m pytest -p no:cacheprovider -rs --timeout 600 tests 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

step "LangGraph's conformance suite on snapfence.langgraph (tests/test_langgraph_conformance.py)"
if [ -s "$SNAPFENCE_LANGGRAPH_REPORT" ]; then
  cat "$SNAPFENCE_LANGGRAPH_REPORT"
else
  echo "not run (LangGraph needs Python 3.10+, snapfence.langgraph a server with contract v1.3)"
fi
printf '\npython client: %s\n' "$(grep -E '^=+ .*(passed|failed|error).* =+$' "$log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
exit "$rc"
