#!/usr/bin/env bash
# `make bench-stdio` (also `BENCH_ONLY=stdio scripts/bench.sh`, and part of `make bench`): one
# stdio MCP server (tests/bench/stdio-server.mjs, the official SDK) reached over Streamable HTTP
# four ways, each a process this script starts:
#   idemgw_per_session  idemgw spawning it, a child per session (`sessions: per_session`)
#   idemgw_shared       idemgw spawning it once for every session (`sessions: shared`)
#   supergateway        supergateway 4 --stateful (a child per session)
#   mcp_proxy           mcp-proxy 6 (one child for every session)
# Both gateways keep keys in the embedded SQLite store, `append` classed non_idempotent, so each
# first call claims and records a key. tests/bench/stdio-bench.mjs drives one target per run;
# rounds take the targets in turn. Every figure is printed as it comes; at the end
# scripts/bench/stdio-report.py prints the Markdown tables and writes BENCH_OUT/stdio-latest.json
# (and a dated copy).
#
#   BENCH_STDIO_ROUNDS=3        rounds (each runs every target once)
#   BENCH_STDIO_SECS=3          seconds of each load phase (append, then get)
#   BENCH_STDIO_SESSIONS="1 16" concurrent sessions of the load phases and the memory figure
#   BENCH_STDIO_NEW=10          new sessions timed to their first answer, per target and round
#   BENCH_STDIO_TARGETS="idemgw_per_session idemgw_shared supergateway mcp_proxy"
#   BENCH_SMOKE=1               1 round, 0.5 s phases, 1 and 4 sessions, 2 new sessions (the
#                               test suite's size)
#   BENCH_OUT=DIR               where the JSON goes (default bench-results)
# Needs python3, curl, tools/node and the test packages (tests/node_modules).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

smoke=${BENCH_SMOKE:-0}
if [ "$smoke" = 1 ]; then
    rounds=${BENCH_STDIO_ROUNDS:-1}
    secs=${BENCH_STDIO_SECS:-0.5}
    new_n=${BENCH_STDIO_NEW:-2}
    sessions=${BENCH_STDIO_SESSIONS:-"1 4"}
else
    rounds=${BENCH_STDIO_ROUNDS:-3}
    secs=${BENCH_STDIO_SECS:-3}
    new_n=${BENCH_STDIO_NEW:-10}
    sessions=${BENCH_STDIO_SESSIONS:-"1 16"}
