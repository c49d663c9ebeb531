#!/usr/bin/env bash
# The engine conformance suite of every engine (pool, linux-aio, io_uring with its own ring,
# registered files, with registered files and buffers, on the uring monitor, and the shared ring) under valgrind's memcheck: any invalid read or write, use of freed memory or uninitialised
# value fails the run (exit code 1 from valgrind's --error-exitcode).
#
#   scripts/memcheck.sh            # valgrind (installed with apt-get where missing)
#   scripts/memcheck.sh --asan     # AddressSanitizer instead (needs a nightly toolchain)
#
# Memory the kernel writes (io_uring and Linux AIO buffers, rings) is owned by the engines
# until the completion is reaped; this is the check that nothing frees or reuses it earlier.
# scripts/valgrind.supp lists the one valgrind blind spot suppressed (the Linux AIO ring's
# real size), with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(-p aio-pool -p aio-backend-linux-aio -p aio-backend-uring)
TESTS=(--test conformance)
export AIO_REQUIRE_ALL_BACKENDS=1

if [ "${1:-}" = "--asan" ]; then
    # std is not instrumented (no -Zbuild-std): reports cover this workspace's code.
    export RUSTFLAGS="-Zsanitizer=address ${RUSTFLAGS:-}"
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/asan}"
    cargo +nightly test --target x86_64-unknown-linux-gnu "${PACKAGES[@]}" "${TESTS[@]}" \
        --test shared_ring
    echo "memcheck: AddressSanitizer found nothing"
    exit 0
fi

# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ensure_installed valgrind valgrind

# The test binaries, built once (a failed build stops the script here), then each run under
# memcheck.
cargo test --no-run "${PACKAGES[@]}" "${TESTS[@]}" --test shared_ring
mapfile -t BINARIES < <(
    cargo test --no-run --message-format=json "${PACKAGES[@]}" "${TESTS[@]}" --test shared_ring 2>/dev/null |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
)
if [ "${#BINARIES[@]}" -ne 4 ]; then
    echo "memcheck: expected 4 test binaries, found ${#BINARIES[@]}: ${BINARIES[*]}" >&2
    exit 1
fi
LOG_DIR="${CARGO_TARGET_DIR:-target}/memcheck"
rm -rf "$LOG_DIR" && mkdir -p "$LOG_DIR"
status=0
for bin in "${BINARIES[@]}"; do
    name="$(basename "$bin")"
    echo "memcheck: $name"
    # One test thread: valgrind serialises threads anyway, and reports stay readable.
    if ! valgrind --tool=memcheck --error-exitcode=1 --errors-for-leak-kinds=none \
        --suppressions=scripts/valgrind.supp \
        --log-file="$LOG_DIR/$name.log" "$bin" --test-threads=1 -q; then
        echo "memcheck: $name: errors, see $LOG_DIR/$name.log" >&2
        status=1
    fi
    grep -h "ERROR SUMMARY" "$LOG_DIR/$name.log" | tail -1
done
exit $status
