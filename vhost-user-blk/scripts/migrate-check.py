#!/usr/bin/env python3
"""Live-migrates a QEMU VM whose disk is a vhost-user-blk export of aio-storage-daemon to a
second QEMU on a second daemon of the same raw image, and checks the dirty log did its job.

    python3 vhost-user-blk/scripts/migrate-check.py --daemon target/debug/aio-storage-daemon
    python3 vhost-user-blk/scripts/migrate-check.py --daemon target/debug/aio-storage-daemon \\
        --guest target/guest

Without --guest the VMs have no guest (-S): `migrate` must be accepted (QEMU refuses a
backend without VHOST_USER_PROTOCOL_F_LOG_SHMFD) and reach `completed`.

With --guest (the directory scripts/build-guest.sh fills: vmlinuz, initramfs.cpio.gz) the
source runs a guest whose init (appended to the initramfs here) reads the disk's first 64 MiB
over and over with O_DIRECT into one 2 MiB buffer, piped to a compare with a copy: after its
first read the buffer's pages are written by the device alone, so only the dirty log tells
QEMU to send them again. Once the migration completed, the destination (started paused) and
the stopped source must hold the same RAM, page for page: a page the device wrote and did
not log differs (a daemon with its logging cut out leaves a few to 512 such pages here). Then
the destination runs on and the guest's own compare must pass; that one says the guest and
its disk go on after the move, but it rarely catches a missed page (its buffer is mostly
copied out before the switchover).

Needs qemu-system-x86_64 (TCG is enough). Exits 0 when every check passes.
"""
import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

RAM = 512 << 20
CAPACITY = 256 << 20

GUEST_INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
kver="$(uname -r)"
for m in $(cat /etc/modules.order); do insmod "/lib/modules/$kver/$m.ko" 2>/dev/null; done
echo 3 >/proc/sys/kernel/printk
i=0
while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
secs=40
for arg in $(cat /proc/cmdline); do case "$arg" in aio.secs=*) secs="${arg#*=}" ;; esac; done
dd if=/dev/urandom of=/tmp/src bs=1M count=64 2>/dev/null
dd if=/tmp/src of=/dev/vda bs=1M count=64 oflag=direct conv=fsync 2>/dev/null
dd if=/dev/vda of=/tmp/ref bs=1M count=64 iflag=direct 2>/dev/null
rm /tmp/src
echo "GUEST-MIGRATE-READY"
end=$(( $(cut -d. -f1 /proc/uptime) + secs ))
n=0 bad=0
while [ "$(cut -d. -f1 /proc/uptime)" -lt "$end" ]; do
    if dd if=/dev/vda bs=2M count=32 iflag=direct 2>/dev/null | cmp -s - /tmp/ref; then :; else
        bad=$((bad + 1)); echo "GUEST-LOG round $n: read back other bytes than the disk holds"
    fi
    n=$((n + 1))
