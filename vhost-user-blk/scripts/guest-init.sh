#!/bin/busybox sh
# The guest's init: loads the modules, checks /dev/vda against the kernel command line,
# prints GUEST-CHECK lines on the console and powers off.
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/bin
# This busybox runs its own applets before anything on PATH (it has blockdev and blkdiscard
# too), so the real tools are named by their full paths.
FIO=/usr/bin/fio MKFS=/usr/sbin/mkfs.ext4 FSCK=/usr/sbin/fsck.ext4
BLOCKDEV=/usr/sbin/blockdev BLKDISCARD=/usr/sbin/blkdiscard
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
kver="$(uname -r)"
echo "GUEST-START $kver"

passed=0
failed=0
# check NAME PASS|FAIL DETAIL...: prints one result line and counts it.
check() {
    name="$1" res="$2"
    shift 2
    echo "GUEST-CHECK $name $res $*"
    if [ "$res" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
# log FILE: prints a failed command's output, prefixed.
log() {
    sed 's/^/GUEST-LOG /' "$1" | tail -n 40
}
# run NAME CMD...: runs CMD, and the check NAME passes when it exits 0.
run() {
    name="$1"
    shift
    if "$@" >/tmp/out 2>&1; then
        check "$name" PASS "exit=0"
    else
        rc=$?
        check "$name" FAIL "exit=$rc: $*"
        log /tmp/out
    fi
}
# no_io_errors: the check no-io-errors, on the kernel log.
no_io_errors() {
    if dmesg | grep -iE 'I/O error|blk_update_request|critical (medium|target)' >/tmp/out; then
        check no-io-errors FAIL "the kernel log has I/O errors"
        log /tmp/out
    else
        check no-io-errors PASS "none in the kernel log"
    fi
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
# Only errors from here on, so kernel messages do not break our lines.
echo 3 >/proc/sys/kernel/printk

want_size="" want_serial="" want_queues="" readonly=0 fio_size=16M
mode=checks iodepth=32 loops=4 fio_timeout=300 idle=0 resize_to=0
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    aio.size=*) want_size="${arg#*=}" ;;
    aio.serial=*) want_serial="${arg#*=}" ;;
    aio.queues=*) want_queues="${arg#*=}" ;;
    aio.readonly=*) readonly="${arg#*=}" ;;
    aio.fio_size=*) fio_size="${arg#*=}" ;;
    aio.mode=*) mode="${arg#*=}" ;;
    aio.iodepth=*) iodepth="${arg#*=}" ;;
    aio.loops=*) loops="${arg#*=}" ;;
    aio.fio_timeout=*) fio_timeout="${arg#*=}" ;;
    aio.idle=*) idle="${arg#*=}" ;;
    aio.resize_to=*) resize_to="${arg#*=}" ;;
    esac
done

i=0
while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
done
if [ ! -b /dev/vda ]; then
    check vda FAIL "no /dev/vda after 30 s; block devices: $(ls /sys/block | tr '\n' ' ')"
    finish
fi
check vda PASS "/dev/vda"

q=/sys/block/vda/queue
echo "GUEST-INFO ro=$(cat /sys/block/vda/ro) write_cache=$(cat $q/write_cache | tr ' ' '_')" \
    "discard_max_bytes=$(cat $q/discard_max_bytes) write_zeroes_max_bytes=$(cat $q/write_zeroes_max_bytes)" \
    "logical_block_size=$(cat $q/logical_block_size) physical_block_size=$(cat $q/physical_block_size)" \
    "max_sectors_kb=$(cat $q/max_sectors_kb) hw_queues=$(ls /sys/block/vda/mq | wc -l)"

size="$("$BLOCKDEV" --getsize64 /dev/vda 2>&1)"
if [ -z "$want_size" ]; then
    check size FAIL "got=$size want=(aio.size not given)"
elif [ "$size" = "$want_size" ]; then
    check size PASS "got=$size"
else
    check size FAIL "got=$size want=$want_size"
fi

serial="$(cat /sys/block/vda/serial 2>&1)"
if [ "$serial" = "$want_serial" ]; then
    check serial PASS "got=$serial"
else
    check serial FAIL "got='$serial' want='$want_serial'"
fi

if [ -n "$want_queues" ]; then
    nq="$(ls /sys/block/vda/mq | wc -l)"
    if [ "$nq" = "$want_queues" ]; then
        check queues PASS "got=$nq"
    else
        check queues FAIL "got=$nq want=$want_queues"
    fi
