#!/usr/bin/env bash
# Line coverage of src/, what `make coverage` prints once it has built with --coverage.
#   scripts/coverage.sh BUILD [INTEGRATION_FILE...]
# Clears the counters of BUILD (build-cov), runs every unit test binary of BUILD/tests with a
# private Postgres (test_store needs one), then the integration files given, if any, against
# BUILD/idemgw (through tests/run-all.sh, which runs the unit tests itself). Then gcov reads
# the counters of each object and one line per src/ folder gives the lines run, the lines
# that could run, and their ratio; a last line the total. COVERAGE_FILES=1 adds one line per
# source file under its folder's. Exits non-zero when a test failed (the figures still print).
set -uo pipefail
cd "$(dirname "$0")/.."

build=${1:?usage: coverage.sh BUILD [INTEGRATION_FILE...]}
shift

find "$build/obj" -name '*.gcda' -delete 2>/dev/null

rc=0
if [ $# -gt 0 ]; then
    BUILD=$build IDEMGW_BIN=$build/idemgw tests/run-all.sh "$@" || rc=1
else
    pgdir=$(mktemp -d "${TMPDIR:-/tmp}/idemgw-cov-pg.XXXXXX")
    if [ -d /dev/shm ] && [ -w /dev/shm ]; then
        rmdir "$pgdir"
        pgdir=$(mktemp -d /dev/shm/idemgw-cov-pg.XXXXXX)
    fi
    trap 'scripts/pg-cluster.sh remove "$pgdir" >/dev/null 2>&1; rm -rf "$pgdir"' EXIT
    if url=$(scripts/pg-cluster.sh start "$pgdir" 2>/dev/null); then
        export IDEMGW_TEST_PG_URL=$url
    else
        echo "coverage: no Postgres; test_store skips" >&2
    fi
    for t in "$build"/tests/test_*; do
        [ -x "$t" ] || continue
        if ! "$t" >"$build/coverage-unit.log" 2>&1; then
            echo "coverage: $t failed:" >&2
            tail -n 20 "$build/coverage-unit.log" >&2
            rc=1
        fi
    done
fi

# gcov -n prints, for each source an object was built from (and the headers it inlines),
#   File 'src/net/upstream_stdio.c'
#   Lines executed:41.52% of 1011
# An object that never ran has no .gcda: gcov then counts all its lines as not run.
echo
printf '%-28s %8s %8s %7s\n' 'folder' 'run' 'lines' 'cover'
for dir in src/*/; do
    dir=${dir%/}
    name=${dir#src/}
    set -- "$dir"/*.c
    [ -e "$1" ] || continue
    gcov -n -o "$build/obj/$name" "$@" 2>/dev/null
done | awk -v files="${COVERAGE_FILES:-0}" '
    /^File / {
        f = $2
        gsub(/\047/, "", f)
        keep = (f ~ /^src\/[^\/]+\/[^\/]+\.c$/) && !(f in seen)
        next
    }
    /^Lines executed:/ && keep {
        seen[f] = 1
        split($0, a, /[:% ]+/)
        pct = a[3]
        n = $NF
        run = int(pct * n / 100 + 0.5)
        split(f, p, "/")
        d = p[2]
        if (!(d in dl)) order[++nd] = d
        dl[d] += n
        dr[d] += run
        fl[d, ++nf[d]] = f
        frun[f] = run
        flines[f] = n
        keep = 0
    }
    END {
        for (i = 1; i <= nd; i++) {
            d = order[i]
            printf "%-28s %8d %8d %6.1f%%\n", d, dr[d], dl[d], dl[d] ? 100 * dr[d] / dl[d] : 0
            if (files)
                for (j = 1; j <= nf[d]; j++) {
                    f = fl[d, j]
                    printf "  %-26s %8d %8d %6.1f%%\n", substr(f, length(d) + 6), frun[f],
                           flines[f], flines[f] ? 100 * frun[f] / flines[f] : 0
                }
            tl += dl[d]
            tr += dr[d]
        }
        printf "%-28s %8d %8d %6.1f%%\n", "total", tr, tl, tl ? 100 * tr / tl : 0
    }'
exit $rc
