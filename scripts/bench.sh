#!/usr/bin/env bash
# `make bench`: measures idemgw against a direct connection, against nginx as a plain reverse
# proxy and against the Postgres ceiling (pgbench running the gateway's own claim and finish
# statements), each pair in the same run; protected calls also on the embedded SQLite store;
# section (8) against idempotency inside an MCP SDK server (AWS Lambda Powertools over a durable
# Redis); section (10), stdio servers, is scripts/bench/stdio.sh, run last with its own table
# and JSON (stdio-latest.json). Prints one table and writes the figures to
# bench-results/latest.json (and a dated copy) so runs can be compared, and the table into
# docs/performance.md (scripts/bench/write-doc.py).
#
#   BENCH_DURATION=10s    length of each wrk / pgbench run (default 10s)
#   BENCH_CONNS="1 16 64 256"   connection counts of the pass-through comparison
#   BENCH_LOAD_CONNS=64   connections for protected, replay and growth runs
#   BENCH_IDLE=10000      idle keep-alive agent connections for the memory figure
#   BENCH_STREAMS=1000    in-flight SSE streams for the memory figure
#   BENCH_SSE_CALLS=20    streaming calls (100 progress events each) per SSE path
#   BENCH_GROWTH_ROWS=1000000   live rows of the large-table growth run
#   BENCH_STORE_POOL=4    the gateway's store.pool, and pgbench's client count
#   BENCH_PASS_ROUNDS=3   rounds of the pass-through section (each target's median is kept)
#   BENCH_SSE_ROUNDS=3    rounds of the SSE section (the same)
#   BENCH_OBS_ROUNDS=3    rounds of the observability section (each variant's median is kept)
#   BENCH_SMOKE=1         everything, with tiny durations and sizes (for the test suite)
#   BENCH_OUT=DIR         where the JSON goes (default bench-results)
#   BENCH_DOC=FILE        where a whole run's table is written, between marker comments
#                         (default docs/performance.md; empty: nowhere; smoke and BENCH_ONLY
#                         runs write it only when this is set)
#   BENCH_ONLY="passthrough protected replay sse memory growth jwt powertools observability cost https stdio"   run only these sections
# Needs wrk, nginx, pgbench/psql (postgresql), a C compiler and python3; section (8) also
# redis-server and the test packages (tests/node_modules).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

smoke=${BENCH_SMOKE:-0}
if [ "$smoke" = 1 ]; then
    duration=${BENCH_DURATION:-1s}
    conns_list=${BENCH_CONNS:-"1 16"}
    load_conns=${BENCH_LOAD_CONNS:-16}
    idle_n=${BENCH_IDLE:-200}
    streams_n=${BENCH_STREAMS:-20}
    sse_calls=${BENCH_SSE_CALLS:-2}
    growth_rows=${BENCH_GROWTH_ROWS:-5000}
else
    duration=${BENCH_DURATION:-10s}
    conns_list=${BENCH_CONNS:-"1 16 64 256"}
    load_conns=${BENCH_LOAD_CONNS:-64}
    idle_n=${BENCH_IDLE:-10000}
    streams_n=${BENCH_STREAMS:-1000}
    sse_calls=${BENCH_SSE_CALLS:-20}
    growth_rows=${BENCH_GROWTH_ROWS:-1000000}
fi
store_pool=${BENCH_STORE_POOL:-4}
out_dir=${BENCH_OUT:-bench-results}
only=${BENCH_ONLY:-"passthrough protected replay sse memory growth jwt powertools observability cost https stdio"}
# (10) alone needs none of the tools, the Postgres cluster or nginx below
if [ "$(echo $only)" = stdio ]; then
    exec scripts/bench/stdio.sh
