#!/usr/bin/env bash
# Installs the Debian package on this machine and checks it (`make package-test`, as root; not
# part of `make check`, whose tests run side by side): dpkg -i, the unit passes
# systemd-analyze verify, the installed man pages render, the installed binary accepts the
# installed config, serves /healthz from it, and the package removes cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "package-test: run as root (it installs the package)" >&2; exit 1; }
pass=0 fail=0
check() {
    local what=$1
    shift
    if "$@" >/tmp/idemgw-package-test.out 2>&1; then
        pass=$((pass + 1)); echo "ok - $what"
    else
        fail=$((fail + 1)); echo "not ok - $what"; sed 's/^/# /' /tmp/idemgw-package-test.out
    fi
}
deb=$(scripts/make-deb.sh)
echo "package-test: $deb ($(du -k "$deb" | cut -f1) KiB)"
check "dpkg -i installs it" dpkg -i "$deb"
check "the unit passes systemd-analyze verify" systemd-analyze verify /lib/systemd/system/idemgw.service
check "the man page renders" sh -c 'man -l /usr/share/man/man8/idemgw.8.gz | grep -q "idempotency gateway"'
check "the configuration's man page renders" sh -c 'man -l /usr/share/man/man5/idemgw.5.gz | grep -q "store.timeout"'
check "/etc/idemgw/idemgw.yaml is a conffile" sh -c 'dpkg-query -W -f="\${Conffiles}" idemgw | grep -q /etc/idemgw/idemgw.yaml'
check "the installed binary accepts the installed config" /usr/bin/idemgw --check-config -c /etc/idemgw/idemgw.yaml
state=$(mktemp -d)
chmod 0700 "$state"
STATE_DIRECTORY=$state IDEMGW_ADMIN_LISTEN=127.0.0.1:18981 IDEMGW_LISTEN=127.0.0.1:18980 \
    /usr/bin/idemgw -c /etc/idemgw/idemgw.yaml >"$state/log" 2>&1 &
gw=$!
for _ in $(seq 50); do /usr/bin/idemgw health 127.0.0.1:18981 >/dev/null 2>&1 && break; sleep 0.1; done
check "the installed gateway runs with the installed config and is healthy" /usr/bin/idemgw health 127.0.0.1:18981
kill -TERM "$gw"
check "it drains and exits 0 on SIGTERM" wait "$gw"
rm -rf "$state"
check "dpkg -r removes it" dpkg -r idemgw
echo "package-test: $pass passed, $fail failed"
[ "$fail" = 0 ]
