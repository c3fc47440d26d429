#!/usr/bin/env python3
"""Nodes that reboot under jobs, again and again: a figure, not a test.

    cargo build --release --target x86_64-unknown-linux-musl
    tests/bench/powercycle.py                    # 20 cycles on the host's Slurm (22.05)
    SLURM=26.05 tests/bench/powercycle.py --cycles 20
    tests/bench/powercycle.py --publish          # n4 publishes its own record (README: publish)

Runs as root, where no other test cluster runs (`cluster.sh up` takes any down). The test
cluster comes up with accounting (4 nodes, its RebootProgram: `cluster.sh`), cvslurm's hooks
and the service (`PollInterval=2`, `ReconcileInterval=3`) beside the CloudVision stand-in.
Each cycle:

1. n4 is held down (`run/reboot-n4.hold`) and a job that takes every CPU of n4 waits for it
   to boot (`sbatch --reboot --exclusive -w n4`); the RebootProgram stops n4's slurmd;
2. meanwhile n4's data NIC (ens1f0) gets a new MAC, as a replaced NIC or a node re-created
   by a cloud ResumeProgram would;
3. n4 comes back (slurmd with `-b`), Slurm resets the job's start and runs it.

With `--publish`, every slurmd runs `cvslurm-publish` as its HealthCheckProgram and the service
has `WorkerRecords=yes`: n4, held by the job (root's, not the service's user's), is taken from
the record it published after its start instead of waiting for a free CPU.

Per cycle it prints: seconds from slurmd's start on n4 (SlurmdStartTime) to CloudVision
holding n4's new MAC, whether a NodeConfig carried a MAC n4 no longer had after that start,
and whether the job's record in CloudVision ends with Slurm's own start and end (sacct's).
Then the p50 and max of the delay, and the counts.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("bench_array", os.path.join(HERE, "array.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

W = "/var/tmp/cvslurm-cluster"
HOLD = os.path.join(W, "run/reboot-n4.hold")
NS = "cvslurm-n4"


def log(msg):
    print("[powercycle] " + msg, file=sys.stderr, flush=True)


def mac_now():
    out = bench.sh(["ip", "-n", NS, "-j", "link", "show", "ens1f0"]).stdout
    return json.loads(out)[0]["address"]


def set_mac(mac):
    bench.sh(["ip", "-n", NS, "link", "set", "ens1f0", "address", mac])


def slurmd_start():
    """n4's SlurmdStartTime, epoch seconds (None while it has none)."""
    env = dict(os.environ, SLURM_TIME_FORMAT="%s")
    out = bench.sh(["scontrol", "show", "node", "n4", "-o"], env=env, check=False).stdout
    for w in out.split():
        if w.startswith("SlurmdStartTime="):
            v = w.split("=", 1)[1]
            return int(v) if v.isdigit() else None
    return None


def cv_mac(standin):
    node = standin.control("GET", "state").get("nodes", {}).get("n4") or {}
    for i in (node.get("data_interfaces") or {}).get("values", []):
        if i.get("name") == "ens1f0":
            return i.get("mac_address")
    return None


def node_posts(standin):
    """The MACs of ens1f0 in every NodeConfig POST for n4, in the order CloudVision got them."""
    out = []
    for r in standin.control("GET", "requests"):
        b = r.get("body") or {}
        if r.get("method") == "POST" and r.get("path", "").endswith("NodeConfig") and \
                (b.get("key") or {}).get("id") == "n4":
            macs = [i.get("mac_address") for i in (b.get("data_interfaces") or {}).get("values", [])
                    if i.get("name") == "ens1f0"]
            out.append(macs)
    return out


def sacct_times(job):
    out = bench.sh(["sacct", "-j", job, "-X", "-n", "-P", "--format=Start,End,State"],
                   check=False).stdout.strip().splitlines()
    if not out:
        return None
    start, end, state = out[-1].split("|")[:3]
    return start + "Z", end + "Z", state


