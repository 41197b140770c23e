#!/usr/bin/env bash
# `make bench-stdio` (also `BENCH_ONLY=stdio scripts/bench.sh`, and part of `make bench`): stdio
# MCP servers reached over Streamable HTTP four ways, each a process this script starts:
#   idemgw_per_session  idemgw spawning the server, a child per session (`sessions: per_session`)
#   idemgw_shared       idemgw spawning it once for every session (`sessions: shared`)
#   supergateway        supergateway --stateful (a child per session)
#   mcp_proxy           mcp-proxy (one child for every session)
# (the bridges at the versions tests/package.json pins, printed with the tables). The servers:
#   bench   tests/bench/stdio-server.mjs (the official SDK): write `append`, read `get`
#   memory  @modelcontextprotocol/server-memory from npm, its graph in a file of each target's:
#           write `create_entities`, read `open_nodes`
# Both gateways keep keys in the embedded SQLite store, the write classed non_idempotent, so each
# first call claims and records a key. tests/bench/stdio-bench.mjs drives one target per run;
# rounds take the targets in turn, a server's rounds after the other's. Then
# tests/bench/stdio-failures.mjs runs the failure classes (a child that dies mid-call, one that
# never answers initialize, agents that never DELETE, SIGTERM with a call in flight, helpers a
# server starts, a retried write) against idemgw and both bridges, each class on copies of its
# own. Every figure is printed as it comes; at the end scripts/bench/stdio-report.py prints the
# Markdown tables and writes BENCH_OUT/stdio-latest.json (and a dated copy).
#
#   BENCH_STDIO_ROUNDS=3        rounds of the bench server (each runs every target once)
#   BENCH_STDIO_ROUNDS_2=1      rounds of each further server
#   BENCH_STDIO_SECS=2          seconds of each load phase (the write, then the read)
#   BENCH_STDIO_SESSIONS="1 16" concurrent sessions of the load phases and the memory figure
#   BENCH_STDIO_NEW=8           new sessions timed to their first answer, per target and round
#   BENCH_STDIO_SERVERS="bench memory"
#   BENCH_STDIO_TARGETS="idemgw_per_session idemgw_shared supergateway mcp_proxy"
#   BENCH_STDIO_FAILURES=1      0: no failure classes
#   BENCH_STDIO_CAPS="15 65 8"  how long the failure classes wait, in seconds: for a call's
#                               answer, for an answer to initialize (idemgw's start_timeout is
#                               30 s), for a helper to be gone
#   BENCH_SMOKE=1               1 round, 0.5 s phases, 1 and 4 sessions, 2 new sessions, 3 s
#                               waits in the failure classes (the test suite's size)
#   BENCH_OUT=DIR               where the JSON goes (default bench-results)
# Needs python3, curl, tools/node and the test packages (tests/node_modules).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

smoke=${BENCH_SMOKE:-0}
if [ "$smoke" = 1 ]; then
    rounds=${BENCH_STDIO_ROUNDS:-1}
    rounds_2=${BENCH_STDIO_ROUNDS_2:-1}
    secs=${BENCH_STDIO_SECS:-0.5}
    new_n=${BENCH_STDIO_NEW:-2}
    sessions=${BENCH_STDIO_SESSIONS:-"1 4"}
    caps=${BENCH_STDIO_CAPS:-"3 3 3"}
else
    rounds=${BENCH_STDIO_ROUNDS:-3}
    rounds_2=${BENCH_STDIO_ROUNDS_2:-1}
    secs=${BENCH_STDIO_SECS:-2}
    new_n=${BENCH_STDIO_NEW:-8}
    sessions=${BENCH_STDIO_SESSIONS:-"1 16"}
    caps=${BENCH_STDIO_CAPS:-"15 65 8"}
