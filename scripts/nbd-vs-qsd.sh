#!/usr/bin/env bash
# Our NBD export against its peers, on the same disks, the order rotated each round: fio's
# `ioengine=nbd` (libnbd) over a Unix socket, 4 KiB random reads and writes, the server pinned
# to CPU 0 and fio to CPU 1. The peers, each run as its users run it:
#   ours, qsd        qemu-storage-daemon's command line, the export in the main loop
#                    (`--export type=nbd,...`), run by our daemon and by qemu-storage-daemon;
#   ours-iot, qsd-iot the same with the export on an iothread (`--object iothread,id=iot0`,
#                    `--export ...,iothread=iot0`: how an operator runs qemu-storage-daemon);
#   nbdkit           nbdkit's file plugin (its defaults: the page cache), or its null plugin.
# io_uring for both daemons. Disks: the null device (`null-co`; nbdkit's `null`), and, as root,
# a loop device with direct I/O over a file in /dev/shm (raw, `host_device`: the fast device,
# whose latency does not hide the server's). Per disk, workload and peer: QD 1 mean latency,
# QD 32 IOPS, and the server's CPU per request at QD 32 (its utime + stime over the run, from
# /proc, all threads, divided by fio's requests). Then fio itself on the loop device at QD 32
# (io_uring, the machine's limit), and `nbdcopy` of a 1 GiB qcow2 image half of whose clusters
# are holes, out of each daemon into `null:` (time, and the server's CPU).
#
#   scripts/nbd-vs-qsd.sh [ROUNDS] [RUNTIME_S]     (default 3 rounds, 5 s per run)
#   PEERS="ours qsd-iot" scripts/nbd-vs-qsd.sh    (default: ours ours-iot qsd qsd-iot nbdkit)
#
# Run nothing else meanwhile (a build beside it is noise). Needs fio, libnbd-bin, qemu-utils,
# nbdkit (installed when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}" runtime="${2:-5}"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_installed fio fio
ensure_installed nbdcopy libnbd-bin
ensure_installed qemu-storage-daemon qemu-utils
read -r -a peers <<<"${PEERS:-ours ours-iot qsd qsd-iot nbdkit}"
for peer in "${peers[@]}"; do
    if [ "$peer" = nbdkit ]; then ensure_installed nbdkit nbdkit; fi
done
cargo build --release -q -p aio-storage-daemon
ours="$PWD/target/release/aio-storage-daemon"
qsd="$(command -v qemu-storage-daemon)"
dir="$(mktemp -d /dev/shm/aio-nbd-bench-XXXXXX)"
loopdev=""
cleanup() { [ -n "$loopdev" ] && losetup -d "$loopdev"; rm -rf "$dir"; }
trap cleanup EXIT
disks=("null")
if [ "$(id -u)" = 0 ] && truncate -s 1G "$dir/loop.img" &&
    loopdev="$(losetup --find --show --direct-io=on "$dir/loop.img" 2>/dev/null)"; then
    # Written once, so that reads read blocks, not holes.
    dd if=/dev/urandom of="$loopdev" bs=1M count=1024 oflag=direct status=none
    disks+=("$loopdev")
fi

# The blockdev of disk $1.
blockdev() {
    case "$1" in
    null) echo "driver=null-co,node-name=disk0,size=1073741824,read-zeroes=on" ;;
    *) echo "driver=host_device,node-name=disk0,filename=$1,cache.direct=on,aio=io_uring" ;;
    esac
}

# Starts peer $1 on disk $2 (pinned to CPU 0); sets $pid.
start() {
    rm -f "$dir/nbd.sock"
    local bin="$ours" iothread=() on_iothread=""
    case "$1" in
    qsd*) bin="$qsd" ;;
    esac
    case "$1" in
    *-iot) iothread=(--object iothread,id=iot0) on_iothread=",iothread=iot0" ;;
    esac
    if [ "$1" = nbdkit ]; then
        local plugin=(file "file=$2")
        [ "$2" = null ] && plugin=(null size=1G)
        taskset -c 0 nbdkit -f -U "$dir/nbd.sock" -e disk "${plugin[@]}" >"$dir/log" 2>&1 &
    else
        taskset -c 0 "$bin" "${iothread[@]}" --blockdev "$(blockdev "$2")" \
            --nbd-server "addr.type=unix,addr.path=$dir/nbd.sock" \
            --export "type=nbd,id=exp0,node-name=disk0,name=disk,writable=on$on_iothread" \
            >"$dir/log" 2>&1 &
    fi
    pid=$!
    for _ in $(seq 100); do [ -S "$dir/nbd.sock" ] && return 0; sleep 0.05; done
    cat "$dir/log" >&2
    return 1
}

