#!/usr/bin/env python3
"""Prints the ratios the project tracks from one criterion run (target/criterion).

Usage: python3 scripts/criterion_ratios.py [target/criterion]
Each figure is a ratio of two benchmarks measured in the same run (mean point estimates).
"""
import json
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"


def mean_ns(group, bench, param=None):
    parts = [root, group, bench] + ([str(param)] if param is not None else []) + ["new", "estimates.json"]
    path = os.path.join(*parts)
    try:
        with open(path) as f:
            return json.load(f)["mean"]["point_estimate"]
    except FileNotFoundError:
        return None


def ratio(label, num, den):
    if num is None or den is None:
        print(f"{label:60s} (not measured)")
    else:
        print(f"{label:60s} {num / den:6.2f}   ({num:,.0f} ns / {den:,.0f} ns)")


for mon in ["epoll", "hybrid", "uring", "poll", "bare-epoll"]:
    for n in [64, 256, 1024]:
        ratio(f"iteration {mon}: {n} fds / 1 fd", mean_ns("iteration", mon, n), mean_ns("iteration", mon, 1))
for n in [1, 256, 1024]:
    ratio(f"iteration at {n} fds: AioContext over epoll / bare epoll_wait loop",
          mean_ns("iteration", "epoll", n), mean_ns("iteration", "bare-epoll", n))
    ratio(f"iteration at {n} fds: hybrid / bare epoll_wait loop",
          mean_ns("iteration", "hybrid", n), mean_ns("iteration", "bare-epoll", n))
    ratio(f"iteration at {n} fds: uring monitor / AioContext over epoll",
          mean_ns("iteration", "uring", n), mean_ns("iteration", "epoll", n))
ratio("notifier: pipe / eventfd", mean_ns("notifier", "pipe"), mean_ns("notifier", "eventfd"))
ratio("pool round trip / tokio spawn_blocking round trip",
      mean_ns("roundtrip", "pool_run"), mean_ns("roundtrip", "tokio_spawn_blocking"))
ratio("pool round trip, loop polling 32768 / tokio spawn_blocking",
      mean_ns("roundtrip", "pool_run_poll_32768"), mean_ns("roundtrip", "tokio_spawn_blocking"))
ratio("QD1 O_DIRECT randread: pool poll_max_ns 32768 / poll_max_ns 0",
      mean_ns("qd1_randread_4k_odirect", "pool_poll_32768"), mean_ns("qd1_randread_4k_odirect", "pool_poll_0"))
ratio("QD1 O_DIRECT randread: pool (poll 32768) / sync pread",
      mean_ns("qd1_randread_4k_odirect", "pool_poll_32768"), mean_ns("qd1_randread_4k_odirect", "sync_pread"))
ratio("QD1 O_DIRECT randread: pool (poll 0) / sync pread",
      mean_ns("qd1_randread_4k_odirect", "pool_poll_0"), mean_ns("qd1_randread_4k_odirect", "sync_pread"))
ratio("QD1 O_DIRECT randread, workers spin 50us: poll 32768 / poll 0",
      mean_ns("qd1_randread_4k_odirect", "pool_spin50us_poll_32768"), mean_ns("qd1_randread_4k_odirect", "pool_spin50us_poll_0"))
ratio("QD1 O_DIRECT randread: pool (spin 50us, poll 32768) / sync pread",
      mean_ns("qd1_randread_4k_odirect", "pool_spin50us_poll_32768"), mean_ns("qd1_randread_4k_odirect", "sync_pread"))
for eng in ["pool", "linux-aio", "uring", "uring-shared-ring"]:
    ratio(f"round_trip QD1 4k read: {eng} / raw pread",
          mean_ns("round_trip", eng), mean_ns("round_trip", "pread"))
ratio("round_trip: uring on the loop's ring / uring with its own ring",
      mean_ns("round_trip", "uring-shared-ring"), mean_ns("round_trip", "uring"))
ratio("round_trip: uring / linux-aio", mean_ns("round_trip", "uring"), mean_ns("round_trip", "linux-aio"))
# The fast device (a loop device with direct I/O over tmpfs; set up when the bench runs as root).
for eng in ["pool", "linux-aio", "uring", "uring-shared-ring"]:
    ratio(f"round_trip on the loop device, polling off: {eng} / raw pread",
          mean_ns("round_trip", f"loop_{eng}"), mean_ns("round_trip", "loop_pread"))
    ratio(f"round_trip on the loop device, polling 32768: {eng} / raw pread",
          mean_ns("round_trip", f"loop_{eng}_poll"), mean_ns("round_trip", "loop_pread"))
for size in ["4k", "64k"]:
    ratio(f"dirty log on / off: a batch of 64 {size} reads on a null disk",
          mean_ns("dirty_log", "on", size), mean_ns("dirty_log", "off", size))
for rw in ["randread", "randwrite"]:
    # Time per batch, so off / on is IOPS on over off.
    ratio(f"dirty log IOPS on / off: QD 32 4k {rw}, raw file in /dev/shm, io_uring",
          mean_ns("dirty_log_qd32", "off", rw), mean_ns("dirty_log_qd32", "on", rw))
