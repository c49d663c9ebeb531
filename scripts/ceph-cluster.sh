#!/usr/bin/env bash
# A one-node Ceph cluster for tests, without systemd: one monitor and one OSD (bluestore on an
# 8 GiB sparse file: room for what the tests write and its RocksDB's WAL; at 4 GiB a benchmark's
# images filled it and BlueFS aborted), pool `rbd` of size 1, everything (config, keys, data,
# logs, sockets, PID files) under DIR, nothing left running once stopped.
#
#   scripts/ceph-cluster.sh start DIR    # prints the config path; `rbd -c DIR/ceph.conf ...`
#   scripts/ceph-cluster.sh stop DIR     # SIGTERM to the PIDs in DIR's pid files, then waits
#   scripts/ceph-cluster.sh kill DIR osd.0|mon.a     # SIGKILL one daemon (a fault test's crash)
#   scripts/ceph-cluster.sh revive DIR osd.0|mon.a   # start it again on its data
#
# Installs ceph-mon, ceph-osd and ceph-common (Debian's Ceph 16.2) when missing, as .ci/run
# installs qemu-utils. Loopback only: the monitor listens on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 start|stop DIR, or kill|revive DIR osd.0|mon.a" >&2; exit 2; }
action="$1"
mkdir -p "$2"
dir="$(realpath "$2")"
conf="$dir/ceph.conf"

stop() {
    local pids=() pid
    for f in "$dir"/run/*.pid; do
        [ -f "$f" ] || continue
        pid="$(cat "$f")"
        kill -0 "$pid" 2>/dev/null && pids+=("$pid") && kill -TERM "$pid"
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    done
    rm -f "$dir"/run/*.pid "$dir"/run/*.asok
}

case "$action" in
stop)
    stop
    exit 0
    ;;
kill)
    pid="$(cat "$dir/run/$3.pid")"
    kill -KILL "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    rm -f "$dir/run/$3.pid" "$dir/run/$3.asok"
    exit 0
    ;;
revive)
    case "$3" in
    mon.*) ceph-mon -c "$conf" -i "${3#mon.}" ;;
    osd.*) ceph-osd -c "$conf" -i "${3#osd.}" --keyring "$dir/osd/ceph-${3#osd.}/keyring" \
        2>>"$dir/log/osd-start.log" ;;
    *) echo "$0: revive osd.N or mon.NAME" >&2; exit 2 ;;
    esac
    exit 0
    ;;
start) ;;
*)
    echo "$0: unknown action '$action' (start, stop, kill or revive)" >&2
    exit 2
    ;;
esac

# shellcheck source=scripts/lib.sh
source scripts/lib.sh
ensure_installed ceph-mon ceph-mon
ensure_installed ceph-osd ceph-osd
ensure_installed rbd ceph-common

stop
rm -rf "${dir:?}"/{mon,osd,run,log,keyring,monmap,ceph.conf}
mkdir -p "$dir"/{mon,osd,run,log}
fsid="$(cat /proc/sys/kernel/random/uuid)"
cat >"$conf" <<CONF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:3300,v1:127.0.0.1:6789]
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $dir/keyring
run dir = $dir/run
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.asok
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
osd crush chooseleaf type = 0
osd pool default pg autoscale mode = off
mon warn on pool no redundancy = false
# A test machine's disk may be nearly full (a build's target directories): the monitor must
# still start (its default refuses below 5 % free).
mon data avail crit = 0
mon data avail warn = 0
[mon]
mon data = $dir/mon/\$cluster-\$id
[osd]
osd data = $dir/osd/\$cluster-\$id
osd objectstore = bluestore
bluestore block create = true
bluestore block path = $dir/osd/block
bluestore block size = 8589934592
osd memory target = 536870912
CONF
ceph-authtool "$dir/keyring" --create-keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$dir/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
monmaptool --create --fsid "$fsid" --addv a '[v2:127.0.0.1:3300,v1:127.0.0.1:6789]' \
    "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
ceph-mon -c "$conf" -i a
ceph="ceph -c $conf --connect-timeout 30"
uuid="$(cat /proc/sys/kernel/random/uuid)"
id="$($ceph osd new "$uuid")"
mkdir -p "$dir/osd/ceph-$id"
$ceph auth get-or-create "osd.$id" mon 'allow profile osd' osd 'allow *' mgr 'allow profile osd' \
    -o "$dir/osd/ceph-$id/keyring"
ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" --keyring "$dir/osd/ceph-$id/keyring" \
    >/dev/null 2>&1
ceph-osd -c "$conf" -i "$id" --keyring "$dir/osd/ceph-$id/keyring" 2>>"$dir/log/osd-start.log"
$ceph osd pool create rbd 8 8 >/dev/null 2>&1
rbd -c "$conf" pool init rbd
# Ready when an image can be made and removed.
for _ in $(seq 100); do
    if rbd -c "$conf" create --size 1M rbd/ready 2>/dev/null; then
        rbd -c "$conf" rm rbd/ready >/dev/null 2>&1
        echo "$conf"
        exit 0
    fi
    sleep 0.2
done
echo "$0: the cluster in $dir did not become ready (logs in $dir/log)" >&2
exit 1
