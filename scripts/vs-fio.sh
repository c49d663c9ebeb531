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
if ! command -v fio >/dev/null 2>&1; then
    echo "vs-fio: fio is missing; installing it with apt-get" >&2
    if [ "$(id -u)" -ne 0 ]; then
        echo "vs-fio: not root: run 'sudo apt-get install -y fio' first" >&2
        exit 2
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null
fi
exec cargo run --release -q -p aio-bench -- vs-fio "$@"
