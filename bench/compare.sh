#!/usr/bin/env bash
# The service against its SQL floors (pgbench running the service's own statements, and the
# simplest hand-written fenced write and read), against an older revision of itself, and against
# a peer (etcd, over its native gRPC API and its JSON gateway), side by side in one run, on a
# throwaway PostgreSQL this script starts itself. Prints its tables at the end; see bench/README.md.
#
#   bench/compare.sh [--duration 10s] [--clients "1 8 32"] [--keys 10000] [--ops "acquire lock renew put get"]
#                    [--baseline REV] [--with-etcd] [--with-watcher] [--install] [--memory] [--catch-up]
#                    [--growth] [--profile] [--via-pgbouncer]
#                    [--dev] [--clean] [--rounds 200] [--expiry-rounds 40] [--rates "200 2000"]
#
#   Lists (--clients, --ops, --rates) are separated by spaces or commas.
#   --ops         the request cells: acquire (a lease on a key that expired since), lock (acquire
#                 then release of a free key, one cycle), renew, put (a fenced write), get, nsput
#                 (a fenced write under a namespace's lease), txn (a transaction of ten puts); and
#                 the timing cells, printed in a table of their own:
#                 handoff  a waiting acquire's grant after the holder's release (--rounds times)
#                          and after its expiry (--rounds, and etcd --expiry-rounds, each at
#                          least 2 s there); etcd: Lock after Unlock / after the lease ran out
#                 watch    fenced PUTs at each of --rates writes/s (by the largest of --clients
#                          writers) to a watcher of /v1/watch; etcd: puts to a Watch
#                 flood    another client's reads and acquires while 5,000 waiting acquires
#                          arrive at once at an instance of its own at the default limits,
#                          wait, and hang up at once (two thirds into --duration)
#                          (snapfence only; needs an open-file limit above 5,000)
#                 (they are not run against --baseline, nor over etcd's JSON gateway)
#
#   --baseline    also build revision REV (a commit, tag or branch of this repository) and load it
#                 beside this one, on a database of its own in the same PostgreSQL (built once:
#                 kept as target/release/snapfence-baseline-<commit>)
#   --install     apt-get install wrk, and etcd-server and protobuf-compiler (for --with-etcd),
#                 when they are missing
#   --with-etcd   also load etcd doing the same work, over its native gRPC API and its JSON
#                 gateway, in a table of its own: lock as lease grant + txn + revoke and as a
#                 session mutex (txn + delete on a lease granted once), put as a txn on a fence
#                 key, get as a range read; and a bare lease grant (no key) as a calibration row
#   --via-pgbouncer  also load a second instance whose hot statements go through PgBouncer in
#                 transaction mode (--database-url the pooler, --database-direct-url PostgreSQL),
#                 on a database of its own: the pgb/s column and x-pgb (through the pooler / direct)
#   --with-watcher  also run each service cell again with one watcher of every change open
#                 (`GET /v1/watch`, read to the end by curl): the watched/s column, and x-watch
#                 (watched / unwatched), the watch's cost as its users pay it
#   --memory      peak server RSS through the 1 KiB put runs, then with 32 concurrent 8 MiB puts
#   --catch-up    the 32-client put again while 64 watchers read a backlog of 400,000 changes from
#                 `since=0` (a prefix none of it is under, so they deliver nothing and read it all),
#                 against the same put just before and just after (issue 34: target >= 0.80 x)
#   --growth      the 32-client acquire and put again with 1,000,000 keys and 10,000,000 audit rows
#   --profile     perf record the server through a 32-client put run; summary in the work dir
#   --repeat N    each cell of the service and the baseline N times, interleaved (service, baseline,
#                 service, ...), and its row from the round of median answers/s: one cell's ratio
#                 to an unchanged baseline moves by ±10 % from run to run, so a smaller change
#                 shows only over rounds. Every round's answers are checked
#   --dev         build with the dev profile (quick to build, slow to run: a smoke test of this
#                 script, as CI runs it, not figures)
#   --clean       remove the work directory (the tools' logs) at the end
#
# Exits 1 if any request of a run failed or a run's check found a key not as it left it.
#
# Runs as root (PostgreSQL then runs as the `postgres` user) or as any user.
set -euo pipefail

duration=10s clients="1 8 32" keys=10000 ops="acquire lock renew put get"
rounds=200 expiry_rounds=40 rates="200 2000" repeat=1
with_etcd=0 with_watcher=0 via_pgbouncer=0 install=0 memory=0 catch_up=0 growth=0 profile=0 baseline= profile_dir=release clean=0
while [ $# -gt 0 ]; do
    case "$1" in
    --duration) duration=$2; shift ;;
    --clients) clients=$2; shift ;;
    --keys) keys=$2; shift ;;
    --ops) ops=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --repeat) repeat=$2; shift ;;
    --expiry-rounds) expiry_rounds=$2; shift ;;
    --rates) rates=$2; shift ;;
    --baseline) baseline=$2; shift ;;
    --with-etcd) with_etcd=1 ;;
    --with-watcher) with_watcher=1 ;;
    --via-pgbouncer) via_pgbouncer=1 ;;
    --install) install=1 ;;
    --memory) memory=1 ;;
    --catch-up) catch_up=1 ;;
    --growth) growth=1 ;;
    --profile) profile=1 ;;
    --dev) profile_dir=debug ;;
    --clean) clean=1 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
secs=${duration%s}
clients=${clients//,/ } ops=${ops//,/ } rates=${rates//,/ }
# The cells of the request table, and the timing cells (their own table, below it).
load_ops= timing_ops=
for op in $ops; do
    case $op in
    handoff | watch | flood) timing_ops+=" $op" ;;
    *) load_ops+=" $op" ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
