#!/usr/bin/env python3
"""The job-array benchmark: how much do PrologSlurmctld/EpilogSlurmctld slow the
scheduler down, and how fast do events reach CloudVision?

On the real test cluster (tests/cluster/cluster.sh: 4 nodes x 8 CPUs, sched/backfill with
its default bf_interval of 30 s, batch_sched_delay=0), for each set-up it brings the cluster
up, submits `sbatch --array=0-(N-1) --wrap true` and times it from submission until squeue
lists none of its tasks. Set-ups:

  none        no hooks
  noop        a /bin/sh script (`exit 0`) as both hooks
  service     cvslurm hooks, the cvslurm service running (the default set-up)
  direct      cvslurm hooks, no service: each hook asks slurmctld and sends itself
  prolog      cvslurm as PrologSlurmctld only (no EpilogSlurmctld), the service running
              with ReconcileInterval=2: it learns the ends from slurmctld's listing
  jobcomp     cvslurm as PrologSlurmctld only, ends from Slurm's jobcomp/elasticsearch
              plugin posting to the service's receiver (install.sh's default set-up);
              one warm-up job first, outside the timing, until the plugin itself posted
              its end (slurmctld's first posts after its start come up to ~30 s late)

cvslurm set-ups run with the CloudVision stand-in answering at once and after 200 ms.
It prints seconds, the ratio to the no-op hook, the events CloudVision accepted (2 per job,
RUNNING then COMPLETED, in order) and, for the service, the delay from the hook writing the
event to CloudVision's 200 (p50/p99, from the service's log).

`hookcost` (no cluster): the hook alone, run N times as slurmctld runs it with the service
running, median wall and CPU per call (through the rusage.c launcher), and without the
service for comparison.

`--disrupt stop-120|kill-9` (the jobcomp set-up): once a quarter of the array's RUNNING
events reached CloudVision, the service is stopped (SIGTERM) for 120 s and started again, or
killed with SIGKILL and started again at once; the table then says how many jobs still reached
CloudVision as RUNNING then COMPLETED (0 lost: all of them; the plugin posts again what the
receiver did not answer, every 30 s), waiting up to 5 minutes after the array for the last.

`--rounds N` runs the whole list N times, interleaved (none, noop, service-0, ... then again),
and reports each set-up's median: a single array run swings with whatever else the machine
does (a missed scheduler pass costs a 30 s backfill wave), so one run settles nothing.

Run as root, on a machine where no other test cluster runs:
  tests/bench/array.py [--only LIST] [--tasks N] [--rounds N]
Environment: BENCH_BIN (default target/x86_64-unknown-linux-musl/release/cvslurm);
BENCH_LOG_LEVEL (cvslurm's LogLevel, default info; debug logs each end-state question);
SLURM=22.05|24.11|26.05 (tests/cluster/cluster.sh: the Slurm release under test; its
commands are the cluster's wrappers in /var/tmp/cvslurm-cluster/bin).
"""
import argparse
import calendar
import json
import os
import pwd
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLUSTER_SH = os.path.join(ROOT, "tests/cluster/cluster.sh")
STANDIN = os.path.join(ROOT, "tests/standin/cv_standin.py")
BIN = os.path.abspath(os.environ.get(
    "BENCH_BIN", os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/cvslurm")))
WORK = "/var/tmp/cvslurm-bench"
# The set-ups that run cvslurm (and talk to the CloudVision stand-in).
CVSLURM_KINDS = ("service", "direct", "prolog", "jobcomp")
# The job-completion receiver's port in the jobcomp set-up.
JOBCOMP_PORT = 39250
# The cluster's Slurm commands (the release under test), for this script and the service.
CLUSTER_BIN = "/var/tmp/cvslurm-cluster/bin"
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


def install_binary():
    """Copies the binary under test to WORK (`cvslurm`, and `cvslurm-hook` linked to it),
    where slurmctld and SlurmUser can run it; returns the hook's path."""
    os.makedirs(WORK, exist_ok=True)
    os.chmod(WORK, 0o755)
    shutil.copy(BIN, os.path.join(WORK, "cvslurm"))
    os.chmod(os.path.join(WORK, "cvslurm"), 0o755)
    link = os.path.join(WORK, "cvslurm-hook")
    if not os.path.islink(link):
        os.symlink("cvslurm", link)
    return link


def write_conf(standin, state_dir, log_file, extra=""):
    token = os.path.join(WORK, "cloudvision.token")
    with open(token, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token, 0o600)
    chown_slurm(token)
    with open(CONF, "w") as f:
        f.write("# cvslurm array benchmark (tests/bench/array.py)\n"
                "ApiServer=127.0.0.1:%d\nApiTokenFile=%s\nCaFile=%s\nStateDir=%s\nLogFile=%s\n"
                "SlurmBinDir=%s\nLogLevel=%s\nInterfacePhysicalOnly=no\n%s"
                % (standin.port, token, standin.ca, state_dir, log_file, CLUSTER_BIN,
                   os.environ.get("BENCH_LOG_LEVEL", "info"), extra))
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
        # Nice=10, as packaging/cvslurm.service runs it.
        ["runuser", "-u", "slurm", "--", "nice", "-n", "10", os.path.join(WORK, "cvslurm"),
         "inventory", "--monitor"],
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
    r = sh(["sbatch", "--parsable", "--array=0-%d" % (tasks - 1), "-o", "/dev/null",
            "-J", "bench", "--wrap", "true"], check=False)
    if r.returncode != 0:
        raise SystemExit("sbatch failed: " + r.stderr.strip())
    out = r.stdout.strip()
    t0 = time.time()
    job = out.split(";")[0]
    while True:
        q = sh(["squeue", "-h", "-r", "-j", job, "-o", "%i"], check=False)
        # A squeue that failed (slurmctld busy past MessageTimeout) says nothing: ask again.
        if q.returncode == 0 and not q.stdout.split():
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


def epoch(utc):
    """`YYYY-MM-DDTHH:MM:SSZ` → Unix seconds."""
    return calendar.timegm(time.strptime(utc, "%Y-%m-%dT%H:%M:%SZ"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else None


def hold_jobs(n):
    """Puts `n` held jobs in slurmctld, each its own job record, in one second or so: one held
    array, whose tasks 1..n-1 one `scontrol update` splits into records of their own (an
    update of some tasks of a pending array splits them off; `squeue` lists each)."""
    if n <= 0:
        return
    r = sh(["sbatch", "--parsable", "--hold", "--array=0-%d" % (n - 1), "-o", "/dev/null",
            "-J", "held", "--wrap", "true"], check=False)
    if r.returncode != 0:
        raise SystemExit("sbatch of the held jobs failed: " + r.stderr.strip())
    job = r.stdout.strip().split(";")[0]
    if n > 1:
        sh(["scontrol", "update", "JobId=%s_[1-%d]" % (job, n - 1), "Comment=held"],
           timeout=600)
    listed = records()
    if listed < n:
        # This release did not split them (or not all): the rest one sbatch each, 8 at a time.
        log("%d job records after the split; submitting %d more one by one" % (listed, n - listed))
        script = ("for i; do sbatch --hold -o /dev/null -J held --wrap true >/dev/null "
                  "|| exit 1; done")
        r = subprocess.run("seq %d | xargs -P 8 -n 100 sh -c '%s' sh" % (n - listed, script),
                           shell=True, timeout=3600)
        if r.returncode != 0:
            raise SystemExit("sbatch of the held jobs failed")
        listed = records()
    if listed < n:
        raise SystemExit("slurmctld holds %d job records, not %d" % (listed, n))


def records():
    """How many job records slurmctld holds (a pending array not split is one)."""
    r = sh(["squeue", "--only-job-state", "--json"], check=False, timeout=600)
    if r.returncode == 0:
        return len(json.loads(r.stdout).get("jobs", []))
    return len(sh(["squeue", "-h", "-o", "%i"], timeout=600).stdout.split())


SDIAG_USER = re.compile(r"^\s*(\S+)\s*\(\s*(\d+)\)\s*count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)")


def sdiag():
    """slurmctld's RPC statistics since the last `sdiag -r`: {"users": {name: (count,
    total_us)}, "types": {message type: (count, total_us)}}."""
    out = sh(["sdiag"]).stdout
    part = None
    res = {"users": {}, "types": {}}
    for line in out.splitlines():
        if "statistics by message type" in line:
            part = "types"
        elif "statistics by user" in line:
            part = "users"
        elif line and not line[0].isspace():
            part = None
        elif part:
            m = SDIAG_USER.match(line)
            if m:
                res[part][m.group(1)] = (int(m.group(3)), int(m.group(5)))
    return res


def service_pid(proc):
    """The cvslurm process under `runuser` (nice execs it)."""
    with open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)) as f:
        return int(f.read().split()[0])


def disrupt(how, holder, standin, tasks, log_file):
    """Once a quarter of the array's RUNNING events reached CloudVision: stops the service
    (SIGTERM) for 120 s, or kills it with SIGKILL, then starts it again."""
    until = time.time() + 120
    while sum(1 for v in events(standin).values() if "JOB_STATE_RUNNING" in v) < tasks // 4:
        if time.time() > until:
            log("disrupt: a quarter of the array never ran; not disrupted")
            return
        time.sleep(0.2)
    proc = holder["service"]
    if how == "kill-9":
        os.kill(service_pid(proc), signal.SIGKILL)
        proc.wait()
        log("disrupt: service killed -9")
    else:
        proc.terminate()
        proc.wait(30)
        log("disrupt: service stopped for 120 s")
        time.sleep(120)
    holder["service"] = subprocess.Popen(
        ["runuser", "-u", "slurm", "--", "nice", "-n", "10", os.path.join(WORK, "cvslurm"),
         "inventory", "--monitor"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    log("disrupt: service started again")


def setup(kind, delay, tasks, timeout, standins, held=None, how=None):
    """One set-up: returns a result dict. `held`: that many held jobs wait in slurmctld
    while the array runs, and slurmctld's RPC statistics (`sdiag`) are taken around it.
    `how`: the disruption of the service during the array (jobcomp only; see `disrupt`)."""
    tag = kind if kind in ("none", "noop") else "%s-%d" % (kind, delay)
    if held is not None:
        tag += " Q=%d" % held
    how = how if kind == "jobcomp" and how != "none" else None
    if how:
        tag += " " + how
    hook = {"none": "", "noop": os.path.join(WORK, "noop-hook.sh")}.get(
        kind, os.path.join(WORK, "cvslurm-hook"))
    res = {"setup": tag}
    standin = standins.get(delay) if kind in CVSLURM_KINDS else None
    state_dir, log_file = fresh_state(tag)
    if standin:
        write_conf(standin, state_dir, log_file,
                   {"prolog": "ReconcileInterval=2\n",
                    "jobcomp": "JobCompPort=%d\n" % JOBCOMP_PORT}.get(kind, ""))
    # MinJobAge=300, Slurm's default (the test cluster's own is 5 s): slurmctld keeps ended
    # jobs as long as on a production controller, so its listings are as large.
    env = dict(os.environ, CVSLURM_HOOK=hook, CLUSTER_NAME="bench", WITH_DBD="0",
               MIN_JOB_AGE="300",
               MAX_JOB_COUNT=str(max(10000, (held or 0) + 2 * tasks + 1000)),
               MAX_ARRAY_SIZE=str(max(1001, (held or 0) + 1, tasks + 1)),
               CVSLURM_HOOKS="prolog" if kind in ("prolog", "jobcomp") else "both")
    if kind == "jobcomp":
        env["JOBCOMP_LOC"] = "http://127.0.0.1:%d/slurm/jobcomp" % JOBCOMP_PORT
    if not hook:
        env.pop("CVSLURM_HOOK")
    log("%s: cluster up" % tag)
    r = sh([CLUSTER_SH, "up", "4"], env=env, check=False, timeout=240)
    if r.returncode != 0:
        raise SystemExit("cluster up failed:\n" + r.stderr[-3000:])
    holder = {"service": None}
    try:
        if held:
            log("%s: %d held jobs" % (tag, held))
            hold_jobs(held)
        if kind in ("service", "prolog", "jobcomp"):
            holder["service"] = start_service(log_file, standin, 4)
        if kind == "jobcomp":
            warm = sh(["sbatch", "--parsable", "-o", "/dev/null", "-J", "warm", "--wrap", "true"])
            key = "%s@bench" % warm.stdout.strip().split(";")[0]
            until = time.time() + 90
            # From the plugin itself (the receiver's line), not the stand-in: reconciliation
            # may send the end first, while the plugin still waits out its start-up.
            mark = "job %s: " % key
            while not any(mark in l and "queued from Slurm's job-completion record" in l
                          for l in open(log_file, errors="replace")):
                if time.time() > until:
                    raise SystemExit("the warm-up job's end never came from the job-completion plugin; see " + log_file)
                time.sleep(0.5)
        if standin:
            standin.control("POST", "reset", {})
        if held is not None:
            # The service's start-up passes (inventory, a first reconciliation) are not the
            # array's: let them end, then count from zero.
            time.sleep(5)
            sh(["sdiag", "-r"])
        log("%s: %d-task array" % (tag, tasks))
        th = None
        if how:
            th = threading.Thread(target=disrupt, args=(how, holder, standin, tasks, log_file))
            th.start()
        secs, _ = run_array(tasks, timeout)
        if th:
            th.join()
        res["seconds"] = secs
        if standin:
            # Wait for the last events (the service sends after the hooks returned).
            # Ends from reconciliation may wait for a full listing held back a minute (a big
            # queue before Slurm 24.11): wait longer there.
            until = time.time() + (300 if how else 90 if kind == "prolog" else 30)
            while time.time() < until:
                per = events(standin)
                if how:
                    # Every job's last state COMPLETED (a RUNNING may come twice).
                    if sum(1 for v in per.values()
                           if v[-1:] == ["JOB_STATE_COMPLETED"]) >= tasks:
                        break
                elif sum(len(v) for v in per.values()) >= 2 * tasks:
                    break
                time.sleep(0.5)
            per = events(standin)
            # From Slurm's end time (whole seconds) to CloudVision's 200, for every end.
            res["after_end"] = [
                r["time"] - epoch(r["body"]["end_time"])
                for r in standin.control("GET", "requests")
                if r.get("method") == "POST" and r.get("status") == 200
                and r.get("path", "").endswith("JobConfig") and r["body"].get("end_time")]
            res["events"] = sum(len(v) for v in per.values())
            res["right"] = sum(1 for v in per.values()
                               if v == ["JOB_STATE_RUNNING", "JOB_STATE_COMPLETED"])
            # Jobs whose last state CloudVision took is COMPLETED, after a RUNNING.
            res["ended"] = sum(1 for v in per.values()
                               if v[-1:] == ["JOB_STATE_COMPLETED"] and "JOB_STATE_RUNNING" in v)
            if how:
                res["not_right"] = {k: v for k, v in list(per.items())
                                    if v != ["JOB_STATE_RUNNING", "JOB_STATE_COMPLETED"]}
            if held is not None:
                res["sdiag"] = sdiag()
            res["left_in_outbox"] = len([n for n in os.listdir(os.path.join(state_dir, "outbox"))
                                         if n.endswith(".json")]) \
                if os.path.isdir(os.path.join(state_dir, "outbox")) else 0
            text = open(log_file, errors="replace").read()
            # (state, ms) per delivery by the service: RUNNING and the ends apart, as an end
            # also waits for its RUNNING and for the batch question to slurmctld.
            res["delays"] = [(st, int(ms)) for st, ms in re.findall(
                r"outbox: delivered job \S+ (\S+) \(HTTP 200, (\d+) ms after", text)]
            # Without the service: each hook's own request time.
            res["hook_sends"] = [int(m) for m in re.findall(
                r": sent \S+ on .*\(HTTP 200, (\d+) ms\)", text)]
    finally:
        service = holder["service"]
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


def merge(results):
    """One row per set-up over the rounds: median seconds (a stopped run counts as slower
    than any finished one), every round's seconds, events and right jobs summed, delays
    pooled."""
    rows = {}
    for r in results:
        m = rows.setdefault(r["setup"], {"setup": r["setup"], "runs": [], "delays": [],
                                         "hook_sends": [], "after_end": [], "events": 0,
                                         "right": 0,
                                         "counted": False})
        m["runs"].append(r.get("seconds"))
        m["delays"] += r.get("delays", [])
        m["hook_sends"] += r.get("hook_sends", [])
        m["after_end"] += r.get("after_end", [])
        if "sdiag" in r:
            m.setdefault("sdiag", []).append(r["sdiag"])
        if "events" in r:
            m["counted"] = True
            m["events"] += r["events"]
            m["right"] += r["right"]
    for m in rows.values():
        done = sorted(x for x in m["runs"] if x)
        m["seconds"] = statistics.median(done + [float("inf")] * (len(m["runs"]) - len(done)))
    return list(rows.values())


def print_table(rows, tasks, timeout, rounds):
    base = next((r["seconds"] for r in rows if r["setup"] == "noop"), None)
    print("| set-up | seconds (median of %d) | each round | vs no-op hook | events accepted "
          "| jobs RUNNING→COMPLETED | delay hook→200 p50 / p99: all; RUNNING; end "
          "| job's end→200 p50 / p99 |" % rounds)
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["seconds"]
        fin = s != float("inf")
        secs = "%.1f" % s if fin else "> %d (stopped)" % timeout
        each = ", ".join("%.1f" % x if x else "stopped" for x in r["runs"])
        ratio = "%.2f×" % (s / base) if fin and base and base != float("inf") else "-"
        n = len(r["runs"])
        ev = "%d / %d" % (r["events"], 2 * tasks * n) if r["counted"] else "-"
        right = "%d / %d" % (r["right"], tasks * n) if r["counted"] else "-"
        d = r["delays"]
        if d:
            parts = []
            for pick in (lambda st: True, lambda st: st == "RUNNING",
                         lambda st: st != "RUNNING"):
                xs = [ms for st, ms in d if pick(st)]
                parts.append("%d / %d" % (pct(xs, 50), pct(xs, 99)) if xs else "-")
            delay = "%s ms; %s; %s" % tuple(parts)
        elif r["hook_sends"]:
            delay = "in the hook: %d / %d ms" % (pct(r["hook_sends"], 50),
                                                 pct(r["hook_sends"], 99))
        else:
            delay = "-"
        ae = r["after_end"]
        after = "%.1f / %.1f s" % (pct(ae, 50), pct(ae, 99)) if ae else "-"
        if r["setup"].startswith("prolog") and d:
            # Its ends are queued by the service itself: only the RUNNING delay is the hook's.
            delay = "RUNNING %s ms" % delay.split("; ")[1]
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (r["setup"], secs, each, ratio, ev,
                                                             right, delay, after))


def print_sdiag(rows, tasks):
    """slurmctld's time answering SlurmUser (cvslurm's hooks and service) per job of the
    array, from `sdiag` (median over the rounds), and the RPCs that carry the cost."""
    print("| set-up | held jobs | array seconds | jobs RUNNING→COMPLETED | SlurmUser RPCs | "
          "SlurmUser RPC time | per job | full listings (REQUEST_JOB_INFO, all users) | "
          "by id (_SINGLE) | state-only (REQUEST_JOB_STATE) |")
    print("|---|---|---|---|---|---|---|---|---|---|")

    def med(xs):
        return statistics.median(xs) if xs else 0

    for r in rows:
        ds = r.get("sdiag")
        if not ds:
            continue
        setup, _, q = r["setup"].partition(" Q=")
        slurm = [d["users"].get("slurm", (0, 0)) for d in ds]
        kinds = {}
        for t in ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_JOB_STATE"):
            xs = [d["types"].get(t, (0, 0)) for d in ds]
            kinds[t] = "%d, %.1f ms" % (med([c for c, _ in xs]), med([u for _, u in xs]) / 1000)
        total_ms = med([u for _, u in slurm]) / 1000
        secs = r["seconds"]
        print("| %s | %s | %s | %d / %d | %d | %.1f ms | %.3f ms | %s | %s | %s |" % (
            setup, "{:,}".format(int(q)), "%.1f" % secs if secs != float("inf") else "stopped",
            r["right"], tasks * len(r["runs"]), med([c for c, _ in slurm]), total_ms,
            total_ms / tasks, kinds["REQUEST_JOB_INFO"], kinds["REQUEST_JOB_INFO_SINGLE"],
            kinds["REQUEST_JOB_STATE"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per array at most")
    ap.add_argument("--runs", type=int, default=200, help="hook calls for hookcost")
    ap.add_argument("--only", default="none,noop,service-0,service-200,direct-0,direct-200,hookcost")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the array set-ups this many times, interleaved; medians reported")
    ap.add_argument("--held", default=None,
                    help="comma list of queue sizes Q: each set-up runs with Q held jobs in "
                         "slurmctld, and slurmctld's RPC time for SlurmUser is taken (sdiag)")
    ap.add_argument("--disrupt", default="none", choices=("none", "stop-120", "kill-9"),
                    help="jobcomp set-up: stop the service for 120 s, or kill -9 it, during "
                         "the array")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("array.py: run as root (it brings the test cluster up)")
    # A SIGTERM (timeout(1)) still brings the cluster down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    only = a.only.split(",")
    os.environ["PATH"] = CLUSTER_BIN + ":" + os.environ.get("PATH", "/usr/bin:/bin")
    install_binary()
    with open(os.path.join(WORK, "noop-hook.sh"), "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(os.path.join(WORK, "noop-hook.sh"), 0o755)
    saved = open(CONF).read() if os.path.exists(CONF) else None
    standins = {}
    results = []
    try:
        for rnd in range(a.rounds):
            for item in only:
                if item == "hookcost" or item.startswith("burst"):
                    continue
                kind, _, d = item.partition("-")
                delay = int(d or 0)
                if kind in CVSLURM_KINDS and delay not in standins:
                    standins[delay] = Standin(delay)
                for held in ([int(q) for q in a.held.split(",")] if a.held else [None]):
                    r = setup(kind, delay, a.tasks, a.timeout, standins, held, a.disrupt)
                    log("round %d, %s: %s" % (rnd + 1, r["setup"], {
                        k: v for k, v in r.items()
                        if k not in ("delays", "hook_sends", "after_end")}))
                    results.append(r)
    finally:
        for s in standins.values():
            s.stop()
        if any(i != "hookcost" and not i.startswith("burst") for i in only):
            sh([CLUSTER_SH, "down"], check=False)
        if saved is not None:
            with open(CONF, "w") as f:
                f.write(saved)
    if results:
        print("Slurm %s, %d-task array, %d round(s)" % (
            os.environ.get("SLURM", "22.05"), a.tasks, a.rounds))
        print_table(merge(results), a.tasks, a.timeout, a.rounds)
        if a.held:
            print()
            print("slurmctld's RPC time for SlurmUser (sdiag, from the array's submission "
                  "until CloudVision has every event), median of %d round(s)" % a.rounds)
            print_sdiag(merge(results), a.tasks)
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
