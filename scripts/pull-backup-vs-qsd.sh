#!/usr/bin/env bash
# A 1 GiB pull backup (libvirt's pull mode: a scratch qcow2 over the disk's node, a
# `transaction` with the new checkpoint and `blockdev-backup sync=none`, the scratch node
# exported over NBD) read with `nbdcopy` while a guest stand-in writes the disk: fio
# `ioengine=nbd`, 4 KiB random writes at QD 8 through the disk's own NBD export, so that
# copy-before-write runs all through the copy. Our daemon and qemu-storage-daemon, alternated
# (A B, B A, ...), on the same image: a 1 GiB qcow2 in /dev/shm half of whose MiBs are holes.
# The daemon is pinned to CPU 0, nbdcopy and fio to CPU 1.
#
# Per daemon: the backup's MB/s (1 GiB over nbdcopy's wall time), the guest's write IOPS
# during it, and the same guest alone on the same daemon before the backup (its IOPS during
# over alone: what the backup costs the guest). Medians over the rounds, and ours over theirs.
#
#   scripts/pull-backup-vs-qsd.sh [ROUNDS]     (default 3)
#
# Run nothing else meanwhile (a build beside it is noise). Needs fio, libnbd-bin, qemu-utils.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_installed fio fio
ensure_installed nbdcopy libnbd-bin
ensure_installed qemu-storage-daemon qemu-utils
cargo build --release -q -p aio-storage-daemon
ours="$PWD/target/release/aio-storage-daemon"
qsd="$(command -v qemu-storage-daemon)"
dir="$(mktemp -d /dev/shm/aio-pull-bench-XXXXXX)"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

# The disk: 1 GiB, every other MiB random data, the rest holes.
python3 - "$dir/base.raw" <<'EOF'
import os, sys
with open(sys.argv[1], "wb") as f:
    f.truncate(1 << 30)
    for mib in range(0, 1024, 2):
        f.seek(mib << 20)
        f.write(os.urandom(1 << 20))
EOF
qemu-img convert -f raw -O qcow2 "$dir/base.raw" "$dir/base.qcow2"
rm "$dir/base.raw"

# QMP commands (one JSON object per argument) to the monitor of the running daemon.
qmp() {
    python3 - "$dir/qmp.sock" "$@" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.readline()
for cmd in [{"execute": "qmp_capabilities"}] + [json.loads(a) for a in sys.argv[2:]]:
    f.write(json.dumps(cmd) + "\n")
    f.flush()
    while True:
        reply = json.loads(f.readline())
        if "event" in reply:
            continue
        if "error" in reply:
            sys.exit(f"{cmd['execute']}: {reply['error']['desc']}")
        break
EOF
}

# Starts daemon $1 on a fresh copy of the disk (pinned to CPU 0); sets $pid.
start() {
    rm -f "$dir"/*.sock "$dir/disk.qcow2" "$dir/scratch.qcow2"
    cp --sparse=always "$dir/base.qcow2" "$dir/disk.qcow2"
    qemu-img create -q -f qcow2 -u -b "$dir/disk.qcow2" -F qcow2 "$dir/scratch.qcow2" 1G
    taskset -c 0 "$1" \
        --chardev "socket,id=m,path=$dir/qmp.sock,server=on,wait=off" --monitor chardev=m \
        --blockdev "driver=file,node-name=file,filename=$dir/disk.qcow2,cache.direct=on,aio=io_uring" \
        --blockdev driver=qcow2,node-name=fmt,file=file \
        --nbd-server "addr.type=unix,addr.path=$dir/nbd.sock" \
        --export type=nbd,id=exp,node-name=fmt,name=disk,writable=on >"$dir/log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -S "$dir/nbd.sock" ] && [ -S "$dir/qmp.sock" ] && return 0; sleep 0.05; done
    cat "$dir/log" >&2
    return 1
}

stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }

# The guest stand-in for $1 seconds (or until interrupted), its IOPS printed at its end (fio
# says it connected on stdout first).
guest() {
    taskset -c 1 fio --name=guest --ioengine=nbd --uri="nbd+unix:///disk?socket=$dir/nbd.sock" \
        --rw=randwrite --bs=4k --iodepth=8 --size=1g --time_based --runtime="${1:-600}" \
        --output-format=json 2>/dev/null | python3 -c \
        'import json,sys; s=sys.stdin.read(); print(round(json.loads(s[s.index("{"):])["jobs"][0]["write"]["iops"]))'
}

# One round of daemon $1: "MB/s guest-IOPS-during guest-IOPS-alone".
round() {
    start "$1"
    local alone
    alone="$(guest 5)"
    qmp '{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"sf","filename":"'"$dir"'/scratch.qcow2"}}' \
        '{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"scratch","file":"sf","backing":"fmt"}}' \
        '{"execute":"transaction","arguments":{"actions":[
            {"type":"block-dirty-bitmap-add","data":{"node":"fmt","name":"c1","persistent":true}},
            {"type":"blockdev-backup","data":{"job-id":"fleece","device":"fmt","target":"scratch","sync":"none"}}]}}' \
        '{"execute":"block-export-add","arguments":{"type":"nbd","id":"bexp","node-name":"scratch","name":"backup"}}'
    guest 600 >"$dir/during" &
    local fio=$!
    sleep 0.5
    local t0 t1
    t0="$(date +%s.%N)"
    taskset -c 1 nbdcopy "nbd+unix:///backup?socket=$dir/nbd.sock" null:
    t1="$(date +%s.%N)"
    pkill -INT -P "$fio" fio 2>/dev/null || pkill -INT -f "fio --name=guest" || true
    wait "$fio" || true
    stop
    echo "$(python3 -c "print(round(1024 / ($t1 - $t0), 1))") $(cat "$dir/during") $alone"
}

declare -A results
for r in $(seq "$rounds"); do
    order=(ours qsd)
    [ $((r % 2)) = 0 ] && order=(qsd ours)
    for who in "${order[@]}"; do
        prog="$ours"
        [ "$who" = qsd ] && prog="$qsd"
        line="$(round "$prog")"
        echo "round $r $who: backup MB/s, guest IOPS during, guest IOPS alone: $line"
        results[$who]+="$line;"
    done
done

python3 - "${results[ours]}" "${results[qsd]}" <<'EOF'
import statistics, sys
def medians(s):
    rows = [list(map(float, r.split())) for r in s.split(";") if r]
    return [statistics.median(c) for c in zip(*rows)]
ours, qsd = medians(sys.argv[1]), medians(sys.argv[2])
for name, i in [("backup MB/s", 0), ("guest write IOPS during the backup", 1),
                ("guest write IOPS alone", 2)]:
    print(f"{name}: ours {ours[i]:.0f}, qemu-storage-daemon {qsd[i]:.0f}, ours/theirs {ours[i] / qsd[i]:.2f}")
print(f"guest IOPS during / alone: ours {ours[1] / ours[2]:.2f}, qemu-storage-daemon {qsd[1] / qsd[2]:.2f}")
EOF