say() { printf '\n== %s\n' "$*" >&2; }

if [ "$install" = 1 ]; then
    missing=()
    command -v wrk >/dev/null || missing+=(wrk)
    [ "$with_etcd" = 1 ] && ! command -v etcd >/dev/null && missing+=(etcd-server)
    [ "$with_etcd" = 1 ] && ! command -v protoc >/dev/null && missing+=(protobuf-compiler)
    [ "$profile" = 1 ] && ! command -v perf >/dev/null && missing+=(linux-perf)
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
fi
if [ "$with_etcd" = 1 ] && ! { command -v etcd && command -v protoc; } >/dev/null; then
    echo "compare.sh: --with-etcd needs etcd and protoc (apt-get install etcd-server protobuf-compiler, or pass --install)" >&2
    exit 2
fi

build_flags=(--locked --quiet)
[ "$profile_dir" = release ] && build_flags+=(--release)
say "building snapfence ($profile_dir)"
bench_features=()
[ "$with_etcd" = 1 ] && bench_features=(--features snapfence-bench/etcd-grpc)
(cd "$root" && cargo build "${build_flags[@]}" "${bench_features[@]}" --bin snapfence --bin snapfence-bench)
sf=$root/target/$profile_dir/snapfence

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$pgbin/postgres" ] || { echo "compare.sh: no PostgreSQL binaries under /usr/lib/postgresql" >&2; exit 2; }
work=$(mktemp -d /tmp/snapfence-bench.XXXXXX)
as_pg=()
if [ "$(id -u)" = 0 ]; then
    chown postgres "$work"
    as_pg=(runuser -u postgres --)
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Waits for the instance at URL to answer /readyz; if it never does, prints LOG and exits.
wait_ready() { # url log
    for _ in $(seq 100); do curl -fs "$1/readyz" >/dev/null 2>&1 && return; sleep 0.2; done
    curl -fs "$1/readyz" >/dev/null || { cat "$2" >&2; exit 1; }
}
pg_port=$(free_port) sf_port=$(free_port)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    "${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
    git -C "$root" worktree remove --force "$work/baseline" >/dev/null 2>&1 || true
}
trap cleanup EXIT

base_sf=
if [ -n "$baseline" ]; then
    rev=$(git -C "$root" rev-parse --verify "$baseline^{commit}") ||
        { echo "compare.sh: --baseline $baseline is not a revision of this repository" >&2; exit 2; }
    # Kept in this tree's target directory by commit, so that a second run (one on a quiet
    # machine, after a first that built it) does not build it again.
    base_sf=$root/target/$profile_dir/snapfence-baseline-$rev
    if [ -x "$base_sf" ]; then
        say "the baseline $(git -C "$root" log -1 --format='%h' "$rev"): built before ($base_sf)"
    else
        say "building the baseline $(git -C "$root" log -1 --format='%h "%s"' "$rev" | cut -c1-90) ($profile_dir)"
        git -C "$root" worktree add -q --detach "$work/baseline" "$rev"
        # Its own target directory, seeded with this build's dependencies so only the changed
        # crates build again; removed with its worktree.
        bt=$work/baseline-target/$profile_dir
        mkdir -p "$bt"
        cp -a "$root/target/$profile_dir/deps" "$root/target/$profile_dir/build" \
            "$root/target/$profile_dir/.fingerprint" "$bt/" 2>/dev/null || true
        (cd "$work/baseline" && CARGO_TARGET_DIR=$work/baseline-target cargo build "${build_flags[@]}" --bin snapfence)
        mv "$bt/snapfence" "$base_sf"
        rm -rf "$work/baseline-target"
        git -C "$root" worktree remove --force "$work/baseline"
    fi
fi

say "starting PostgreSQL in $work (fsync and synchronous_commit on, as in production)"
"${as_pg[@]}" "$pgbin/initdb" -D "$work/pg" -U postgres -A trust -E UTF8 --locale=C >/dev/null
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
    -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