fi
read -r call_cap init_cap helper_cap <<<"$caps"
servers=${BENCH_STDIO_SERVERS:-"bench memory"}
targets=${BENCH_STDIO_TARGETS:-"idemgw_per_session idemgw_shared supergateway mcp_proxy"}
failures=${BENCH_STDIO_FAILURES:-1}
out_dir=${BENCH_OUT:-bench-results}
IDEMGW=${IDEMGW_BIN:-build/idemgw}
# an absolute IDEMGW_BIN is taken as it is, a relative one from the checkout's root
case $IDEMGW in /*) ;; *) IDEMGW=$root/$IDEMGW ;; esac
NODE=${NODE:-$root/tools/node/bin/node}
BIN=$root/tests/node_modules/.bin
MEMORY_SERVER=$root/tests/node_modules/@modelcontextprotocol/server-memory/dist/index.js
# the bridges' launchers are `#!/usr/bin/env node` scripts
export PATH="$(dirname "$NODE"):$PATH"

for f in "$IDEMGW" "$NODE" "$BIN/supergateway" "$BIN/mcp-proxy" "$MEMORY_SERVER"; do
    [ -x "$f" ] || { echo "bench-stdio: $f not found (make; scripts/install-deps.sh)" >&2; exit 2; }
done
for tool in python3 curl; do
    command -v "$tool" >/dev/null || { echo "bench-stdio: $tool not found" >&2; exit 2; }
done

# the bridges' versions the figures are for (tests/package.json pins them); another installed
# copy still runs, with a warning, and the tables print the versions that ran
declare -A pinned=([supergateway]=4.0.0 [mcp-proxy]=6.7.19)
for pkg in "${!pinned[@]}"; do
    have=$("$NODE" -p "require('./tests/node_modules/$pkg/package.json').version")
    [ "$have" = "${pinned[$pkg]}" ] ||
        echo "bench-stdio: WARNING: tests/node_modules has $pkg $have, the benchmark is pinned to ${pinned[$pkg]} (scripts/install-deps.sh)" >&2
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

# set_server NAME: what the targets of server NAME run ($server_cmd, with $srv_env naming its
# state file, if any, under a target's name), and how the gateways class its tools ($tools_yaml)
set_server() {
    case $1 in
    bench)
        server_cmd=("$NODE" "$root/tests/bench/stdio-server.mjs")
        srv_env=
        tools_yaml=$'  append: {class: non_idempotent}\n  get: {class: read}'
        write_tool=append
        ;;
    memory)
        server_cmd=("$NODE" "$MEMORY_SERVER")
        srv_env=MEMORY_FILE_PATH
        tools_yaml=$'  create_entities: {class: non_idempotent}\n  open_nodes: {class: read}'
        write_tool=create_entities
        ;;
    *) echo "bench-stdio: unknown server $1" >&2; exit 2 ;;
    esac
}

# env_for NAME: the server's environment under target NAME, as VAR=VALUE words (none or one)
env_for() {
    [ -z "$srv_env" ] || echo "$srv_env=$tmp/$srv-$1-state.jsonl"
}

start_idemgw() { # NAME per_session|shared
    local name=$1 mode=$2 port admin env_line=
    port=$(free_port)
    admin=$(free_port)
    [ -z "$srv_env" ] || env_line="  env: {$srv_env: \"$tmp/$srv-$name-state.jsonl\"}"
    cat >"$tmp/$srv-$name.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$admin
workers: 1
upstream:
  command: [${server_cmd[0]}, ${server_cmd[1]}]
$env_line
  sessions: $mode
  max_children: 64
  idle_timeout: 10m
database_url: sqlite:$tmp/$srv-$name-keys.db
log:
  level: warn
subject:
  static: bench
tools:
$tools_yaml
EOF
    "$IDEMGW" -c "$tmp/$srv-$name.yaml" >"$tmp/$srv-$name.log" 2>&1 &
    pids+=($!)
    pid_of[$name]=$!
    port_of[$name]=$port
    eval "${name}_admin=$admin"
    gw_ready "$port" "$admin" "$tmp/$srv-$name.log" "$name"
}

start_supergateway() {
    local port
    port=$(free_port)
    # --logLevel none: at info it logs every message both ways
    env $(env_for supergateway) "$BIN/supergateway" --stdio "${server_cmd[*]}" --outputTransport streamableHttp \
        --stateful --port "$port" --logLevel none >"$tmp/$srv-supergateway.log" 2>&1 &
    pids+=($!)
    pid_of[supergateway]=$!
    port_of[supergateway]=$port
    wait_port "$port" supergateway
}

start_mcp_proxy() {
    local port
    port=$(free_port)
    env $(env_for mcp_proxy) "$BIN/mcp-proxy" --host 127.0.0.1 --port "$port" --server stream -- "${server_cmd[@]}" \
        >"$tmp/$srv-mcp_proxy.log" 2>&1 &
    pids+=($!)
    pid_of[mcp_proxy]=$!
    port_of[mcp_proxy]=$port
    wait_port "$port" mcp-proxy
}

# forget PID...: drops processes that have been waited for from those the exit trap ends
forget() {
    local keep=() p q gone
    for p in "${pids[@]}"; do
        gone=0
        for q in "$@"; do [ "$p" = "$q" ] && gone=1; done
        [ "$gone" = 1 ] || keep+=("$p")
    done
    pids=("${keep[@]}")
}

# stop_targets: ends this server's targets (and waits for them), so the next server's start
# with the machine to themselves
stop_targets() {
    local t
    for t in $targets; do kill "${pid_of[$t]}" 2>/dev/null || true; done
    for t in $targets; do
        wait "${pid_of[$t]}" 2>/dev/null || true
        forget "${pid_of[$t]}"
    done
}

# ---- rounds -----------------------------------------------------------------------------------
results=$tmp/results.jsonl
: >"$results"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average $load_start; servers: $servers; $rounds rounds (further servers $rounds_2) of $secs s phases, sessions: $sessions; $new_n new sessions each"
run_id=$RANDOM$RANDOM
gw_meta=
for srv in $servers; do
    set_server "$srv"
    for t in $targets; do
        log "starting $t in front of the $srv server"
        case $t in
        idemgw_per_session) start_idemgw "$t" per_session ;;
        idemgw_shared) start_idemgw "$t" shared ;;
        supergateway) start_supergateway ;;
        mcp_proxy) start_mcp_proxy ;;
        *) echo "bench-stdio: unknown target $t" >&2; exit 2 ;;
        esac
    done
    n_rounds=$rounds
    [ "$srv" = bench ] || n_rounds=$rounds_2
    for r in $(seq 1 "$n_rounds"); do
        for t in $targets; do
            if ! kill -0 "${pid_of[$t]}" 2>/dev/null; then
                echo "bench-stdio: $t (pid ${pid_of[$t]}) has exited" >&2
                exit 1
            fi
            # in the background, so that a signal reaches the trap now, not when the round ends
            "$NODE" tests/bench/stdio-bench.mjs --url "http://127.0.0.1:${port_of[$t]}/mcp" --pid "${pid_of[$t]}" \
                --target "$t" --server "$srv" --round "$r" --sessions "$sessions" --secs "$secs" --new "$new_n" \
                --run "$run_id" >>"$results" &
            driver=$!
            pids+=("$driver")
            wait "$driver"
            forget "$driver"
        done
        load_now=$(cut -d' ' -f1-3 /proc/loadavg)
        printf '{"kind":"round_end","server":"%s","round":%s,"loadavg":"%s"}\n' "$srv" "$r" "$load_now" >>"$results"
        log "$srv server: round $r done, load average $load_now"
    done

    # what the gateways recorded: every write a first execution, none a replay (the bench
    # server's under the names of old, a further server's prefixed with its name)
    prefix=
    [ "$srv" = bench ] || prefix=${srv}_
    for t in idemgw_per_session idemgw_shared; do
        [[ " $targets " == *" $t "* ]] || continue
        eval "admin=\$${t}_admin"
        gw_meta+=",\"$prefix${t}_executions\":$(metric "$admin" idemgw_executions_total)"
        gw_meta+=",\"$prefix${t}_children_left\":$(metric "$admin" idemgw_upstream_children)"
    done
    stop_targets
done

# ---- failure classes --------------------------------------------------------------------------
if [ "$failures" = 1 ]; then
    fail_targets=
    [[ " $targets " == *" idemgw_per_session "* ]] && fail_targets+=" idemgw"
    [[ " $targets " == *" supergateway "* ]] && fail_targets+=" supergateway"
    [[ " $targets " == *" mcp_proxy "* ]] && fail_targets+=" mcp_proxy"
    log "failure classes against$fail_targets (waits: call $call_cap s, initialize $init_cap s, helpers $helper_cap s)"
    mkdir -p "$tmp/failures"
    IDEMGW_BIN=$IDEMGW "$NODE" tests/bench/stdio-failures.mjs --dir "$tmp/failures" --targets "$fail_targets" \
        --call-cap "$call_cap" --init-cap "$init_cap" --helper-cap "$helper_cap" >>"$results" &
    driver=$!
    pids+=("$driver")
    wait "$driver"
    forget "$driver"
fi
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- report -----------------------------------------------------------------------------------
mkdir -p "$out_dir"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
versions="\"node\":\"$("$NODE" --version)\""
versions+=",\"sdk\":\"$("$NODE" -p 'require("./tests/node_modules/@modelcontextprotocol/sdk/package.json").version')\""
versions+=",\"supergateway\":\"$("$NODE" -p 'require("./tests/node_modules/supergateway/package.json").version')\""
versions+=",\"mcp_proxy\":\"$("$NODE" -p 'require("./tests/node_modules/mcp-proxy/package.json").version')\""
versions+=",\"server_memory\":\"$("$NODE" -p 'require("./tests/node_modules/@modelcontextprotocol/server-memory/package.json").version')\""
python3 scripts/bench/stdio-report.py "$results" "$out_dir/stdio-latest.json" \
    --meta "{\"commit\":\"$commit\",\"cpus\":$(nproc),\"smoke\":$([ "$smoke" = 1 ] && echo true || echo false),\"rounds\":$rounds,\"secs\":$secs,\"sessions\":\"$sessions\",\"new_sessions\":$new_n,\"servers\":\"$servers\",\"rounds_further_servers\":$rounds_2,\"targets\":\"$targets\",\"failure_waits_s\":\"$caps\",\"loadavg_at_start\":\"$load_start\",\"loadavg_at_end\":\"$load_end\",$versions$gw_meta}"
cp "$out_dir/stdio-latest.json" "$out_dir/stdio-$(date +%Y%m%d-%H%M%S).json"
