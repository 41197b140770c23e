#!/usr/bin/env bash
# The fault suite (`make faults`): misbehaving upstreams, Postgres killed and restarted under
# load, a locked key table, descriptors running out, slowloris connections, callers on each
# other's calls (tests/faults/tenant.mjs, scenarios tenant:*, then "tenant: breaches=N"). Loopback only,
# bounded loops, a few minutes. One line per scenario; ends "faults: N passed, N failed".
#   scripts/faults.sh [scenario...]                       (all when none is named)
#   IDEMGW_BIN=build-asan/idemgw scripts/faults.sh        (against the sanitizer build)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export IDEMGW_BIN=${IDEMGW_BIN:-build/idemgw}
NODE=${NODE:-$root/tools/node/bin/node}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/idemgw-faults.XXXXXX")
cleanup() {
    scripts/pg-cluster.sh stop "$tmp/pg" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! IDEMGW_TEST_PG_URL=$(scripts/pg-cluster.sh start "$tmp/pg"); then
    echo "faults: could not start Postgres" >&2
    exit 1
fi
export IDEMGW_TEST_PG_URL
"$NODE" tests/faults/run.mjs "$@"
