#!/usr/bin/env python3
"""`cvslurm status` against a large outbox: wall time and peak RSS.

    tests/bench/outbox_status.py              # 100,000 events
    tests/bench/outbox_status.py 1000000      # 1,000,000 events (OutboxMaxEvents' default)
    BENCH_BIN=/path/to/cvslurm tests/bench/outbox_status.py

Fills a scratch StateDir (BENCH_WORK, default tests/.work/bench/outbox-status) with N JobConfig
events in the documented format (src/state/queue.rs; each file's mtime is its queue time, as
cvslurm writes it), then runs `cvslurm status --offline --json` three times through the C
launcher rusage.c and prints each run's wall time, CPU and peak RSS, and the depth it reported.
A figure, not a timed test: no cluster and no CloudVision needed. The binary defaults to the
static release build (`cargo build --release --target x86_64-unknown-linux-musl`).
"""
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORK = os.path.abspath(os.environ.get("BENCH_WORK", os.path.join(ROOT, "tests/.work/bench")))
BIN = os.environ.get(
    "BENCH_BIN", os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/cvslurm"))


def rusage_helper():
    exe = os.path.join(WORK, "rusage")
    if not os.path.exists(exe):
        os.makedirs(WORK, exist_ok=True)
        subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "rusage.c")], check=True)
    return exe


def fill(state, n):
    d = os.path.join(state, "outbox")
    for s in ("outbox", "inflight", "rejected", "jobs"):
        os.makedirs(os.path.join(state, s), mode=0o700)
    now = time.time()
    for i in range(n):
        key = "%d@bench" % (100000 + i)
        queued = int(now) - (n - i) // 100  # older first, 100 a second
        ev = {"v": 1, "seq": queued * 10**9 + i, "rank": [0, 0], "queued_at": queued,
              "attempts": 0, "kind": "job",
              "job": {"key": {"id": key}, "state": "JOB_STATE_RUNNING",
                      "start_time": "2024-05-01T10:00:00Z", "name": "j@p", "location": "bench",
                      "nodes": {"values": ["n1", "n2"]}}}
        path = os.path.join(d, "job.%s.json" % key)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, json.dumps(ev).encode())
        os.close(fd)
        os.utime(path, (queued, queued))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
    rusage = rusage_helper()
    state = os.path.join(WORK, "outbox-status", "state")
    shutil.rmtree(os.path.dirname(state), ignore_errors=True)
    fill(state, n)
    conf = os.path.join(os.path.dirname(state), "cloudvision.conf")
    with open(conf, "w") as f:
        f.write("StateDir=%s\nLogFile=%s\n" % (state, os.path.join(os.path.dirname(state), "log")))
    print("cvslurm status --offline, outbox of %d events (%s)" % (n, BIN))
    for _ in range(3):
        out = subprocess.run([rusage, BIN, "status", "--offline", "--json", "--config", conf],
                             stdout=subprocess.PIPE, check=True).stdout.decode()
        body, last = out.rsplit("}", 1)
        wall, cpu, rss, rc = last.split()
        depth = json.loads(body + "}").get("outbox_depth")
        print("  wall %.3f s  CPU %.3f s  peak RSS %.1f MiB  exit %s  depth %s"
              % (float(wall), float(cpu), int(rss) / 1024, rc, depth))
    shutil.rmtree(os.path.dirname(state), ignore_errors=True)


if __name__ == "__main__":
    main()
