#!/usr/bin/env bash
# Installs what a Debian 12 machine needs to build, run, test and benchmark idemgw:
#   - Debian packages (apt-get update only when one is missing),
#   - Node 22 (binary plus its npm) into tools/node/ (the conformance suite needs Node >= 22),
#   - the test packages pinned in tests/package-lock.json, into tests/node_modules/.
# Safe to run again: each step checks first and is skipped when already done.
#
#   scripts/install-deps.sh [--profile all|demo]
#     all   (default) everything above: `make check`, .ci/run, benchmarks, image and package tests
#     demo  what scripts/demo.sh uses: the C toolchain and the gateway's libraries, Node, and the
#           npm packages of the demo's MCP server (@modelcontextprotocol/sdk, zod, at the versions
#           the lock file pins); no browser, Postgres, podman, Prometheus, Redis or benchmark tools
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export DEBIAN_FRONTEND=noninteractive

profile=all
while [ $# -gt 0 ]; do
    case "$1" in
    --profile) profile=${2:-}; shift ;;
    --profile=*) profile=${1#--profile=} ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps: unknown argument '$1' (--profile all|demo)" >&2; exit 2 ;;
    esac
    shift
done
case "$profile" in
all | demo) ;;
*) echo "install-deps: unknown profile '$profile': all or demo" >&2; exit 2 ;;
esac

NODE_VERSION=22.23.5 # node-linux-<arch> on npm: the official Node binary
NPM_VERSION=10.9.8   # the npm that ships with Node 22

# Why each package is here. The demo profile installs the first list only.
demo_apt_packages=(
    build-essential pkg-config # the C toolchain and make
    libevent-dev libjansson-dev libfyaml-dev libpq-dev libssl-dev # the gateway's libraries
    libsqlite3-dev             # the embedded store (src/store/store_sqlite.c)
    node-llhttp                # llhttp C sources, compiled by the Makefile
    zlib1g-dev libbrotli-dev   # decoding upstream answers compressed with gzip/deflate or br
    ca-certificates            # npm talks https to its registry
)
test_apt_packages=(
    clang libclang-rt-14-dev   # `make asan` and the libFuzzer drivers
    clang-format               # `make format`
    libcmocka-dev              # unit tests
    postgresql                 # initdb/pg_ctl for the private clusters of scripts/pg-cluster.sh
    python3                    # free-port helper in scripts/pg-cluster.sh
    nginx-light wrk            # benchmarks (scripts/bench.sh): nginx baseline, load generator
    redis-server               # benchmarks: the durable Redis behind the Powertools comparison
    openssl                    # test certificates for the https-upstream tests
    chromium                   # a real browser for the CORS test (headless)
    podman runc debootstrap    # `make image-test`: build and run the container image
    systemd man-db             # `make package-test`: systemd-analyze verify, man -l
    prometheus                 # promtool and a real scrape in tests/integration/prometheus
)
# The npm packages the demo's refund server imports (tests/fixtures/refund-server.mjs).
demo_npm_packages=(@modelcontextprotocol/sdk zod)

apt_packages=("${demo_apt_packages[@]}")
[ "$profile" = demo ] || apt_packages+=("${test_apt_packages[@]}")

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- Debian packages --------------------------------------------------------------------------
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
# Any npm will do to fetch Node 22 from the registry; Debian's is the fallback.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: apt packages: ${missing[*]}"
    sudo_ apt-get update -q
    sudo_ apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- Node 22 into tools/node ------------------------------------------------------------------
case "$(uname -m)" in
x86_64) node_arch=x64 ;;
aarch64) node_arch=arm64 ;;
*) echo "install-deps: no Node build for $(uname -m)" >&2; exit 1 ;;
esac
node_dir=$root/tools/node
if [ "$("$node_dir/bin/node" --version 2>/dev/null)" != "v$NODE_VERSION" ] \
    || [ "$("$node_dir/bin/node" "$node_dir/bin/npm" --version 2>/dev/null)" != "$NPM_VERSION" ]; then
    echo "install-deps: Node $NODE_VERSION and npm $NPM_VERSION into tools/node"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && npm pack --silent "node-linux-$node_arch@$NODE_VERSION" "npm@$NPM_VERSION" >/dev/null)
    rm -rf "$node_dir"
    mkdir -p "$node_dir/lib/node_modules/npm"
    tar xzf "$tmp"/node-linux-"$node_arch"-*.tgz -C "$node_dir" --strip-components=1 package/bin/node package/LICENSE
    tar xzf "$tmp"/npm-*.tgz -C "$node_dir/lib/node_modules/npm" --strip-components=1
    ln -s ../lib/node_modules/npm/bin/npm-cli.js "$node_dir/bin/npm"
    ln -s ../lib/node_modules/npm/bin/npx-cli.js "$node_dir/bin/npx"
    "$node_dir/bin/node" --version >/dev/null
fi
export PATH=$node_dir/bin:$PATH

# --- test packages ----------------------------------------------------------------------------
# npm ci only when package-lock.json changed since the last install (stamp in node_modules).
# The demo profile installs its few packages alone and stamps them "demo <digest>"; a later
# install of everything sees that stamp as out of date and runs npm ci (which starts afresh).
cd "$root/tests"
stamp=node_modules/.idemgw-installed
lock_digest() { cat package.json package-lock.json 2>/dev/null | sha256sum | cut -d' ' -f1 || true; }
want=$(lock_digest)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$profile" = demo ]; then
    if [ "$have" != "$want" ] && [ "$have" != "demo $want" ]; then
        # the versions the lock file pins, so the demo runs what the tests run
        specs=$(node -e '
            const lock = require("./package-lock.json");
            for (const name of process.argv.slice(1)) {
                const p = lock.packages?.[`node_modules/${name}`];
                if (!p) { console.error(`install-deps: ${name} is not in tests/package-lock.json`); process.exit(1); }
                console.log(`${name}@${p.version}`);
            }' "${demo_npm_packages[@]}")
        echo "install-deps: npm packages for the demo: $(echo $specs)"
        tmp_npm=$(mktemp -d)
        echo '{"private":true}' >"$tmp_npm/package.json"
        # shellcheck disable=SC2086 # one spec a word
        (cd "$tmp_npm" && npm install --no-audit --no-fund --loglevel=error $specs)
        rm -rf node_modules
        mv "$tmp_npm/node_modules" node_modules
        rm -rf "$tmp_npm"
        echo "demo $want" >"$stamp"
    fi
elif [ "$have" != "$want" ]; then
    if [ -f package-lock.json ]; then
        echo "install-deps: npm ci in tests/"
        npm ci --no-audit --no-fund --loglevel=error
    else
        echo "install-deps: npm install in tests/ (writes package-lock.json)"
        npm install --no-audit --no-fund --loglevel=error
        want=$(lock_digest)
    fi
    echo "$want" >"$stamp"
fi