def wait(what, within, ok, step=0.2):
    until = time.time() + within
    while True:
        v = ok()
        if v:
            return v
        if time.time() > until:
            raise SystemExit("timed out waiting for " + what)
        time.sleep(step)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--publish", action="store_true",
                    help="HealthCheckProgram=cvslurm-publish and WorkerRecords=yes")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    link = bench.install_binary()
    os.environ["PATH"] = bench.CLUSTER_BIN + ":" + os.environ["PATH"]
    standin = bench.Standin(0)
    state_dir, log_file = bench.fresh_state("powercycle")
    bench.write_conf(standin, state_dir, log_file,
                     "PollInterval=2\nReconcileInterval=3\n"
                     + ("WorkerRecords=yes\n" if args.publish else ""))
    env = dict(os.environ, CVSLURM_HOOK=link, CLUSTER_NAME="bench", WITH_DBD="1")
    if args.publish:
        publish = os.path.join(os.path.dirname(link), "cvslurm-publish")
        if not os.path.islink(publish):
            os.symlink("cvslurm", publish)
        env["HEALTH_CHECK"] = publish
    log("cluster up")
    r = bench.sh([bench.CLUSTER_SH, "up", "4"], env=env, check=False, timeout=300)
    if r.returncode != 0:
        raise SystemExit("cluster up failed:\n" + r.stderr[-3000:])
    service = None
    original = mac_now()
    rows = []
    try:
        service = bench.start_service(log_file, standin, 4)
        for c in range(1, args.cycles + 1):
            new = "02:cc:00:00:%02x:%02x" % (c // 256, c % 256)
            before = slurmd_start()
            pid = open(os.path.join(W, "run/slurmd-n4.pid.ours")).read().strip()
            open(HOLD, "w").close()
            out = bench.sh(["sbatch", "--parsable", "--reboot", "--exclusive", "-w", "n4",
                            "-o", "/dev/null", "-J", "cycle-%d" % c, "--wrap", "sleep 1"])
            job = out.stdout.strip().split(";")[0]
            t0 = time.time()
            # n4's slurmd stops (the RebootProgram stops the process `up` or its last run
            # recorded), then its NIC changes while it is down.
            wait("n4's slurmd to stop", 60,
                 lambda: not os.path.exists("/proc/%s" % pid))
            set_mac(new)
            os.remove(HOLD)
            start = wait("n4's slurmd to start again", 90,
                         lambda: (lambda s: s if s and s != before else None)(slurmd_start()))
            wait("CloudVision to hold n4's new MAC", 60, lambda: cv_mac(standin) == new)
            seen = time.time()
            key = "%s@bench" % job
            wait("the job's end in CloudVision", 120, lambda: (
                bench.events(standin).get(key, [])[-1:] == ["JOB_STATE_COMPLETED"]))
            acct = wait("accounting's record of the job", 60, lambda: (
                (lambda t: t if t and t[2] == "COMPLETED" else None)(sacct_times(job))))
            rec = standin.control("GET", "state")["jobs"].get(key, {})
            right = (rec.get("start_time"), rec.get("end_time")) == acct[:2]
            rows.append({"cycle": c, "delay": seen - start, "job_right": right,
                         "cycle_seconds": time.time() - t0,
                         "running": bench.events(standin).get(key, []).count("JOB_STATE_RUNNING")})
            log("cycle %d: new MAC in CloudVision %.1f s after slurmd started; job %s %s "
                "(CloudVision %s..%s, sacct %s..%s); %.0f s" % (
                    c, seen - start, job, "right" if right else "WRONG",
                    rec.get("start_time"), rec.get("end_time"), acct[0], acct[1],
                    time.time() - t0))
        # In the order CloudVision got them, a NodeConfig of n4 whose MAC is older than one
        # an earlier NodeConfig carried (the original MAC is the oldest) is stale.
        order = [original] + ["02:cc:00:00:%02x:%02x" % (c // 256, c % 256)
                              for c in range(1, args.cycles + 1)]
        stale, latest = 0, 0
        for macs in node_posts(standin):
            for m in macs:
                if m not in order:
                    continue
                k = order.index(m)
                if k < latest:
                    stale += 1
                latest = max(latest, k)
    finally:
        if service:
            service.terminate()
            service.wait()
        if os.path.exists(HOLD):
            os.remove(HOLD)
        try:
            set_mac(original)
        except subprocess.CalledProcessError:
            pass
        bench.sh([bench.CLUSTER_SH, "down"], check=False, timeout=120)
        standin.stop()
    delays = [r["delay"] for r in rows]
    print("cycles: %d (Slurm %s)%s" % (len(rows), os.environ.get("SLURM", "22.05"),
                                       ", nodes publish their records" if args.publish else ""))
    print("slurmd start -> new MAC in CloudVision: p50 %.1f s, max %.1f s" % (
        bench.pct(delays, 50), max(delays)))
    print("NodeConfigs with a MAC from before a later restart, after it: %d" % stale)
    print("jobs whose final record = sacct's start and end: %d / %d" % (
        sum(r["job_right"] for r in rows), len(rows)))
    print("RUNNING records per job (the prolog's, then Slurm's start once n4 booted): %s" %
          sorted(set(r["running"] for r in rows)))
    print("seconds per cycle: p50 %.1f, max %.1f" % (
        bench.pct([r["cycle_seconds"] for r in rows], 50),
        max(r["cycle_seconds"] for r in rows)))


if __name__ == "__main__":
    main()