fi
workers=${BENCH_WORKERS:-$(nproc)}
IDEMGW=${IDEMGW_BIN:-build/idemgw}
# an absolute IDEMGW_BIN is taken as it is, a relative one from the checkout's root
case $IDEMGW in /*) ;; *) IDEMGW=$root/$IDEMGW ;; esac
NODE=${NODE:-$root/tools/node/bin/node}

# pgbench takes whole seconds
secs=${duration%s}
case "$secs" in *[!0-9]* | '') echo "bench: BENCH_DURATION must be whole seconds (e.g. 10s)" >&2; exit 2 ;; esac

for tool in wrk nginx pgbench psql python3 cc curl; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
        echo "bench: $tool not found (scripts/install-deps.sh installs everything)" >&2
        exit 2
    fi
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

# 10,000 idle agent connections need file descriptors in the gateway and in the client.
want_fds=$((idle_n + streams_n * 2 + 1024))
ulimit -n "$want_fds" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$want_fds" ]; then
    idle_n=$(($(ulimit -n) - 1024))
    echo "bench: ulimit -n is $(ulimit -n); using $idle_n idle connections" >&2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/idemgw-bench.XXXXXX")
chmod 755 "$tmp"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    scripts/pg-cluster.sh stop "$tmp/pg" >/dev/null 2>&1 || true
    if [ -n "${BENCH_KEEP_TMP:-}" ]; then echo "bench: kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '%s bench: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
results=$tmp/results.jsonl
: >"$results"
# record SECTION JSON-OBJECT-FIELDS...: appends one result line
record() {
    local section=$1
    shift
    printf '{"section":"%s",%s}\n' "$section" "$*" >>"$results"
}

# free_port, wait_port, gw_ready and metric
bench_name=bench
. "$root/scripts/bench/lib.sh"

# CPU ticks (user + system) of a process and its children: the gateway's workers, nginx's.
tree_ticks() {
    local t=0 p
    for p in $1 $(pgrep -P "$1" 2>/dev/null); do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}
# cpu_us_per_req TICKS WRK-JSON: microseconds of CPU per answered request
cpu_us_per_req() {
    local req
    req=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' <<<"$2")
    awk -v t="$1" -v n="${req:-0}" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { if (n > 0) printf "%.1f", t * 1e6 / hz / n; else printf "null" }'
}
# wrk_cpu MODE PORT CONNS PID: wrk_run, with "cpu_us" (PID's tree, per request) added
wrk_cpu() {
    local t0 w
    t0=$(tree_ticks "$4")
    w=$(wrk_run "$1" "$2" "$3")
    echo "${w%\}},\"cpu_us\":$(cpu_us_per_req $(($(tree_ticks "$4") - t0)) "$w")}"
}

# RSS of a process and its children (the gateway's workers), in KiB.
rss_kib() {
    local total=0 p
    for p in $1 $(pgrep -P "$1" 2>/dev/null); do
        total=$((total + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
    done
    echo "$total"
}

# ---- build the helpers ----------------------------------------------------------------------
mkdir -p build/bench
CFLAGS_BENCH="-O2 -g -Wall -Wextra"
cc $CFLAGS_BENCH -o build/bench/fast-upstream tests/bench/fast-upstream.c
cc $CFLAGS_BENCH -o build/bench/bench-client tests/bench/bench-client.c
make -s "build/libidemgw.a" >/dev/null
# shellcheck disable=SC2046
cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc/store $(pkg-config --cflags libpq libevent) -O2 -o build/bench/print-sql tests/bench/print-sql.c \
    build/libidemgw.a $(pkg-config --libs libevent libevent_openssl jansson libfyaml libpq openssl sqlite3 zlib libbrotlidec) -lm -pthread

# ---- Postgres, upstream, nginx --------------------------------------------------------------
log "starting Postgres"
pg_url=$(scripts/pg-cluster.sh start "$tmp/pg")
psql_() { psql "$pg_url" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

up_port=$(free_port)
build/bench/fast-upstream "$up_port" 1000 >"$tmp/upstream.log" 2>&1 &
up_pid=$!
pids+=($!)
wait_port "$up_port" "fast upstream"

ngx_port=$(free_port)
otlp_port=$(free_port)
mkdir -p "$tmp/nginx/logs" "$tmp/nginx/tmp"
chmod 777 "$tmp/nginx/tmp"
cat >"$tmp/nginx/nginx.conf" <<EOF
worker_processes auto;
daemon off;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log warn;
worker_rlimit_nofile $want_fds;
events { worker_connections 20000; }
http {
    access_log off;
    client_body_temp_path $tmp/nginx/tmp/body;
    proxy_temp_path $tmp/nginx/tmp/proxy;
    fastcgi_temp_path $tmp/nginx/tmp/fastcgi;
    uwsgi_temp_path $tmp/nginx/tmp/uwsgi;
    scgi_temp_path $tmp/nginx/tmp/scgi;
    upstream mcp { server 127.0.0.1:$up_port; keepalive 64; }
    # the OTLP endpoint of the observability section: takes every batch, answers {}
    server {
        listen 127.0.0.1:$otlp_port;
        client_max_body_size 64m;
        location / { return 200 '{}'; }
    }
    server {
        listen 127.0.0.1:$ngx_port;
        keepalive_requests 1000000;
        location / {
            proxy_pass http://mcp;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
"$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -e "$tmp/nginx/logs/error.log" >"$tmp/nginx.log" 2>&1 &
ngx_pid=$!
pids+=($!)
wait_port "$ngx_port" nginx

# ---- the gateway ----------------------------------------------------------------------------
gw_port=$(free_port)
gw_admin=$(free_port)
cat >"$tmp/idemgw.yaml" <<EOF
listen: 127.0.0.1:$gw_port
admin_listen: 127.0.0.1:$gw_admin
workers: $workers
upstream: http://127.0.0.1:$up_port/mcp
database_url: $pg_url
store:
  pool: $store_pool
limits:
  max_connections: $((idle_n + streams_n + 1000))
timeouts:
  client_idle: 600s
  drain: 1s
$(bench_policy stream hold)
EOF
gw_pid=
start_gw() {
    "$IDEMGW" -c "$tmp/idemgw.yaml" >>"$tmp/idemgw.log" 2>&1 &
    gw_pid=$!
    pids+=("$gw_pid")
    gw_ready "$gw_port" "$gw_admin" "$tmp/idemgw.log" idemgw
}
stop_gw() {
    kill "$gw_pid" 2>/dev/null || true
    wait "$gw_pid" 2>/dev/null || true
}
log "starting idemgw"
start_gw

# ---- sanity: every path answers what a benchmark assumes ------------------------------------
call() { # PORT TOOL ARGS -> headers and body
    curl -s -D - -o - "http://127.0.0.1:$1/mcp" -H 'Content-Type: application/json' \
        -H 'Accept: application/json, text/event-stream' \
        --data "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"$2\",\"arguments\":$3}}"
}
for p in "$up_port" "$ngx_port" "$gw_port"; do
    if ! call "$p" search '{"q":1}' | grep -q '"text":"ok"'; then
        echo "bench: read call on port $p did not answer the fixed result" >&2
        call "$p" search '{"q":1}' >&2 || true
        exit 1
    fi
done
sanity_run=$RANDOM$RANDOM
first=$(call "$gw_port" write "{\"sanity\":\"$sanity_run\"}")
second=$(call "$gw_port" write "{\"sanity\":\"$sanity_run\"}")
if ! grep -q '"text":"ok"' <<<"$first" || ! grep -qi '^Idempotent-Replayed: true' <<<"$second"; then
    echo "bench: protected call / replay does not behave as expected:" >&2
    printf '%s\n---\n%s\n' "$first" "$second" >&2
    exit 1
fi
key_len=$(psql_ -c "SELECT max(length(key)) FROM idem_keys")

# ---- wrk ------------------------------------------------------------------------------------
# wrk_run MODE PORT CONNS [RUN_ID] -> prints the JSON object of mcp.lua's done()
wrk_run() {
    local mode=$1 port=$2 conns=$3 run=${4:-$RANDOM$RANDOM} threads=2 out
    [ "$conns" -lt 2 ] && threads=1
    out=$(BENCH_MODE=$mode BENCH_RUN=$run wrk -t"$threads" -c"$conns" -d"$duration" --timeout 10s \
        -s scripts/bench/mcp.lua "http://127.0.0.1:$port/mcp" 2>&1) || true
    local json
    json=$(sed -n 's/^BENCHJSON //p' <<<"$out")
    if [ -z "$json" ]; then
        echo "bench: wrk failed ($mode on port $port, $conns connections):" >&2
        echo "$out" >&2
        json='{"requests":0,"rps":0,"p50_us":0,"p99_us":0,"errors":-1,"non2xx":0}'
    fi
    echo "$json"
}
succeeded_rows() { psql_ -c "SELECT count(*) FROM idem_keys WHERE state = 'succeeded'"; }

want() { [[ " $only " == *" $1 "* ]]; }

# ---- (1) pass-through -----------------------------------------------------------------------
if want passthrough; then
    if [ "$smoke" != 1 ]; then
        log "warming up"
        for p in "$up_port" "$ngx_port" "$gw_port"; do
            BENCH_MODE=read wrk -t2 -c64 -d1s -s scripts/bench/mcp.lua "http://127.0.0.1:$p/mcp" >/dev/null 2>&1 || true
        done
    fi
    # Each connection count runs in rounds (BENCH_PASS_ROUNDS, 3; smoke 1), the three targets back
    # to back in each, their order turned by one every round; the report takes each target's
    # median round and counts the rounds in which idemgw answered at least nginx's rate (a burst
    # of the shared machine's other work hits one run, not the same target every round).
    pass_rounds=${BENCH_PASS_ROUNDS:-$([ "$smoke" = 1 ] && echo 1 || echo 3)}
    pass_targets=(direct nginx idemgw)
    for c in $conns_list; do
        for r in $(seq 1 "$pass_rounds"); do
            for i in 0 1 2; do
                target=${pass_targets[$(((i + r - 1) % 3))]}
                case $target in
                    direct) p=$up_port who=$up_pid ;;
                    nginx) p=$ngx_port who=$ngx_pid ;;
                    idemgw) p=$gw_port who=$gw_pid ;;
                esac
                log "pass-through: $target, $c connections, round $r of $pass_rounds"
                # cpu_us: the CPU of the proxy (direct: the upstream's own) per request
                record passthrough "\"conns\":$c,\"round\":$r,\"target\":\"$target\",\"wrk\":$(wrk_cpu read "$p" "$c" "$who")"
            done
        done
    done
fi

# ---- (2) protected first executions vs the pgbench ceiling ----------------------------------
pgbench_run() { # -> JSON fields; uses the gateway's claim + finish statements
    local result_hex
    result_hex=$(printf '%s' '{"content":[{"type":"text","text":"ok"}]}' | od -An -tx1 | tr -d ' \n')
    local out
    # as many clients as the gateway has store connections: store.pool per worker
    local clients=$((store_pool * workers))
    out=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$secs" \
        -f scripts/bench/claim-finish.sql \
        -D c2=write -D c3=bench -D c4="$(printf 'a%.0s' $(seq 64))" -D c5=f -D c6=bench-session \
        -D c7=1 -D c8=90000 -D c9=3600000 -D c10=t -D c11=99999999999999 -D c12=0123456789abcdef0123456789abcdef \
        -D f2=1 -D f3=succeeded -D f4="\\x$result_hex" -D f5=f -D f6=3600000 \
        -D 'tsfmt=YYYY-MM-DD"T"HH24:MI:SS.MS"Z"' "$pg_url" 2>&1) || {
        echo "bench: pgbench failed:" >&2
        echo "$out" >&2
        echo '"tps":0,"latency_ms":0,"transactions":0'
        return
    }
    local tps lat n
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out" | tail -n 1)
    lat=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' <<<"$out")
    n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
    echo "\"tps\":${tps:-0},\"latency_ms\":${lat:-0},\"transactions\":${n:-0},\"clients\":$((store_pool * workers))"
}
sql_matches=false
if diff <(build/bench/print-sql) <(grep -v '^--' scripts/bench/claim-finish.sql | grep -v '^\\set' |
    sed -e "s/:tsfmt/'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'/g" -e 's/:key::/$1::/g' \
        -e 's/:[cf]\([0-9][0-9]*\)::/$\1::/g' -e 's/;$//') >"$tmp/sql.diff"; then
    sql_matches=true
else
    log "WARNING: scripts/bench/claim-finish.sql differs from the statements in src/store/store_pg_sql.c:"
    cat "$tmp/sql.diff" >&2
fi

if want protected; then
    log "protected first executions through idemgw, $load_conns connections"
    before=$(succeeded_rows)
    gw=$(wrk_run protected "$gw_port" "$load_conns")
    after=$(succeeded_rows)
    log "pgbench ceiling: claim + finish, $((store_pool * workers)) clients"
    record protected "\"conns\":$load_conns,\"store_pool\":$store_pool,\"workers\":$workers,\"idemgw\":$gw,\"rows_finished\":$((after - before)),\"pgbench\":{$(pgbench_run)},\"sql_matches_store\":$sql_matches,\"gateway_key_length\":${key_len:-0}"

    # The same load on the embedded store: a gateway of its own (one process: the file takes
    # one), the same config otherwise, a fresh SQLite file in the run's folder.
    sq_port=$(free_port)
    sq_admin=$(free_port)
    sed -e "s/^listen: .*/listen: 127.0.0.1:$sq_port/" -e "s/^admin_listen: .*/admin_listen: 127.0.0.1:$sq_admin/" \
        -e "s/^workers: .*/workers: 1/" -e "s|^database_url: .*|database_url: sqlite:$tmp/keys.db|" \
        "$tmp/idemgw.yaml" >"$tmp/idemgw-sqlite.yaml"
    "$IDEMGW" -c "$tmp/idemgw-sqlite.yaml" >>"$tmp/idemgw-sqlite.log" 2>&1 &
    sq_pid=$!
    pids+=("$sq_pid")
    gw_ready "$sq_port" "$sq_admin" "$tmp/idemgw-sqlite.log" "idemgw (sqlite)"
    log "protected first executions through idemgw on the embedded SQLite store, $load_conns connections"
    sq=$(wrk_run protected "$sq_port" "$load_conns")
    kill "$sq_pid" 2>/dev/null || true
    wait "$sq_pid" 2>/dev/null || true
    record protected_sqlite "\"conns\":$load_conns,\"workers\":1,\"idemgw\":$sq"
