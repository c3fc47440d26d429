#!/usr/bin/env python3
"""200 epilogs at once on a loaded controller: are any ends lost?

    cargo build --release --target x86_64-unknown-linux-musl
    tests/bench/epilog_load.py                      # 8 runs of 200 epilogs
    tests/bench/epilog_load.py --runs 3 --hooks 100
    BENCH_BIN=/path/to/older/cvslurm tests/bench/epilog_load.py   # the same, another build

A figure, not a timed test: nothing here fails on a number (the exit status is 0 unless
the set-up fails). No Slurm cluster is needed. Each run, on a fresh StateDir:

1. CloudVision (the stand-in, tests/standin) answers 503: --hooks prologs run (as slurmctld
   runs them: `cvslurm-hook`, SLURM_* environment only, no service), so every job's RUNNING
   waits in the outbox.
2. The stand-in is switched to `hang` (it accepts each connection and never answers), and
   the load starts: 4 CPU-bound processes, one `dd oflag=dsync` writer on StateDir's
   filesystem, and `cvslurm flush` in a loop (each one the drainer, stuck sending to the
   silent CloudVision).
3. --hooks epilogs start at once (exit code 0:0); each one's wall time is taken from its
   spawn to its exit.
4. Once all have exited the load stops, and the outbox (`outbox/` and `inflight/`, both the
   keys' pending files and the files hooks handed in) is read: a job whose end is in none of
   them is a lost end. The log's `LOST` lines are counted too.

Printed per run: lost ends, LOST lines, the hooks' p50/p99/max wall time; then the same over
all runs (every hook of every run in one distribution). HookTimeout is cvslurm's default (2 s)
unless --hook-timeout says otherwise. The binary defaults to the static release build.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "standin"))
import standin_client  # noqa: E402

BIN = os.path.abspath(os.environ.get(
    "BENCH_BIN", os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/cvslurm")))
WORK = os.path.join(os.path.abspath(os.environ.get(
    "BENCH_WORK", os.path.join(ROOT, "tests/.work/bench"))), "epilog-load")
FAKE = os.path.join(HERE, "fake-slurm")
TOKEN = "bench-token"
CLUSTER = "bench"


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def hook_env(conf, ctx, job):
    return {"CVSLURM_CONF": conf, "PATH": "/usr/bin:/bin", "SLURM_SCRIPT_CONTEXT": ctx,
            "SLURM_JOB_ID": str(job), "SLURM_CLUSTER_NAME": CLUSTER,
            "SLURM_JOB_NAME": "load", "SLURM_JOB_PARTITION": "debug",
            "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_EXIT_CODE2": "0:0"}


def fire(hook, conf, ctx, jobs):
    """Starts one hook per job at once; returns each one's wall time (s)."""
    started = {}
    for j in jobs:
        p = subprocess.Popen([hook], env=hook_env(conf, ctx, j), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        started[p.pid] = (time.monotonic(), p)
    walls = []
    while started:
        pid, _ = os.wait()
        if pid in started:
            t0, p = started.pop(pid)
            walls.append(time.monotonic() - t0)
            p.returncode = 0  # reaped here
    return walls


def queued_ends(state):
    """The job keys whose end is queued (pending, handed in, or in flight)."""
    ended = set()
    for d in ("outbox", "inflight"):
        path = os.path.join(state, d)
        for n in os.listdir(path) if os.path.isdir(path) else []:
            if not n.endswith(".json") or n.startswith("."):
                continue
            try:
                with open(os.path.join(path, n)) as f:
                    ev = json.load(f)
            except (OSError, ValueError):
                continue
            for e in (ev, ev.get("then") or {}):
                job = e.get("job") or {}
                if job.get("state", "JOB_STATE_RUNNING") != "JOB_STATE_RUNNING":
                    ended.add(job["key"]["id"])
    return ended


def one_run(n, hooks, hook_timeout):
    base = os.path.join(WORK, "run%d" % n)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    state = os.path.join(base, "state")
    token = os.path.join(base, "token")
    with open(token, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token, 0o600)
    cv = standin_client.start(os.path.join(base, "cv"), token=TOKEN)
    log = os.path.join(base, "cvslurm.log")
    conf = os.path.join(base, "cloudvision.conf")
    with open(conf, "w") as f:
        f.write("\n".join([
            "ApiServer=127.0.0.1:%d" % cv.port, "ApiTokenFile=%s" % token, "CaFile=%s" % cv.ca,
            "StateDir=%s" % state, "LogFile=%s" % log, "SlurmBinDir=%s" % FAKE,
            "ReconcileInterval=0", "NodeReassertInterval=0",
        ] + (["HookTimeout=%s" % hook_timeout] if hook_timeout else [])) + "\n")
    hook = os.path.join(base, "cvslurm-hook")
    os.symlink(BIN, hook)
    load = []
    try:
        jobs = range(100000, 100000 + hooks)
        cv.set_mode("status", status=503)
        for i in range(0, hooks, 50):
            fire(hook, conf, "prolog_slurmctld", jobs[i:i + 50])
        cv.set_mode("hang")
        env = dict(os.environ, CVSLURM_CONF=conf)
        for _ in range(4):
            load.append(subprocess.Popen(["sh", "-c", "while :; do :; done"],
                                         start_new_session=True))
        load.append(subprocess.Popen(
            ["sh", "-c", "while :; do dd if=/dev/zero of=%s bs=4k count=2000 oflag=dsync "
             "2>/dev/null; done" % os.path.join(base, "dsync.out")], start_new_session=True))
        load.append(subprocess.Popen(
            ["sh", "-c", "while :; do %s flush >/dev/null 2>&1; done" % BIN], env=env,
            start_new_session=True))
        time.sleep(1)  # the load and the first flush under way
        walls = fire(hook, conf, "epilog_slurmctld", jobs)
    finally:
        # Each load process leads its own process group: the loop's current child goes too.
        for p in load:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in load:
            p.wait()
        cv.stop()
    ended = queued_ends(state)
    lost = [j for j in jobs if "%d@%s" % (j, CLUSTER) not in ended]
    with open(log, errors="replace") as f:
        lost_lines = sum(1 for line in f if "LOST" in line)
    return lost, lost_lines, walls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--hooks", type=int, default=200)
    ap.add_argument("--hook-timeout", default="", help="HookTimeout (default: cvslurm's)")
    a = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit("epilog_load.py: no binary at %s (cargo build --release --target "
                 "x86_64-unknown-linux-musl, or BENCH_BIN)" % BIN)
    print("binary %s, %d runs of %d epilogs" % (BIN, a.runs, a.hooks))
    all_walls, total_lost = [], 0
    for n in range(1, a.runs + 1):
        lost, lines, walls = one_run(n, a.hooks, a.hook_timeout)
        all_walls += walls
        total_lost += len(lost)
        print("run %d: %d of %d ends lost (%d LOST lines); hook wall p50 %.0f ms, p99 %.0f ms, "
              "max %.0f ms" % (n, len(lost), a.hooks, lines, pct(walls, 50) * 1000,
                               pct(walls, 99) * 1000, max(walls) * 1000), flush=True)
    print("all runs: %d of %d ends lost; hook wall p50 %.0f ms, p99 %.0f ms, max %.0f ms"
          % (total_lost, a.runs * a.hooks, pct(all_walls, 50) * 1000,
             pct(all_walls, 99) * 1000, max(all_walls) * 1000))


if __name__ == "__main__":
    main()