psql() { "${as_pg[@]}" "$pgbin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -d "${db:-snapfence}" -v ON_ERROR_STOP=1 -qAt "$@"; }
"${as_pg[@]}" "$pgbin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres snapfence

# As many connections as pgbench opens at its highest concurrency.
pool_size=$(printf '%s\n' $clients | sort -n | tail -1)
say "starting snapfence on 127.0.0.1:$sf_port (--db-pool-size $pool_size)"
export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/snapfence"
# --max-watches-per-key: the catch-up cell opens 64 streams with one API key.
"$sf" serve --listen "127.0.0.1:$sf_port" --db-pool-size "$pool_size" --max-watches-per-key 64 >"$work/serve.log" 2>&1 &
sf_pid=$!
pids+=("$sf_pid")
url=http://127.0.0.1:$sf_port
wait_ready "$url" "$work/serve.log"
# Measured as it runs in production: every request carries an API key.
api_key=$("$sf" keys create --name bench --scope write 2>/dev/null)

# The baseline serves a database of its own, so that neither sees the other's keys.
base_url=
if [ -n "$base_sf" ]; then
    "${as_pg[@]}" "$pgbin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres baseline
    base_port=$(free_port)
    say "starting the baseline on 127.0.0.1:$base_port"
    DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/baseline" \
        "$base_sf" serve --listen "127.0.0.1:$base_port" --db-pool-size "$pool_size" >"$work/baseline.log" 2>&1 &
    pids+=("$!")
    base_url=http://127.0.0.1:$base_port
    wait_ready "$base_url" "$work/baseline.log"
    baseline_api_key=$(DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/baseline" "$base_sf" keys create --name bench --scope write 2>/dev/null)
fi

# The instance behind PgBouncer (transaction mode, as Supavisor's 6543 or RDS Proxy pool) serves a
# database of its own; its sessions (LISTEN, migrations, locks) go straight to PostgreSQL.
pgb_url=
if [ "$via_pgbouncer" = 1 ]; then
    pgbouncer=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
    [ -x "$pgbouncer" ] || { echo "compare.sh: --via-pgbouncer needs PgBouncer: apt-get install pgbouncer" >&2; exit 2; }
    "${as_pg[@]}" "$pgbin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres pooled
    pgb_port=$(free_port) pgb_dir=$work/pgbouncer
    mkdir -p "$pgb_dir"
    printf '"postgres" ""\n' >"$pgb_dir/users.txt"
    cat >"$pgb_dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$pg_port
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $pgb_port
unix_socket_dir =
pool_mode = transaction
auth_type = trust
auth_file = $pgb_dir/users.txt
ignore_startup_parameters = extra_float_digits
max_client_conn = 2000
default_pool_size = $pool_size
logfile = $pgb_dir/pgbouncer.log
INI
    [ -z "${as_pg[*]}" ] || chown -R postgres "$pgb_dir"
    say "starting PgBouncer $("$pgbouncer" --version | head -1 | awk '{print $2}') on 127.0.0.1:$pgb_port (transaction mode, pool of $pool_size) and an instance behind it"
    "${as_pg[@]}" "$pgbouncer" "$pgb_dir/pgbouncer.ini" >/dev/null 2>&1 &
    pids+=("$!")
    pgb_sf_port=$(free_port)
    direct="postgres://postgres@127.0.0.1:$pg_port/pooled"
    for _ in $(seq 50); do (echo >"/dev/tcp/127.0.0.1/$pgb_port") 2>/dev/null && break; sleep 0.1; done
    DATABASE_URL="postgres://postgres@127.0.0.1:$pgb_port/pooled" DATABASE_DIRECT_URL=$direct \
        "$sf" serve --listen "127.0.0.1:$pgb_sf_port" --db-pool-size "$pool_size" >"$work/pgbouncer-serve.log" 2>&1 &
    pids+=("$!")
    pgb_url=http://127.0.0.1:$pgb_sf_port
    wait_ready "$pgb_url" "$work/pgbouncer-serve.log"
    pgb_api_key=$(DATABASE_URL=$direct "$sf" keys create --name bench --scope write 2>/dev/null)
fi

# pgbench and the floors run in a database of their own, migrated by an instance started and
# stopped on it: their rows would otherwise grow the service's tables and not the baseline's.
"${as_pg[@]}" "$pgbin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres floors
floors_port=$(free_port)
DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/floors" \
    "$sf" serve --listen "127.0.0.1:$floors_port" >"$work/floors-serve.log" 2>&1 &
floors_pid=$!
pids+=("$floors_pid")
wait_ready "http://127.0.0.1:$floors_port" "$work/floors-serve.log"
kill "$floors_pid" && wait "$floors_pid" || true
# The floors' table (bench/fenced_write.sql), its read keys written once.
db=floors psql -c "CREATE TABLE floor_snapshots (key text PRIMARY KEY, token bigint NOT NULL, body bytea NOT NULL)"
db=floors psql -c "INSERT INTO floor_snapshots SELECT (50000000 + i)::text, 0, decode(repeat('61', 1024), 'hex') FROM generate_series(0, $keys - 1) i"

# pgbench runs the service's own statements, as the service sends them: the files of
# src/store/rendered, which src/store/engine/statement.rs assembles (a test checks they are the
# statements the service runs), each over a batch of one request: every array parameter
# `$N::type[]` becomes `ARRAY[:pN::type]`, and their comments (whole lines) are left out, since
# pgbench would turn a `$N` named in a comment into a parameter of its own. Each client takes the
# keys of its own slice in turn, as the workers of `snapfence-bench` do. pgbench cannot bind
# NULL, so the gate's parameters ($1 to $4: no Idempotency-Key, no principal) and an acquire's
# queue row ($14: not a waiter) are written in as arrays of one NULL, and an absent value is
# bound as what the service's NULL stands for there: `[]` for If-Match's tags (not sent, so
# never read), an empty metadata object, and for the read the current version (1) and `[]` for
# If-None-Match's tags (none, so it reads its body). The service itself sends each statement
# over as many requests as arrived together; pgbench's column is the floor of one request per
# statement and commit.
script() { # op -> a pgbench script on stdout: the service's statement over a batch of one
    local op=$1 sql
    sql=$(cat "$root/src/store/rendered/$op.sql")
    sql=$(grep -v '^[[:space:]]*--' <<<"$sql")
    # Each array parameter `$n::type[]` becomes a one-element array of pgbench's `:pn`; the gate's
    # $1 to $4 (no Idempotency-Key, no authentication) are NULL.
    if [ "$op" != get ]; then
        sql=$(sed -E 's/\$([1-4])::([a-z0-9]+)\[\]/ARRAY[NULL::\2]/g' <<<"$sql")
    fi
    if [ "$op" = acquire ]; then
        sql=$(sed -E 's/\$14::([a-z0-9]+)\[\]/ARRAY[NULL::\1]/g' <<<"$sql")
    fi
    # A put's prefix columns (a transaction's delete_prefix alone has them) and its metadata.
    if [ "$op" = put ]; then
        sql=$(sed -E 's/\$(10|11|12|23)::([a-z0-9]+)\[\]/ARRAY[NULL::\2]/g' <<<"$sql")
    fi
    sql=$(sed -E 's/\$([0-9]+)::([a-z0-9]+)\[\]/ARRAY[:p\1::\2]/g' <<<"$sql")
    if [ "$op" = get ]; then
        printf '\\set i :n %% :per + :client_id * :per\n\\set n :n + 1\n\\set p1 :base_key + :i\n'
    else
        printf '\\set i :n %% :per + :client_id * :per\n\\set n :n + 1\n\\set p5 :base_key + :i\n'
        # A put's fence ($6) is its key; its token is $7.
        case $op in
        acquire) ;;
        put) printf '\\set p6 :p5\n\\set p7 :base_token + :i\n' ;;
        *) printf '\\set p6 :base_token + :i\n' ;;
        esac
    fi
    printf '%s;\n' "$sql"
}
body_hex=$(head -c 1024 /dev/zero | tr '\0' 'a' | od -v -An -tx1 | tr -d ' \n')
pg_vars() { # op -> the fixed parameters of its statement
    case $1 in
    acquire) echo "-D p6=pgbench -D p7=$3 -D p8={} -D p9=false -D p10=false -D p11=pgbench -D p12=127.0.0.1 -D p13=false -D p15=true" ;;
    renew) echo "-D p7=600000" ;;
    put) echo "-D p8=false -D p9=put -D p13=false -D p14=[] -D p15=pgbench -D p16=127.0.0.1 -D p17=put -D p18=pgbench-etag -D p19=1024 -D p20=application/octet-stream -D p21=\\x$body_hex -D p22=10" ;;
    get) echo "-D p2=1 -D p3=true -D p4=10 -D p5=[]" ;;
    esac
}
base_key() { case $1 in acquire) echo 10000000 ;; renew) echo 20000000 ;; put) echo 30000000 ;; get) echo 40000000 ;; esac; }
pgbench_run() { # op clients seconds [transactions] -> tps
    local op=$1 c=$2 t=$3 per=$((keys / $2)) j=$(($2 < 2 ? 1 : 2))
    script "$op" >"$work/$op.pgbench"
    local run=(-T "$t")
    [ -n "${4:-}" ] && run=(-t "$4")
    # shellcheck disable=SC2046
    "${as_pg[@]}" "$pgbin/pgbench" -h 127.0.0.1 -p "$pg_port" -U postgres -n -M prepared \
        -c "$c" -j "$j" "${run[@]}" -f "$work/$op.pgbench" -D n=0 -D per="$per" \
        -D base_key="${key_base:-$(base_key "$op")}" -D base_token="${base_token:-0}" \
        $(pg_vars "$op" "$c" 100) floors 2>&1 | tee -a "$work/pgbench.log" |
        sed -n 's/^tps = \([0-9]*\).*/\1/p'
}
floor_run() { # op clients -> tps of the hand-written floor of a put or a get, else -
    local op=$1 c=$2 per=$((keys / $2)) j=$(($2 < 2 ? 1 : 2)) file
    case $op in put) file=fenced_write.sql ;; get) file=floor_read.sql ;; *) echo -; return ;; esac
    cp "$here/$file" "$work/$file"
    "${as_pg[@]}" "$pgbin/pgbench" -h 127.0.0.1 -p "$pg_port" -U postgres -n -M prepared \
        -c "$c" -j "$j" -T "$secs" -f "$work/$file" -D n=0 -D per="$per" -D base_key=50000000 \
        -D body="\\x$body_hex" -D run="$(date +%s%6N)" floors 2>&1 | tee -a "$work/pgbench.log" |
        sed -n 's/^tps = \([0-9]*\).*/\1/p'
}

