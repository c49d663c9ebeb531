#!/usr/bin/env python3
"""Writes the fuzz target's seeds: what real clients send on one connection.

Usage: python3 fuzz/seeds/make_seeds.py   (from nbd/)
"""
import struct
from pathlib import Path

OPTS = 0x49484156454F5054
OUT = Path(__file__).parent / "negotiate_and_requests"


def option(code, payload=b""):
    return struct.pack(">QII", OPTS, code, len(payload)) + payload


def name(s):
    return struct.pack(">I", len(s)) + s


def go(export, infos=(3,)):
    return option(7, name(export) + struct.pack(">H", len(infos)) + b"".join(struct.pack(">H", i) for i in infos))


def meta(code, export, queries):
    return option(code, name(export) + struct.pack(">I", len(queries)) + b"".join(name(q) for q in queries))


def compact(flags, kind, cookie, offset, length):
    return struct.pack(">IHHQQI", 0x25609513, flags, kind, cookie, offset, length)


def extended(flags, kind, cookie, offset, length):
    return struct.pack(">IHHQQQ", 0x21E41C71, flags, kind, cookie, offset, length)


# The first byte is the server's mode (bit 0: TLS required), then what the client sends.
FLAGS = b"\0" + struct.pack(">I", 3)
requests = [(0, 0, 1, 0, 4096), (1, 1, 2, 4096, 512), (0, 3, 3, 0, 0), (0, 4, 4, 0, 4096),
            (2, 6, 5, 0, 4096), (8, 7, 6, 0, 1 << 20), (0, 5, 7, 0, 4096), (0, 2, 8, 0, 0)]
seeds = {
    "qemu-extended": FLAGS + option(11) + meta(10, b"w", [b"base:allocation"]) + go(b"w")
    + b"".join(extended(*r) for r in requests),
    "libnbd-structured": FLAGS + option(8) + meta(10, b"w", [b"base:allocation"]) + go(b"w", (1, 3))
    + b"".join(compact(*r) for r in requests),
    "simple-export-name": FLAGS + option(1, b"r") + b"".join(compact(*r) for r in requests),
    "list-info-abort": FLAGS + option(3) + meta(9, b"w", []) + option(6, name(b"r") + b"\0\0") + option(2),
    "tls": b"\1" + struct.pack(">I", 1) + option(3) + option(5) + option(3),
}
OUT.mkdir(parents=True, exist_ok=True)
for seed, data in seeds.items():
    (OUT / seed).write_bytes(data)