fi

# ---- (3) replays ----------------------------------------------------------------------------
if want replay; then
    log "replays through idemgw, $load_conns connections (and pass-through at the same count)"
    pt=$(wrk_cpu read "$gw_port" "$load_conns" "$gw_pid")
    rp=$(wrk_cpu replay "$gw_port" "$load_conns" "$gw_pid")
    record replay "\"conns\":$load_conns,\"idemgw\":$rp,\"passthrough\":$pt"
fi

# ---- (4) SSE: upstream write -> agent receipt -----------------------------------------------
if want sse; then
    # in rounds as section (1) (BENCH_SSE_ROUNDS, 3; smoke 1): a p99 of a few thousand events
    # moves with the machine's other work from one run to the next
    sse_rounds=${BENCH_SSE_ROUNDS:-$([ "$smoke" = 1 ] && echo 1 || echo 3)}
    sse_targets=(direct nginx idemgw idemgw_protected)
    for r in $(seq 1 "$sse_rounds"); do
        for i in 0 1 2 3; do
            target=${sse_targets[$(((i + r - 1) % 4))]}
            tool=stream
            case $target in
            direct) p=$up_port ;;
            nginx) p=$ngx_port ;;
            idemgw) p=$gw_port ;;
            idemgw_protected) p=$gw_port tool=stream_protected ;;
            esac
            log "SSE: $target, $sse_calls calls of 100 progress events, round $r of $sse_rounds"
            l=$(build/bench/bench-client sse "$p" /mcp "$sse_calls" "$tool") || l='{"events":0}'
            record sse "\"round\":$r,\"target\":\"$target\",\"tool\":\"$tool\",\"latency\":$l"
        done
    done
