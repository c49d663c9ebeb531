#!/usr/bin/env bash
# The loop's user-space instructions per iteration (criterion's iteration/epoll/1, counted by
# callgrind: exact, where the wall time of one run on a shared VM moves by 10-30%).
#
# Usage: scripts/loop_instructions.sh [BINARY...]
#   With no argument, builds and counts this tree's `loop_instructions` bench binary. Given
#   binaries (say, one built from an older commit, with its own CARGO_TARGET_DIR), counts each:
#   an A/B comparison of two trees without the noise.
# Each binary runs 100,000 and 200,000 iterations; the difference over 100,000 is what one
# iteration costs, setup and exit cancelled. About 4,100 of it is the test helper's 4 KiB
# zeroed drain buffer (a memset), the same in every tree.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_installed valgrind valgrind

bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
    bin=$(cargo bench -p aio-bench --bench loop_instructions --no-run --message-format=json 2>/dev/null \
        | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    bins=("$bin")
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for bin in "${bins[@]}"; do
    counts=()
    for n in 100000 200000; do
        valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" "$n" >/dev/null 2>"$out/log"
        counts+=("$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/log")")
    done
    echo "$bin: $(( (counts[1] - counts[0]) / 100000 )) instructions per iteration"
done
