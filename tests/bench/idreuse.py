#!/usr/bin/env python3
"""Job ids that Slurm gives again: a figure, not a test.

    cargo build --release --target x86_64-unknown-linux-musl
    tests/bench/idreuse.py                          # the host's Slurm (22.05)
    SLURM=24.11 tests/bench/idreuse.py --jobs 400 --max-job-id 40

Runs as root, where no other test cluster runs (`cluster.sh up` takes any down). The test
cluster comes up with accounting, `FirstJobId=1`, `MaxJobId=N` (ids start over at 1 past N)
and `MinJobAge=12` (an id is free 12 s after its job ended, past cvslurm's 10 s margin
between runs), cvslurm's hooks (both) and the service beside the CloudVision stand-in.
It submits the jobs one by one (each `sleep` 0–20 s on one CPU; a submission that finds no
free id is tried again), so every id is used about jobs/N times. A third of the way in,
CloudVision answers 503 for `--outage` seconds; two thirds in, the service is killed with
SIGKILL and started again.

Then, per id, it compares what CloudVision holds with accounting's last job of that id
(state, start, end, nodes), counts the accepted events of an earlier job that came after an
event of a later one (a record's start going back in time), and how many of Slurm's jobs had
a RUNNING in CloudVision.
"""

import argparse
import importlib.util
import os
import random
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("bench_array", os.path.join(HERE, "array.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

CLUSTER = "bench"
STATES = {"COMPLETED": "JOB_STATE_COMPLETED", "FAILED": "JOB_STATE_FAILED",
          "TIMEOUT": "JOB_STATE_FAILED", "NODE_FAIL": "JOB_STATE_FAILED",
          "OUT_OF_MEMORY": "JOB_STATE_FAILED", "CANCELLED": "JOB_STATE_CANCELLED"}


def log(msg):
    print("[idreuse] " + msg, file=sys.stderr, flush=True)


def accepted(standin):
    """Per job key, the bodies CloudVision accepted, in order."""
    per = {}
    for r in standin.control("GET", "requests"):
        if r.get("method") == "POST" and r.get("status") == 200 and \
                r.get("path", "").endswith("JobConfig"):
            per.setdefault(r["body"]["key"]["id"], []).append(r["body"])
    return per


def hostnames(nodelist):
    out = bench.sh(["scontrol", "show", "hostnames", nodelist], check=False).stdout
    return sorted(out.split())


def runs_of(job_id):
    """Accounting's jobs under `job_id` that started, oldest first: (submit, start, end, state,
    nodes), times as CloudVision's UTC strings."""
    env = dict(os.environ, SLURM_TIME_FORMAT="%s")
    out = bench.sh(["sacct", "-j", job_id, "-X", "-D", "-n", "-P", "-S", "now-2hours",
                    "--format=JobIDRaw,Submit,Start,End,State,NodeList"],
                   env=env, check=False).stdout
    rows = []
    for line in out.splitlines():
        f = line.split("|")
        if len(f) != 6 or f[0] != job_id or not f[2].isdigit() or f[2] == "0":
            continue
        iso = lambda s: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(s)))
        rows.append((int(f[1]), iso(f[2]), iso(f[3]) if f[3].isdigit() else None,
                     f[4].split()[0], hostnames(f[5])))
    rows.sort()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--max-job-id", type=int, default=40)
    ap.add_argument("--outage", type=int, default=60, help="seconds of CloudVision's 503s")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    rnd = random.Random(args.seed)
    link = bench.install_binary()
    os.environ["PATH"] = bench.CLUSTER_BIN + ":" + os.environ["PATH"]
    standin = bench.Standin(0)
    state_dir, log_file = bench.fresh_state("idreuse")
    bench.write_conf(standin, state_dir, log_file, "PollInterval=10\nReconcileInterval=3\n")
    env = dict(os.environ, CVSLURM_HOOK=link, CLUSTER_NAME=CLUSTER, WITH_DBD="1",
               MAX_JOB_ID=str(args.max_job_id), MIN_JOB_AGE="12")
    log("cluster up (MaxJobId=%d)" % args.max_job_id)
    r = bench.sh([bench.CLUSTER_SH, "up", "4"], env=env, check=False, timeout=300)
    if r.returncode != 0:
        raise SystemExit("cluster up failed:\n" + r.stderr[-3000:])
    holder = {"service": None}
    t0 = time.time()
    try:
        holder["service"] = bench.start_service(log_file, standin, 4)
        submitted, failing_since = 0, None
        outage_at, kill_at = args.jobs // 3, 2 * args.jobs // 3
        outage_end = None
        while submitted < args.jobs:
            if submitted == outage_at and outage_end is None:
                standin.control("POST", "mode", {"mode": "status", "status": 503})
                outage_end = time.time() + args.outage
                log("CloudVision answers 503 for %d s" % args.outage)
            if outage_end and time.time() > outage_end:
                standin.control("POST", "mode", {"mode": "ok"})
                outage_end = 0
                log("CloudVision answers again")
            if submitted == kill_at and holder.get("killed") is None:
                proc = holder["service"]
                os.kill(bench.service_pid(proc), signal.SIGKILL)
                proc.wait()
                # CloudVision holds the 4 nodes already: this returns once it runs.
                holder["service"] = bench.start_service(log_file, standin, 4)
                holder["killed"] = True
                log("service killed -9 and started again")
            r = bench.sh(["sbatch", "--parsable", "-n1", "-o", "/dev/null",
                          "-J", "reuse-%d" % submitted, "--wrap", "sleep %d" % rnd.randint(0, 20)],
                         check=False)
            if r.returncode == 0:
                submitted += 1
                failing_since = None
            else:
                # No free id, or slurmctld busy: again, for a minute at most (a tiny MaxJobId
                # can make slurmctld itself fail: 24.11 once found a reused id's batch script
                # gone and exited).
                failing_since = failing_since or time.time()
                if time.time() - failing_since > 60:
                    raise SystemExit("sbatch failed for 60 s: " + r.stderr.strip())
                time.sleep(0.5)
        if outage_end:
            while time.time() < outage_end:
                time.sleep(0.5)
            standin.control("POST", "mode", {"mode": "ok"})
            log("CloudVision answers again")
        log("%d jobs submitted in %.0f s; waiting for the queue to empty" % (
            submitted, time.time() - t0))
        until = time.time() + 600
        while bench.sh(["squeue", "-h", "-o", "%i"], check=False).stdout.split():
            if time.time() > until:
                raise SystemExit("the queue did not empty")
            time.sleep(1)
        # Until CloudVision holds each id's last job as accounting has it (or 3 minutes).
        ids = [str(i) for i in range(1, args.max_job_id + 1)]
        until = time.time() + 180
        while True:
            held = standin.control("GET", "state")["jobs"]
            wrong = []
            for i in ids:
                runs = runs_of(i)
                if not runs:
                    continue
                _, start, end, state, nodes = runs[-1]
                rec = held.get("%s@%s" % (i, CLUSTER), {})
                got = (rec.get("state"), rec.get("start_time"), rec.get("end_time"),
                       sorted((rec.get("nodes") or {}).get("values", [])))
                if got != (STATES.get(state, state), start, end, nodes):
                    wrong.append((i, got, (state, start, end, nodes)))
            if not wrong or time.time() > until:
                break
            time.sleep(3)
        per = accepted(standin)
        back, with_running, all_runs = 0, 0, 0
        for i in ids:
            bodies = per.get("%s@%s" % (i, CLUSTER), [])
            # A record's start going back by more than a clock's slip (22.05's prolog records
            # its own clock, Slurm's end record Slurm's start) is an earlier job's event.
            starts = [bench.epoch(b["start_time"]) for b in bodies if b.get("start_time")]
            back += sum(1 for a, b in zip(starts, starts[1:]) if b < a - 5)
            # 22.05's prolog records its own clock, a second or so after Slurm's start; jobs
            # under one id start at least MinJobAge (12 s) apart.
            running = [bench.epoch(b["start_time"]) for b in bodies
                       if b["state"] == "JOB_STATE_RUNNING" and b.get("start_time")]
            for run in runs_of(i):
                all_runs += 1
                with_running += any(abs(s - bench.epoch(run[1])) <= 5 for s in running)
    finally:
        if holder["service"]:
            holder["service"].terminate()
            holder["service"].wait()
        bench.sh([bench.CLUSTER_SH, "down"], check=False, timeout=120)
        standin.stop()
    print("Slurm %s: %d jobs on ids 1-%d, a %d s CloudVision outage, one kill -9 of the service"
          % (os.environ.get("SLURM", "22.05"), args.jobs, args.max_job_id, args.outage))
    print("ids whose record in CloudVision = accounting's last job (state, start, end, nodes): "
          "%d / %d" % (len(ids) - len(wrong), len(ids)))
    for w in wrong[:10]:
        print("  id %s: CloudVision %s, accounting %s" % w)
    print("events of an earlier job accepted after a later job's: %d" % back)
    print("jobs with a RUNNING in CloudVision (its start): %d / %d" % (with_running, all_runs))
    print("seconds: %.0f" % (time.time() - t0))


if __name__ == "__main__":
    main()
