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
# Idempotent: a second run with the same scripts and tools only checks them and exits. Delete
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
#   aio.mode=replay     instead of the write checks: the same writes on every run (fio randwrite,
#                       fixed seed, each block a pattern with its offset, verified; fixed discard
#                       and write-zeroes ranges), then GUEST-INFO disk_sha256= of the whole disk,
#                       so the images two servers wrote can be compared
#   aio.mode=backup     instead of the write checks: fio passes one after another (randwrite
#                       4k-64k + crc32c verify, 2 jobs each 16 deep over its own aio.fio_size
#                       region, new data every pass), each ended with GUEST-FIO-PASS N, until
#                       the host fills the disk's last 4 KiB with 'S' (the stop mark; at most
#                       aio.loops passes); checks fio-backup and no-io-errors. The host backs the
#                       disk up meanwhile, a step at each pass
#   aio.mode=resize     instead of the write checks: prints GUEST-RESIZE-READY (the host then
#                       resizes the disk to aio.resize_to=BYTES), waits for /sys/block/vda/size to
#                       follow (checks resize-seen, capacity-logged: virtio_blk's "new size"),
#                       writes the new last MiB and reads it back (end-write, end-readback),
#                       GUEST-INFO end_sha256=
# Restart mode's output lines (besides the checks fio-restart and no-io-errors):
#   GUEST-IDLE-START                         (the idle seconds begin)
#   GUEST-FIO-START uptime=S                 (fio started: the host may begin its kills)
#   GUEST-HUNG                               (fio overran its deadline, pending requests
#                                             printed: the host may restart the daemon; the
#                                             guest waits 30 s more, GUEST-INFO after_restart=)
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
script_dir="$(dirname "$script_path")"

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

# QEMU's packages of the same release and version as qemu-utils (bookworm-backports on
# bookworm, the source added when missing): scripts/lib.sh.
# shellcheck source=scripts/lib.sh
source "$script_dir/../../scripts/lib.sh"

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
    local qsd_before=""
    command -v qemu-storage-daemon >/dev/null 2>&1 &&
        qsd_before="$(qemu_version_of qemu-storage-daemon)"
    ensure_qemu_package qemu-system-x86 || unavailable "qemu-system-x86 cannot be installed"
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

# QEMU's block modules (qemu-block-extra: rbd, iscsi, ...) of the same QEMU: the RBD tests give
# qemu-storage-daemon and qemu-img `rbd:` images. Not fatal: only those tests need it.
ensure_qemu_block_extra() {
    qemu_has_rbd_module && return 0
    ensure_qemu_package qemu-block-extra || echo "$me: qemu-block-extra not installed" >&2
}

ensure_qemu_system
ensure_qemu_block_extra
ensure_host_tool cpio cpio
ensure_host_tool fio fio
ensure_host_tool ldd libc-bin
ensure_host_tool depmod kmod

# Fast path: the outputs exist and were built by this very script.
stamp_want="$(cat "$script_path" "$script_dir/guest-init.sh" | sha256sum | cut -d' ' -f1)"
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
# The init is scripts/guest-init.sh (its options and output lines are listed above).
install -m 755 "$script_dir/guest-init.sh" "$ROOT/init"

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