fi

# ---- (5) memory -----------------------------------------------------------------------------
# A fresh gateway for each figure, so freed memory from earlier runs does not hide the cost.
# wait_ready FILE: waits for the client's "ready" line
wait_ready() {
    for _ in $(seq 1 1200); do
        grep -q '^ready' "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
if want memory; then
    for kind in idle hold; do
        n=$idle_n
        [ $kind = hold ] && n=$streams_n
        stop_gw
        start_gw
        # warm up the allocator and the upstream pool with a few calls
        build/bench/bench-client idle "$gw_port" /mcp 10 >"$tmp/warm.out" 2>&1 &
        wpid=$!
        pids+=("$wpid")
        wait_ready "$tmp/warm.out" || true
        kill "$wpid"
        wait "$wpid" 2>/dev/null || true
        sleep 0.5
        base=$(rss_kib "$gw_pid")
        log "memory: $n $kind connections"
        build/bench/bench-client "$kind" "$gw_port" /mcp "$n" >"$tmp/client.out" 2>&1 &
        cpid=$!
        pids+=("$cpid")
        ok=true
        wait_ready "$tmp/client.out" || { ok=false; log "client did not open its $n connections:"; cat "$tmp/client.out" >&2; }
        sleep 0.5
        with=$(rss_kib "$gw_pid")
        kill "$cpid"
        wait "$cpid" 2>/dev/null || true
        record memory "\"kind\":\"$kind\",\"connections\":$n,\"opened\":$ok,\"rss_before_kib\":$base,\"rss_with_kib\":$with"
    done
    stop_gw
    start_gw
fi

# ---- (6) growth: 1 thousand vs many live rows -----------------------------------------------
bulk_rows() { # FROM TO
    psql_ -c "INSERT INTO idem_keys (key, tool, subject, args_digest, state, fence, attempts, result,
                  first_session_id, first_jsonrpc_id, lease_until, finished_at, expires_at)
              SELECT 'bulk:write:h:' || md5(i::text) || md5((-i)::text), 'write', 'bulk',
                     md5(i::text) || md5((-i)::text), 'succeeded', 1, 1,
                     convert_to('{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}', 'UTF8'),
                     'bench-session', '1', now() + interval '1 hour', now(), now() + interval '2 hours'
              FROM generate_series($1, $2) AS i" -c "VACUUM ANALYZE idem_keys" -c "CHECKPOINT"
}
if want growth; then
    psql_ -c "TRUNCATE idem_keys"
    bulk_rows 1 1000
    small=1000
    for rows in "$small" "$growth_rows"; do
        if [ "$rows" != "$small" ]; then
            log "growth: inserting rows up to $rows"
            t0=$(date +%s.%N)
            bulk_rows $((small + 1)) "$rows"
            t1=$(date +%s.%N)
            insert_s=$(python3 -c "print(round($t1 - $t0, 2))")
        fi
        live=$(psql_ -c "SELECT count(*) FROM idem_keys")
        log "growth: $live live rows: protected and replay, $load_conns connections"
        pr=$(wrk_run protected "$gw_port" "$load_conns")
        rp=$(wrk_run replay "$gw_port" "$load_conns")
        record growth "\"rows\":$rows,\"live_rows_at_start\":$live,\"conns\":$load_conns,\"protected\":$pr,\"replay\":$rp${insert_s:+,\"bulk_insert_s\":$insert_s}"
    done
fi

# ---- (7) JWT verification per protected call ------------------------------------------------
if want jwt; then
    log "jwt: verifying RS256 and ES256 tokens"
    # shellcheck disable=SC2046
    cc -std=c11 -D_GNU_SOURCE -Iinclude -O2 -o build/bench/jwt-bench tests/bench/jwt-bench.c \
        build/libidemgw.a $(pkg-config --libs libevent libevent_openssl jansson libfyaml libpq openssl sqlite3) -lm
    "$NODE" tests/bench/jwt-tokens.mjs "$tmp"
    verifies=$([ "$smoke" = 1 ] && echo 200 || echo 20000)
    while read -r line; do
        printf '{"section":"jwt",%s\n' "${line#\{}" >>"$results"
    done < <(build/bench/jwt-bench "$tmp/jwks.json" "$tmp/tokens.txt" "$verifies")
