#!/usr/bin/env bash
# Our daemon's image paths beside qemu-storage-daemon's, on the same images, alternated, each
# run driven by `aio-bench vhost --socket` (libblkio; 4 KiB random, 5 s per run), the daemon
# pinned to CPU 0 and the client to CPU 1, io_uring on both sides, poll-max-ns 32768.
#
#   scripts/images-vs-qsd.sh [ROUNDS] [MODE]      (default 2 tmpfs; builds the release binaries)
#
# MODE:
#   tmpfs  1 GiB images in /dev/shm, every cluster allocated (qemu-img convert of a written raw
#          file): ours raw, ours qcow2, QEMU qcow2, ours null, QEMU null-co (randread and
#          randwrite at QD 1 and 32), then allocating writes (randwrite QD 32, 2 s) into a
#          fresh empty 32 GiB qcow2 image for each daemon: 0.5M clusters of 64 KiB, so at
#          QEMU's rate about 9 in 10 writes land in a cluster not written yet (with a smaller
#          image the faster daemon would find more clusters already allocated).
#   loop   the issue's setting: loop devices with direct I/O over files in /dev/shm. A raw
#          1 GiB device, and a qcow2 image with preallocation=metadata written straight onto a
#          second device (1 GiB virtual), both filled with data: ours and QEMU's raw, ours and
#          QEMU's qcow2, randread and randwrite at QD 1 and 32.
#   large  a disk beyond imago's L2 cache (128 tables: 64 GiB at 64 KiB clusters): 256 GiB,
#          sparse in /dev/shm, raw and qcow2 with preallocation=metadata (512 L2 tables of 64 KiB):
#          ours raw, ours qcow2, QEMU's qcow2, randread at QD 1 and 32 over the whole disk.
#
# Prints one line per run: what, workload, IOPS, latency, the daemon's CPU per request.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_installed qemu-img qemu-utils
ensure_installed qemu-storage-daemon qemu-utils
rounds="${1:-2}"
mode="${2:-tmpfs}"
case "$mode" in
tmpfs | large) ;;
loop) [ "$(id -u)" -eq 0 ] || { echo "images-vs-qsd: loop needs root (losetup)" >&2; exit 2; } ;;
*) echo "usage: $0 [ROUNDS] [tmpfs|loop|large]" >&2; exit 2 ;;
esac
cargo build --release -q -p aio-bench -p aio-storage-daemon
bin="$PWD/target/release"
dir="$(mktemp -d /dev/shm/aio-images-XXXXXX)"
cleanup() {
    local f
    for f in "$dir"/*.backing; do
        [ -e "$f" ] && losetup -j "$f" | cut -d: -f1 | xargs -r -n1 losetup -d
    done
    rm -rf "$dir"
}
trap cleanup EXIT
sock="$dir/s.sock"
export_args="type=vhost-user-blk,id=e0,node-name=d0,addr.type=unix,addr.path=$sock,writable=on,num-queues=1,iothread=io0"

run() { # NAME COMMAND...   (WORKLOADS=randwrite DEPTHS=32 RUNTIME=2s to run fewer)
    local name="$1" pid rw qd out
    shift
    rm -f "$sock"
    taskset -c 0 "$@" >"$dir/$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    for rw in ${WORKLOADS:-randread randwrite}; do
        for qd in ${DEPTHS:-1 32}; do
            out=$("$bin/aio-bench" vhost --socket "$sock" --rw "$rw" --iodepth "$qd" \
                --runtime "${RUNTIME:-5s}" --client-cpu 1 --daemon-pid "$pid" 2>&1 |
                grep -E "IOPS|latency|per request" | tr '\n' ' ' |
                sed -E 's/\(([0-9]+) requests[^)]*\)//')
            echo "$name $rw qd$qd: $out"
        done
    done
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
}

ours() { run "$1" "$bin/aio-storage-daemon" --disk "socket=$sock,$2" --engine uring \
    --iothreads 1 --poll-max-ns 32768; }
qsd() { run "$1" qemu-storage-daemon --object iothread,id=io0,poll-max-ns=32768 "${@:2}" \
    --export "$export_args"; }
# QEMU's nodes for an image: DRIVER (file or host_device), PATH, FORMAT (raw or qcow2).
qsd_image() { qsd "$1" --blockdev "driver=$2,node-name=f0,filename=$3,cache.direct=on,aio=io_uring,locking=off" \
    --blockdev "driver=$4,node-name=d0,file=f0"; }
# A loop device with direct I/O over a new file of SIZE in $dir; prints its path.
loop_device() {
    truncate -s "$2" "$dir/$1"
    losetup --find --show --direct-io=on "$dir/$1"
}

tmpfs_rounds() {
    qemu-img create -q -f raw "$dir/src.raw" 1G
    qemu-io -f raw -c "write -P 0x5a 0 1G" "$dir/src.raw" >/dev/null
    cp "$dir/src.raw" "$dir/raw.img"
    qemu-img convert -f raw -O qcow2 "$dir/src.raw" "$dir/image.qcow2"
    rm "$dir/src.raw"
    for _ in $(seq "$rounds"); do
        ours ours-raw "image=$dir/raw.img"
        ours ours-qcow2 "image=$dir/image.qcow2"
        qsd_image qsd-qcow2 file "$dir/image.qcow2" qcow2
        ours ours-null "image=null,size=1G"
        qsd qsd-null --blockdev driver=null-co,node-name=d0,size=1073741824,read-zeroes=on
        for who in ours qsd; do
            rm -f "$dir/empty.qcow2"
            qemu-img create -q -f qcow2 "$dir/empty.qcow2" 32G
            export WORKLOADS=randwrite DEPTHS=32 RUNTIME=2s
            if [ "$who" = ours ]; then
                ours ours-alloc "image=$dir/empty.qcow2"
            else
                qsd_image qsd-alloc file "$dir/empty.qcow2" qcow2
            fi
            unset WORKLOADS DEPTHS RUNTIME
        done
    done
}

loop_rounds() {
    local raw qcow2
    raw="$(loop_device raw.backing 1G)"
    qcow2="$(loop_device qcow2.backing 1100M)"
    qemu-io -f raw -c "write -P 0x5a 0 1G" "$raw" >/dev/null
    qemu-img create -q -f qcow2 -o preallocation=metadata "$qcow2" 1G
    qemu-io -f qcow2 -c "write -P 0x5a 0 1G" "$qcow2" >/dev/null
    echo "raw on $raw, qcow2 on $qcow2 (loop devices, direct I/O, over /dev/shm)"
    for _ in $(seq "$rounds"); do
        ours ours-raw "image=$raw,format=raw"
        qsd_image qsd-raw host_device "$raw" raw
        ours ours-qcow2 "image=$qcow2,format=qcow2"
        qsd_image qsd-qcow2 host_device "$qcow2" qcow2
    done
}

large_rounds() {
    qemu-img create -q -f raw "$dir/large.raw" 256G
    qemu-img create -q -f qcow2 -o preallocation=metadata "$dir/large.qcow2" 256G
    export WORKLOADS=randread
    for _ in $(seq "$rounds"); do
        ours ours-raw-256g "image=$dir/large.raw,format=raw"
        ours ours-qcow2-256g "image=$dir/large.qcow2,format=qcow2"
        qsd_image qsd-qcow2-256g file "$dir/large.qcow2" qcow2
    done
}

"${mode}_rounds"
