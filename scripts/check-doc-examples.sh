#!/bin/sh
# Checks the configuration examples of the documentation: every ```yaml block of README.md and
# docs/*.md is given to `idemgw --check-config`. A block without `upstream:` or `servers:` at
# its top level is a fragment and is checked with an upstream added; a block that names files
# which must exist (TLS certificates, CA and JWK Set files) is checked with those keys'
# values left as they are, so it is skipped when they do not exist here, and said so.
# Exits 1 listing the examples the gateway refuses. Run by `make check`; no network.
#   scripts/check-doc-examples.sh [IDEMGW_BIN]
set -eu
cd "$(dirname "$0")/.."
bin=${1:-${IDEMGW_BIN:-build/idemgw}}
[ -x "$bin" ] || { echo "check-doc-examples: $bin not built" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idemgw-doc-examples.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
checked=0 skipped=0 bad=0
for doc in README.md docs/*.md; do
    [ -f "$doc" ] || continue
    # one file per block, named by the line its fence is on
    awk -v dir="$tmp" -v doc="$doc" '
        /^```yaml[ \t]*$/ { inb = 1; out = dir "/" NR ".yaml"; print doc ":" NR > (dir "/" NR ".where"); next }
        /^```/ && inb     { inb = 0; close(out); next }
        inb               { print > out }
    ' "$doc"
    for y in "$tmp"/*.yaml; do
        [ -e "$y" ] || continue
        where=$(cat "${y%.yaml}.where")
        if grep -Eq '(cert_file|key_file|ca_file|jwks_file):' "$y" &&
            ! grep -Eo '(cert_file|key_file|ca_file|jwks_file): *[^ #]+' "$y" |
                sed 's/^[a-z_]*: *//' | while read -r f; do [ -e "$f" ] || exit 1; done; then
            echo "check-doc-examples: $where: skipped (names files that are not on this machine)"
            skipped=$((skipped + 1))
            rm -f "$y" "${y%.yaml}.where"
            continue
        fi
        if ! grep -Eq '^(upstream|servers):' "$y"; then
            printf 'upstream: http://127.0.0.1:9/mcp\n' >>"$y"
        fi
        if out=$(env -u IDEMGW_UPSTREAM -u IDEMGW_DATABASE_URL "$bin" --check-config -c "$y" 2>&1); then
            checked=$((checked + 1))
        else
            echo "check-doc-examples: $where: the gateway refuses this example:"
            printf '%s\n' "$out" | sed 's/^/    /'
            bad=$((bad + 1))
        fi
        rm -f "$y" "${y%.yaml}.where"
    done
done
echo "check-doc-examples: $checked examples accepted, $skipped skipped, $bad refused"
[ "$bad" -eq 0 ]