fi

# ---- (8) idempotency in the server: AWS Lambda Powertools + durable Redis vs idemgw ----------
# One official MCP SDK server (tests/fixtures/powertools-server.mjs, stateless, JSON answers)
# three ways: plain; with its tool wrapped by Powertools' makeIdempotent over Redis (appendonly,
# appendfsync always: a record is on disk before Redis answers); plain behind idemgw on
# Postgres (idemgw_pg: one statement per call, store.group_commit: false; idemgw_pg_gc: group
# commit, as configured by default; idemgw_pg_cd: with store.commit_delay: 2ms too) and on the
# embedded SQLite store (as configured by default, and with store.commit_delay: 2ms). First executions and replays, 1 and 16 keep-alive connections, the same wrk client;
# each (mode, connections) pair runs in rounds, every target back to back in each round, and the
# report takes the median over the rounds (a shared machine's bursts hit one round, not all).
#   BENCH_PT_DURATION=6s  length of each run of this section (2 s rounds let Powertools' own
#                         rounds at 16 clients spread from 911 to 1,662 calls/s, one above the
#                         plain server's: no verdict could be read from five of them)
#   BENCH_PT_ROUNDS=5     rounds per (mode, connections)
#   BENCH_PT_CONNS="1 16" BENCH_PT_WORKERS=1 (the gateways' workers)
if want powertools; then
    pt_secs=${BENCH_PT_DURATION:-$([ "$smoke" = 1 ] && echo 1s || echo 6s)}
    pt_rounds=${BENCH_PT_ROUNDS:-$([ "$smoke" = 1 ] && echo 1 || echo 5)}
    pt_conns=${BENCH_PT_CONNS:-"1 16"}
    pt_workers=${BENCH_PT_WORKERS:-1}
    REDIS=$(command -v redis-server || echo /usr/bin/redis-server)
    [ -x "$REDIS" ] || { echo "bench: redis-server not found (scripts/install-deps.sh installs it)" >&2; exit 2; }

    rd_port=$(free_port)
    mkdir -p "$tmp/redis"
    "$REDIS" --bind 127.0.0.1 --port "$rd_port" --dir "$tmp/redis" --appendonly yes \
        --appendfsync always --save '' --daemonize no --logfile "$tmp/redis/redis.log" &
    pids+=($!)
    wait_port "$rd_port" redis-server

    start_node() { # NAME PORT [ENV=VALUE...]
        local name=$1 port=$2
        shift 2
        env "$@" "$NODE" tests/fixtures/powertools-server.mjs "$port" >"$tmp/$name.log" 2>&1 &
        pids+=($!)
        wait_port "$port" "$name"
    }
    plain_port=$(free_port)
    start_node sdk-plain "$plain_port"
    ptl_port=$(free_port)
    start_node sdk-powertools "$ptl_port" REDIS_URL="redis://127.0.0.1:$rd_port"

    # gateways in front of the plain server: NAME DATABASE_URL GROUP_COMMIT WORKERS [COMMIT_DELAY]
    start_pt_gw() {
        local name=$1 db=$2 gc=$3 w=$4 cd=${5:-0ms} port admin
        port=$(free_port)
        admin=$(free_port)
        sed -e "s/^listen: .*/listen: 127.0.0.1:$port/" -e "s/^admin_listen: .*/admin_listen: 127.0.0.1:$admin/" \
            -e "s/^workers: .*/workers: $w/" -e "s|^database_url: .*|database_url: $db|" \
            -e "s|^upstream: .*|upstream: http://127.0.0.1:$plain_port/mcp|" \
            -e "s/^  pool: .*/  pool: $store_pool\n  group_commit: $gc\n  commit_delay: $cd/" \
            "$tmp/idemgw.yaml" >"$tmp/$name.yaml"
        "$IDEMGW" -c "$tmp/$name.yaml" >"$tmp/$name.log" 2>&1 &
        pids+=($!)
        eval "${name}_pid=$! ${name}_port=$port"
        gw_ready "$port" "$admin" "$tmp/$name.log" "$name"
    }
    start_pt_gw gw_pg "$pg_url" false "$pt_workers"
    start_pt_gw gw_pggc "$pg_url" true "$pt_workers"
    start_pt_gw gw_pgcd "$pg_url" true "$pt_workers" 2ms
    start_pt_gw gw_sqlite "sqlite:$tmp/pt-keys.db" false 1
    start_pt_gw gw_sqlite_cd "sqlite:$tmp/pt-keys-cd.db" false 1 2ms
    targets="plain powertools idemgw_pg idemgw_pg_gc idemgw_pg_cd idemgw_sqlite idemgw_sqlite_cd"
    port_of() {
        case $1 in
        plain) echo "$plain_port" ;;
        powertools) echo "$ptl_port" ;;
        idemgw_pg) echo "$gw_pg_port" ;;
        idemgw_pg_gc) echo "$gw_pggc_port" ;;
        idemgw_pg_cd) echo "$gw_pgcd_port" ;;
        idemgw_sqlite) echo "$gw_sqlite_port" ;;
        idemgw_sqlite_cd) echo "$gw_sqlite_cd_port" ;;
        esac
    }

    # sanity: each answers the write; the idempotent ones replay it (Powertools' replay looks
    # like a first answer, so Redis must hold the key instead)
    for t in $targets; do
        p=$(port_of "$t")
        a=$(call "$p" write "{\"q\":\"sanity-$sanity_run\"}")
        b=$(call "$p" write "{\"q\":\"sanity-$sanity_run\"}")
        if ! grep -q '"text":"ok"' <<<"$a" || ! grep -q '"text":"ok"' <<<"$b" ||
            { [[ $t == idemgw* ]] && ! grep -qi '^Idempotent-Replayed: true' <<<"$b"; }; then
            echo "bench: $t does not answer the write as expected:" >&2
            printf '%s\n---\n%s\n' "$a" "$b" >&2
            exit 1
        fi
    done
    if [ "$(redis-cli -p "$rd_port" --raw config get appendfsync | tail -n 1)" != always ] ||
        [ "$(redis-cli -p "$rd_port" dbsize)" -lt 1 ]; then
        echo "bench: Redis is not durable (appendfsync) or holds no Powertools record" >&2
        exit 1
    fi

    saved_duration=$duration saved_secs=$secs
    duration=$pt_secs secs=${pt_secs%s}
    if [ "$smoke" != 1 ]; then
        log "powertools: warming up"
        for t in $targets; do
            BENCH_MODE=protected BENCH_RUN=warm$RANDOM wrk -t2 -c16 -d1s -s scripts/bench/mcp.lua \
                "http://127.0.0.1:$(port_of "$t")/mcp" >/dev/null 2>&1 || true
        done
    fi
    for mode in protected replay; do
        for c in $pt_conns; do
            log "powertools: $mode, $c connections, $pt_rounds rounds of: $targets"
            for r in $(seq 1 "$pt_rounds"); do
                for t in $targets; do
                    record powertools "\"mode\":\"$mode\",\"conns\":$c,\"round\":$r,\"target\":\"$t\",\"wrk\":$(wrk_run "$mode" "$(port_of "$t")" "$c")"
                done
            done
        done
    done
    log "powertools: pgbench ceiling, claim + finish, $((store_pool * pt_workers)) clients"
    pt_pgbench=$(workers=$pt_workers pgbench_run)
    duration=$saved_duration secs=$saved_secs

    # The group-commit gateway logs its batch counts as its store closes, at level info: the
    # runs above were at warn (info logs every recorded key), so reload at info, then stop.
    sed -i "s/^  level: .*/  level: info/" "$tmp/gw_pggc.yaml"
    kill -HUP "$gw_pggc_pid"
    for _ in $(seq 1 100); do
        grep -q 'configuration reloaded' "$tmp/gw_pggc.log" && break
        sleep 0.05
    done
    for g in gw_pg gw_pggc gw_pgcd gw_sqlite gw_sqlite_cd; do
        eval "gp=\$${g}_pid"
        kill "$gp" 2>/dev/null || true
        wait "$gp" 2>/dev/null || true
    done
    batches=$(sed -n 's/.*store: group commit: \([0-9]*\) claims in \([0-9]*\) batches, \([0-9]*\) finishes in \([0-9]*\) batches.*/\1 \2 \3 \4/p' "$tmp/gw_pggc.log" |
        awk '{a+=$1; b+=$2; c+=$3; d+=$4} END {printf "\"claims_batched\":%d,\"claim_batches\":%d,\"finishes_batched\":%d,\"finish_batches\":%d", a, b, c, d}')
    record powertools_meta "\"workers\":$pt_workers,\"rounds\":$pt_rounds,\"store_pool\":$store_pool,\"duration\":\"$pt_secs\",\"pgbench\":{$pt_pgbench},\"group_commit\":{$batches},\"redis\":\"$("$REDIS" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') appendonly yes appendfsync always\""
