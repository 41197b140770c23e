#!/usr/bin/env bash
# Runs every test: the cmocka unit test binaries in $BUILD/tests/, then the node:test
# integration files tests/integration/*.test.mjs against $IDEMGW_BIN, with one private
# Postgres cluster for the whole run (IDEMGW_TEST_PG_URL), then the idempotency suite again
# against the embedded SQLite store (IDEMGW_TEST_STORE=sqlite). Ends with one line
# "N passed, N failed" and exits non-zero when anything failed.
#   BUILD=build-asan IDEMGW_BIN=build-asan/idemgw tests/run-all.sh   (what `make check-asan` runs)
#   tests/run-all.sh tests/integration/proxy.test.mjs                 (only these integration files)
#   tests/run-all.sh --only NAME       (one test, what `make check TEST=NAME` runs: a unit test
#                                       binary such as test_jcs, or proxy / proxy.test.mjs, or
#                                       docs: the documentation's checks alone)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# --only NAME: one unit test binary (test_jcs) or one integration file (proxy, proxy.test.mjs),
# and nothing else.
only=''
if [ "${1:-}" = --only ]; then
    only=${2:?usage: run-all.sh --only NAME}
    shift 2
fi

BUILD=${BUILD:-build}
export IDEMGW_BIN=${IDEMGW_BIN:-$BUILD/idemgw}
NODE=${NODE:-$root/tools/node/bin/node}
JOBS=${TEST_JOBS:-2}

passed=0
failed=0

shopt -s nullglob
unit_bins=("$BUILD"/tests/test_*)
if [ -n "$only" ]; then
    name=${only##*/}
    if [ "$name" = docs ]; then
        docs_only=1
    elif [ -x "$BUILD/tests/$name" ]; then
        unit_bins=("$BUILD/tests/$name")
        set --
        no_integration=1
    else
        name=${name%.test.mjs}
        if [ -f "tests/integration/$name.test.mjs" ]; then
            unit_bins=()
            set -- "tests/integration/$name.test.mjs"
        else
            echo "run-all: no test named '$only': give a unit test binary of $BUILD/tests/" \
                "(test_jcs), a file of tests/integration/ (proxy, proxy.test.mjs) or docs" >&2
            echo "0 passed, 1 failed"
            exit 1
        fi
    fi
fi

# --- documentation (no Postgres, no network): ARCHITECTURE.md names every source file,
# docs/configuration.md every key of the reader, the documentation's configuration examples
# load, and idemgw.5 is made from docs/configuration.md ---------------------------------------
docs_check() {
    local what=$1
    shift
    echo "=== docs: $what"
    if "$@"; then
        passed=$((passed + 1))
    else
        echo "run-all: docs: $what failed"
        failed=$((failed + 1))
    fi
}
man_page_builds() {
    local page
    page=$(mktemp "${TMPDIR:-/tmp}/idemgw.5.XXXXXX") || return 1
    if ! scripts/man-config.sh docs/configuration.md >"$page"; then
        rm -f "$page"
        return 1
    fi
    # groff's warnings are the page's errors (an unknown request, a stray escape)
    local warnings=''
    if command -v groff >/dev/null; then
        warnings=$(groff -man -ww -z "$page" 2>&1)
    fi
    rm -f "$page"
    [ -z "$warnings" ] || { echo "$warnings"; return 1; }
    echo "idemgw.5 made from docs/configuration.md"
}
if [ -z "$only" ] || [ -n "${docs_only:-}" ]; then
    docs_check "ARCHITECTURE.md names every source file" scripts/check-code-map.sh
    docs_check "docs/configuration.md documents every key" scripts/check-config-doc.sh
    docs_check "configuration examples load" scripts/check-doc-examples.sh "$IDEMGW_BIN"
    docs_check "idemgw.5 builds" man_page_builds
fi
if [ -n "${docs_only:-}" ]; then
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/idemgw-run.XXXXXX")
# The cluster keeps fsync on; in RAM its flushes are cheap.
pgdir=$tmp/pg
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    pgdir=$(mktemp -d /dev/shm/idemgw-pg.XXXXXX)
fi
cleanup() {
    scripts/pg-cluster.sh remove "$pgdir" >/dev/null 2>&1 || true
    rm -rf "$tmp" "$pgdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! pg_url=$(scripts/pg-cluster.sh start "$pgdir"); then
    echo "run-all: could not start Postgres" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
export IDEMGW_TEST_PG_URL=$pg_url
echo "run-all: Postgres at $pg_url"

# --- unit tests (cmocka, TAP output: one "ok"/"not ok" line per test) ------------------------
for bin in "${unit_bins[@]}"; do
    [ -x "$bin" ] || continue
    echo "=== $bin"
    log=$tmp/unit.log
    CMOCKA_MESSAGE_OUTPUT=TAP "$bin" >"$log" 2>&1
    rc=$?
    cat "$log"
    p=$(grep -E '^ok [0-9]+' "$log" | grep -vc '# SKIP')
    # cmocka's TAP marks a skipped case "not ok N # SKIP": skipped, not failed
    f=$(grep -E '^not ok [0-9]+' "$log" | grep -vc '# SKIP')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        # crashed (sanitizer report, abort) before it could report a failure
        echo "run-all: $bin exited with status $rc"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
done

# --- integration tests (node:test, TAP reporter) ---------------------------------------------
# Runs node --test over the files given after the label, adding to passed / failed.
run_node() {
    local label=$1
    shift
    echo "=== integration$label: $* (IDEMGW_BIN=$IDEMGW_BIN)"
    local log=$tmp/integration.log
    "$NODE" --test --test-reporter=tap --test-concurrency="$JOBS" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    # The summary comes last; nested subtests are counted once, through their parent.
    local p f c
    p=$(grep -E '^# pass [0-9]+' "$log" | tail -n 1 | awk '{print $3}')
    f=$(grep -E '^# fail [0-9]+' "$log" | tail -n 1 | awk '{print $3}')
    c=$(grep -E '^# cancelled [0-9]+' "$log" | tail -n 1 | awk '{print $3}')
    p=${p:-0} f=${f:-0} c=${c:-0}
    f=$((f + c))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "run-all: node --test exited with status $rc"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
}

if [ $# -gt 0 ]; then
    files=("$@")
elif [ -n "${no_integration:-}" ]; then
    files=()
else
    files=(tests/integration/*.test.mjs)
fi
# The idempotency suite runs a second time against the embedded store: createDatabase() then
# makes a SQLite file (IDEMGW_TEST_STORE=sqlite); its Postgres-only tests skip, saying why.
sqlite_files=()
for f in "${files[@]}"; do
    case ${f##*/} in
    idempotency-*.test.mjs | key-cmd.test.mjs | duplicate-source.test.mjs | operator-queue.test.mjs) sqlite_files+=("$f") ;;
    esac
done
if [ ${#files[@]} -gt 0 ]; then
    if [ ! -x "$NODE" ]; then
        echo "run-all: $NODE missing; run scripts/install-deps.sh" >&2
        failed=$((failed + 1))
    else
        run_node '' "${files[@]}"
        if [ ${#sqlite_files[@]} -gt 0 ]; then
            # its files go in the run's folder, removed at exit
            mkdir -p "$tmp/sqlite"
            IDEMGW_TEST_STORE=sqlite TMPDIR=$tmp/sqlite run_node ' (embedded SQLite store)' \
                "${sqlite_files[@]}"
        fi
    fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
