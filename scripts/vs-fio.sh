#!/usr/bin/env bash
# Side-by-side: one job through fio and through an aio-rs engine, alternating A B A B.
# Installs fio where it is missing (Debian/Ubuntu, as root), then runs
#   cargo run --release -p aio-bench -- vs-fio ARGS...
# Examples:
#   scripts/vs-fio.sh --engine linux-aio --iodepth 32      # QD32 4k random reads (IOPS)
#   scripts/vs-fio.sh --engine linux-aio --iodepth 1       # QD1 (mean latency)
#   scripts/vs-fio.sh --engine pool --iodepth 8
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
ensure_installed fio fio
exec cargo run --release -q -p aio-bench -- vs-fio "$@"