fi

# ---- (9) the cost of metrics and tracing -----------------------------------------------------
# A gateway of its own per variant (the same config plus the tracing lines): tracing off, off
# with /metrics scraped 10 times a second during the load, traces sampled at 10 %, every trace
# exported (to nginx answering {}). Protected first executions and plain proxied reads each.
# The variants take turns, BENCH_OBS_ROUNDS rounds (3; smoke 1), and each variant's median run
# is kept: on a shared machine the load drifts, and taking turns spreads it over all of them.
# start_variant NAME [SED-EXPRESSION...]: a gateway of its own, the bench config on ports of its
# own with the expressions applied ($tmp/idemgw-NAME.yaml), started and ready; its port, admin
# port and pid in v_port, v_admin, v_pid
start_variant() {
    local name=$1 e
    shift
    v_port=$(free_port)
    v_admin=$(free_port)
    local args=(-e "s/^listen: .*/listen: 127.0.0.1:$v_port/" -e "s/^admin_listen: .*/admin_listen: 127.0.0.1:$v_admin/")
    for e in "$@"; do args+=(-e "$e"); done
    sed "${args[@]}" "$tmp/idemgw.yaml" >"$tmp/idemgw-$name.yaml"
    "$IDEMGW" -c "$tmp/idemgw-$name.yaml" >>"$tmp/idemgw-$name.log" 2>&1 &
    v_pid=$!
    pids+=("$v_pid")
    gw_ready "$v_port" "$v_admin" "$tmp/idemgw-$name.log" "idemgw ($name)"
}
if want observability; then
    obs_rounds=${BENCH_OBS_ROUNDS:-$([ "$smoke" = 1 ] && echo 1 || echo 3)}
    declare -A ob_ports ob_admins ob_pids
    for variant in off scrape sampled on; do
        ob_port=$(free_port)
        ob_admin=$(free_port)
        sed -e "s/^listen: .*/listen: 127.0.0.1:$ob_port/" -e "s/^admin_listen: .*/admin_listen: 127.0.0.1:$ob_admin/" \
            "$tmp/idemgw.yaml" >"$tmp/idemgw-ob-$variant.yaml"
        case $variant in
        sampled) printf 'otlp_endpoint: http://127.0.0.1:%s\notlp_sample_ratio: 0.1\n' "$otlp_port" >>"$tmp/idemgw-ob-$variant.yaml" ;;
        on) printf 'otlp_endpoint: http://127.0.0.1:%s\n' "$otlp_port" >>"$tmp/idemgw-ob-$variant.yaml" ;;
        esac
        "$IDEMGW" -c "$tmp/idemgw-ob-$variant.yaml" >>"$tmp/idemgw-ob-$variant.log" 2>&1 &
        ob_pids[$variant]=$!
        pids+=("${ob_pids[$variant]}")
        ob_ports[$variant]=$ob_port
        ob_admins[$variant]=$ob_admin
        gw_ready "$ob_port" "$ob_admin" "$tmp/idemgw-ob-$variant.log" "idemgw ($variant)"
        if [ "$smoke" != 1 ]; then
            BENCH_MODE=read wrk -t2 -c"$load_conns" -d1s -s scripts/bench/mcp.lua "http://127.0.0.1:$ob_port/mcp" >/dev/null 2>&1 || true
        fi
    done
    for mode in protected read; do
        for round in $(seq 1 "$obs_rounds"); do
            for variant in off scrape sampled on; do
                ob_admin=${ob_admins[$variant]}
                scraper=
                : >"$tmp/scrapes"
                if [ "$variant" = scrape ]; then
                    (while :; do
                        curl -sf -o /dev/null "http://127.0.0.1:$ob_admin/metrics" && echo >>"$tmp/scrapes"
                        sleep 0.1
                    done) &
                    scraper=$!
                    pids+=("$scraper")
                fi
                exported=$(metric "$ob_admin" idemgw_spans_exported_total)
                dropped=$(metric "$ob_admin" idemgw_spans_dropped_total)
                log "observability: round $round, tracing $variant, $mode calls, $load_conns connections"
                w=$(wrk_run "$mode" "${ob_ports[$variant]}" "$load_conns")
                if [ -n "$scraper" ]; then
                    kill "$scraper" 2>/dev/null || true
                    wait "$scraper" 2>/dev/null || true
                fi
                # what the exporter still holds leaves within its flush period
                [ "$variant" = sampled ] || [ "$variant" = on ] && sleep 1.5
                exported=$(($(metric "$ob_admin" idemgw_spans_exported_total) - exported))
                dropped=$(($(metric "$ob_admin" idemgw_spans_dropped_total) - dropped))
                record observability "\"variant\":\"$variant\",\"mode\":\"$mode\",\"round\":$round,\"conns\":$load_conns,\"idemgw\":$w,\"scrapes\":$(wc -l <"$tmp/scrapes"),\"spans_exported\":$exported,\"spans_dropped\":$dropped"
            done
        done
    done
    for variant in off scrape sampled on; do
        kill "${ob_pids[$variant]}" 2>/dev/null || true
        wait "${ob_pids[$variant]}" 2>/dev/null || true
    done
