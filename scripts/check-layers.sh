#!/bin/sh
# The layer order of src/, and its check: every `#include "..."` in src/ and include/ must name a
# header of the including file's own folder or of a folder below it. Prints every include that
# runs the other way (or sideways, between two folders of one layer) and exits 1.
#
#   scripts/check-layers.sh        (run by `make layers` and `make check`)
#
# A header's folder: src/F/X.h is F's (private); include/X.h is the folder of the src/*/X.c
# that implements it; a header with no X.c of its own (types only, callbacks only, generated
# code) is named in HEADERS below. A header that is in none of these stops the check: give it
# a .c or a line in HEADERS.
# Why this order: ARCHITECTURE.md, "Layers".
set -eu
cd "$(dirname "$0")/.."

# Top to bottom. A file may include its own folder and any folder on a later line; folders
# sharing a line are one layer and may not include each other.
LAYERS='
cmd
idem
catalog
pipeline
ops
identity store
mcp
net
core
'

# include/ headers that have no .c of the same name: header folder.
HEADERS='
handler.h pipeline
store_migrations.h store
'

# src/F/X.c -> F for every source; more than one X.c for one X.h is an error below.
sources=$(for f in src/*/*.c; do
    d=${f#src/}
    echo "${f##*/} ${d%%/*}"
done)

# Every "file include" pair: the file with its folder, the header as written.
includes=$(for f in src/*/*.c src/*/*.h include/*.h; do
    grep -H '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true
done)

{
    echo "@layers"
    echo "$LAYERS"
    echo "@headers"
    echo "$HEADERS"
    echo "@sources"
    echo "$sources"
    echo "@private"
    ls src/*/*.h 2>/dev/null || true
    echo "@public"
    ls include/*.h
    echo "@includes"
    echo "$includes"
} | awk '
function fail(msg) { print "check-layers: " msg > "/dev/stderr"; bad = 1 }
/^@/ { part = substr($0, 2); next }
NF == 0 { next }
part == "layers" { n_layers++; for (i = 1; i <= NF; i++) rank[$i] = n_layers; next }
part == "headers" { table[$1] = $2; next }
part == "sources" {
    if ($1 in impl) fail("two sources named " $1 ": src/" impl[$1] " and src/" $2)
    impl[$1] = $2
    next
}
part == "private" {
    # only its own folder can name it: the compiler looks beside the file and in include/
    split($0, p, "/")
    private[p[2] "/" p[3]] = 1
    next
}
part == "public" {
    h = substr($0, 9)
    c = h; sub(/\.h$/, ".c", c)
    if (h in table) folder_of[$0] = table[h]
    else if (c in impl) folder_of[$0] = impl[c]
    else fail($0 ": no layer (no src/*/" c " and no line in HEADERS of scripts/check-layers.sh)")
    next
}
part == "includes" {
    colon = index($0, ":")
    file = substr($0, 1, colon - 1)
    line = substr($0, colon + 1)
    sub(/^[^"]*"/, "", line)
    sub(/".*$/, "", line)
    if (file ~ /^src\//) { split(file, p, "/"); from = p[2] } else from = folder_of[file]
    if (from == "") next # reported above
    if (!(from in rank)) { fail(file ": folder " from " is in no layer of LAYERS"); next }
    if (file ~ /^src\// && (from "/" line) in private) { to = from; hdr = "src/" from "/" line }
    else if (("include/" line) in folder_of) { hdr = "include/" line; to = folder_of[hdr] }
    else { fail(file ": includes \"" line "\", which is neither in include/ nor beside it"); next }
    if (!(to in rank)) { fail(hdr ": folder " to " is in no layer of LAYERS"); next }
    if (to != from && rank[to] <= rank[from]) {
        fail(file " (" from ") includes " line " (" to ")" \
             (rank[to] == rank[from] ? ": one layer" : ": a higher layer"))
    }
}
END { exit bad }
'
