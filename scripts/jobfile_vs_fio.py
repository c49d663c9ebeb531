#!/usr/bin/env python3
"""Runs one fio job file through fio and through `aio-bench run`, alternating A B / B A, and
prints each side's IOPS and CPU per request, and ours over fio's.

Usage: scripts/jobfile_vs_fio.py JOBFILE [--rounds N] [--dir DIR] [--bench PATH]

fio gets a copy of the job file without aio-bench's own options (poll_max_ns, poll_rule, fdmon,
pool_spin, uring_taskrun, disks, iothreads), which fio does not know. Both run in DIR (default
/var/tmp, a directory on the machine's disk), so a relative
`filename=` is the same file for both; a file named by the job that does not exist yet is made
once, before the first round, and removed at the end. The CPU is the child process's user +
system time (getrusage), ramp and setup included, over the requests fio's JSON counts
(`total_ios`, the ramp excluded), the same reading for both. Needs fio (apt-get install fio)
and a release build of aio-bench (`cargo build --release -p aio-bench`, which this runs).
"""
import argparse
import configparser
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# aio-bench's own job options: fio refuses them.
OURS = {"poll_max_ns", "poll_rule", "fdmon", "pool_spin", "uring_taskrun", "disks", "iothreads"}


def fio_copy(jobfile, out):
    """Writes `jobfile` without aio-bench's own options to `out`."""
    with open(jobfile) as f, open(out, "w") as w:
        for line in f:
            key = line.split("=", 1)[0].strip()
            if key not in OURS:
                w.write(line)


def job_files(jobfile):
    """(path, bytes) of each filename= in the job file that has a size= (global or own)."""
    parser = configparser.ConfigParser(allow_no_value=True, inline_comment_prefixes=(";", "#"))
    parser.optionxform = str
    with open(jobfile) as f:
        parser.read_string(f.read())
    defaults = parser["global"] if parser.has_section("global") else {}
    out = []
    for name in parser.sections():
        if name == "global":
            continue
        sec = parser[name]
        filename = sec.get("filename") or defaults.get("filename")
        size = sec.get("size") or defaults.get("size")
        if filename and size:
            out.append((filename, parse_size(size)))
    return out


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower()
    if text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def make_file(path, size):
    """Writes `size` bytes that are not zeros (a file system may keep zeros sparse)."""
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def run(cmd, cwd):
    """Runs `cmd`; returns (its JSON output, CPU seconds it used)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # fio may print notes before the JSON.
    text = out.stdout[out.stdout.index("{"):]
    return json.loads(text), cpu


def figures(report, cpu):
    iops = sum(j["read"]["iops"] + j["write"]["iops"] for j in report["jobs"])
    ios = sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in report["jobs"])
    return iops, cpu / max(ios, 1) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jobfile")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--bench", default=os.path.join(ROOT, "target/release/aio-bench"))
    args = ap.parse_args()
    jobfile = os.path.abspath(args.jobfile)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "aio-bench"], cwd=ROOT, check=True)
    made = []
    for name, size in job_files(jobfile):
        path = os.path.join(args.dir, name)
        if not os.path.exists(path):
            make_file(path, size)
            made.append(path)
    fio_jobfile = os.path.join(args.dir, ".fio-" + os.path.basename(jobfile))
    fio_copy(jobfile, fio_jobfile)
    made.append(fio_jobfile)
    sides = {
        "fio": ["fio", "--output-format=json", fio_jobfile],
        "ours": [args.bench, "run", "--output-format", "json", jobfile],
    }
    results = {"fio": [], "ours": []}
    try:
        for r in range(args.rounds):
            order = ["fio", "ours"] if r % 2 == 0 else ["ours", "fio"]
            for side in order:
                report, cpu = run(sides[side], args.dir)
                iops, cpu_us = figures(report, cpu)
                results[side].append((iops, cpu_us))
                print(f"round {r + 1} {side:>4}: {iops:10.0f} IOPS  {cpu_us:6.1f} us CPU per request",
                      flush=True)
                time.sleep(1)
    finally:
        for path in made:
            os.remove(path)
    ratios = [o[0] / f[0] for o, f in zip(results["ours"], results["fio"])]
    cpu_ratios = [o[1] / f[1] for o, f in zip(results["ours"], results["fio"])]
    print(f"ours / fio IOPS: median {statistics.median(ratios):.3f} "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"ours / fio CPU per request: median {statistics.median(cpu_ratios):.3f} "
          f"(rounds {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f})")


if __name__ == "__main__":
    main()