done
if [ "$bad" = 0 ]; then echo "GUEST-CHECK dma-reads PASS rounds=$n"
else echo "GUEST-CHECK dma-reads FAIL bad=$bad rounds=$n"; fi
echo "GUEST-DONE"
sync
poweroff -f
"""


def newc(name, data, mode):
    """One entry of a cpio archive in the "newc" format."""
    fields = [1, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
    head = b"070701" + b"".join(b"%08x" % f for f in fields) + name.encode() + b"\0"
    pad = lambda n: b"\0" * (-n % 4)
    return head + pad(len(head)) + data + pad(len(data))


def initramfs_with_init(base, out):
    """`base` with `init` replaced (a second archive appended: the kernel unpacks both)."""
    extra = newc("init", GUEST_INIT.encode(), 0o100755) + newc("TRAILER!!!", b"", 0)
    with open(out, "wb") as f:
        with open(base, "rb") as b:
            shutil.copyfileobj(b, f)
        f.write(gzip.compress(extra))


class Qmp:
    def __init__(self, path, deadline=30):
        end = time.time() + deadline
        while not os.path.exists(path):
            if time.time() > end:
                sys.exit(f"{path} never appeared")
            time.sleep(0.05)
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rw")
        json.loads(self.f.readline())
        self.cmd("qmp_capabilities")

    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, "arguments": args}) + "\n")
        self.f.flush()
        while True:
            reply = json.loads(self.f.readline())
            if "event" not in reply:
                return reply


def guest_ram(pid):
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:mem") and os.path.getsize(path) == RAM:
                return path
        except OSError:
            pass
    sys.exit(f"no guest RAM memfd in process {pid}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--daemon", required=True, help="the aio-storage-daemon binary")
    p.add_argument("--guest", help="the guest directory (vmlinuz, initramfs.cpio.gz)")
    p.add_argument("--bandwidth", type=int, default=64 << 20, help="migration bytes/s")
    p.add_argument("--keep", action="store_true", help="keep the run's directory")
    a = p.parse_args()
    d = tempfile.mkdtemp(prefix="aio-migrate-")
    procs = []
    failed = []

    def spawn(args, log):
        out = open(os.path.join(d, log), "w")
        pr = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(pr)
        return pr

    def console(side):
        try:
            with open(f"{d}/{side}.console", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    try:
        image = os.path.join(d, "disk.img")
        with open(image, "wb") as f:
            f.truncate(CAPACITY)
        for side in ("src", "dst"):
            spawn([a.daemon, "--disk",
                   f"socket={d}/{side}.sock,image={image},serial=mig,queues=2,locking=off"],
                  f"daemon-{side}.log")
        initrd = None
        if a.guest:
            initrd = os.path.join(d, "initramfs.cpio.gz")
            initramfs_with_init(os.path.join(a.guest, "initramfs.cpio.gz"), initrd)
        qemus = {}
        for side in ("src", "dst"):
            while not os.path.exists(f"{d}/{side}.sock"):
                time.sleep(0.05)
            args = ["qemu-system-x86_64", "-nodefaults", "-no-user-config",
                    "-machine", "q35,accel=tcg", "-cpu", "max", "-smp", "2", "-m", "512",
                    "-object", f"memory-backend-memfd,id=mem,size={RAM},share=on",
                    "-numa", "node,memdev=mem",
                    "-chardev", f"socket,id=c0,path={d}/{side}.sock",
                    "-device", "vhost-user-blk-pci,chardev=c0,num-queues=2",
                    "-display", "none", "-serial", f"file:{d}/{side}.console",
                    "-qmp", f"unix:{d}/{side}.qmp,server=on,wait=off", "-no-reboot"]
            if a.guest:
                args += ["-kernel", os.path.join(a.guest, "vmlinuz"), "-initrd", initrd,
                         "-append", "console=ttyS0 panic=-1 aio.secs=40"]
            if side == "dst":
                args += ["-incoming", f"unix:{d}/mig.sock"]
            if side == "dst" or not a.guest:
                args += ["-S"]
            qemus[side] = spawn(args, f"qemu-{side}.log")
        src, dst = Qmp(f"{d}/src.qmp"), Qmp(f"{d}/dst.qmp")
        if a.guest:
            end = time.time() + 600
            while "GUEST-MIGRATE-READY" not in console("src"):
                if time.time() > end or qemus["src"].poll() is not None:
                    sys.exit("the guest never got ready:\n" + console("src")[-2000:])
                time.sleep(0.5)
            time.sleep(3)
        src.cmd("migrate-set-parameters", **{"max-bandwidth": a.bandwidth})
        reply = src.cmd("migrate", uri=f"unix:{d}/mig.sock")
        if "error" in reply:
            print("migrate refused:", reply["error"]["desc"])
            return 1
        while True:
            q = src.cmd("query-migrate")["return"]
            if q.get("status") in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.2)
        ram = q.get("ram", {})
        print(f"migration {q.get('status')}: total {q.get('total-time')} ms, downtime "
              f"{q.get('downtime')} ms, {ram.get('dirty-sync-count')} dirty syncs, "
              f"{ram.get('transferred')} bytes{', ' + q['error-desc'] if 'error-desc' in q else ''}")
        if q.get("status") != "completed":
            return 1
        if not a.guest:
            return 0
        pages = RAM // 4096
        with open(guest_ram(qemus["src"].pid), "rb") as s, \
                open(guest_ram(qemus["dst"].pid), "rb") as t:
            differ = [n for n in range(pages) if s.read(4096) != t.read(4096)]
        print(f"RAM: {len(differ)} of {pages} pages differ between source and destination"
              + (f" (from {differ[0] * 4096:#x})" if differ else ""))
        if differ:
            failed.append("ram")
        src.cmd("quit")
        dst.cmd("cont")
        end = time.time() + 600
        while "GUEST-DONE" not in console("dst"):
            if time.time() > end or qemus["dst"].poll() is not None:
                break
            time.sleep(1)
        checks = [l for l in console("dst").splitlines() if l.startswith("GUEST-")]
        print("destination's guest:", "; ".join(checks[-3:]))
        if not any(l.startswith("GUEST-CHECK") and " PASS" in l for l in checks):
            failed.append("guest")
        return 1 if failed else 0
    finally:
        for pr in reversed(procs):
            if pr.poll() is None:
                pr.terminate()
        for pr in procs:
            try:
                pr.wait(10)
            except subprocess.TimeoutExpired:
                pr.kill()
        if a.keep or failed:
            print("logs in", d)
        else:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
