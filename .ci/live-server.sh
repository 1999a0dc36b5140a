# Sourced by .ci/run and scripts/fuzz: schemathesis, pinned, in a venv kept in the user's cache
# (not the temporary directory, which is cleaned), and `snapfence serve` on embedded PostgreSQL
# in a throwaway directory under the temporary directory.

SCHEMATHESIS_VERSION=4.32.5
schemathesis_venv="${XDG_CACHE_HOME:-$HOME/.cache}/snapfence/schemathesis-$SCHEMATHESIS_VERSION"
schemathesis="$schemathesis_venv/bin/schemathesis"

# Installs schemathesis into the venv unless it is there already (from PyPI, once per machine).
ensure_schemathesis() {
  if "$schemathesis" --version 2>/dev/null | grep -qF "$SCHEMATHESIS_VERSION"; then
    return 0
  fi
  echo "installing schemathesis $SCHEMATHESIS_VERSION into $schemathesis_venv"
  rm -rf "$schemathesis_venv"
  mkdir -p "$(dirname "$schemathesis_venv")"
  python3 -m venv "$schemathesis_venv"
  "$schemathesis_venv/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

live_pid=
live_dir=
live_url=

# start_live_server PREFIX BINARY: starts BINARY serve on a free loopback port, with its data in a
# new directory ${TMPDIR:-/tmp}/PREFIX-XXXXXX, and waits until it is ready. Sets live_dir,
# live_url and live_pid; stop_live_server undoes it all (call it from an EXIT trap).
start_live_server() {
  local prefix=$1 bin=$2 port
  live_dir=$(mktemp -d "${TMPDIR:-/tmp}/$prefix-XXXXXX")
  # As root the embedded PostgreSQL runs as `postgres`, which must be able to reach its data dir.
  chmod 0755 "$live_dir"
  port=$(free_port)
  live_url="http://127.0.0.1:$port"
  # --max-wait: the fuzzer sends acquires with any wait_ms up to 5 minutes, many on keys it
  # holds itself for hours; cut each wait short, so that a case is answered at once (the waiting
  # itself is the API tests' business, tests/api/waiting.rs). --max-watch likewise: a watch
  # streams until the service ends it, and the fuzzer reads each answer to its end
  # (tests/api/watch.rs covers the streams).
  "$bin" serve --data-dir "$live_dir/data" --listen "127.0.0.1:$port" --max-wait 20ms \
    --max-watch 20ms >"$live_dir/serve.log" 2>&1 &
  live_pid=$!
  local _
  for _ in $(seq 1 240); do
    curl -fsS "$live_url/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$live_pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "snapfence serve did not get ready within 2 minutes; its log:" >&2
  cat "$live_dir/serve.log" >&2
  return 1
}

# Stops the server (SIGTERM: it stops its PostgreSQL too; SIGKILL after a minute) and removes its
# directory. Safe to call twice, or when nothing was started.
stop_live_server() {
  if [ -n "$live_pid" ]; then
    kill "$live_pid" 2>/dev/null || true
    local _
    for _ in $(seq 1 120); do
      kill -0 "$live_pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL "$live_pid" 2>/dev/null || true
    wait "$live_pid" 2>/dev/null || true
    live_pid=
  fi
  if [ -n "$live_dir" ]; then
    rm -rf "$live_dir"
    live_dir=
  fi
}
