#!/bin/sh
# Checks that docs/configuration.md documents every key the configuration reader knows: each
# name in the key tables of src/*/config*.c (`.name = "..."`, and the subject's sources, read
# by name) must appear in a key heading (### ...) or a Type: line of that page. So a key added
# to the reader without its reference fails `make check`. Prints the missing names; exit 1.
set -eu
cd "$(dirname "$0")/.."
doc=docs/configuration.md
names=$(cat src/*/config*.c |
    grep -oE '\.name = "[a-z_0-9]+"|strcmp\(key, "[a-z_]+"\)' |
    sed -E 's/.*"([^"]+)".*/\1/' | sort -u)
[ -n "$names" ] || { echo "check-config-doc: no key tables found in src/*/config*.c" >&2; exit 2; }
documented=$(grep -E '^### |^Type: ' "$doc")
missing=0
for n in $names; do
    if ! printf '%s\n' "$documented" | grep -Eq "(^|[^a-z_])$n([^a-z_]|\$)"; then
        echo "$doc does not document the key '$n'"
        missing=$((missing + 1))
    fi
done
[ "$missing" -eq 0 ] || { echo "check-config-doc: $missing key(s) missing" >&2; exit 1; }
echo "check-config-doc: $doc documents all $(printf '%s\n' "$names" | wc -l) key names"
