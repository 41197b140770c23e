#!/usr/bin/env bash
# The idemgw demo, from a fresh clone on Debian 12 (as root, or as a user with sudo):
#   1. installs what is missing (scripts/install-deps.sh --profile demo: the toolchain, the
#      libraries, Node and the demo's npm packages) and builds build/idemgw (make),
#   2. starts a refund MCP server as the upstream and the gateway in front of it with the
#      demo policy conf/demo.yaml, its keys in the embedded store (the default: one SQLite
#      file in the demo's folder, fresh on every run),
#   3. runs a retrying agent (scripts/demo-agent.mjs): the same refund call N times, two of them
#      at once; one refund is executed, the others get the stored answer replayed,
#   4. prints how to point a real MCP client at the gateway, then keeps everything running
#      until Ctrl-C (which stops the gateway and the refund server).
#
#   scripts/demo.sh [--once] [--calls N] [--no-install]
#     --once        run the demo, stop everything and exit (0 when exactly one refund ran)
#     --calls N     how many identical calls the agent sends (default 5)
#     --no-install  skip step 1's install (the tests run it so: they never install anything)
#
# Environment:
#   IDEMGW_DEMO_DIR   working folder: the key store, logs, ledger (default .run/demo)
#   IDEMGW_BIN        gateway binary to run; when set, the build step is skipped
#   NO_COLOR          no colours (there are none anyway when stdout is not a terminal)
# shellcheck disable=SC2317 # cleanup functions run from traps
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

once=0
calls=5
install=1
while [ $# -gt 0 ]; do
    case "$1" in
    --once) once=1 ;;
    --no-install) install=0 ;;
    --calls) calls=${2:-}; shift ;;
    --calls=*) calls=${1#--calls=} ;;
    -h | --help) usage; exit 0 ;;
    *) echo "demo: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if ! [[ "$calls" =~ ^[1-9][0-9]{0,2}$ ]]; then
    echo "demo: --calls needs a whole number from 1 to 999" >&2
    exit 2
fi

dir=${IDEMGW_DEMO_DIR:-$root/.run/demo}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
NODE=$root/tools/node/bin/node

# --- output ---------------------------------------------------------------------------------
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ] && [ "${TERM:-dumb}" != dumb ]; then
    B=$'\e[1m' D=$'\e[2m' G=$'\e[32m' R=$'\e[31m' N=$'\e[0m'
else
    B='' D='' G='' R='' N=''
