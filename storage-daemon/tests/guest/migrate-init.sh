#!/bin/busybox sh
# The guest's init for tests/guest_migrate.rs, put over the built guest's /init (a second cpio
# archive appended to scripts/build-guest.sh's initramfs: the kernel unpacks both, the later
# /init wins). It uses what that initramfs holds: busybox, fio, the modules in
# /etc/modules.order.
#
# It checks /dev/vda (vda, size, queues), then runs fio passes until the host says stop, so
# however slow the machine the workload spans both migrations: each pass is fio randwrite,
# 4k, crc32c verify, two jobs (one per queue) aio.iodepth deep (default 32) over their own
# aio.fio_size regions, verifying as it goes (--verify_backlog: reads interleaved with the
# writes) and all of it at the end. The host stops it by writing a line to the serial
# console; the pass under way ends, then the checks fio-migrate and no-io-errors, GUEST-DONE
# and the power-off.
#
# Output lines: GUEST-CHECK (vda, size, queues, fio-migrate, no-io-errors), GUEST-FIO-START,
# GUEST-FIO-PASS n=N gap_ms=MS (a pass ended with exit 0; its longest time between two
# completions), GUEST-INFO max_completion_gap_ms=MS passes=N (the longest of any pass: on the
# guest's clock, which stops while the VM is stopped, so a switchover's downtime is not in
# it), GUEST-LOG, GUEST-DONE.
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/bin
FIO=/usr/bin/fio BLOCKDEV=/usr/sbin/blockdev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
kver="$(uname -r)"
echo "GUEST-START $kver"

passed=0
failed=0
check() {
    name="$1" res="$2"
    shift 2
    echo "GUEST-CHECK $name $res $*"
    if [ "$res" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
log() {
    sed 's/^/GUEST-LOG /' "$1" | tail -n 40
}
finish() {
    echo "GUEST-DONE passed=$passed failed=$failed"
    sync
    poweroff -f
    sleep 5
}

for m in $(cat /etc/modules.order); do
    insmod "/lib/modules/$kver/$m.ko" 2>/tmp/out || { echo "GUEST-LOG insmod $m failed"; log /tmp/out; }
done
echo 3 >/proc/sys/kernel/printk

want_size="" want_queues="" fio_size=16M iodepth=32 pass_timeout=600
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    aio.size=*) want_size="${arg#*=}" ;;
    aio.queues=*) want_queues="${arg#*=}" ;;
    aio.fio_size=*) fio_size="${arg#*=}" ;;
    aio.iodepth=*) iodepth="${arg#*=}" ;;
    aio.pass_timeout=*) pass_timeout="${arg#*=}" ;;
    esac
done

i=0
while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
done
if [ ! -b /dev/vda ]; then
    check vda FAIL "no /dev/vda after 30 s"
    finish
fi
check vda PASS "/dev/vda"
size="$("$BLOCKDEV" --getsize64 /dev/vda 2>&1)"
if [ "$size" = "$want_size" ]; then check size PASS "got=$size"; else check size FAIL "got=$size want=$want_size"; fi
nq="$(ls /sys/block/vda/mq | wc -l)"
if [ "$nq" = "$want_queues" ]; then check queues PASS "got=$nq"; else check queues FAIL "got=$nq want=$want_queues"; fi

# The host's stop: any line on the console.
(read -r _ </dev/ttyS0; : >/tmp/stop) &

echo "GUEST-FIO-START uptime=$(cut -d' ' -f1 /proc/uptime)"
n=0 gap=0 result=""
while [ ! -e /tmp/stop ] && [ -z "$result" ]; do
    rm -f /tmp/pass_lat.*.log
    "$FIO" --name=pass --filename=/dev/vda --rw=randwrite --bs=4k --size="$fio_size" \
        --numjobs=2 --offset_increment="$fio_size" --cpus_allowed=0-1 --cpus_allowed_policy=split \
        --direct=1 --ioengine=libaio --iodepth="$iodepth" --verify=crc32c --do_verify=1 \
        --verify_backlog=256 --verify_fatal=1 --thread --group_reporting --output-format=terse \
        --write_lat_log=/tmp/pass --log_avg_msec=0 >/tmp/out 2>&1 &
    fio_pid=$!
    waited=0
    while kill -0 "$fio_pid" 2>/dev/null && [ "$waited" -lt "$pass_timeout" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$fio_pid" 2>/dev/null; then
        result="FAIL pass $((n + 1)) still running after ${pass_timeout} s"
        cat /sys/block/vda/inflight | sed 's/^/GUEST-LOG inflight /'
        log /tmp/out
        break
    fi
    if wait "$fio_pid"; then
        n=$((n + 1))
        g="$(cat /tmp/pass_lat.*.log 2>/dev/null | cut -d, -f1 | sort -n |
            awk 'NR > 1 && $1 - prev > gap { gap = $1 - prev } { prev = $1 } END { print gap + 0 }')"
        [ "$g" -gt "$gap" ] && gap="$g"
        echo "GUEST-FIO-PASS n=$n gap_ms=$g"
    else
        rc=$?
        result="FAIL pass $((n + 1)) exit=$rc"
        log /tmp/out
    fi
done
[ -z "$result" ] && result="PASS passes=$n"
check fio-migrate $result
echo "GUEST-INFO max_completion_gap_ms=$gap passes=$n"
if dmesg | grep -iE 'I/O error|blk_update_request|critical (medium|target)' >/tmp/out; then
    check no-io-errors FAIL "the kernel log has I/O errors"
    log /tmp/out
else
    check no-io-errors PASS "none in the kernel log"
fi
finish
