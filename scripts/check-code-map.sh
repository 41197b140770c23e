#!/bin/sh
# Checks that ARCHITECTURE.md names every source file: each src/*/*.c and src/*/*.h and each
# include/*.h, by its file name (so a file moved to another folder still counts as named).
# Prints the files it misses and exits 1 when there are any. Run by `make check`.
#   scripts/check-code-map.sh [ROOT]       (ROOT: the source tree, default this one)
set -eu
root=${1:-$(dirname "$0")/..}
doc=$root/ARCHITECTURE.md
if [ ! -f "$doc" ]; then
    echo "check-code-map: $doc not found" >&2
    exit 2
fi
missing=0
for f in "$root"/src/*/*.c "$root"/src/*/*.h "$root"/include/*.h; do
    [ -e "$f" ] || continue
    name=${f##*/}
    # the name as a word of its own: not the tail of a longer name (log.h in dup_log.h)
    pattern=$(printf '%s' "$name" | sed 's/[.]/[.]/g')
    if ! grep -Eq "(^|[^A-Za-z0-9_])$pattern([^A-Za-z0-9_]|\$)" "$doc"; then
        echo "ARCHITECTURE.md does not name ${f#"$root"/}"
        missing=$((missing + 1))
    fi
done
if [ "$missing" -gt 0 ]; then
    echo "check-code-map: $missing source file(s) missing from ARCHITECTURE.md's code map" >&2
    exit 1
fi
echo "check-code-map: ARCHITECTURE.md names every source file"
