#!/usr/bin/env python3
"""Writes the chain target's seed inputs (valid requests of each type, an indirect table, a
loop) into seeds/chain/: 8 bytes of disk (capacity_sectors << 1 | read_only) then guest memory
as the target lays it out (descriptor table at 0, avail ring at 0x100, used ring at 0x200)."""
import os
import struct

NEXT, WRITE, INDIRECT = 1, 2, 4
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chain")
os.makedirs(here, exist_ok=True)


def seed(name, descs, header=None, read_only=False, extra=()):
    mem = bytearray(0x3100)
    for i, (addr, length, flags, nxt) in enumerate(descs):
        struct.pack_into("<QIHH", mem, 16 * i, addr, length, flags, nxt)
    struct.pack_into("<HHH", mem, 0x100, 0, 1, 0)  # avail: flags, idx 1, ring[0] = head 0
    if header:
        struct.pack_into("<IIQ", mem, 0x1000, header[0], 0, header[1])
    for at, data in extra:
        mem[at:at + len(data)] = data
    disk = struct.pack("<Q", (2048 << 1) | int(read_only))
    with open(os.path.join(here, name), "wb") as f:
        f.write(disk + bytes(mem))


seed("read", [(0x1000, 16, NEXT, 1), (0x2000, 512, WRITE | NEXT, 2), (0x3000, 1, WRITE, 0)], (0, 0))
seed("write", [(0x1000, 16, NEXT, 1), (0x2000, 1024, NEXT, 2), (0x3000, 1, WRITE, 0)], (1, 8))
seed("write-read-only", [(0x1000, 16, NEXT, 1), (0x2000, 512, NEXT, 2), (0x3000, 1, WRITE, 0)],
     (1, 0), read_only=True)
seed("flush", [(0x1000, 16, NEXT, 1), (0x3000, 1, WRITE, 0)], (4, 0))
seed("get-id", [(0x1000, 16, NEXT, 1), (0x2000, 20, WRITE | NEXT, 2), (0x3000, 1, WRITE, 0)], (8, 0))
discard = struct.pack("<QII", 16, 8, 0)  # sector, num_sectors, flags
seed("discard", [(0x1000, 16, NEXT, 1), (0x2000, 16, NEXT, 2), (0x3000, 1, WRITE, 0)], (11, 0),
     extra=[(0x2000, discard)])
seed("write-zeroes", [(0x1000, 16, NEXT, 1), (0x2000, 16, NEXT, 2), (0x3000, 1, WRITE, 0)], (13, 0),
     extra=[(0x2000, struct.pack("<QII", 16, 8, 1))])
table = b"".join(struct.pack("<QIHH", *d) for d in
                 [(0x1000, 16, NEXT, 1), (0x2100, 512, WRITE | NEXT, 2), (0x3000, 1, WRITE, 0)])
seed("indirect", [(0x2800, len(table), INDIRECT, 0)], (0, 4), extra=[(0x2800, table)])
seed("loop", [(0x1000, 16, NEXT, 1), (0x2000, 512, WRITE | NEXT, 0)], (0, 0))