fi

# ---- (11) what a call costs the gateway -----------------------------------------------------
# One worker in front of the C upstream, tracing off: the gateway's CPU (user + system, from
# /proc, its store's threads included) per relayed read and per protected first execution, on
# the embedded store and on Postgres, and the upstream connections each kind opens per 1,000
# calls (idemgw_upstream_connections_total). BENCH_COST_ROUNDS rounds (3; smoke 1), the kinds
# taking turns within each; the report keeps every round and the median.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# the main thread alone: the event loop, without the embedded store's writer thread
loop_ticks() { awk '{print $14 + $15}' "/proc/$1/task/$1/stat"; }
# Postgres's CPU: its server processes' ticks (the gateway's store connections are long-lived
# backends, so a run's statements are counted in them)
pg_ticks() {
    local home=$tmp/pg pm
    [ -f "$tmp/pg/cluster" ] && home=$(cat "$tmp/pg/cluster") # as root: the cluster's own folder
    pm=$(head -n 1 "$home/data/postmaster.pid" 2>/dev/null) || { echo 0; return; }
    tree_ticks "$pm"
}
if want cost; then
    cost_rounds=${BENCH_COST_ROUNDS:-$([ "$smoke" = 1 ] && echo 1 || echo 3)}
    hz=$(getconf CLK_TCK)
    declare -A cost_port cost_admin cost_pid
    for store in sqlite postgres; do
        db=$pg_url
        [ "$store" = sqlite ] && db="sqlite:$tmp/cost-keys.db"
        start_variant "cost-$store" "s/^workers: .*/workers: 1/" "s|^database_url: .*|database_url: $db|"
        cost_port[$store]=$v_port cost_admin[$store]=$v_admin cost_pid[$store]=$v_pid
        if [ "$smoke" != 1 ]; then
            BENCH_MODE=protected BENCH_RUN=warm$RANDOM wrk -t1 -c16 -d1s -s scripts/bench/mcp.lua \
                "http://127.0.0.1:${cost_port[$store]}/mcp" >/dev/null 2>&1 || true
        fi
    done
    for c in 1 16; do
        for round in $(seq 1 "$cost_rounds"); do
            for store in sqlite postgres; do
                for mode in read protected; do
                    pid=${cost_pid[$store]}
                    conns0=$(metric "${cost_admin[$store]}" idemgw_upstream_connections_total)
                    t0=$(cpu_ticks "$pid") l0=$(loop_ticks "$pid") p0=$(pg_ticks)
                    log "cost: round $round, $mode calls, $store store, $c connections"
                    w=$(wrk_run "$mode" "${cost_port[$store]}" "$c")
                    # the loop's window inside the process's (each figure is rounded to ticks)
                    l1=$(loop_ticks "$pid") t1=$(cpu_ticks "$pid") p1=$(pg_ticks)
                    conns1=$(metric "${cost_admin[$store]}" idemgw_upstream_connections_total)
                    pg_ms=null
                    [ "$store" = postgres ] && pg_ms=$(((p1 - p0) * 1000 / hz))
                    record cost "\"store\":\"$store\",\"mode\":\"$mode\",\"conns\":$c,\"round\":$round,\"idemgw\":$w,\"cpu_ms\":$(((t1 - t0) * 1000 / hz)),\"loop_cpu_ms\":$(((l1 - l0) * 1000 / hz)),\"postgres_cpu_ms\":$pg_ms,\"upstream_connections\":$((conns1 - conns0))"
                done
            done
        done
    done
    for store in sqlite postgres; do
        kill "${cost_pid[$store]}" 2>/dev/null || true
        wait "${cost_pid[$store]}" 2>/dev/null || true
    done
fi