# Leases for the pgbench keys of renew, put and get, taken in key order by one client so that
# key i has token base_token + i; a read's key also gets its first version.
pgbench_prepare() {
    local op=$1
    if [ "$op" = acquire ]; then
        pgbench_run acquire 1 0 "$keys" >/dev/null
        return
    fi
    script acquire >"$work/prep.pgbench"
    # shellcheck disable=SC2046
    "${as_pg[@]}" "$pgbin/pgbench" -h 127.0.0.1 -p "$pg_port" -U postgres -n -M prepared -c 1 -t "$keys" \
        -f "$work/prep.pgbench" -D n=0 -D per="$keys" -D base_key="$(base_key "$op")" \
        $(pg_vars acquire 1 600000) floors >>"$work/pgbench.log" 2>&1
    base_token=$(db=floors psql -c "SELECT min(token) FROM leases WHERE key ~ '^[0-9]+$' AND key::bigint >= $(base_key "$op") AND key::bigint < $(base_key "$op") + $keys")
    local contiguous
    contiguous=$(db=floors psql -c "SELECT count(*) FROM leases WHERE key ~ '^[0-9]+$' AND key::bigint - $(base_key "$op") BETWEEN 0 AND $keys - 1 AND token = $base_token + key::bigint - $(base_key "$op")")
    [ "$contiguous" = "$keys" ] || { echo "compare.sh: the $op leases' tokens are not contiguous ($contiguous of $keys); is something else using the database?" >&2; exit 1; }
    if [ "$op" = get ]; then
        key_base=$(base_key get) pgbench_run put 1 0 "$keys" >/dev/null
    fi
}

