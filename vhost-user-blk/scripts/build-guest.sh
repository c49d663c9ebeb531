#!/usr/bin/env bash
# build-guest.sh OUTDIR: a small Linux guest that tests a virtio-blk disk, from Debian packages.
#
# Writes OUTDIR/vmlinuz (Debian's cloud kernel) and OUTDIR/initramfs.cpio.gz (busybox, fio,
# e2fsprogs and util-linux tools, the virtio and ext4 modules, and an init that checks /dev/vda
# and powers off). Also makes sure that qemu-system-x86_64 is installed on the host, so the
# guest can be booted:
#   - on bookworm it comes from bookworm-backports (10.0.x, the same QEMU as the qemu-utils of
#     this machine; bookworm's own 7.2 would replace qemu-utils and remove qemu-storage-daemon).
#     A bookworm-backports apt source is added when none is configured, and the install is
#     refused if apt would remove any package;
#   - on later releases it comes from the release itself.
# The kernel, busybox-static and e2fsprogs/util-linux tools are taken from downloaded packages
# (`apt-get download` + `dpkg-deb -x`), not installed on the host; fio, cpio and kmod (depmod)
# are installed on the host (fio's binary and the shared libraries `ldd` lists are copied into
# the guest).
#
# Idempotent: a second run with the same script and tools only checks them and exits. Delete
# OUTDIR (or OUTDIR/stamp) to force a rebuild.
#
# The guest reads its expectations from the kernel command line and prints one line per check on
# its console (ttyS0), then `GUEST-DONE`, then powers off:
#   aio.size=BYTES      expected capacity of /dev/vda (blockdev --getsize64)
#   aio.serial=ID       expected /sys/block/vda/serial (no spaces)
#   aio.queues=N        expected number of blk-mq hardware queues of vda (optional)
#   aio.readonly=1      read-only disk: checks that writes fail instead of the write checks
#   aio.fio_size=SIZE   size of the fio verify job (default 16M)
#   aio.mode=restart    instead of the write checks: the restart workload (the host kills and
#                       restarts the daemon meanwhile): fio randwrite + crc32c verify, 4k, 2 jobs
#                       (one per queue) each aio.iodepth deep (default 32) over its own
#                       aio.fio_size region, aio.loops times (default 4); the check fails if fio
#                       does not end within aio.fio_timeout seconds (default 300), and then the
#                       guest prints its pending requests (sysfs inflight, blk-mq debugfs)
#   aio.idle=S          restart mode: first S seconds without I/O (GUEST-IDLE-START), then fio
# Restart mode's output lines (besides the checks fio-restart and no-io-errors):
#   GUEST-IDLE-START                         (the idle seconds begin)
#   GUEST-FIO-START                          (fio started: the host may begin its kills)
#   GUEST-INFO max_completion_gap_ms=N completions=M   (from fio's per-request log)
# Output lines:
#   GUEST-START <kernel release>
#   GUEST-INFO key=value ...                 (what the device advertises; not a check)
#   GUEST-CHECK <name> PASS|FAIL <detail>    (one per check)
#   GUEST-LOG <text>                         (output of a failed command)
#   GUEST-DONE passed=N failed=M
#
# Exit codes: 0 done, 2 what it needs cannot be had here (not root, apt failed, no package),
# 1 anything else (a bug).
set -euo pipefail

me="build-guest"
script_path="$(readlink -f "${BASH_SOURCE[0]}")"

die() {
    echo "$me: $*" >&2
    exit 1
}
# Something the build needs cannot be had on this machine: exit code 2.
unavailable() {
    echo "$me: unavailable: $*" >&2
    exit 2
}

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
OUT="$(realpath -m "$1")"
mkdir -p "$OUT"

export DEBIAN_FRONTEND=noninteractive
apt_updated=0
# Runs `apt-get update` once per script run.
apt_update() {
    [ "$apt_updated" -eq 1 ] && return 0
    echo "$me: apt-get update" >&2
    apt-get update -qq >&2 || unavailable "apt-get update failed"
    apt_updated=1
}

codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"

# The apt target release for qemu-system-x86: bookworm-backports on bookworm, else the default.
qemu_release=""
[ "$codename" = bookworm ] && qemu_release="bookworm-backports"

# Adds a bookworm-backports source (deb.debian.org) when no configured source names it.
ensure_backports_source() {
    [ -n "$qemu_release" ] || return 0
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        if grep -v '^[[:space:]]*#' "$f" | grep -qw "$qemu_release"; then
            return 0
        fi
    done
    echo "$me: adding the $qemu_release apt source" >&2
    cat >/etc/apt/sources.list.d/bookworm-backports.sources <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt_updated=0
}