# The daemon's CPU time so far, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }

# fio at depth $2 doing $1 against the daemon: "IOPS mean_latency_us requests" (fio's nbd
# engine says "connected" before its JSON).
fio_nbd() {
    taskset -c 1 fio --name=n --ioengine=nbd --uri="nbd+unix:///disk?socket=$dir/nbd.sock" \
        --rw="$1" --bs=4k --iodepth="$2" --size=1G --time_based --runtime="$runtime" \
        --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; k="read" if j["read"]["io_bytes"] else "write"; print(j[k]["iops"], j[k]["lat_ns"]["mean"]/1000, j[k]["total_ios"])'
}

hz="$(getconf CLK_TCK)"
for round in $(seq "$rounds"); do
    # The order rotated by one peer each round.
    order=()
    for i in "${!peers[@]}"; do order+=("${peers[$(((i + round) % ${#peers[@]}))]}"); done
    for who in "${order[@]}"; do
        for disk in "${disks[@]}"; do
            start "$who" "$disk"
            for rw in randread randwrite; do
                read -r _ lat _ < <(fio_nbd "$rw" 1)
                before="$(ticks)"
                read -r iops _ ios < <(fio_nbd "$rw" 32)
                after="$(ticks)"
                cpu_us="$(python3 -c "print(($after - $before) / $hz * 1e6 / $ios)")"
                echo "${disk##*/} $rw $who $lat $iops $cpu_us"
            done
            kill "$pid"; wait "$pid" 2>/dev/null || true
        done
    done
done | awk '{ k = $1 " " $2 " " $3; n[k]++; lat[k] += $4; iops[k] += $5; cpu[k] += $6 }
    END { for (k in n) printf "%s QD1-lat %.1f us QD32 %.0f IOPS CPU/req %.2f us\n", k, lat[k] / n[k], iops[k] / n[k], cpu[k] / n[k] }' |
    sort

if [ -n "$loopdev" ]; then
    taskset -c 1 fio --name=bare --ioengine=io_uring --direct=1 --filename="$loopdev" --rw=randread \
        --bs=4k --iodepth=32 --time_based --runtime="$runtime" --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; print("bare loop device randread QD32 %.0f IOPS (fio io_uring)" % json.load(sys.stdin)["jobs"][0]["read"]["iops"])'
fi

# nbdcopy of a 1 GiB qcow2 image, every other MiB data: holes skipped through block status.
python3 - "$dir/half.raw" <<'PY'
import os, sys
with open(sys.argv[1], "wb") as f:
    f.truncate(1 << 30)
    for mib in range(0, 1024, 2):
        f.seek(mib << 20)
        f.write(os.urandom(1 << 20))
PY
qemu-img convert -q -O qcow2 "$dir/half.raw" "$dir/half.qcow2"
rm -f "$dir/half.raw"
# Round 0 warms the machine up and is not counted: the first copy of a batch, whichever
# daemon serves it, takes up to twice as long. The copy goes to `null:`, so that the time
# is the server's and the client's, not tmpfs's allocating a 1 GiB file (whose cost varied
# 2.5x from run to run).
for round in $(seq 0 "$rounds"); do
    for bin in "$ours" "$qsd"; do
        who=ours; [ "$bin" = "$qsd" ] && who=qsd
        rm -f "$dir/nbd.sock"
        taskset -c 0 "$bin" --blockdev "driver=file,node-name=f0,filename=$dir/half.qcow2,cache.direct=on,aio=io_uring" \
            --blockdev driver=qcow2,node-name=disk0,file=f0 \
            --nbd-server "addr.type=unix,addr.path=$dir/nbd.sock" \
            --export type=nbd,id=exp0,node-name=disk0,name=disk >"$dir/log" 2>&1 &
        pid=$!
        for _ in $(seq 100); do [ -S "$dir/nbd.sock" ] && break; sleep 0.05; done
        before="$(ticks)"
        start_ns="$(date +%s%N)"
        taskset -c 1 nbdcopy "nbd+unix:///disk?socket=$dir/nbd.sock" null:
        ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
        cpu_ms="$(python3 -c "print(($(ticks) - $before) / $hz * 1e3)")"
        [ "$round" -gt 0 ] && echo "nbdcopy $who $ms $cpu_ms"
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
done | awk '{ n[$2]++; ms[$2] += $3; cpu[$2] += $4 }
    END { for (k in n) printf "nbdcopy 1 GiB half holes %s %.0f ms, server CPU %.0f ms\n", k, ms[k] / n[k], cpu[k] / n[k] }' | sort
