#!/usr/bin/env bash
# Our daemon against qemu-storage-daemon serving the same RBD image (`--blockdev driver=rbd`),
# alternated (A B, B A, ...), exported over NBD to the same client (fio `ioengine=nbd`), the
# daemon pinned to CPU 0 and fio to CPU 1 (the cluster's monitor and OSD float), 4 KiB random
# reads and writes. Per workload and daemon: QD 1 mean latency, QD 32 IOPS, the daemon's CPU
# per request at QD 32, the OSD's, and the whole machine's (utime + stime from /proc/PID/stat,
# busy time from /proc/stat, over the run, divided by fio's requests). Then fio's
# `ioengine=rbd` (librbd in fio, no daemon: the limit) at QD 32, with the OSD's and the
# machine's CPU per request.
#
#   scripts/rbd-vs-qsd.sh [ROUNDS] [RUNTIME_S]     (default 3 rounds, 5 s per run)
#
# The cluster is the one AIO_CEPH_CONF names, else a one-node cluster started here and stopped
# after (scripts/ceph-cluster.sh). Run nothing else meanwhile (a build beside it is noise).
# Needs fio, qemu-utils and qemu-block-extra (qemu-storage-daemon's rbd driver).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}" runtime="${2:-5}"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_installed fio fio
ensure_installed qemu-storage-daemon qemu-utils
cargo build --release -q -p aio-storage-daemon
ours="$PWD/target/release/aio-storage-daemon"
qsd="$(command -v qemu-storage-daemon)"
dir="$(mktemp -d /dev/shm/aio-rbd-bench-XXXXXX)"
cluster=""
cleanup() {
    [ -n "$cluster" ] && bash scripts/ceph-cluster.sh stop "$cluster"
    rm -rf "$dir"
}
trap cleanup EXIT
conf="${AIO_CEPH_CONF:-}"
if [ -z "$conf" ]; then
    cluster="$dir/ceph"
    conf="$(bash scripts/ceph-cluster.sh start "$cluster")"
fi
export CEPH_CONF="$conf"
osd_pid="$(cat "$(dirname "$conf")/run/osd.0.pid")"
image="bench-$$"
rbd create --size 1G "rbd/$image"
# Written once, so that reads read objects, not holes.
rbd bench --io-type write --io-size 4M --io-threads 4 --io-total 1G "rbd/$image" >/dev/null

# Starts daemon $1 on the image (pinned to CPU 0); sets $pid.
start() {
    rm -f "$dir/nbd.sock"
    taskset -c 0 "$1" --blockdev "driver=rbd,node-name=disk0,pool=rbd,image=$image,conf=$conf,user=admin" \
        --nbd-server "addr.type=unix,addr.path=$dir/nbd.sock" \
        --export type=nbd,id=exp0,node-name=disk0,name=disk,writable=on >"$dir/log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do [ -S "$dir/nbd.sock" ] && return 0; sleep 0.05; done
    cat "$dir/log" >&2
    return 1
}

# CPU time so far of process $1, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# Busy time so far of the whole machine (every CPU but idle and iowait), in clock ticks.
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
# CPU microseconds per request from ticks $1 to $2 over $3 requests.
per_req() { python3 -c "print(($2 - $1) / $hz * 1e6 / $3)"; }

# fio's JSON on stdin: "IOPS mean_latency_us requests" (the nbd engine says "connected" first).
summary='import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; k="read" if j["read"]["io_bytes"] else "write"; print(j[k]["iops"], j[k]["lat_ns"]["mean"]/1000, j[k]["total_ios"])'

# fio at depth $2 doing $1 against the daemon.
fio_nbd() {
    taskset -c 1 fio --name=n --ioengine=nbd --uri="nbd+unix:///disk?socket=$dir/nbd.sock" \
        --rw="$1" --bs=4k --iodepth="$2" --size=1G --time_based --runtime="$runtime" \
        --output-format=json 2>/dev/null | python3 -c "$summary"
}

hz="$(getconf CLK_TCK)"
for round in $(seq "$rounds"); do
    order=("$ours" "$qsd")
    [ $((round % 2)) = 0 ] && order=("$qsd" "$ours")
    for bin in "${order[@]}"; do
        who=ours; [ "$bin" = "$qsd" ] && who=qsd
        start "$bin"
        for rw in randread randwrite; do
            read -r _ lat _ < <(fio_nbd "$rw" 1)
            before="$(ticks "$pid")" osd_before="$(ticks "$osd_pid")" all_before="$(busy)"
            read -r iops _ ios < <(fio_nbd "$rw" 32)
            after="$(ticks "$pid")" osd_after="$(ticks "$osd_pid")" all_after="$(busy)"
            echo "$rw $who $lat $iops $(per_req "$before" "$after" "$ios")" \
                "$(per_req "$osd_before" "$osd_after" "$ios")" \
                "$(per_req "$all_before" "$all_after" "$ios")"
        done
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
    for rw in randread randwrite; do
        osd_before="$(ticks "$osd_pid")" all_before="$(busy)"
        read -r iops _ ios < <(taskset -c 1 fio --name=r --ioengine=rbd --clientname=admin \
            --pool=rbd --rbdname="$image" --rw="$rw" --bs=4k --iodepth=32 --size=1G \
            --time_based --runtime="$runtime" --output-format=json 2>/dev/null |
            python3 -c "$summary")
        osd_after="$(ticks "$osd_pid")" all_after="$(busy)"
        echo "$rw fio-rbd 0 $iops 0 $(per_req "$osd_before" "$osd_after" "$ios")" \
            "$(per_req "$all_before" "$all_after" "$ios")"
    done
done | awk '{ k = $1 " " $2; n[k]++; lat[k] += $3; iops[k] += $4; cpu[k] += $5; osd[k] += $6; all[k] += $7 }
    END { for (k in n) printf "%s QD1-lat %.1f us QD32 %.0f IOPS CPU/req %.1f us OSD %.1f us machine %.1f us\n", k, lat[k] / n[k], iops[k] / n[k], cpu[k] / n[k], osd[k] / n[k], all[k] / n[k] }' |
    sort
rbd rm "rbd/$image" >/dev/null 2>&1 || true