# The "major.minor.patch" of the first line of `$1 --version`, or nothing.
qemu_version_of() {
    "$1" --version 2>/dev/null | head -n1 | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n1 || true
}

# Installs qemu-system-x86 (from backports on bookworm), refusing any install that would remove
# a package, and checks that qemu-storage-daemon kept its version.
ensure_qemu_system() {
    if command -v qemu-system-x86_64 >/dev/null 2>&1; then
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || unavailable "qemu-system-x86_64 is missing and this is not root"
    local qsd_before="" target=() sim
    command -v qemu-storage-daemon >/dev/null 2>&1 &&
        qsd_before="$(qemu_version_of qemu-storage-daemon)"
    ensure_backports_source
    apt_update
    [ -n "$qemu_release" ] && target=(-t "$qemu_release")
    apt-cache policy qemu-system-x86 qemu-utils >&2
    sim="$(apt-get install -s -y --no-install-recommends "${target[@]}" qemu-system-x86 2>&1)" ||
        unavailable "apt-get cannot install qemu-system-x86: $(echo "$sim" | tail -n3)"
    if echo "$sim" | grep -q '^Remv '; then
        echo "$sim" | grep '^Remv ' >&2
        unavailable "installing qemu-system-x86 would remove the packages above; refused"
    fi
    echo "$me: apt-get install ${target[*]} qemu-system-x86" >&2
    apt-get install -y -qq --no-install-recommends "${target[@]}" qemu-system-x86 >&2 ||
        unavailable "apt-get install qemu-system-x86 failed"
    local sys_v qsd_after
    sys_v="$(qemu_version_of qemu-system-x86_64)"
    echo "$me: qemu-system-x86_64 $sys_v" >&2
    if [ -n "$qsd_before" ]; then
        qsd_after="$(qemu_version_of qemu-storage-daemon)"
        [ "$qsd_after" = "$qsd_before" ] ||
            die "qemu-storage-daemon changed from $qsd_before to '${qsd_after:-missing}'"
        echo "$me: qemu-storage-daemon still $qsd_after" >&2
    fi
}

# Installs the Debian package $2 on the host when command $1 is missing.
ensure_host_tool() {
    command -v "$1" >/dev/null 2>&1 && return 0
    [ "$(id -u)" -eq 0 ] || unavailable "$1 is missing and this is not root (apt-get install $2)"
    apt_update
    echo "$me: apt-get install $2" >&2
    apt-get install -y -qq --no-install-recommends "$2" >&2 || unavailable "apt-get install $2 failed"
}

ensure_qemu_system
ensure_host_tool cpio cpio
ensure_host_tool fio fio
ensure_host_tool ldd libc-bin
ensure_host_tool depmod kmod