# ---- (12) an https upstream --------------------------------------------------------------------
# nginx terminates TLS 1.3 (session tickets on) in front of the C upstream; one gateway worker
# reaches it over https, another over plain http, in the same run. Relayed reads and protected
# first executions, and the upstream connections and TLS handshakes (full and resumed,
# idemgw_upstream_tls_handshakes_total) per 1,000 calls.
if want https; then
    mkdir -p "$tmp/tls"
    (
        cd "$tmp/tls"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
            -out ca.pem -days 2 -subj /CN=bench-ca >/dev/null 2>&1
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key \
            -out server.csr -subj /CN=127.0.0.1 >/dev/null 2>&1
        printf 'subjectAltName=IP:127.0.0.1\n' >ext.cnf
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
            -days 2 -extfile ext.cnf >/dev/null 2>&1
    )
    tls_port=$(free_port)
    mkdir -p "$tmp/nginx-tls/logs" "$tmp/nginx-tls/tmp"
    chmod 777 "$tmp/nginx-tls/tmp"
    {
        echo "worker_processes 1; daemon off; pid $tmp/nginx-tls/nginx.pid;"
        echo "error_log $tmp/nginx-tls/logs/error.log warn;"
        echo "events { worker_connections 4096; }"
        echo "http {"
        echo "    access_log off;"
        for d in client_body proxy fastcgi uwsgi scgi; do echo "    ${d}_temp_path $tmp/nginx-tls/tmp/$d;"; done
        echo "    upstream mcp { server 127.0.0.1:$up_port; keepalive 64; }"
        echo "    server {"
        echo "        listen 127.0.0.1:$tls_port ssl;"
        echo "        ssl_certificate $tmp/tls/server.pem; ssl_certificate_key $tmp/tls/server.key;"
        echo "        ssl_protocols TLSv1.3; ssl_session_tickets on; keepalive_requests 1000000;"
        echo "        location / { proxy_pass http://mcp; proxy_http_version 1.1; proxy_set_header Connection \"\"; }"
        echo "    }"
        echo "}"
    } >"$tmp/nginx-tls/nginx.conf"
    "$NGINX" -p "$tmp/nginx-tls" -c "$tmp/nginx-tls/nginx.conf" -e "$tmp/nginx-tls/logs/error.log" >"$tmp/nginx-tls.log" 2>&1 &
    pids+=($!)
    wait_port "$tls_port" "nginx (TLS)"
    declare -A tl_port tl_admin tl_pid
    for scheme in http https; do
        up="http://127.0.0.1:$up_port/mcp"
        [ "$scheme" = https ] && up="https://127.0.0.1:$tls_port/mcp"
        start_variant "tls-$scheme" "s/^workers: .*/workers: 1/" \
            "s|^upstream: .*|upstream: $up\nupstream_ca_file: $tmp/tls/ca.pem|"
        tl_port[$scheme]=$v_port tl_admin[$scheme]=$v_admin tl_pid[$scheme]=$v_pid
    done
    if ! call "${tl_port[https]}" search '{"q":1}' | grep -q '"text":"ok"'; then
        echo "bench: a read through the https upstream did not answer:" >&2
        tail -n 20 "$tmp/idemgw-tls-https.log" >&2
        exit 1
    fi
    full_m='idemgw_upstream_tls_handshakes_total{resumed="false"}'
    res_m='idemgw_upstream_tls_handshakes_total{resumed="true"}'
    for c in 1 16; do
        for mode in read protected; do
            for scheme in http https; do
                a=${tl_admin[$scheme]}
                full0=$(metric "$a" "$full_m") res0=$(metric "$a" "$res_m")
                conns0=$(metric "$a" idemgw_upstream_connections_total)
                log "https: $mode calls, $scheme upstream, $c connections"
                w=$(wrk_run "$mode" "${tl_port[$scheme]}" "$c")
                full=$(($(metric "$a" "$full_m") - full0)) res=$(($(metric "$a" "$res_m") - res0))
                conns=$(($(metric "$a" idemgw_upstream_connections_total) - conns0))
                record https "\"scheme\":\"$scheme\",\"mode\":\"$mode\",\"conns\":$c,\"idemgw\":$w,\"handshakes_full\":$full,\"handshakes_resumed\":$res,\"upstream_connections\":$conns"
            done
        done
    done
    for scheme in http https; do
        kill "${tl_pid[$scheme]}" 2>/dev/null || true
        wait "${tl_pid[$scheme]}" 2>/dev/null || true
    done
fi

# ---- report ---------------------------------------------------------------------------------
mkdir -p "$out_dir"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 scripts/bench/report.py "$results" "$out_dir/latest.json" \
    --meta "{\"commit\":\"$commit\",\"duration\":\"$duration\",\"smoke\":$([ "$smoke" = 1 ] && echo true || echo false),\"cpus\":$(nproc),\"store_pool\":$store_pool,\"workers\":$workers,\"load_conns\":$load_conns,\"sections\":\"$only\",\"loadavg_at_end\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
cp "$out_dir/latest.json" "$out_dir/bench-$(date +%Y%m%d-%H%M%S).json"
# A whole run's table goes into the documentation too (BENCH_DOC, default docs/performance.md;
# BENCH_DOC= writes none); a smoke run's figures mean nothing and a partial run's table misses
# sections, so neither touches it unless BENCH_DOC names a file.
bench_doc=${BENCH_DOC-docs/performance.md}
if [ -n "$bench_doc" ] && { [ -n "${BENCH_DOC:-}" ] || { [ "$smoke" != 1 ] && [ -z "${BENCH_ONLY:-}" ]; }; }; then
    python3 scripts/bench/write-doc.py "$out_dir/latest.json" "$bench_doc"
fi

# ---- (10) stdio servers ----------------------------------------------------------------------
# Its own gateways, bridges, table and JSON (BENCH_OUT/stdio-latest.json); BENCH_SMOKE carries over.
if want stdio; then
    log "stdio servers: scripts/bench/stdio.sh"
    BENCH_OUT=$out_dir scripts/bench/stdio.sh
fi