bench() { # op clients [extra args] -> the JSON report (also kept in the work dir)
    local op=$1 c=$2
    shift 2
    "$sf-bench" --api-key "${target_key:-$api_key}" --url "${target_url:-$url}" --op "$op" --concurrency "$c" \
        --duration "${run_for:-$duration}" --keys "${run_keys:-$keys}" --output json "$@" 2>>"$work/bench.log" |
        tee -a "$work/reports.json"
}
field() { python3 -c 'import json,sys; r=json.load(sys.stdin); v=r; [v:=v[k] for k in sys.argv[1].split(".")]; print(v if not isinstance(v,float) else (f"{v:.0f}" if v >= 100 else f"{v:.2f}"))' "$1"; }
errors() { python3 -c 'import json,sys; r=json.load(sys.stdin); e=r["errors"]; v=r["verified"]; print((",".join(f"{k}:{n}" for k,n in e.items()) or "-") + ("" if "ok" in v else " CHECK-FAILED"))'; }
median() { # JSON reports, one per line -> the one of median ops_per_sec
    python3 -c 'import json,sys; r=sorted((json.loads(l) for l in sys.stdin if l.strip()), key=lambda r: r["ops_per_sec"]); print(json.dumps(r[(len(r) - 1) // 2]))'
}
ratio() { python3 -c 'import sys; a,b=sys.argv[1:]; print(f"{float(a)/float(b):.2f}" if "-" not in (a, b) and float(b) else "-")' "$1" "$2"; }

wrk_get() { # clients prefix keys -> requests/s of wrk reading the snapshots `snapfence-bench` prepared
    local c=$1 prefix=$2 used=$3 t=$(($1 < 2 ? 1 : 2))
    cat >"$work/get.lua" <<EOF
local n = 0
request = function()
    n = n + 1
    return wrk.format("GET", "/v1/snapshots/$prefix" .. ((n * 7919) % $used))
end
EOF
    wrk -t "$t" -c "$c" -d "$duration" -H "Authorization: Bearer $api_key" -s "$work/get.lua" "$url" 2>&1 | tee -a "$work/wrk.log" |
        awk '/Requests\/sec/ {print $2} /Non-2xx/ {print "non-2xx " $4 > "/dev/stderr"}'
}

etcd_url=
if [ "$with_etcd" = 1 ]; then
    etcd_port=$(free_port) etcd_peer=$(free_port)
    say "starting etcd on 127.0.0.1:$etcd_port ($(etcd --version | head -1))"
    etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
        --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
        --initial-cluster "default=http://127.0.0.1:$etcd_peer" >"$work/etcd.log" 2>&1 &
    pids+=("$!")
    etcd_url=http://127.0.0.1:$etcd_port
    for _ in $(seq 100); do curl -fs "$etcd_url/health" >/dev/null 2>&1 && break; sleep 0.2; done
fi

