#!/usr/bin/env bash
# `make bench-instructions`: instructions the gateway executes per call, counted by
# valgrind's callgrind, which do not move with the machine's other load the way CPU time does
# (docs/performance.md compares builds this way). One worker in front of the C upstream
# (tests/bench/fast-upstream.c), the embedded store in a file of its own; started with
# instrumentation off, warmed up with a second of wrk, then instrumentation is switched on for
# exactly BENCH_INSTR_CALLS sequential calls from one keep-alive connection and off again, so
# neither start-up nor the client is counted. Prints one line per mode and keeps the profiles
# (callgrind_annotate FILE shows where the instructions went).
#
#   BENCH_INSTR_MODES="read protected replay"   read: a read-class tool; protected: first
#                                               executions, unique arguments; replay: the same
#                                               call again and again (claimed once)
#   BENCH_INSTR_CALLS=2000
#   IDEMGW_BIN=build/idemgw                     the build to count
#   BENCH_OUT=bench-results                     where the profiles go (instructions-MODE.out)
# Needs valgrind (callgrind_control), wrk, curl and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
bench_name=bench-instructions
# shellcheck source=scripts/bench/lib.sh
. scripts/bench/lib.sh

modes=${BENCH_INSTR_MODES:-"read protected replay"}
calls=${BENCH_INSTR_CALLS:-2000}
bin=$(realpath "${IDEMGW_BIN:-build/idemgw}")
out_dir=${BENCH_OUT:-bench-results}
for tool in valgrind callgrind_control wrk curl python3 cc; do
    command -v "$tool" >/dev/null || { echo "$bench_name: $tool not found" >&2; exit 2; }
done
[ -x "$bin" ] || { echo "$bench_name: $bin not built (make all)" >&2; exit 2; }
mkdir -p "$out_dir" build/bench
cc -O2 -g -Wall -Wextra -o build/bench/fast-upstream tests/bench/fast-upstream.c

tmp=$(mktemp -d "${TMPDIR:-/tmp}/idemgw-instr.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

up_port=$(free_port)
build/bench/fast-upstream "$up_port" 1000 >"$tmp/upstream.log" 2>&1 &
pids+=($!)
wait_port "$up_port" "fast upstream"

# calls MODE PORT N RUN: N sequential calls on one connection, each answered 200 with a result
# (RUN keeps one run's arguments apart from another's)
calls() {
    python3 - "$@" <<'EOF'
import http.client, json, sys
mode, port, n, run = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
conn = http.client.HTTPConnection("127.0.0.1", port)
pad = "x" * 900
for i in range(n):
    q = "fixed" if mode == "read" else ("replay-" + run if mode == "replay" else "%s-%d" % (run, i))
    body = json.dumps({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                       "params": {"name": "search" if mode == "read" else "write",
                                  "arguments": {"q": q, "pad": pad}}})
    conn.request("POST", "/mcp", body, {"Content-Type": "application/json",
                                        "Accept": "application/json, text/event-stream"})
    r = conn.getresponse()
    text = r.read()
    if r.status != 200 or b'"result"' not in text:
        sys.exit("call %d answered %d: %s" % (i, r.status, text[:200]))
EOF
}

for mode in $modes; do
    port=$(free_port) admin=$(free_port)
    cat >"$tmp/idemgw-$mode.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$admin
workers: 1
upstream: http://127.0.0.1:$up_port/mcp
database_url: sqlite:$tmp/keys-$mode.db
$(bench_policy)
EOF
    profile="$out_dir/instructions-$mode.out"
    rm -f "$profile" "$profile".*
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$profile" \
        "$bin" -c "$tmp/idemgw-$mode.yaml" >"$tmp/idemgw-$mode.log" 2>&1 &
    vg=$!
    pids+=("$vg")
    wait_port "$port" "idemgw under callgrind"
    # warm: the upstream pool, the allocator, the replayed key's first execution
    BENCH_MODE=read wrk -t1 -c1 -d1s -s scripts/bench/mcp.lua "http://127.0.0.1:$port/mcp" >/dev/null
    run=$RANDOM$RANDOM
    calls "$mode" "$port" 1 "$run"
    callgrind_control -i on "$vg" >/dev/null 2>&1
    calls "$mode" "$port" "$calls" "$run"
    callgrind_control -i off "$vg" >/dev/null 2>&1
    callgrind_control -d "$vg" >/dev/null 2>&1
    kill "$vg"
    wait "$vg" 2>/dev/null || true
    # the dump taken above is the first numbered part; the one at exit counted nothing
    total=$(sed -n 's/^totals: *//p' "$profile.1" | awk '{print $1}')
    if [ -z "$total" ]; then
        echo "$bench_name: callgrind wrote no counts for $mode (valgrind's log: $tmp/idemgw-$mode.log)" >&2
        tail -n 20 "$tmp/idemgw-$mode.log" >&2
        exit 1
    fi
    mv "$profile.1" "$profile"
    echo "$mode: $((total / calls)) instructions per call ($calls calls; profile $profile)"
done
