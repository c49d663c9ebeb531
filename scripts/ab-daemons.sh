#!/usr/bin/env bash
# Two builds of the daemon, A and B, alternated on the same disks: the null device, a 1 GiB
# raw file in /dev/shm, a qcow2 image there (metadata preallocated) and, as root, a loop device
# with direct I/O over a tmpfs file (the fast device); random 4 KiB reads and writes at QD 32,
# 3 s each, the daemon pinned to CPU 0 and the libblkio client (`aio-bench vhost --socket`) to
# CPU 1, io_uring, poll-max-ns 32768. Prints the means per disk, workload and build: IOPS and
# the daemon's CPU per request.
#
#   scripts/ab-daemons.sh A_BINARY B_BINARY [ROUNDS]     (default 5; builds aio-bench first)
#
# Make A from an older commit with `git worktree add /tmp/a <rev> && cargo build --release -p
# aio-storage-daemon --manifest-path /tmp/a/Cargo.toml` (`-p aio-vhost-user-blk` before the
# daemon was a crate of its own). Run nothing else meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 A_BINARY B_BINARY [ROUNDS]" >&2; exit 2; }
a="$(realpath "$1")" b="$(realpath "$2")" rounds="${3:-5}"
cargo build --release -q -p aio-bench
bench="$PWD/target/release/aio-bench"
dir="$(mktemp -d /dev/shm/aio-ab-XXXXXX)"
trap 'rm -rf "$dir"' EXIT
truncate -s 1G "$dir/raw.img"
disks=("image=null,size=1G" "image=$dir/raw.img")
if command -v qemu-img >/dev/null; then
    qemu-img create -q -f qcow2 -o preallocation=metadata "$dir/disk.qcow2" 1G
    disks+=("image=$dir/disk.qcow2")
fi
loopdev=""
if [ "$(id -u)" = 0 ] && truncate -s 1G "$dir/loop.img" &&
    loopdev="$(losetup --find --show --direct-io=on "$dir/loop.img" 2>/dev/null)"; then
    disks+=("image=$loopdev")
fi
trap '[ -n "$loopdev" ] && losetup -d "$loopdev"; rm -rf "$dir"' EXIT
for _ in $(seq "$rounds"); do
    for who in A B; do
        bin="$a"; [ "$who" = B ] && bin="$b"
        for disk in "${disks[@]}"; do
            rm -f "$dir/s.sock"
            taskset -c 0 "$bin" --disk "socket=$dir/s.sock,$disk" --engine uring --iothreads 1 \
                --poll-max-ns 32768 >/dev/null 2>&1 &
            pid=$!
            for _ in $(seq 50); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
            for rw in randread randwrite; do
                "$bench" vhost --socket "$dir/s.sock" --rw "$rw" --iodepth 32 --runtime 3s \
                    --client-cpu 1 --daemon-pid "$pid" 2>&1 |
                    grep -E "IOPS|per request" |
                    sed -E 's/.*IOPS ([0-9]+).*/\1/; s/.*, ([0-9.]+) µs per request.*/\1/' |
                    tr '\n' ' ' | sed "s|^|${disk%%,*} $rw $who |"
                echo
            done
            kill "$pid"
            wait "$pid" 2>/dev/null || true
        done
    done
done | awk 'NF == 5 { k = $1 " " $2 " " $3; n[k]++; iops[k] += $4; cpu[k] += $5 }
    END { for (k in n) printf "%s IOPS %.0f CPU/req %.3f us\n", k, iops[k] / n[k], cpu[k] / n[k] }' |
    sed "s|$dir/||" | sort
