#!/usr/bin/env bash
# Runs QEMU's own qemu-iotests against aio-storage-daemon: `scripts/qemu-iotests.sh [-f FMT]
# [--qsd PROGRAM] TEST...` (default: the tests listed in PASSING below, qcow2 and raw).
#
# The tests come from the upstream source tarball of the installed qemu-utils' version (Debian's
# `qemu_<version>.orig.tar.xz`, cached in $AIO_QEMU_SRC, default /var/tmp/aio-rs-qemu-src), run
# with the installed QEMU's binaries and `QSD_PROG` set to our daemon (`target/debug`, built
# first, or --qsd). Two adaptations to Debian's QEMU, which has no qtest accelerator:
# the harness's `-accel qtest` becomes `-accel tcg` (its qtest socket still works); nothing
# else in the tests or their golden output changes. `--qsd qemu-storage-daemon` runs the same
# tests against QEMU's own daemon, the reference.
#
# Exit code: check's (0 when every test passed). What each other qemu-storage-daemon test of
# the suite still lacks is listed in docs/QEMU-IOTESTS.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
# shellcheck source=lib.sh
. "$here/lib.sh"

# The qemu-storage-daemon tests that pass against our daemon (CI runs these).
PASSING=(qsd-migrate)

formats=()
qsd=""
tests=()
while [ $# -gt 0 ]; do
    case "$1" in
    -f) formats+=("$2"); shift 2 ;;
    --qsd) qsd="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) tests+=("$1"); shift ;;
    esac
done
[ ${#formats[@]} -gt 0 ] || formats=(qcow2 raw)
[ ${#tests[@]} -gt 0 ] || tests=("${PASSING[@]}")

ensure_installed qemu-img qemu-utils
ensure_installed curl curl
ensure_installed xz xz-utils
command -v qemu-system-x86_64 >/dev/null 2>&1 || ensure_qemu_package qemu-system-x86

version="$(dpkg-query -W -f='${Version}' qemu-utils)"
upstream="${version#*:}"   # no epoch
upstream="${upstream%-*}"  # no Debian revision: 10.0.2+ds
src_cache="${AIO_QEMU_SRC:-/var/tmp/aio-rs-qemu-src}"
tree="$src_cache/qemu-$upstream"
if [ ! -f "$tree/.aio-rs-adapted" ]; then
    mkdir -p "$src_cache"
    tarball="$src_cache/qemu_$upstream.orig.tar.xz"
    if [ ! -s "$tarball" ]; then
        url="http://deb.debian.org/debian/pool/main/q/qemu/qemu_$upstream.orig.tar.xz"
        echo "qemu-iotests: fetching $url" >&2
        curl -fsSL -o "$tarball.part" "$url"
        mv "$tarball.part" "$tarball"
    fi
    rm -rf "$tree" "$src_cache/extract"
    mkdir -p "$src_cache/extract"
    tar -C "$src_cache/extract" -xJf "$tarball" --wildcards '*/tests/qemu-iotests/*' '*/python/*'
    mv "$src_cache/extract"/qemu-* "$tree"
    rmdir "$src_cache/extract"
    # Debian's QEMU has no qtest accelerator: TCG, with the qtest socket kept.
    sed -i 's/-accel qtest/-accel tcg/' "$tree/tests/qemu-iotests/testenv.py"
    python3 - "$tree/python/qemu/machine/qtest.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = "            '-qtest', 'chardev:qtest',\n            '-accel', 'qtest'\n"
if old not in s:
    sys.exit(f"{p}: the harness's qtest arguments are not where expected")
open(p, "w").write(s.replace(old, "            '-qtest', 'chardev:qtest',\n"))
PY
    touch "$tree/.aio-rs-adapted"
fi

if [ -z "$qsd" ]; then
    qsd="$root/target/debug/aio-storage-daemon"
    (cd "$root" && cargo build -q -p aio-storage-daemon --bin aio-storage-daemon)
fi
qsd="$(command -v "$qsd")"

export QEMU_PROG=/usr/bin/qemu-system-x86_64 QEMU_IMG_PROG=/usr/bin/qemu-img \
    QEMU_IO_PROG=/usr/bin/qemu-io QEMU_NBD_PROG=/usr/bin/qemu-nbd QSD_PROG="$qsd"
work="$(mktemp -d /var/tmp/aio-rs-iotests.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export TEST_DIR="$work/scratch" SOCK_DIR="$work/sock"
cd "$tree/tests/qemu-iotests"
status=0
for fmt in "${formats[@]}"; do
    echo "qemu-iotests: -$fmt ${tests[*]} with QSD_PROG=$qsd" >&2
    ./check "-$fmt" "${tests[@]}" || status=$?
done
exit $status