# Fast path: the outputs exist and were built by this very script.
stamp_want="$(sha256sum "$script_path" | cut -d' ' -f1)"
if [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initramfs.cpio.gz" ] && [ -f "$OUT/stamp" ] &&
    [ "$(cat "$OUT/stamp")" = "$stamp_want" ]; then
    echo "$me: $OUT is up to date" >&2
    exit 0
fi
rm -f "$OUT/stamp"

# ---- packages for the guest: downloaded, extracted, never installed ----
DEBS="$OUT/debs"
mkdir -p "$DEBS"
# Prints the first of its arguments that exists (for a glob's first match), or nothing.
first_existing() {
    local f
    for f in "$@"; do
        [ -e "$f" ] && echo "$f" && return 0
    done
    return 0
}
# Downloads the candidate .deb of package $1 into $DEBS (once) and prints its path.
download_deb() {
    local pkg="$1" ver file
    ver="$(apt-cache policy "$pkg" 2>/dev/null | sed -n 's/^ *Candidate: //p')"
    if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
        apt_update
        ver="$(apt-cache policy "$pkg" 2>/dev/null | sed -n 's/^ *Candidate: //p')"
    fi
    { [ -n "$ver" ] && [ "$ver" != "(none)" ]; } || unavailable "no Debian package $pkg"
    # apt-get download names the file PKG_VERSION_ARCH.deb with ':' as %3a.
    file="$(first_existing "$DEBS/${pkg}_${ver//:/%3a}_"*.deb)"
    if [ -z "$file" ]; then
        (cd "$DEBS" && apt-get download -qq -o APT::Sandbox::User=root "$pkg=$ver" >&2) || unavailable "apt-get download $pkg failed"
        file="$(first_existing "$DEBS/${pkg}_${ver//:/%3a}_"*.deb)"
        [ -n "$file" ] || die "apt-get download $pkg left no .deb in $DEBS"
    fi
    echo "$file"
}

# The kernel: the metapackage's first linux-image-* dependency is the real package.
meta_deps="$(apt-cache show --no-all-versions linux-image-cloud-amd64 2>/dev/null | sed -n 's/^Depends: //p' || true)"
if [ -z "$meta_deps" ]; then
    apt_update
    meta_deps="$(apt-cache show --no-all-versions linux-image-cloud-amd64 2>/dev/null | sed -n 's/^Depends: //p' || true)"
fi
kpkg="$(echo "$meta_deps" | tr ',' '\n' | grep -oE 'linux-image-[^ ]+' | head -n1 || true)"
[ -n "$kpkg" ] || unavailable "cannot resolve linux-image-cloud-amd64"
kdeb="$(download_deb "$kpkg")"
bbdeb="$(download_deb busybox-static)"
e2deb="$(download_deb e2fsprogs)"
uldeb="$(download_deb util-linux)"

WORK="$OUT/work"
rm -rf "$WORK"
mkdir -p "$WORK/kernel" "$WORK/pkgs"
echo "$me: extracting $(basename "$kdeb")" >&2
dpkg-deb -x "$kdeb" "$WORK/kernel"
for d in "$bbdeb" "$e2deb" "$uldeb"; do
    dpkg-deb -x "$d" "$WORK/pkgs"
done

kver="$(basename "$(first_existing "$WORK/kernel/lib/modules/"*)")"
[ -n "$kver" ] || die "no lib/modules in $kdeb"
KMOD="$WORK/kernel/lib/modules/$kver"
[ -f "$WORK/kernel/boot/vmlinuz-$kver" ] || die "no boot/vmlinuz-$kver in $kdeb"
# The package ships no modules.dep (its postinst makes it): make it for the extracted tree.
depmod -b "$WORK/kernel" "$kver"

# ---- the initramfs tree ----
ROOT="$WORK/root"
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,mnt,lib/modules}

cp "$WORK/pkgs/bin/busybox" "$ROOT/bin/busybox"
# Guest tools from the extracted packages: file in the package -> path in the guest.
declare -A tools=(
    [sbin/mke2fs]=usr/sbin/mkfs.ext4
    [sbin/e2fsck]=usr/sbin/fsck.ext4
    [sbin/blkdiscard]=usr/sbin/blkdiscard
    [sbin/blockdev]=usr/sbin/blockdev
)
for src in "${!tools[@]}"; do
    found=""
    for cand in "$WORK/pkgs/$src" "$WORK/pkgs/usr/$src"; do
        [ -f "$cand" ] && found="$cand" && break
    done
    [ -n "$found" ] || die "$src is not in the extracted packages"
    cp "$found" "$ROOT/${tools[$src]}"
done
[ -f "$WORK/pkgs/etc/mke2fs.conf" ] && cp "$WORK/pkgs/etc/mke2fs.conf" "$ROOT/etc/mke2fs.conf"
cp "$(command -v fio)" "$ROOT/usr/bin/fio"

# Copies the shared libraries (and the dynamic loader) that binary $1 needs, as `ldd` lists
# them on the host, to the same paths in the guest. The e2fsprogs and util-linux packages come
# from the same release as the host's, so their libraries are the host's too.
copy_libs() {
    local lib
    for lib in $(ldd "$1" 2>/dev/null | grep -oE '(=> )?/[^ ]+' | sed 's/^=> //'); do
        [ -e "$ROOT$lib" ] && continue
        mkdir -p "$ROOT$(dirname "$lib")"
        cp -L "$lib" "$ROOT$lib"
    done
}
for b in "$ROOT"/usr/bin/* "$ROOT"/usr/sbin/*; do
    ldd "$b" >/dev/null 2>&1 || continue # static
    if ldd "$b" | grep -q 'not found'; then
        ldd "$b" >&2
        die "$b needs libraries the host does not have"
    fi
    copy_libs "$b"
done
# glibc loads libgcc_s at run time for thread cancellation.
for lib in /lib/x86_64-linux-gnu/libgcc_s.so.1 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1; do
    if [ -e "$lib" ] && [ ! -e "$ROOT$lib" ]; then
        mkdir -p "$ROOT$(dirname "$lib")"
        cp -L "$lib" "$ROOT$lib"
        break
    fi
done

# ---- kernel modules: the virtio disk and ext4, with their dependencies, in load order ----
declare -A moddep=() modfile=() builtin=() loaded=()
while IFS= read -r line; do
    path="${line%%:*}"
    name="$(basename "$path")"
    name="${name%%.ko*}"
    name="${name//-/_}"
    modfile[$name]="$path"
    moddep[$name]="${line#*:}"
done <"$KMOD/modules.dep"
while IFS= read -r path; do
    name="$(basename "$path")"
    name="${name%%.ko*}"
    builtin[${name//-/_}]=1
done <"$KMOD/modules.builtin"

order=()
# Appends module $1 (after its dependencies) to the load order, unless built in or already there.
add_module() {
    local name="${1//-/_}" dep dname
    [ -n "${loaded[$name]:-}" ] && return 0
    loaded[$name]=1
    if [ -n "${builtin[$name]:-}" ]; then
        echo "$me: module $name is built in" >&2
        return 0
    fi
    [ -n "${modfile[$name]:-}" ] || return 1
    for dep in ${moddep[$name]}; do
        dname="$(basename "$dep")"
        dname="${dname%%.ko*}"
        add_module "$dname" || die "module $dname (needed by $name) not found"
    done
    order+=("$name")
}
# Required: the disk, the PCI transport and the filesystem with the checksum it uses.
for m in virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk \
    crc16 crc32c_generic libcrc32c mbcache jbd2 ext4; do
    if ! add_module "$m"; then
        case "$m" in
        virtio_pci_modern_dev | virtio_pci_legacy_dev | libcrc32c | crc16) ;; # not in every kernel
        *) die "module $m is neither built in nor a module of $kver" ;;
        esac
    fi
done
# Optional: the faster crc32c (SSE 4.2 is in -cpu max).
add_module crc32c_intel || true

mkdir -p "$ROOT/lib/modules/$kver"
: >"$ROOT/etc/modules.order"
for name in "${order[@]}"; do
    src="$KMOD/${modfile[$name]}"
    dst="$ROOT/lib/modules/$kver/$name.ko"
    case "$src" in
    *.ko.xz) xz -dc "$src" >"$dst" ;;
    *.ko.zst) zstd -qdc "$src" >"$dst" ;;
    *.ko.gz) gzip -dc "$src" >"$dst" ;;
    *) cp "$src" "$dst" ;;
    esac
    echo "$name" >>"$ROOT/etc/modules.order"
done
echo "$me: modules to load: ${order[*]:-(none)}" >&2

# ---- the init ----
cat >"$ROOT/init" <<'INIT'
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
mode=checks iodepth=32 loops=4 fio_timeout=300 idle=0
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
    dmesg | grep -iE 'virtio|vda|blk' | tail -n 20 | sed 's/^/GUEST-LOG dmesg: /'
}

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
    echo "GUEST-FIO-START"
    waited=0
    while kill -0 "$fio_pid" 2>/dev/null && [ "$waited" -lt "$fio_timeout" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$fio_pid" 2>/dev/null; then
        check fio-restart FAIL "fio still running after ${fio_timeout} s"
        pending
        log /tmp/out
        # Time for the host to look at the device's side (QEMU's monitor) before power-off.
        sleep 15
    elif wait "$fio_pid"; then
        check fio-restart PASS "exit=0 after ${waited} s"
    else
        rc=$?
        check fio-restart FAIL "exit=$rc"
        log /tmp/out
    fi
    # Every completion of both jobs (writes and verifying reads), in time order: the longest
    # time without one is the restart's downtime as the guest saw it.
    cat /tmp/restart_lat.*.log 2>/dev/null | cut -d, -f1 | sort -n |
        awk 'NR > 1 && $1 - prev > gap { gap = $1 - prev } { prev = $1; n++ }
            END { printf "GUEST-INFO max_completion_gap_ms=%d completions=%d\n", gap, n }'
    if dmesg | grep -iE 'I/O error|blk_update_request|critical (medium|target)' >/tmp/out; then
        check no-io-errors FAIL "the kernel log has I/O errors"
        log /tmp/out
    else
        check no-io-errors PASS "none in the kernel log"
    fi
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
INIT
chmod 755 "$ROOT/init"

# ---- pack ----
echo "$me: packing the initramfs" >&2
(cd "$ROOT" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet --owner=0:0) |
    gzip -6 >"$OUT/initramfs.cpio.gz.tmp"
mv "$OUT/initramfs.cpio.gz.tmp" "$OUT/initramfs.cpio.gz"
cp "$WORK/kernel/boot/vmlinuz-$kver" "$OUT/vmlinuz"
echo "$kver" >"$OUT/kernel-release"
rm -rf "$WORK"
echo "$stamp_want" >"$OUT/stamp"
echo "$me: built $OUT/vmlinuz ($kver) and $OUT/initramfs.cpio.gz ($(du -h "$OUT/initramfs.cpio.gz" | cut -f1))" >&2