fi

if [ "$readonly" = 1 ]; then
    ro="$(cat /sys/block/vda/ro)"
    if [ "$ro" = 1 ]; then check readonly PASS "ro=1"; else check readonly FAIL "ro=$ro want=1"; fi
    run read dd if=/dev/vda of=/dev/null bs=1M count=4 iflag=direct
    # The kernel refuses writes to a read-only disk itself; a forced write must fail too.
    "$BLOCKDEV" --setrw /dev/vda 2>/dev/null
    if dd if=/dev/zero of=/dev/vda bs=4k count=1 oflag=direct conv=fsync >/tmp/out 2>&1; then
        check write-refused FAIL "a direct write to /dev/vda succeeded"
    else
        check write-refused PASS "the write failed"
    fi
    finish
fi

# aio.mode=resize: the host resizes the disk to aio.resize_to bytes while the guest runs (it
# does so when it reads GUEST-RESIZE-READY); the kernel must take the new capacity from the
# device's config interrupt, and the new end must take a write and read it back.
if [ "$mode" = resize ]; then
    echo "GUEST-RESIZE-READY"
    want=$((resize_to / 512))
    i=0
    while [ "$(cat /sys/block/vda/size)" != "$want" ] && [ $i -lt 1200 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    got="$(cat /sys/block/vda/size)"
    if [ "$got" = "$want" ]; then
        check resize-seen PASS "sectors=$got"
    else
        check resize-seen FAIL "sectors=$got want=$want after 120 s"
    fi
    # virtio_blk's own line for a resize ("new size: N 512-byte logical blocks").
    if dmesg | grep -q "\[vda\] new size: $want "; then
        check capacity-logged PASS "$(dmesg | grep -o 'new size: [0-9]* [^ ]*' | tail -n 1)"
    else
        check capacity-logged FAIL "no 'new size: $want' in the kernel log"
        dmesg | grep -iE 'vda|virtio' | tail -n 10 | sed 's/^/GUEST-LOG dmesg: /'
    fi
    last=$((resize_to / 1048576 - 1))
    dd if=/dev/urandom of=/tmp/end bs=1M count=1 2>/dev/null
    run end-write dd if=/tmp/end of=/dev/vda bs=1M seek="$last" count=1 oflag=direct conv=fsync
    echo 3 >/proc/sys/vm/drop_caches
    dd if=/dev/vda of=/tmp/back bs=1M skip="$last" count=1 iflag=direct 2>/dev/null
    sum1="$(sha256sum /tmp/end | cut -d' ' -f1)"
    sum2="$(sha256sum /tmp/back | cut -d' ' -f1)"
    if [ "$sum1" = "$sum2" ]; then
        check end-readback PASS "sha256=$sum1"
    else
        check end-readback FAIL "wrote=$sum1 read=$sum2"
    fi
    echo "GUEST-INFO end_sha256=$sum1"
    finish
fi

# pending: prints what the disk still has in flight (the guest's side of a hang).
pending() {
    echo "GUEST-LOG vda inflight (reads writes): $(cat /sys/block/vda/inflight)"
    mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
    for h in /sys/kernel/debug/block/vda/hctx*; do
        [ -d "$h" ] || continue
        echo "GUEST-LOG $(basename "$h") busy: $(tr '\n' ' ' <"$h/busy" 2>/dev/null)"
        echo "GUEST-LOG $(basename "$h") dispatch: $(tr '\n' ' ' <"$h/dispatch" 2>/dev/null)"
        echo "GUEST-LOG $(basename "$h") tags: $(grep -E 'nr_tags|busy' "$h/tags" 2>/dev/null | tr '\n' ' ')"
    done
    for f in /tmp/last-hctx*; do
        [ -f "$f" ] && echo "GUEST-LOG ${f#/tmp/last-} last dispatched at uptime $(cat "$f")"
    done
    echo "GUEST-LOG uptime now $(cut -d' ' -f1 /proc/uptime)"
    dmesg | grep -iE 'virtio|vda|blk' | tail -n 20 | sed 's/^/GUEST-LOG dmesg: /'
}

# watch_queues: records in /tmp/last-hctxN the uptime at which each hardware queue last
# dispatched a request (blk-mq debugfs), for `pending` to say when a queue stalled.
watch_queues() {
    mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
    while :; do
        for h in /sys/kernel/debug/block/vda/hctx*; do
            n="$(basename "$h")"
            now="$(awk '{ s += $2 } END { print s }' "$h/dispatched" 2>/dev/null)"
            if [ "$now" != "$(cat "/tmp/count-$n" 2>/dev/null)" ]; then
                echo "$now" >"/tmp/count-$n"
                cut -d' ' -f1 /proc/uptime >"/tmp/last-$n"
            fi
        done
        sleep 1
    done
}

# aio.mode=replay: the same writes on every run, whatever serves the disk, so that two servers'
# images can be compared byte for byte afterwards. fio randwrite on both queues with a fixed
# seed, mixed sizes, each block holding a pattern and its own offset (no verify header: fio's
# holds a timestamp), read back and verified; then fixed discard and write-zeroes ranges, some
# not cluster-aligned; then the sha256 of the whole disk (GUEST-INFO disk_sha256=).
if [ "$mode" = replay ]; then
    run replay-fio "$FIO" --name=replay --filename=/dev/vda --rw=randwrite --bsrange=4k-128k \
        --size="$fio_size" --numjobs=2 --offset_increment="$fio_size" --cpus_allowed=0-1 \
        --cpus_allowed_policy=split --direct=1 --ioengine=libaio --iodepth=16 --randseed=36 \
        --verify=pattern --verify_pattern=0x61696f2d%o --do_verify=1 --verify_fatal=1 \
        --thread --output-format=terse
    run replay-discard "$BLKDISCARD" -o 1052672 -l 3211264 /dev/vda
    run replay-zeroes "$BLKDISCARD" -z -o 9441280 -l 2101248 /dev/vda
    if sum="$(sha256sum /dev/vda 2>/tmp/out)"; then
        echo "GUEST-INFO disk_sha256=${sum%% *}"
        check replay-sum PASS "sha256=${sum%% *}"
    else
        check replay-sum FAIL "sha256sum /dev/vda"
        log /tmp/out
    fi
    finish
fi

# aio.mode=backup: fio passes until the host's stop mark (the last 4 KiB all 'S'); the host
# takes its backups while they run, one step at each GUEST-FIO-PASS line.
if [ "$mode" = backup ]; then
    mark_block=$((size / 4096 - 1))
    pass=0 stopped=0 failed_pass=0
    while [ "$pass" -lt "$loops" ]; do
        pass=$((pass + 1))
        # randrepeat=0: every pass writes new data, so a backup that missed a write shows.
        if ! "$FIO" --name=backup --filename=/dev/vda --rw=randwrite --bsrange=4k-64k \
            --size="$fio_size" --numjobs=2 --offset_increment="$fio_size" --cpus_allowed=0-1 \
            --cpus_allowed_policy=split --direct=1 --ioengine=libaio --iodepth=16 \
            --randrepeat=0 --verify=crc32c --do_verify=1 --verify_fatal=1 --thread \
            --output-format=terse >/tmp/out 2>&1; then
            failed_pass=$pass
            log /tmp/out
            break
        fi
        echo "GUEST-FIO-PASS $pass"
        rm -f /tmp/mark
        dd if=/dev/vda of=/tmp/mark bs=4096 skip="$mark_block" count=1 iflag=direct 2>/dev/null
        if [ "$(($(wc -c </tmp/mark)))" = 4096 ] && [ "$(($(tr -d S </tmp/mark | wc -c)))" = 0 ]; then
            stopped=1
            break
        fi
    done
    if [ "$failed_pass" != 0 ]; then
        check fio-backup FAIL "pass $failed_pass failed"
    elif [ "$stopped" = 1 ]; then
        check fio-backup PASS "passes=$pass"
    else
        check fio-backup FAIL "no stop mark after $pass passes"
    fi
    no_io_errors
    finish
fi

if [ "$mode" = restart ]; then
    if [ "$idle" -gt 0 ]; then
        echo "GUEST-IDLE-START"
        sleep "$idle"
    fi
    # Per-request completion times (ms since the job's start) for the longest gap.
    "$FIO" --name=restart --filename=/dev/vda --rw=randwrite --bs=4k --size="$fio_size" \
        --numjobs=2 --offset_increment="$fio_size" --cpus_allowed=0-1 --cpus_allowed_policy=split \
        --direct=1 --ioengine=libaio --iodepth="$iodepth" --loops="$loops" --verify=crc32c \
        --do_verify=1 --verify_fatal=1 --thread --group_reporting --output-format=terse \
        --write_lat_log=/tmp/restart --log_avg_msec=0 >/tmp/out 2>&1 &
    fio_pid=$!
    echo "GUEST-FIO-START uptime=$(cut -d' ' -f1 /proc/uptime)"
    watch_queues &
    watcher=$!
    waited=0
    while kill -0 "$fio_pid" 2>/dev/null && [ "$waited" -lt "$fio_timeout" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$fio_pid" 2>/dev/null; then
        check fio-restart FAIL "fio still running after ${fio_timeout} s"
        pending
        log /tmp/out
        # The host restarts the daemon once more: does the disk come back?
        echo "GUEST-HUNG"
        waited=0
        while kill -0 "$fio_pid" 2>/dev/null && [ "$waited" -lt 30 ]; do
            sleep 1
            waited=$((waited + 1))
        done
        if kill -0 "$fio_pid" 2>/dev/null; then
            echo "GUEST-INFO after_restart=still_hung"
        else
            echo "GUEST-INFO after_restart=fio_ended_within_${waited}s"
        fi
    elif wait "$fio_pid"; then
        check fio-restart PASS "exit=0 after ${waited} s"
    else
        rc=$?
        check fio-restart FAIL "exit=$rc"
        log /tmp/out
    fi
    kill "$watcher" 2>/dev/null
    # Every completion of both jobs (writes and verifying reads), in time order: the longest
    # time without one is the restart's downtime as the guest saw it.
    cat /tmp/restart_lat.*.log 2>/dev/null | cut -d, -f1 | sort -n |
        awk 'NR > 1 && $1 - prev > gap { gap = $1 - prev } { prev = $1; n++ }
            END { printf "GUEST-INFO max_completion_gap_ms=%d completions=%d\n", gap, n }'
    no_io_errors
    finish
fi

run fio-verify "$FIO" --name=verify --filename=/dev/vda --rw=randwrite --bs=4k --size="$fio_size" \
    --direct=1 --ioengine=psync --verify=crc32c --do_verify=1 --verify_fatal=1 --thread \
    --output-format=terse
# Many requests in flight on both queues: one job per vCPU (so per blk-mq queue), each on its
# own region, mixed sizes, 16 deep.
run fio-verify-qd16 "$FIO" --name=verify-qd --filename=/dev/vda --rw=randwrite --bsrange=4k-128k \
    --size="$fio_size" --numjobs=2 --offset_increment="$fio_size" --cpus_allowed=0-1 \
    --cpus_allowed_policy=split --direct=1 --ioengine=libaio --iodepth=16 --verify=crc32c \
    --do_verify=1 --verify_fatal=1 --thread --output-format=terse
if mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null && [ -d /sys/kernel/debug/block/vda ]; then
    per=""
    for h in /sys/kernel/debug/block/vda/hctx*; do
        per="$per $(basename "$h")=$(cat "$h/run" 2>/dev/null)"
    done
    echo "GUEST-INFO hw_queue_runs:$per"
fi

run mkfs "$MKFS" -F -q -E nodiscard /dev/vda
run mount mount -t ext4 /dev/vda /mnt
if grep -q " /mnt " /proc/mounts; then
    dd if=/dev/urandom of=/mnt/data bs=1M count=8 2>/dev/null
    sum1="$(sha256sum /mnt/data | cut -d' ' -f1)"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    sum2="$(sha256sum /mnt/data | cut -d' ' -f1)"
    if [ -n "$sum1" ] && [ "$sum1" = "$sum2" ]; then
        check file-readback PASS "sha256=$sum1"
    else
        check file-readback FAIL "wrote=$sum1 read=$sum2"
    fi
    run umount umount /mnt
    run fsck "$FSCK" -n -f /dev/vda
    # Mounted again, the file is read from the disk itself.
    if mount -t ext4 -o ro /dev/vda /mnt 2>/tmp/out; then
        sum3="$(sha256sum /mnt/data | cut -d' ' -f1)"
        umount /mnt
        if [ "$sum3" = "$sum1" ]; then
            check file-remount PASS "sha256=$sum3"
        else
            check file-remount FAIL "wrote=$sum1 read=$sum3"
        fi
    else
        check file-remount FAIL "mount failed"
        log /tmp/out
    fi
else
    check file-readback FAIL "not mounted"
    check umount FAIL "not mounted"
    run fsck "$FSCK" -n -f /dev/vda
    check file-remount FAIL "not mounted"
fi

# -f: the disk holds the ext4 made above, which blkdiscard would otherwise refuse to wipe.
run discard "$BLKDISCARD" -f /dev/vda
finish
