#!/usr/bin/env python3
"""The job-array benchmark (issue 10): how much do PrologSlurmctld/EpilogSlurmctld slow the
scheduler down, and how fast do events reach CloudVision?

On the real test cluster (tests/cluster/cluster.sh: 4 nodes x 8 CPUs, sched/backfill with
its default bf_interval of 30 s, batch_sched_delay=0), for each set-up it brings the cluster
up, submits `sbatch --array=0-(N-1) --wrap true` and times it from submission until squeue
lists none of its tasks. Set-ups:

  none        no hooks
  noop        a /bin/sh script (`exit 0`) as both hooks
  service     cvslurm hooks, the cvslurm service running (the default set-up)
  direct      cvslurm hooks, no service: each hook asks slurmctld and sends itself

cvslurm set-ups run with the CloudVision stand-in answering at once and after 200 ms.
It prints seconds, the ratio to the no-op hook, the events CloudVision accepted (2 per job,
RUNNING then COMPLETED, in order) and, for the service, the delay from the hook writing the
event to CloudVision's 200 (p50/p99, from the service's log).

`hookcost` (no cluster): the hook alone, run N times as slurmctld runs it with the service
running, median wall and CPU per call (through the rusage.c launcher), and without the
service for comparison.

Run as root, inside the cluster lock:
  flock /var/lock/cvslurm-dev-cluster.lock tests/bench/array.py [--only LIST] [--tasks N]
Environment: BENCH_BIN (default target/x86_64-unknown-linux-musl/release/cvslurm).
"""
import argparse
import json
import os
import pwd
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLUSTER_SH = os.path.join(ROOT, "tests/cluster/cluster.sh")
STANDIN = os.path.join(ROOT, "tests/standin/cv_standin.py")
BIN = os.path.abspath(os.environ.get(
    "BENCH_BIN", os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/cvslurm")))
WORK = "/var/tmp/cvslurm-bench"
CONF = "/etc/slurm/cloudvision.conf"
TOKEN = "bench-token"
SLURM = pwd.getpwnam("slurm")


def log(msg):
    print("[bench] " + msg, file=sys.stderr, flush=True)


def sh(argv, env=None, check=True, timeout=300):
    return subprocess.run(argv, env=env, check=check, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def chown_slurm(p):
    os.chown(p, SLURM.pw_uid, SLURM.pw_gid)


class Standin:
    def __init__(self, delay_ms):
        self.dir = os.path.join(WORK, "standin-%d" % delay_ms)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.log = open(os.path.join(self.dir, "standin.log"), "w")
        self.proc = subprocess.Popen(
            ["python3", STANDIN, "--dir", self.dir, "--port", "0", "--token", TOKEN,
             "--delay-ms", str(delay_ms)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        port_file = os.path.join(self.dir, "port")
        until = time.time() + 20
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.time() > until:
                raise SystemExit("stand-in did not start")
            time.sleep(0.05)
        self.port = int(open(port_file).read())
        self.ca = os.path.join(WORK, "ca-%d.pem" % delay_ms)
        shutil.copy(os.path.join(self.dir, "ca.pem"), self.ca)
        os.chmod(self.ca, 0o644)

    def control(self, method, path, body=None):
        argv = ["curl", "-sS", "--fail", "--cacert", self.ca, "-X", method,
                "https://127.0.0.1:%d/_standin/%s" % (self.port, path)]
        if body is not None:
            argv += ["-H", "Content-Type: application/json", "--data", json.dumps(body)]
        return json.loads(sh(argv).stdout or "null")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def write_conf(standin, state_dir, log_file):
    token = os.path.join(WORK, "cloudvision.token")
    with open(token, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token, 0o600)
    chown_slurm(token)
    with open(CONF, "w") as f:
        f.write("# cvslurm array benchmark (tests/bench/array.py)\n"
                "ApiServer=127.0.0.1:%d\nApiTokenFile=%s\nCaFile=%s\nStateDir=%s\nLogFile=%s\n"
                % (standin.port, token, standin.ca, state_dir, log_file))
    os.chmod(CONF, 0o644)


def fresh_state(tag):
    state_dir = os.path.join(WORK, "state-" + tag)
    shutil.rmtree(state_dir, ignore_errors=True)
    os.makedirs(state_dir, mode=0o750)
    chown_slurm(state_dir)
    log_file = os.path.join(WORK, "cvslurm-%s.log" % tag)
    if os.path.exists(log_file):
        os.remove(log_file)
    open(log_file, "w").close()
    chown_slurm(log_file)
    return state_dir, log_file


def start_service(log_file, standin, nodes):
    proc = subprocess.Popen(
        ["runuser", "-u", "slurm", "--", os.path.join(WORK, "cvslurm"), "inventory", "--monitor"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    # Its first inventory runs srun on the nodes: wait until it is done, so it does not
    # compete with the array.
    until = time.time() + 120
    while len(standin.control("GET", "state").get("nodes", {})) < nodes:
        if time.time() > until or proc.poll() is not None:
            raise SystemExit("the service did not send its first inventory; see " + log_file)
        time.sleep(0.2)
    return proc


def run_array(tasks, timeout):
    out = sh(["sbatch", "--parsable", "--array=0-%d" % (tasks - 1), "-o", "/dev/null",
              "-J", "bench", "--wrap", "true"]).stdout.strip()
    t0 = time.time()
    job = out.split(";")[0]
    while True:
        left = sh(["squeue", "-h", "-r", "-j", job, "-o", "%i"], check=False).stdout.split()
        if not left:
            return time.time() - t0, job
        if time.time() - t0 > timeout:
            sh(["scancel", job], check=False)
            return None, job
        time.sleep(0.1)


def events(standin):
    """Per job key, the states CloudVision accepted, in order."""
    per = {}
    for r in standin.control("GET", "requests"):
        if r.get("method") == "POST" and r.get("status") == 200 and \
                r.get("path", "").endswith("JobConfig"):
            per.setdefault(r["body"]["key"]["id"], []).append(r["body"]["state"])
    return per


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else None


def setup(kind, delay, tasks, timeout, standins):
    """One set-up: returns a result dict."""
    tag = kind if kind in ("none", "noop") else "%s-%d" % (kind, delay)
    hook = {"none": "", "noop": os.path.join(WORK, "noop-hook.sh")}.get(
        kind, os.path.join(WORK, "cvslurm-hook"))
    res = {"setup": tag}
    standin = standins.get(delay)
    state_dir, log_file = fresh_state(tag)
    if standin:
        write_conf(standin, state_dir, log_file)
    env = dict(os.environ, CVSLURM_HOOK=hook, CLUSTER_NAME="bench", WITH_DBD="0")
    if not hook:
        env.pop("CVSLURM_HOOK")
    log("%s: cluster up" % tag)
    r = sh([CLUSTER_SH, "up", "4"], env=env, check=False, timeout=240)
    if r.returncode != 0:
        raise SystemExit("cluster up failed:\n" + r.stderr[-3000:])
    service = None
    try:
        if kind == "service":
            service = start_service(log_file, standin, 4)
        if standin:
            standin.control("POST", "reset", {})
        log("%s: %d-task array" % (tag, tasks))
        secs, _ = run_array(tasks, timeout)
        res["seconds"] = secs
        if standin:
            # Wait for the last events (the service sends after the hooks returned).
            until = time.time() + 30
            while time.time() < until:
                per = events(standin)
                if sum(len(v) for v in per.values()) >= 2 * tasks:
                    break
                time.sleep(0.5)
            per = events(standin)
            res["events"] = sum(len(v) for v in per.values())
            res["right"] = sum(1 for v in per.values()
                               if v == ["JOB_STATE_RUNNING", "JOB_STATE_COMPLETED"])
            res["left_in_outbox"] = len([n for n in os.listdir(os.path.join(state_dir, "outbox"))
                                         if n.endswith(".json")]) \
                if os.path.isdir(os.path.join(state_dir, "outbox")) else 0
            text = open(log_file, errors="replace").read()
            found = re.findall(
                r"outbox: delivered job \S+ (\S+) \(HTTP 200, (\d+) ms after", text)
            delays = [int(ms) for _, ms in found]
            if delays:
                res["p50"], res["p99"] = pct(delays, 50), pct(delays, 99)
                # RUNNING and the ends apart: an end also waits for its RUNNING and for the
                # batch question to slurmctld.
                for tag, pick in (("run", lambda st: st == "RUNNING"),
                                  ("end", lambda st: st != "RUNNING")):
                    d = [int(ms) for st, ms in found if pick(st)]
                    if d:
                        res[tag + "_p50"], res[tag + "_p99"] = pct(d, 50), pct(d, 99)
            sent = [int(m) for m in re.findall(r": sent \S+ on .*\(HTTP 200, (\d+) ms\)", text)]
            if sent:
                res["hook_send_p50"], res["hook_send_p99"] = pct(sent, 50), pct(sent, 99)
    finally:
        if service:
            service.terminate()
            try:
                service.wait(5)
            except subprocess.TimeoutExpired:
                service.kill()
    return res


def hook_cost(runs):
    """The hook alone, with and without the service (no cluster: SlurmBinDir is empty)."""
    rusage = os.path.join(WORK, "rusage")
    sh(["cc", "-O2", "-o", rusage, os.path.join(HERE, "rusage.c")])
    st = Standin(0)
    out = []
    try:
        for with_service in (True, False):
            tag = "hookcost-" + ("service" if with_service else "direct")
            state_dir, log_file = fresh_state(tag)
            # The hooks run as root here: a StateDir of root's own, so nothing is chowned
            # (as for SlurmUser's hooks in its own StateDir).
            os.chown(state_dir, 0, 0)
            os.chown(log_file, 0, 0)
            conf = os.path.join(WORK, tag + ".conf")
            bindir = os.path.join(WORK, "empty-bin")
            os.makedirs(bindir, exist_ok=True)
            token = os.path.join(WORK, "hookcost.token")
            with open(token, "w") as f:
                f.write(TOKEN + "\n")
            os.chmod(token, 0o600)
            with open(conf, "w") as f:
                f.write("ApiServer=127.0.0.1:%d\nApiTokenFile=%s\nCaFile=%s\nStateDir=%s\n"
                        "LogFile=%s\nSlurmBinDir=%s\n" % (st.port, token, st.ca, state_dir,
                                                          log_file, bindir))
            svc = None
            if with_service:
                svc = subprocess.Popen([os.path.join(WORK, "cvslurm"), "inventory", "--monitor"],
                                       env={"CVSLURM_CONF": conf, "PATH": "/usr/bin:/bin"},
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                until = time.time() + 20
                while not os.path.exists(os.path.join(state_dir, "wake.sock")):
                    if time.time() > until:
                        raise SystemExit("service did not start")
                    time.sleep(0.05)
                time.sleep(0.5)
            walls, cpus = [], []
            for i in range(runs + 5):
                ctx = "prolog_slurmctld" if i % 2 == 0 else "epilog_slurmctld"
                env = {"CVSLURM_CONF": conf, "SLURM_SCRIPT_CONTEXT": ctx,
                       "SLURM_JOB_ID": str(100000 + i // 2), "SLURM_CLUSTER_NAME": "bench",
                       "SLURM_JOB_NAME": "bench", "SLURM_JOB_PARTITION": "debug",
                       "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_EXIT_CODE2": "0:0"}
                w, c, _rss, code = sh([rusage, os.path.join(WORK, "cvslurm-hook")],
                                      env=env).stdout.split()
                assert code == "0"
                if i >= 5:
                    walls.append(float(w) * 1000)
                    cpus.append(float(c) * 1000)
            if svc:
                svc.send_signal(signal.SIGTERM)
                svc.wait()
            out.append((tag, statistics.median(walls), statistics.median(cpus), pct(walls, 90)))
    finally:
        st.stop()
    return out


def established_to(port):
    """TCP connections to 127.0.0.1:port in state ESTABLISHED (client side)."""
    n = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[3] == "01" and int(f[2].split(":")[1], 16) == port:
            n += 1
    return n


def burst(jobs, delay_ms, parallel=20):
    """No cluster: `jobs` prologs then epilogs fired `parallel` at a time with the service
    running; what CloudVision got, the delay to its 200, the most connections at once."""
    import threading
    st = Standin(delay_ms)
    tag = "burst-%d" % delay_ms
    state_dir, log_file = fresh_state(tag)
    os.chown(state_dir, 0, 0)
    os.chown(log_file, 0, 0)
    conf = os.path.join(WORK, tag + ".conf")
    bindir = os.path.join(WORK, "empty-bin")
    os.makedirs(bindir, exist_ok=True)
    token = os.path.join(WORK, "hookcost.token")
    with open(token, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token, 0o600)
    with open(conf, "w") as f:
        f.write("ApiServer=127.0.0.1:%d\nApiTokenFile=%s\nCaFile=%s\nStateDir=%s\nLogFile=%s\n"
                "SlurmBinDir=%s\n" % (st.port, token, st.ca, state_dir, log_file, bindir))
    svc = subprocess.Popen([os.path.join(WORK, "cvslurm"), "inventory", "--monitor"],
                           env={"CVSLURM_CONF": conf, "PATH": "/usr/bin:/bin"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(os.path.join(state_dir, "wake.sock")):
            time.sleep(0.05)
        time.sleep(0.5)
        peak = [0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], established_to(st.port))
                time.sleep(0.01)
        threading.Thread(target=sample, daemon=True).start()
        work = [("prolog_slurmctld", i) for i in range(jobs)] + \
               [("epilog_slurmctld", i) for i in range(jobs)]
        lock = threading.Lock()
        walls = []

        def hooks():
            while True:
                with lock:
                    if not work:
                        return
                    ctx, i = work.pop(0)
                env = {"CVSLURM_CONF": conf, "SLURM_SCRIPT_CONTEXT": ctx,
                       "SLURM_JOB_ID": str(200000 + i), "SLURM_CLUSTER_NAME": "bench",
                       "SLURM_JOB_NAME": "bench", "SLURM_JOB_PARTITION": "debug",
                       "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_EXIT_CODE2": "0:0"}
                t = time.perf_counter()
                subprocess.run([os.path.join(WORK, "cvslurm-hook")], env=env, check=True)
                with lock:
                    walls.append((time.perf_counter() - t) * 1000)
        t0 = time.time()
        threads = [threading.Thread(target=hooks) for _ in range(parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fired = time.time() - t0
        until = time.time() + 120
        while time.time() < until:
            per = events(st)
            if sum(len(v) for v in per.values()) >= 2 * jobs:
                break
            time.sleep(0.2)
        done.set()
        per = events(st)
        text = open(log_file, errors="replace").read()
        delays = [int(m) for m in re.findall(r"\(HTTP 200, (\d+) ms after it was queued", text)]
        return {
            "setup": "burst %d jobs, CloudVision %d ms" % (jobs, delay_ms),
            "fired_s": fired,
            "events": sum(len(v) for v in per.values()),
            "right": sum(1 for v in per.values()
                         if v == ["JOB_STATE_RUNNING", "JOB_STATE_COMPLETED"]),
            "p50": pct(delays, 50), "p99": pct(delays, 99),
            "hook_p50": pct(walls, 50), "hook_p99": pct(walls, 99),
            "peak_conns": peak[0], "jobs": jobs,
        }
    finally:
        svc.send_signal(signal.SIGTERM)
        svc.wait()
        st.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per array at most")
    ap.add_argument("--runs", type=int, default=200, help="hook calls for hookcost")
    ap.add_argument("--only", default="none,noop,service-0,service-200,direct-0,direct-200,hookcost")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("array.py: run as root (it brings the test cluster up)")
    # A SIGTERM (timeout(1)) still brings the cluster down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    only = a.only.split(",")
    os.makedirs(WORK, exist_ok=True)
    os.chmod(WORK, 0o755)
    shutil.copy(BIN, os.path.join(WORK, "cvslurm"))
    os.chmod(os.path.join(WORK, "cvslurm"), 0o755)
    link = os.path.join(WORK, "cvslurm-hook")
    if not os.path.islink(link):
        os.symlink("cvslurm", link)
    with open(os.path.join(WORK, "noop-hook.sh"), "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(os.path.join(WORK, "noop-hook.sh"), 0o755)
    saved = open(CONF).read() if os.path.exists(CONF) else None
    standins = {}
    results = []
    try:
        for item in only:
            if item == "hookcost" or item.startswith("burst"):
                continue
            kind, _, d = item.partition("-")
            delay = int(d or 0)
            if kind in ("service", "direct") and delay not in standins:
                standins[delay] = Standin(delay)
            results.append(setup(kind, delay, a.tasks, a.timeout, standins))
            log("%s: %s" % (item, results[-1]))
    finally:
        for s in standins.values():
            s.stop()
        if any(i != "hookcost" and not i.startswith("burst") for i in only):
            sh([CLUSTER_SH, "down"], check=False)
        if saved is not None:
            with open(CONF, "w") as f:
                f.write(saved)
    base = next((r["seconds"] for r in results if r["setup"] == "noop" and r.get("seconds")), None)
    if results:
        print("| set-up | seconds | vs no-op hook | events accepted | jobs RUNNING→COMPLETED | "
              "delay hook→200 p50 / p99 |")
        print("|---|---|---|---|---|---|")
        for r in results:
            s = r.get("seconds")
            secs = "%.1f" % s if s else "> %d (stopped)" % a.timeout
            ratio = "%.2f×" % (s / base) if s and base else "-"
            ev = "%d / %d" % (r["events"], 2 * a.tasks) if "events" in r else "-"
            right = "%d / %d" % (r["right"], a.tasks) if "right" in r else "-"
            if "p50" in r:
                delay = "%d / %d ms" % (r["p50"], r["p99"])
                if "run_p50" in r and "end_p50" in r:
                    delay += " (RUNNING %d / %d, end %d / %d)" % (
                        r["run_p50"], r["run_p99"], r["end_p50"], r["end_p99"])
            elif "hook_send_p50" in r:
                delay = "in the hook: %d / %d ms" % (r["hook_send_p50"], r["hook_send_p99"])
            else:
                delay = "-"
            print("| %s | %s | %s | %s | %s | %s |" % (r["setup"], secs, ratio, ev, right, delay))
    bursts = [b for b in only if b.startswith("burst")]
    if bursts:
        print()
        print("| burst (no cluster; %d hooks at a time) | hooks fired in | events accepted "
              "| jobs RUNNING→COMPLETED | delay hook→200 p50 / p99 | hook wall p50 / p99 "
              "| most connections at once |" % 20)
        print("|---|---|---|---|---|---|---|")
        for b in bursts:
            r = burst(a.tasks, int(b.partition("-")[2] or 0))
            print("| %s | %.1f s | %d / %d | %d / %d | %d / %d ms | %.1f / %.1f ms | %d |" % (
                r["setup"], r["fired_s"], r["events"], 2 * r["jobs"], r["right"], r["jobs"], r["p50"], r["p99"],
                r["hook_p50"], r["hook_p99"], r["peak_conns"]))
    if "hookcost" in only:
        print()
        print("| hook alone (%d calls) | median wall | p90 wall | median CPU |" % a.runs)
        print("|---|---|---|---|")
        for tag, wall, cpu, p90 in hook_cost(a.runs):
            print("| %s | %.2f ms | %.2f ms | %.2f ms |" % (tag, wall, p90, cpu))


if __name__ == "__main__":
    main()