fi
targets=${BENCH_STDIO_TARGETS:-"idemgw_per_session idemgw_shared supergateway mcp_proxy"}
out_dir=${BENCH_OUT:-bench-results}
IDEMGW=${IDEMGW_BIN:-build/idemgw}
# an absolute IDEMGW_BIN is taken as it is, a relative one from the checkout's root
case $IDEMGW in /*) ;; *) IDEMGW=$root/$IDEMGW ;; esac
NODE=${NODE:-$root/tools/node/bin/node}
BIN=$root/tests/node_modules/.bin
SERVER=$root/tests/bench/stdio-server.mjs
# the bridges' launchers are `#!/usr/bin/env node` scripts
export PATH="$(dirname "$NODE"):$PATH"

for f in "$IDEMGW" "$NODE" "$BIN/supergateway" "$BIN/mcp-proxy"; do
    [ -x "$f" ] || { echo "bench-stdio: $f not found (make; scripts/install-deps.sh)" >&2; exit 2; }
done
for tool in python3 curl; do
    command -v "$tool" >/dev/null || { echo "bench-stdio: $tool not found" >&2; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/idemgw-bench-stdio.XXXXXX")
pids=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "$rc" != 0 ]; then
        for f in "$tmp"/*.log; do
            [ -s "$f" ] || continue
            echo "--- $f (last lines)" >&2
            tail -n 20 "$f" >&2
        done
    fi
    if [ -n "${BENCH_KEEP_TMP:-}" ]; then echo "bench-stdio: kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '%s bench-stdio: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

bench_name=bench-stdio
. "$root/scripts/bench/lib.sh"

# ---- the targets ------------------------------------------------------------------------------
declare -A port_of pid_of

start_idemgw() { # NAME per_session|shared
    local name=$1 mode=$2 port admin
    port=$(free_port)
    admin=$(free_port)
    cat >"$tmp/$name.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$admin
workers: 1
upstream:
  command: [$NODE, $SERVER]
  sessions: $mode
  max_children: 64
  idle_timeout: 10m
database_url: sqlite:$tmp/$name-keys.db
log:
  level: warn
subject:
  static: bench
tools:
  append: {class: non_idempotent}
  get: {class: read}
EOF
    "$IDEMGW" -c "$tmp/$name.yaml" >"$tmp/$name.log" 2>&1 &
    pids+=($!)
    pid_of[$name]=$!
    port_of[$name]=$port
    eval "${name}_admin=$admin"
    gw_ready "$port" "$admin" "$tmp/$name.log" "$name"
}

start_supergateway() {
    local port
    port=$(free_port)
    # --logLevel none: at info it logs every message both ways
    "$BIN/supergateway" --stdio "$NODE $SERVER" --outputTransport streamableHttp --stateful \
        --port "$port" --logLevel none >"$tmp/supergateway.log" 2>&1 &
    pids+=($!)
    pid_of[supergateway]=$!
    port_of[supergateway]=$port
    wait_port "$port" supergateway
}

start_mcp_proxy() {
    local port
    port=$(free_port)
    "$BIN/mcp-proxy" --host 127.0.0.1 --port "$port" --server stream -- "$NODE" "$SERVER" \
        >"$tmp/mcp_proxy.log" 2>&1 &
    pids+=($!)
    pid_of[mcp_proxy]=$!
    port_of[mcp_proxy]=$port
    wait_port "$port" mcp-proxy
}

for t in $targets; do
    log "starting $t"
    case $t in
    idemgw_per_session) start_idemgw "$t" per_session ;;
    idemgw_shared) start_idemgw "$t" shared ;;
    supergateway) start_supergateway ;;
    mcp_proxy) start_mcp_proxy ;;
    *) echo "bench-stdio: unknown target $t" >&2; exit 2 ;;
    esac
done

# ---- rounds -----------------------------------------------------------------------------------
results=$tmp/results.jsonl
: >"$results"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average $load_start; $rounds rounds of $secs s phases, sessions: $sessions; $new_n new sessions each"
run_id=$RANDOM$RANDOM
for r in $(seq 1 "$rounds"); do
    for t in $targets; do
        if ! kill -0 "${pid_of[$t]}" 2>/dev/null; then
            echo "bench-stdio: $t (pid ${pid_of[$t]}) has exited" >&2
            exit 1
        fi
        # in the background, so that a signal reaches the trap now, not when the round ends
        "$NODE" tests/bench/stdio-bench.mjs --url "http://127.0.0.1:${port_of[$t]}/mcp" --pid "${pid_of[$t]}" \
            --target "$t" --round "$r" --sessions "$sessions" --secs "$secs" --new "$new_n" \
            --run "$run_id" >>"$results" &
        driver=$!
        pids+=("$driver")
        wait "$driver"
    done
    load_now=$(cut -d' ' -f1-3 /proc/loadavg)
    printf '{"kind":"round_end","round":%s,"loadavg":"%s"}\n' "$r" "$load_now" >>"$results"
    log "round $r done, load average $load_now"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# what the gateways recorded: every append a first execution, none a replay
gw_meta=
for t in idemgw_per_session idemgw_shared; do
    [[ " $targets " == *" $t "* ]] || continue
    eval "admin=\$${t}_admin"
    gw_meta+=",\"${t}_executions\":$(metric "$admin" idemgw_executions_total)"
    gw_meta+=",\"${t}_children_left\":$(metric "$admin" idemgw_upstream_children)"
done

# ---- report -----------------------------------------------------------------------------------
mkdir -p "$out_dir"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
versions="\"node\":\"$("$NODE" --version)\""
versions+=",\"sdk\":\"$("$NODE" -p 'require("./tests/node_modules/@modelcontextprotocol/sdk/package.json").version')\""
versions+=",\"supergateway\":\"$("$NODE" -p 'require("./tests/node_modules/supergateway/package.json").version')\""
versions+=",\"mcp_proxy\":\"$("$NODE" -p 'require("./tests/node_modules/mcp-proxy/package.json").version')\""
python3 scripts/bench/stdio-report.py "$results" "$out_dir/stdio-latest.json" \
    --meta "{\"commit\":\"$commit\",\"cpus\":$(nproc),\"smoke\":$([ "$smoke" = 1 ] && echo true || echo false),\"rounds\":$rounds,\"secs\":$secs,\"sessions\":\"$sessions\",\"new_sessions\":$new_n,\"targets\":\"$targets\",\"loadavg_at_start\":\"$load_start\",\"loadavg_at_end\":\"$load_end\",$versions$gw_meta}"
cp "$out_dir/stdio-latest.json" "$out_dir/stdio-$(date +%Y%m%d-%H%M%S).json"
