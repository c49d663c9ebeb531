#!/usr/bin/env bash
# Our daemon's image paths beside qemu-storage-daemon's, on one image, alternated:
#   ours raw, ours qcow2, QEMU qcow2, ours null, QEMU null-co, and allocating writes (a fresh
#   empty 8 GiB qcow2 image for each run, QD 32: a write to a 64 KiB cluster not written yet
#   allocates it)
# each driven by `aio-bench vhost --socket` (libblkio; randread QD 1 and 32, randwrite QD 1 and
# 32, 4 KiB, 5 s), the daemon pinned to CPU 0 and the client to CPU 1, io_uring on both
# sides, poll-max-ns 32768. The image is 1 GiB on tmpfs, every cluster allocated (qemu-img
# convert of a written raw file), so reads and writes never allocate.
#
#   scripts/images-vs-qsd.sh [ROUNDS]      (default 2; builds the release binaries first)
#
# Prints one line per run: what, workload, IOPS, latency, the daemon's CPU per request.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_installed qemu-img qemu-utils
ensure_installed qemu-storage-daemon qemu-utils
rounds="${1:-2}"
cargo build --release -q -p aio-bench -p aio-vhost-user-blk
bin="$PWD/target/release"
dir="$(mktemp -d /dev/shm/aio-images-XXXXXX)"
trap 'rm -rf "$dir"' EXIT
qemu-img create -q -f raw "$dir/src.raw" 1G
qemu-io -f raw -c "write -P 0x5a 0 1G" "$dir/src.raw" >/dev/null
cp "$dir/src.raw" "$dir/raw.img"
qemu-img convert -f raw -O qcow2 "$dir/src.raw" "$dir/image.qcow2"
rm "$dir/src.raw"
sock="$dir/s.sock"
export_args="type=vhost-user-blk,id=e0,node-name=d0,addr.type=unix,addr.path=$sock,writable=on,num-queues=1,iothread=io0"

run() { # NAME COMMAND...   (WORKLOADS=randwrite DEPTHS=32 to run fewer)
    local name="$1" pid rw qd out
    shift
    rm -f "$sock"
    taskset -c 0 "$@" >"$dir/$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    for rw in ${WORKLOADS:-randread randwrite}; do
        for qd in ${DEPTHS:-1 32}; do
            out=$("$bin/aio-bench" vhost --socket "$sock" --rw "$rw" --iodepth "$qd" \
                --runtime 5s --client-cpu 1 --daemon-pid "$pid" 2>&1 |
                grep -E "IOPS|latency|per request" | tr '\n' ' ' |
                sed -E 's/\(([0-9]+) requests[^)]*\)//')
            echo "$name $rw qd$qd: $out"
        done
    done
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
}

ours() { run "$1" "$bin/aio-vhost-user-blk" --disk "socket=$sock,$2" --engine uring \
    --iothreads 1 --poll-max-ns 32768; }
qsd() { run "$1" qemu-storage-daemon --object iothread,id=io0,poll-max-ns=32768 "${@:2}" \
    --export "$export_args"; }

for _ in $(seq "$rounds"); do
    ours ours-raw "image=$dir/raw.img"
    ours ours-qcow2 "image=$dir/image.qcow2"
    qsd qsd-qcow2 --blockdev "driver=file,node-name=f0,filename=$dir/image.qcow2,cache.direct=on,aio=io_uring,locking=off" \
        --blockdev driver=qcow2,node-name=d0,file=f0
    ours ours-null "image=null,size=1G"
    qsd qsd-null --blockdev driver=null-co,node-name=d0,size=1073741824,read-zeroes=on
    for who in ours qsd; do
        rm -f "$dir/empty.qcow2"
        qemu-img create -q -f qcow2 "$dir/empty.qcow2" 8G
        if [ "$who" = ours ]; then
            WORKLOADS=randwrite DEPTHS=32 ours ours-alloc "image=$dir/empty.qcow2"
        else
            WORKLOADS=randwrite DEPTHS=32 qsd qsd-alloc --blockdev "driver=file,node-name=f0,filename=$dir/empty.qcow2,cache.direct=on,aio=io_uring,locking=off" \
                --blockdev driver=qcow2,node-name=d0,file=f0
        fi
    done
done