rss_peak() { awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$sf_pid/status"; }
rows=() peer_rows=() failed=0
row_format='%-8s %7s %9s %7s %7s %9s %6s %8s %6s %8s %6s %7s %9s %7s %7s %6s %8s  %s'
peer_format='%-8s %7s %11s %7s %7s %9s %7s %7s %7s %8s  %-40s %s'
declare -A at32
peer_row() { # cell clients service-report etcd-does [bench args] -> a row of the etcd table
    local cell=$1 c=$2 mine=$3 does=$4 grpc json e g_s s_s=- s_p50=- s_p99=-
    shift 4
    say "$cell x$c: etcd, $does (gRPC)"
    grpc=$(target_url=$etcd_url bench "$cell" "$c" --target etcd-grpc "$@")
    say "$cell x$c: etcd, $does (JSON gateway)"
    json=$(target_url=$etcd_url bench "$cell" "$c" --target etcd "$@")
    if [ -n "$mine" ]; then
        s_s=$(field ops_per_sec <<<"$mine") s_p50=$(field latency_ms.p50 <<<"$mine") s_p99=$(field latency_ms.p99 <<<"$mine")
    fi
    e="$(errors <<<"$grpc") $(errors <<<"$json")"
    if [ "$e" = "- -" ]; then e=-; else failed=1; fi
    g_s=$(field ops_per_sec <<<"$grpc")
    peer_rows+=("$(printf "$peer_format" "$cell" "$c" "$s_s" "$s_p50" "$s_p99" "$g_s" \
        "$(field latency_ms.p50 <<<"$grpc")" "$(field latency_ms.p99 <<<"$grpc")" "$(ratio "$s_s" "$g_s")" \
        "$(field ops_per_sec <<<"$json")" "$does" "$e")")
    say "row: ${peer_rows[-1]}"
}
# The cells whose request is one statement, which pgbench runs beside the service: a lock cycle
# is two, and the v1.3 cells (nsput, txn) are the put's statement in other forms.
one_statement() { case $1 in acquire | renew | put | get) return 0 ;; *) return 1 ;; esac; }
declare -A by_cell
for op in $load_ops; do
    if one_statement "$op"; then
        say "$op: pgbench (the service's statement) at $clients clients"
        pgbench_prepare "$op"
    fi
    for c in $clients; do
        pg=- floor=-
        if one_statement "$op"; then
            pg=$(pgbench_run "$op" "$c" "$secs")
            floor=$(floor_run "$op" "$c")
        fi
        if [ "$op" = acquire ]; then sleep 0.2; fi
        reports= base_reports= pgb_reports= errs=
        for n in $(seq "$repeat"); do
            round=; [ "$repeat" = 1 ] || round=" (round $n of $repeat)"
            say "$op x$c: snapfence bench$round"
            one=$(bench "$op" "$c")
            reports+="$(tr -d '\n' <<<"$one")"$'\n'
            e=$(errors <<<"$one"); [ "$e" = - ] || errs="$errs $e"
            # A baseline before v1.3 has no namespace fences nor transactions.
            if [ -n "$base_url" ] && [ "$op" != nsput ] && [ "$op" != txn ]; then
                say "$op x$c: the baseline$round"
                one=$(target_url=$base_url target_key=$baseline_api_key bench "$op" "$c")
                base_reports+="$(tr -d '\n' <<<"$one")"$'\n'
                e=$(errors <<<"$one"); [ "$e" = - ] || errs="$errs baseline:$e"
            fi
            if [ -n "$pgb_url" ]; then
                say "$op x$c: through PgBouncer$round"
                one=$(target_url=$pgb_url target_key=$pgb_api_key bench "$op" "$c")
                pgb_reports+="$(tr -d '\n' <<<"$one")"$'\n'
                e=$(errors <<<"$one"); [ "$e" = - ] || errs="$errs pgbouncer:$e"
            fi
        done
        errs=${errs# } errs=${errs:--}
        report=$(median <<<"$reports")
        ops_s=$(field ops_per_sec <<<"$report")
        p50=$(field latency_ms.p50 <<<"$report") p99=$(field latency_ms.p99 <<<"$report")
        base_s=- vs_base=- base_p50=-
        if [ -n "$base_reports" ]; then
            base_report=$(median <<<"$base_reports")
            base_s=$(field ops_per_sec <<<"$base_report")
            base_p50=$(field latency_ms.p50 <<<"$base_report")
            vs_base=$(ratio "$ops_s" "$base_s")
        fi
        pgb_s=- vs_pgb=-
        if [ -n "$pgb_reports" ]; then
            pgb_s=$(field ops_per_sec <<<"$(median <<<"$pgb_reports")")
            vs_pgb=$(ratio "$pgb_s" "$ops_s")
        fi
        watched_s=- vs_watched=-
        if [ "$with_watcher" = 1 ]; then
            say "$op x$c: snapfence bench with a watcher open"
            curl -sN -H "Authorization: Bearer $api_key" "$url/v1/watch" >"$work/watcher.out" 2>&1 &
            watcher=$!
            watched_report=$(bench "$op" "$c")
            kill "$watcher" 2>/dev/null || true
            wait "$watcher" 2>/dev/null || true
            watched_s=$(field ops_per_sec <<<"$watched_report")
            vs_watched=$(ratio "$watched_s" "$ops_s")
            watched_errs=$(errors <<<"$watched_report")
            [ "$watched_errs" = - ] || errs="$errs watched:$watched_errs"
            # A changing cell must have been seen by the watcher (a read sees nothing).
            if [ "$op" != get ] && [ "$op" != renew ] && ! grep -q '^event:' "$work/watcher.out"; then
                errs="$errs watcher-saw-nothing"
            fi
        fi
        wrk_s=-
        if [ "$op" = get ] && command -v wrk >/dev/null; then
            wrk_s=$(wrk_get "$c" "$(field prefix <<<"$report" | sed 's#/#%2F#g')" "$(field keys <<<"$report")")
        fi
        if [ -n "$etcd_url" ]; then
            case $op in
            lock)
                peer_row lock "$c" "$report" "lease grant + txn + revoke" --etcd-lock per-lock
                peer_row lock "$c" "$report" "session mutex: txn + delete" --etcd-lock session
                # What one etcd write costs, to read the rows above by: a grant takes no key.
                peer_row grant "$c" "" "calibration: a bare lease grant, no key"
                ;;
            put) peer_row put "$c" "$report" "txn: compare a fence key, put it + body" ;;
            get) peer_row get "$c" "$report" "range read" ;;
            esac
        fi
        if [ "$c" = 32 ]; then at32[$op]=$ops_s; fi
        by_cell[$op/$c]=$ops_s
        rows+=("$(printf "$row_format" "$op" "$c" "$ops_s" "$p50" "$p99" "$pg" "$(ratio "$ops_s" "$pg")" \
            "$floor" "$(ratio "$ops_s" "$floor")" "$base_s" "$vs_base" "$base_p50" "$watched_s" "$vs_watched" \
            "$pgb_s" "$vs_pgb" "$wrk_s" "$errs")")
        say "row: ${rows[-1]}"
        [ "$errs" = - ] || failed=1
    done
    if [ "$op" = put ]; then put_rss=$(rss_peak); fi
done

# Lines printed under the tables.
extra=()
note() { extra+=("$1"); say "$1"; }