fi
section() { printf '\n%s== %s ==%s\n' "$B" "$1" "$N"; }
step() { printf '  %-16s' "$1"; }
ok() { printf '%s%s%s\n' "$G" "$1" "$N"; }
die() {
    printf '%sfailed%s\n' "$R" "$N"
    printf '%s\n' "$@" >&2
    exit 1
}
rel() { case "$1" in "$root"/*) echo "${1#"$root"/}" ;; *) echo "$1" ;; esac; }

# --- cleanup: whatever was started is stopped, on every way out ------------------------------
gw_pid='' up_pid=''
stop_pid() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do # up to 10 s, then force
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$gw_pid$up_pid" ]; then
        printf '\nStopping the demo: gateway, refund server... '
        stop_pid "$gw_pid"
        stop_pid "$up_pid"
        echo 'stopped.'
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    "$NODE" -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# Waits until a process we started is ready: `http URL` answers 200, or `line FILE REGEX`
# matches a line of its output (prints the first capture group). Fails at once if the
# process exits, or after a timeout. Polls; never a fixed sleep.
wait_ready() {
    # shellcheck disable=SC2016 # JavaScript, not shell
    "$NODE" --input-type=module -e '
import fs from "node:fs";
const [pid, secs, mode, a, b] = process.argv.slice(1);
const alive = () => {
  try { return !/^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, "utf8")); } catch { return false; }
};
const deadline = Date.now() + Number(secs) * 1000;
let last = "no answer";
for (;;) {
  if (mode === "http") {
    try {
      const r = await fetch(a, { signal: AbortSignal.timeout(1000) });
      last = `last answer ${r.status} ${(await r.text()).trim()}`;
      if (r.status === 200) process.exit(0);
    } catch {}
  } else {
    let text = "";
    try { text = fs.readFileSync(a, "utf8"); } catch {}
    const m = new RegExp(b, "m").exec(text);
    if (m) { console.log(m[1] ?? ""); process.exit(0); }
  }
  if (!alive()) { console.error("it exited before it was ready"); process.exit(1); }
  if (Date.now() > deadline) { console.error(`not ready after ${secs} s${mode === "http" ? `; ${last}` : ""}`); process.exit(1); }
  await new Promise((r) => setTimeout(r, 50));
}' "$@"
}

printf '%sidemgw demo%s: a retried refund runs once. Working folder: %s\n' "$B" "$N" "$(rel "$dir")"
section 'Setting up'

# --- 1. dependencies and build --------------------------------------------------------------
# Quiet when everything is already there. On a fresh machine it takes a few minutes: its own
# progress lines are shown, the package managers' output goes to the log.
step 'dependencies'
if [ "$install" = 1 ]; then
    set +e
    scripts/install-deps.sh --profile demo 2>&1 | tee "$dir/install-deps.log" \
        | { grep --line-buffered '^install-deps: ' | sed -u 's/^install-deps: /  installing      /'; true; }
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" = 0 ] || die "scripts/install-deps.sh failed; its output:" "$(tail -n 40 "$dir/install-deps.log")"
    ok 'ok'
else
    # Nothing is installed: name everything missing at once rather than fail halfway.
    missing=()
    [ -x "$NODE" ] || missing+=("$(rel "$NODE")")
    for m in @modelcontextprotocol/sdk zod; do
        [ -d "tests/node_modules/$m" ] || missing+=("tests/node_modules/$m")
    done
    [ ${#missing[@]} = 0 ] || die "--no-install: missing ${missing[*]}; run scripts/install-deps.sh"
    ok 'present (--no-install: nothing installed)'
fi

if [ -n "${IDEMGW_BIN:-}" ]; then
    bin=$IDEMGW_BIN
    step 'gateway binary'
    [ -x "$bin" ] || die "IDEMGW_BIN=$bin is not an executable file"
    ok "$bin (IDEMGW_BIN)"
else
    bin=build/idemgw
    step 'build'
    if ! make -j"$(nproc)" all >"$dir/build.log" 2>&1; then
        die "make failed:" "$(tail -n 40 "$dir/build.log")"
    fi
    ok "$bin"
fi
step 'policy'
# Checked before anything starts; errors are printed as file:line.
check=$("$bin" --check-config -c conf/demo.yaml 2>&1) || die "$check"
ok "conf/demo.yaml"

# --- 2. key store, refund server, gateway -------------------------------------------------
step 'key store'
# The embedded store, fresh on every run, so the demo always starts with no stored keys.
state=$dir/state
rm -rf "$state"
mkdir -p "$state"
ok "$(rel "$state")/idemgw-keys.db"
printf '  %-16s%s\n' '' "${D}one SQLite file (the default when no database_url is set); several gateways share a Postgres instead${N}"

step 'refund server'
ledger=$dir/ledger.jsonl
# Emptied here, not by the redirections below: the readiness check must never see a
# previous run's lines.
: >"$ledger"
: >"$dir/upstream.log"
: >"$dir/gateway.log"
PORT=$(free_port) LEDGER=$ledger "$NODE" tests/fixtures/refund-server.mjs >"$dir/upstream.log" 2>&1 &
up_pid=$!
up_port=$(wait_ready "$up_pid" 30 line "$dir/upstream.log" 'listening on port ([0-9]+)' 2>&1) \
    || die "the refund server did not start ($up_port):" "$(cat "$dir/upstream.log")"
upstream=http://127.0.0.1:$up_port/mcp
ok "$upstream"
printf '  %-16s%s\n' '' "${D}tests/fixtures/refund-server.mjs, an ordinary MCP server: issue_refund, get_ledger, ...${N}"

step 'idemgw'
gw_port=$(free_port)
admin_port=$(free_port)
while [ "$admin_port" = "$gw_port" ]; do admin_port=$(free_port); done
gateway=http://127.0.0.1:$gw_port/mcp
admin=http://127.0.0.1:$admin_port
IDEMGW_UPSTREAM=$upstream \
    IDEMGW_LISTEN=127.0.0.1:$gw_port \
    IDEMGW_ADMIN_LISTEN=127.0.0.1:$admin_port \
    STATE_DIRECTORY=$state \
    "$bin" -c conf/demo.yaml >"$dir/gateway.log" 2>&1 &
gw_pid=$!
why=$(wait_ready "$gw_pid" 30 http "$admin/readyz" 2>&1) \
    || die "the gateway did not become ready ($why):" "$(tail -n 20 "$dir/gateway.log")"
ok "$gateway"
printf '  %-16s%s\n' '' "${D}issue_refund: non_idempotent, get_ledger: read; admin $admin/readyz${N}"

# --- 3. the retrying agent ------------------------------------------------------------------
section 'A retrying agent'
agent_rc=0
"$NODE" scripts/demo-agent.mjs --url "$gateway" --calls "$calls" --ledger "$ledger" \
    --gateway-log "$dir/gateway.log" || agent_rc=$?

# --- 4. how to use it yourself --------------------------------------------------------------
args='{"order_id":"ORD-1042","amount_cents":2500}'
key=$("$bin" key -c conf/demo.yaml --subject demo-agent --tool issue_refund --args "$args")
section 'Try it yourself'
cat <<EOF
Point any MCP client that speaks Streamable HTTP at the gateway instead of the server:
  ${B}$gateway${N}

  MCP Inspector:  npx @modelcontextprotocol/inspector
                  then Transport "Streamable HTTP", URL $gateway
  Client config:  {"mcpServers": {"refunds": {"type": "http", "url": "$gateway"}}}

  With curl (a session, then the same refund again: it comes back with the header
  "Idempotent-Replayed: true" and the marker _meta."idemgw/replay"):
    url=$gateway
    h=(-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream')
    sid=\$(curl -si "\${h[@]}" \$url -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}' | tr -d '\r' | awk -F': ' 'tolower(\$1)=="mcp-session-id"{print \$2}')
    curl -s "\${h[@]}" -H "Mcp-Session-Id: \$sid" \$url -d '{"jsonrpc":"2.0","method":"notifications/initialized"}'
    curl -si "\${h[@]}" -H "Mcp-Session-Id: \$sid" \$url -d '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"issue_refund","arguments":$args}}'

Why was a call replayed? Its idempotency key is the caller plus the tool plus a hash of the
arguments (without "note", which the policy excludes):
  $bin key -c conf/demo.yaml --subject demo-agent --tool issue_refund --args '$args'
  ${D}$key${N}
and the row stored under that key (state, attempts, first JSON-RPC id and session, times):
  STATE_DIRECTORY=$state $bin key -c conf/demo.yaml --subject demo-agent --tool issue_refund --args '$args' --show

Logs: $(rel "$dir/gateway.log") (gateway, JSON lines), $(rel "$dir/upstream.log"), $(rel "$ledger")
Admin: $admin/readyz  $admin/metrics
EOF

if [ "$once" = 1 ]; then
    exit "$agent_rc"
fi

printf '\n%sThe gateway and the refund server keep running. Press Ctrl-C to stop them.%s\n' "$B" "$N"
trap 'exit 0' INT TERM
# Returns when Ctrl-C is pressed (the trap exits and cleans up) or if the gateway stops by itself.
wait "$gw_pid" || true
gw_pid=''
echo "The gateway stopped by itself; its last log lines:" >&2
tail -n 20 "$dir/gateway.log" >&2
exit 1
