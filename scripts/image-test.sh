#!/usr/bin/env bash
# Builds the container image for real and runs it (`make image-test`): this machine has no
# registry, so the Debian 12 base is made here with debootstrap (from the machine's own apt
# mirror) and imported into podman; then the Dockerfile is built on it (--build-arg BASE),
# the image's size is reported, and tests/image/run.test.mjs runs the container in front of
# the refund fixture: non-root, read-only root filesystem, state in its one volume, healthy by
# its HEALTHCHECK, a protected call executed once and replayed, SIGTERM ending it cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$root/.run/image-test
mkdir -p "$work"
export PATH=$root/tools/node/bin:$PATH
if ! command -v podman >/dev/null && ! apt-cache show podman >/dev/null 2>&1; then
    echo "image-test: skipped: podman cannot be installed on this machine"
    exit 0
fi
for tool in podman debootstrap; do
    command -v "$tool" >/dev/null || { echo "image-test: $tool is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
# This machine's limits are lower than podman's defaults, which runc may not raise.
ulimits=(--ulimit "nofile=1024:1024" --ulimit "nproc=1024:1024")

# The mirror this machine's apt uses (deb822 sources first, then sources.list).
mirror=$(awk '/^URIs:/ && !done { print $2; done=1 }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '/^deb / && $2 ~ /debian\/?$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || { echo "image-test: no Debian mirror in the apt sources" >&2; exit 1; }

base=localhost/idemgw-base:bookworm
if ! podman image exists "$base"; then
    if [ ! -s "$work/base.tar" ]; then
        echo "image-test: debootstrap bookworm from $mirror"
        rm -rf "$work/rootfs"
        debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
            || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
        tar -C "$work/rootfs" -c . >"$work/base.tar"
        rm -rf "$work/rootfs"
    fi
    podman import -q "$work/base.tar" "$base" >/dev/null
fi

image=localhost/idemgw:test
echo "image-test: building $image on $base"
podman build -q --format docker "${ulimits[@]}" --build-arg "BASE=$base" -t "$image" . >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; exit 1; }
size=$(podman image inspect --format '{{.Size}}' "$image")
base_size=$(podman image inspect --format '{{.Size}}' "$base")
echo "image-test: image size $((size / 1024 / 1024)) MiB (its base $((base_size / 1024 / 1024)) MiB)"

IDEMGW_IMAGE=$image IDEMGW_PODMAN_ARGS="${ulimits[*]}" \
    node --test --test-reporter=tap tests/image/run.test.mjs 2>&1 | tee "$work/test.log" | grep -vE '^# (Subtest|\{)' || true
summary=$(grep -E '^# (pass|fail) ' "$work/test.log" | awk '{ v[$2] = $3 } END { printf "%d passed, %d failed", v["pass"], v["fail"] }')
echo "image-test: $summary"
grep -qE '^# fail 0$' "$work/test.log"