# The timing cells: each is one run of snapfence-bench against snapfence and, --with-etcd, against
# etcd over gRPC; every answer is checked (an error or a failed check fails the script).
timing_rows=()
timing_format='%-8s %-10s %-9s %6s %8s %8s %8s %8s %8s %8s %8s %12s  %s'
opt() { field "$1" <<<"$2" 2>/dev/null || echo -; } # a field a report may not have
timing_row() { # cell target setup report -> a row of the timing table
    local report=$4 e clock=- events=-
    e=$(errors <<<"$report")
    if [ "$(opt timing.clock_offset_error_ms "$report")" != - ]; then
        clock="$(field timing.clock_offset_ms <<<"$report")±$(field timing.clock_offset_error_ms <<<"$report")"
    fi
    if [ "$1" = watch ]; then events=$(field ops_per_sec <<<"$report"); fi
    timing_rows+=("$(printf "$timing_format" "$1" "$2" "$3" "$(field ok <<<"$report")" \
        "$(field latency_ms.p50 <<<"$report")" "$(field latency_ms.p99 <<<"$report")" "$(field latency_ms.max <<<"$report")" \
        "$(opt timing.from_send_ms.p50 "$report")" "$(opt timing.from_send_ms.p99 "$report")" \
        "$(opt timing.writes_per_sec "$report")" "$events" "$clock" "$e")")
    say "row: ${timing_rows[-1]}"
    [ "$e" = - ] || failed=1
}
timing_targets() { # -> the targets of the timing cells, with the URL of each
    echo "snapfence $url"
    if [ -n "$etcd_url" ]; then echo "etcd-grpc $etcd_url"; fi
}
writers=$(printf '%s\n' $clients | sort -n | tail -1)
for op in $timing_ops; do
    while read -r who at; do
        if [ "$op" = handoff ]; then
            say "handoff: $who, $rounds hand-offs on release"
            timing_row handoff "$who" "release" "$(target_url=$at bench handoff 1 --target "$who" --rounds "$rounds")"
            n=$rounds
            if [ "$who" != snapfence ]; then n=$expiry_rounds; fi
            say "handoff: $who, $n hand-offs on expiry"
            timing_row expiry "$who" "expiry" "$(target_url=$at bench expiry 1 --target "$who" --rounds "$n")"
        elif [ "$op" = flood ]; then
            [ "$who" = snapfence ] || continue
            say "flood: another client's reads and acquires while 5000 waiting acquires arrive at once, wait and hang up, for $duration"
            # The flood comes from another tenant, so it does not count against the timed
            # client's own limits (--max-in-flight-per-key).
            flood_key=${flood_key:-$("$sf" keys create --name flood --scope write 2>/dev/null)}
            # Against an instance of its own at the default limits (pool and waiter bounds), as
            # issue 49 asks, beside the one the other cells load (its pool is sized for pgbench).
            flood_port=$(free_port)
            "$sf" serve --listen "127.0.0.1:$flood_port" >"$work/flood-serve.log" 2>&1 &
            flood_pid=$!
            pids+=("$flood_pid")
            wait_ready "http://127.0.0.1:$flood_port" "$work/flood-serve.log"
            report=$(target_url=http://127.0.0.1:$flood_port bench flood 1 --flood 5000 --flood-api-key "$flood_key")
            kill "$flood_pid" && wait "$flood_pid" 2>/dev/null || true
            timing_row flood "$who" "5000-wait" "$report"
            note "flood: another client's read p99 $(field latency_ms.p99 <<<"$report") ms, max $(field latency_ms.max <<<"$report") ms; its acquire p99 $(field timing.acquire_ms.p99 <<<"$report") ms, max $(field timing.acquire_ms.max <<<"$report") ms (target: each within 100 ms); the flood $(field timing.flood <<<"$report")"
        else
            for r in $rates; do
                say "watch: $who, $writers writers at $r writes/s for $duration"
                timing_row watch "$who" "${writers}x${r}/s" "$(target_url=$at bench watch "$writers" --target "$who" --rate "$r")"
            done
        fi
    done < <(timing_targets)
done

# The v1.3 cells against the plain put of the same run (issue 47's targets: a put under a
# namespace fence >= 0.9 x the put; a transaction of ten puts >= 0.3 x its rate, 3 x its writes).
for c in $clients; do
    put_s=${by_cell[put/$c]:-}
    [ -n "$put_s" ] || continue
    if [ -n "${by_cell[nsput/$c]:-}" ]; then
        note "nsput x$c: ${by_cell[nsput/$c]}/s against put's $put_s/s ($(ratio "${by_cell[nsput/$c]}" "$put_s") x; target >= 0.90)"
    fi
    if [ -n "${by_cell[txn/$c]:-}" ]; then
        note "txn x$c (10 puts each): ${by_cell[txn/$c]}/s against put's $put_s/s ($(ratio "${by_cell[txn/$c]}" "$put_s") x; target >= 0.30)"
    fi
done

if [ "$memory" = 1 ]; then
    say "memory: 32 concurrent 8 MiB puts"
    big=$(run_keys=32 run_for=5s bench put 32 --body-bytes 8388608)
    note "peak RSS through the 1 KiB put runs: ${put_rss:-?} MiB (target < 64)"
    note "peak RSS with 32 concurrent 8 MiB puts: $(rss_peak) MiB (target < 384), $(field ops_per_sec <<<"$big") puts/s, errors $(errors <<<"$big")"
fi
if [ "$catch_up" = 1 ]; then
    backlog=400000 streams=64
    say "catch-up: writing a backlog of $backlog changes, then the put x32 alone, with $streams watchers reading it from since=0, and alone again"
    # Written as the hot statements write them (so that it is cheap to make), a thousand to a
    # transaction; the last change's key is the one a stream that has read everything receives.
    for from in $(seq 1 1000 "$backlog"); do
        echo "INSERT INTO change_log (kind, key, token, at, owner, expires_at)
              SELECT 'lease.granted', 'backlog/' || n, n, now(), 'w', now() FROM generate_series($from, $((from + 999))) n;"
    done | psql >/dev/null
    xid=$(psql -c "INSERT INTO change_log (kind, key, token, at, owner, expires_at)
                   VALUES ('lease.granted', 'backlog-end', 0, now(), 'w', now()) RETURNING xid")
    # Numbered once the relay's newest epoch sees the transaction that wrote the last.
    until [ "$(psql -c "SELECT pg_visible_in_snapshot('$xid'::xid8, snap) FROM change_epochs ORDER BY last_id DESC LIMIT 1")" = t ]; do
        sleep 0.5
    done
    # A key of their own: each stream counts against its key's requests in flight (64).
    watch_key=$("$sf" keys create --name catch-up --scope read 2>/dev/null)
    alone_1=$(bench put 32)
    watchers=()
    for i in $(seq "$streams"); do
        curl -sN -H "Authorization: Bearer $watch_key" "$url/v1/watch?since=0&prefix=backlog-end" >"$work/catch-up.$i" 2>&1 &
        watchers+=("$!")
    done
    with_streams=$(bench put 32)
    done_by_end=$(cat "$work"/catch-up.* | grep -c '"key":"backlog-end"' || true)
    refused=$(cat "$work"/catch-up.* | grep -c too_many_requests || true)
    kill "${watchers[@]}" 2>/dev/null || true
    wait "${watchers[@]}" 2>/dev/null || true
    alone_2=$(bench put 32)
    a1=$(field ops_per_sec <<<"$alone_1") w=$(field ops_per_sec <<<"$with_streams") a2=$(field ops_per_sec <<<"$alone_2")
    alone=$(python3 -c "print(($a1 + $a2) / 2)")
    for r in "$alone_1" "$with_streams" "$alone_2"; do
        e=$(errors <<<"$r")
        [ "$e" = - ] || { note "catch-up run errors: $e"; failed=1; }
    done
    note "put x32 with $streams watchers catching up over $backlog changes: $w/s against $a1/s before and $a2/s after ($(ratio "$w" "$alone") x; target >= 0.80); $done_by_end of $streams had read the whole backlog by the end of the run ($refused refused)"
fi
if [ "$growth" = 1 ]; then
    say "growth: adding 1,000,000 keys and 10,000,000 audit rows"
    psql -c "INSERT INTO leases (key, token, owner, ttl_ms, crash_recovery, acquired_at, expires_at)
             SELECT 'growth/' || i, next_fencing_token(), 'growth', 1000, false, now(), now() FROM generate_series(1, 1000000) i"
    psql -c "INSERT INTO rejections (key, reason, presented_token, highest_token, holder, operation)
             SELECT 'growth/' || (i % 1000000), 'stale_token', 1, 2, 'growth', 'put' FROM generate_series(1, 10000000) i"
    psql -c "VACUUM ANALYZE"
    for op in acquire put; do
        g=$(bench "$op" 32 | field ops_per_sec)
        note "$op x32 with 1M keys and 10M audit rows: $g/s against ${at32[$op]:-?}/s before ($(ratio "$g" "${at32[$op]:-0}") x; target >= 0.80)"
    done
fi
if [ "$profile" = 1 ]; then
    say "profile: perf record of the whole machine through a 32-client put run"
    ticks() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
    busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
    pg_pids() { pgrep -x postgres || true; }
    perf record -F 999 -a -g -o "$work/perf.data" -- sleep "$secs" >/dev/null 2>&1 &
    perf_pid=$!
    # shellcheck disable=SC2046
    s0=$(ticks "$sf_pid") p0=$(ticks $(pg_pids)) b0=$(busy) t0=$(date +%s%N)
    bench put 32 >/dev/null
    # shellcheck disable=SC2046
    s1=$(ticks "$sf_pid") p1=$(ticks $(pg_pids)) b1=$(busy) t1=$(date +%s%N)
    wait "$perf_pid"
    hz=$(getconf CLK_TCK) wall=$(((t1 - t0) / 10000000)) # hundredths of a second
    share() { echo "$(($1 * 10000 / hz / wall))%"; }
    note "CPU through a 32-client put run ($(nproc) cores = $(($(nproc) * 100))%): server $(share $((s1 - s0))), PostgreSQL $(share $((p1 - p0))), everything else (the load generator, the kernel's softirqs) $(share $((b1 - b0 - (s1 - s0) - (p1 - p0))))"
    report() { perf report -i "$work/perf.data" --no-children --stdio -g none --sort dso,symbol "$@" 2>/dev/null |
        grep '%' | grep -v '^#' | sed 's/ \{2,\}/ /g; s/ - - *$//' | cut -c1-150 | head -30 || true; }
    {
        echo "# the server's CPU by library and symbol (share of all samples)"
        report --pid "$sf_pid"
        echo "# PostgreSQL's CPU by library and symbol"
        report --comms postgres
    } >"$work/perf.txt"
    note "profile: $work/perf.txt"
fi

echo
if [ ${#rows[@]} -gt 0 ]; then
    echo "snapfence $("$sf" --version | cut -d' ' -f2) vs pgbench (PostgreSQL $("${as_pg[@]}" "$pgbin/postgres" --version | awk '{print $3}')) on $(nproc) cores, loopback, $duration per cell, $keys keys, 1 KiB bodies"
    printf "$row_format\n" op clients service/s p50ms p99ms pgbench/s x-pg floor/s x-floor base/s x-base b-p50ms watched/s x-watch pgb/s x-pgb wrk/s errors
    for r in "${rows[@]}"; do echo "$r"; done
fi
if [ ${#peer_rows[@]} -gt 0 ]; then
    echo "snapfence vs etcd $(etcd --version | awk 'NR == 1 {print $3}') (one member, over gRPC; json/s: over its JSON gateway), the same work on both sides"
    printf "$peer_format\n" cell clients snapfence/s p50ms p99ms etcd/s p50ms p99ms x-etcd json/s "etcd does" errors
    for r in "${peer_rows[@]}"; do echo "$r"; done
fi
if [ ${#timing_rows[@]} -gt 0 ]; then
    echo "hand-off and watch delivery on $(nproc) cores, loopback: latencies in ms (n: hand-offs or events); watch cells $duration of 1 KiB writes"
    printf "$timing_format\n" cell target setup n p50ms p99ms maxms s-p50ms s-p99ms writes/s events/s clock-ms errors
    for r in "${timing_rows[@]}"; do echo "$r"; done
fi
for e in "${extra[@]}"; do echo "$e"; done
trap - EXIT
cleanup
if [ "$clean" = 1 ]; then
    rm -rf "$work"
else
    echo "(work dir: $work; logs of every tool are there)"
fi
if [ "$failed" = 1 ]; then
    echo "compare.sh: some requests failed or a check found a key not as its run left it (see errors above)" >&2
    exit 1
fi
