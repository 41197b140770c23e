#!/usr/bin/env bash
# Builds the Debian package (`make deb`) from build/idemgw with dpkg-deb: the binary, the
# reference config as /etc/idemgw/idemgw.yaml (a conffile), the hardened systemd unit, the man
# pages idemgw.8 and idemgw.5 (made from docs/configuration.md) and the documentation. Prints
# the package's path.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^#define IDEMGW_VERSION "\(.*\)"/\1/p' src/cmd/main.c)
arch=$(dpkg --print-architecture)
out=build/deb
stage=$out/idemgw_${version}_$arch
rm -rf "$stage"
install -D -m 0755 build/idemgw "$stage/usr/bin/idemgw"
strip "$stage/usr/bin/idemgw"
install -D -m 0644 conf/idemgw.yaml "$stage/etc/idemgw/idemgw.yaml"
install -D -m 0644 conf/idemgw.service "$stage/lib/systemd/system/idemgw.service"
install -d "$stage/usr/share/man/man8" "$stage/usr/share/man/man5"
gzip -9n <conf/idemgw.8 >"$stage/usr/share/man/man8/idemgw.8.gz"
# idemgw.5 is made from docs/configuration.md at build time (as `make man` does), never committed
scripts/man-config.sh docs/configuration.md >build/idemgw.5.tmp && mv build/idemgw.5.tmp build/idemgw.5
gzip -9n <build/idemgw.5 >"$stage/usr/share/man/man5/idemgw.5.gz"
install -d "$stage/usr/share/doc/idemgw"
gzip -9n <README.md >"$stage/usr/share/doc/idemgw/README.md.gz"
for doc in docs/*.md; do
    gzip -9n <"$doc" >"$stage/usr/share/doc/idemgw/${doc#docs/}.gz"
done
install -d "$stage/DEBIAN"
echo /etc/idemgw/idemgw.yaml >"$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: idemgw
Version: $version
Architecture: $arch
Maintainer: idemgw developers <idemgw@localhost>
Installed-Size: $size
Depends: libevent-2.1-7, libevent-openssl-2.1-7, libjansson4, libfyaml0, libpq5, libssl3, zlib1g, libbrotli1, libsqlite3-0, ca-certificates
Section: net
Priority: optional
Homepage: https://localhost/idemgw
Description: idempotency gateway for MCP servers
 Sits between agents and an unmodified MCP server and keeps a tool call that must not
 run twice from running twice when it is retried: it claims an idempotency key before
 forwarding and replays the first result to repeats.
CONTROL
dpkg-deb --root-owner-group --build "$stage" "$out/" >/dev/null
echo "$out/idemgw_${version}_$arch.deb"
