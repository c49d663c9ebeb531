#!/usr/bin/env python3
"""Writes the seeds of the `inflight` fuzz target into seeds/inflight/ (next to this script).

Odd first byte: the model (a geometry byte, then operations: op & 3 is take / complete /
crash mid-completion / crash, op >> 2 picks which head). Even first byte: any region (10 bytes
of geometry and ring indices, the region's bytes, the used ring's heads).
"""
import os
import struct

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inflight")
os.makedirs(here, exist_ok=True)


def write(name, data):
    with open(os.path.join(here, name), "wb") as f:
        f.write(bytes(data))


TAKE, COMPLETE, TORN, CRASH = 0, 1, 2, 3

# The model: a ring of 8 (geometry 3) and of 64 (geometry 6).
write("model-take-crash", [1, 3] + [TAKE] * 4 + [CRASH])
write("model-out-of-order", [1, 3] + [TAKE] * 5 + [COMPLETE | (2 << 2), COMPLETE] + [CRASH] + [TAKE, CRASH])
write("model-torn", [1, 3] + [TAKE] * 3 + [TORN | (1 << 2)] + [COMPLETE, CRASH])
write("model-many", [1, 6] + ([TAKE] * 40 + [COMPLETE | (7 << 2)] * 20 + [CRASH]) * 3)
write("model-wrap", [1, 1] + [TAKE, TAKE, COMPLETE, COMPLETE] * 300 + [TAKE, TORN, CRASH])


def region_seed(queues_sel, qs_sel, ring_sel, queue, avail, used, base, region, used_ring):
    head = bytes([queues_sel, qs_sel, ring_sel, queue]) + struct.pack("<HHH", avail, used, base)
    return b"\x00" + head + region + used_ring


def queue_slice(qs, version, desc_num, last_batch, used_idx, inflight):
    """One queue's slice: header, then qs entries; `inflight` maps head -> (flag, counter)."""
    out = struct.pack("<QHHHH", 0, version, desc_num, last_batch, used_idx)
    for h in range(qs):
        flag, counter = inflight.get(h, (0, 0))
        out += struct.pack("<B5xHQ", flag, 0, counter)
    stride = (16 * qs + 2 + 63) // 64 * 64
    return out + b"\x00" * (stride - len(out))


# One queue of 16, ring of 16: three heads in flight, one torn batch, a bad flag.
region = queue_slice(16, 1, 16, 5, 10, {2: (1, 7), 5: (1, 9), 9: (1, 3), 11: (4, 1)})
write("region-recover", region_seed(0, 4, 4, 0, 14, 11, 11, region, struct.pack("<16H", *range(16))))
# A fresh region (version 0).
write("region-fresh", region_seed(1, 4, 4, 1, 0, 0, 0, b"\x00" * 2 * 1088, b""))
# A region whose used index is ahead of the ring's.
region = queue_slice(16, 1, 16, 0, 40, {1: (1, 1)})
write("region-ahead", region_seed(0, 4, 4, 0, 8, 3, 3, region, b""))
# Too many in flight for what the driver made available.
region = queue_slice(8, 1, 8, 0, 0, {h: (1, h) for h in range(8)})
write("region-too-many", region_seed(0, 3, 3, 0, 2, 0, 0, region, b""))
print("seeds written to", here)
