#!/usr/bin/env python3
"""cvslurm benchmarks: prints figure | cvslurm | comparison | ratio | target | pass/fail.

Run through tests/bench/run.sh (which builds the static release binary first). Everything
runs on this machine over loopback TLS against the CloudVision stand-in
(tests/standin/cv_standin.py). The 10,000-node figures use the BENCHMARK STAND-INS for
sinfo/srun/scontrol in tests/bench/fake-slurm/ (SlurmBinDir points at them): the scale is
simulated, not measured on a real cluster.

Environment:
  BENCH_BIN      binary to measure (default target/x86_64-unknown-linux-musl/release/cvslurm)
  BENCH_NODES    nodes for inventory/monitor/drain (default 10000)
  BENCH_RUNS     hook and curl runs each (default 30)
  BENCH_POLLS    monitor polls to measure (default 60; the target names 1000, ~17 min)
  BENCH_ONLY     comma list of: size,version,hook,inventory,monitor,drain (default all)
  BENCH_WORK     scratch directory (default tests/.work/bench)
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "standin"))
import standin_client  # noqa: E402

BIN = os.path.abspath(os.environ.get(
    "BENCH_BIN", os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/cvslurm")))
NODES = int(os.environ.get("BENCH_NODES", "10000"))
RUNS = int(os.environ.get("BENCH_RUNS", "30"))
POLLS = int(os.environ.get("BENCH_POLLS", "60"))
ONLY = set(filter(None, os.environ.get("BENCH_ONLY", "").split(","))) or {
    "size", "version", "hook", "inventory", "monitor", "drain"}
WORK = os.path.abspath(os.environ.get("BENCH_WORK", os.path.join(ROOT, "tests/.work/bench")))
FAKE = os.path.join(HERE, "fake-slurm")
TOKEN = "bench-token"
DELAY_MS = 20
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

rows = []


def row(figure, mine, comp, ratio, target, ok):
    rows.append((figure, mine, comp, ratio, target, "pass" if ok else "FAIL"))
    print("  %s: %s (comparison %s) -> %s" % (figure, mine, comp, rows[-1][-1]), file=sys.stderr)


RUSAGE = os.environ.get("BENCH_RUSAGE", os.path.join(WORK, "rusage"))


def run_rusage(argv, env=None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=None):
    """Runs argv through the C helper rusage.c (a child forked from Python would carry
    Python's RSS into ru_maxrss); returns (wall s, cpu s, maxrss KiB, exit code)."""
    out = subprocess.run([RUSAGE] + argv, env=env, stdout=subprocess.PIPE, stderr=stderr,
                         stdin=subprocess.DEVNULL, cwd=cwd, check=True).stdout.decode()
    wall, cpu, rss, rc = out.strip().splitlines()[-1].split()
    return float(wall), float(cpu), int(rss), int(rc)


def ms(s):
    return "%.2f ms" % (s * 1000)


def write_conf(path, port, state, extra=()):
    lines = [
        "ApiServer=127.0.0.1:%d" % port,
        "ApiTokenFile=%s" % os.path.join(WORK, "token"),
        "CaFile=%s" % os.path.join(WORK, "cv", "ca.pem"),
        "StateDir=%s" % state,
        "LogFile=%s" % os.path.join(WORK, "cvslurm.log"),
        "SlurmBinDir=%s" % FAKE,
        "InterfacePhysicalOnly=no",
    ] + list(extra)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def fresh(d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def stored(cv, kind):
    return len(cv.state()[kind])


# ---------------------------------------------------------------- figures


def bench_size():
    size = os.path.getsize(BIN)
    out = subprocess.run(["file", "-b", BIN], capture_output=True, text=True).stdout \
        if shutil.which("file") else ""
    static = "static" in out or "static-pie" in out
    row("binary size (static release)", "%.2f MB%s" % (size / 1e6, "" if static else " (NOT static)"),
        "-", "-", "<= 6 MB, static", size <= 6_000_000 and (static or not out))


def hyperfine_median(cmd, runs=200):
    j = os.path.join(WORK, "hf.json")
    subprocess.run(["hyperfine", "-N", "--warmup", "20", "--runs", str(runs), "--export-json", j,
                    cmd], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(j) as f:
        return json.load(f)["results"][0]["median"]


def bench_version():
    if shutil.which("hyperfine"):
        mine = hyperfine_median("%s --version" % BIN)
        curl = hyperfine_median("curl --version")
        how = "hyperfine -N"
    else:
        samples = sorted(run_rusage([BIN, "--version"])[0] for _ in range(200))
        mine = statistics.median(samples)
        curl = statistics.median(run_rusage(["curl", "--version"])[0] for _ in range(200))
        how = "fork+wait4"
    row("`cvslurm --version` median wall (%s)" % how, ms(mine), "curl --version " + ms(curl),
        "%.2f" % (mine / curl), "<= 2 ms", mine <= 0.002)


def bench_hook(cv):
    state = fresh(os.path.join(WORK, "state-hook"))
    conf = os.path.join(WORK, "hook.conf")
    write_conf(conf, cv.port, state)
    hookdir = fresh(os.path.join(WORK, "hookbin"))
    hook = os.path.join(hookdir, "cvslurm-hook")
    os.symlink(BIN, hook)
    payload = os.path.join(WORK, "payload.json")
    with open(payload, "w") as f:
        json.dump({"key": {"id": "1@bench"}, "state": "JOB_STATE_RUNNING",
                   "start_time": "2024-05-01T10:00:00Z", "name": "j@p", "location": "bench",
                   "nodes": {"values": ["n1", "n2", "n3", "n4"]}}, f)
    url = "https://127.0.0.1:%d/api/resources/computejob/v1/JobConfig" % cv.port
    curl = ["curl", "-s", "-o", "/dev/null", "--cacert", os.path.join(WORK, "cv", "ca.pem"),
            "-H", "Authorization: Bearer " + TOKEN, "-H", "Content-Type: application/json",
            "--data", "@" + payload, url]
    cv.set_mode("ok")
    cv.reset()
    h, c = [], []
    for i in range(RUNS + 3):  # 3 warm-up rounds, alternating so drift hits both
        env = {"CVSLURM_CONF": conf, "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld",
               "SLURM_JOB_ID": str(1000 + i), "SLURM_CLUSTER_NAME": "bench",
               "SLURM_JOB_NAME": "j", "SLURM_JOB_PARTITION": "p",
               "SLURM_JOB_NODELIST": "n[1-4]"}
        a = run_rusage([hook], env=env)
        b = run_rusage(curl)
        if b[3] != 0:
            raise SystemExit("curl failed (exit %d)" % b[3])
        if i >= 3:
            h.append(a)
            c.append(b)
    jobs = cv.state()["jobs"]
    sent = sum(1 for i in range(3, RUNS + 3) if "%d@bench" % (1000 + i) in jobs)
    left = len(os.listdir(os.path.join(state, "outbox")))
    hw, cw = statistics.median(x[0] for x in h), statistics.median(x[0] for x in c)
    hc, cc = statistics.median(x[1] for x in h), statistics.median(x[1] for x in c)
    hr, cr = max(x[2] for x in h), max(x[2] for x in c)
    ok_sent = sent == RUNS and left == 0
    row("hook success path: median wall (%d runs)%s" % (RUNS, "" if ok_sent else
        " [only %d/%d delivered, %d left in outbox]" % (sent, RUNS, left)),
        ms(hw), "curl " + ms(cw), "%.2f" % (hw / cw), "<= curl", hw <= cw and ok_sent)
    row("hook success path: median CPU (user+sys)", ms(hc), "curl " + ms(cc), "%.2f" % (hc / cc),
        "<= 0.5 x curl", hc <= cc / 2)
    row("hook success path: peak RSS (max of runs)", "%.2f MiB" % (hr / 1024),
        "curl %.2f MiB" % (cr / 1024), "%.2f" % (hr / cr), "<= 4 MiB", hr <= 4096)


def bench_inventory(cv, concurrency, label, rate_limit=0):
    state = fresh(os.path.join(WORK, "state-inv"))
    conf = os.path.join(WORK, "inv.conf")
    extra = ["MaxConcurrentRequests=%d" % concurrency] if concurrency else []
    write_conf(conf, cv.port, state, extra)
    cv.reset()
    if rate_limit:
        cv.set_mode("status", status=429, retry_after=1, count=rate_limit, delay_ms=DELAY_MS)
    else:
        cv.set_mode("delay", delay_ms=DELAY_MS)
    env = dict(os.environ, PATH=FAKE + ":" + os.environ.get("PATH", ""), BENCH_NODES=str(NODES))
    wall, cpu, rss, rc = run_rusage([BIN, "inventory", "--config", conf], env=env,
                                    stderr=open(os.path.join(WORK, "inventory.stderr"), "w"))
    n = stored(cv, "nodes")
    ideal = NODES * DELAY_MS / 1000 / (concurrency or 16)
    ok = n == NODES and rc == 0
    note = "" if ok else " [%d/%d stored, exit %d]" % (n, NODES, rc)
    row("inventory %d nodes @%d ms, %s: wall%s" % (NODES, DELAY_MS, label, note),
        "%.2f s" % wall, "ideal %.2f s (at %d)" % (ideal, concurrency or 16),
        "%.2f" % (wall / ideal), "<= 10 s", ok and wall <= 10)
    if not rate_limit:
        row("inventory %d nodes, %s: CPU / peak RSS" % (NODES, label),
            "%.2f s / %.1f MiB" % (cpu, rss / 1024), "-", "-", "RSS <= 50 MiB", rss <= 50 * 1024)


def proc_cpu_rss(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK
    with open("/proc/%d/statm" % pid) as f:
        rss = int(f.read().split()[1]) * PAGE / 1024
    return cpu, rss


def count_lines(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def bench_monitor(cv):
    state = fresh(os.path.join(WORK, "state-mon"))
    conf = os.path.join(WORK, "mon.conf")
    write_conf(conf, cv.port, state, ["MaxConcurrentRequests=32"])
    cv.reset()
    cv.set_mode("ok")
    counter = os.path.join(WORK, "sinfo.count")
    if os.path.exists(counter):
        os.unlink(counter)
    env = dict(os.environ, BENCH_NODES=str(NODES), BENCH_SINFO_COUNT=counter)
    env.pop("JOURNAL_STREAM", None)
    p = subprocess.Popen([BIN, "inventory", "--monitor", "--poll-interval", "1", "--config", conf],
                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        # Settle: the first poll queues every node; the drain sends them.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            outbox = os.path.join(state, "outbox")
            if stored(cv, "nodes") == NODES and os.path.isdir(outbox) and not os.listdir(outbox):
                break
            time.sleep(0.5)
        else:
            raise SystemExit("monitor did not settle (nodes stored: %d)" % stored(cv, "nodes"))
        time.sleep(2)
        seq0 = len(cv.requests())
        p0, (c0, r0) = count_lines(counter), proc_cpu_rss(p.pid)
        rss_samples = [r0]
        while count_lines(counter) - p0 < POLLS:
            time.sleep(1)
            rss_samples.append(proc_cpu_rss(p.pid)[1])
        p1, (c1, r1) = count_lines(counter), proc_cpu_rss(p.pid)
        sent = len(cv.requests(since=seq0))
    finally:
        p.terminate()
        p.wait()
    polls = p1 - p0
    per = (c1 - c0) / polls
    row("monitor poll of %d unchanged nodes: CPU per poll (%d polls, incl. idle loop)" %
        (NODES, polls), ms(per), "-", "-", "<= 20 ms, sends 0 (sent %d)" % sent,
        per <= 0.020 and sent == 0)
    row("monitor RSS over %d polls: first -> last (max)" % polls,
        "%.1f -> %.1f MiB (%.1f)" % (r0 / 1024, r1 / 1024, max(rss_samples) / 1024), "-",
        "%.2f" % (r1 / r0), "flat (last <= first + 1 MiB)", r1 <= r0 + 1024)


def write_outbox(state, n):
    d = os.path.join(state, "outbox")
    os.makedirs(d, mode=0o700)
    for s in ("inflight", "rejected", "jobs"):
        os.makedirs(os.path.join(state, s), mode=0o700)
    now = time.time()
    for i in range(n):
        key = "%d@bench" % (100000 + i)
        ev = {"seq": int(now * 1e9) + i, "rank": [0, 0], "queued_at": int(now), "attempts": 0,
              "kind": "job",
              "job": {"key": {"id": key}, "state": "JOB_STATE_RUNNING",
                      "start_time": "2024-05-01T10:00:00Z", "name": "j@p", "location": "bench",
                      "nodes": {"values": ["n1", "n2"]}}}
        path = os.path.join(d, "job.%s.json" % key)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, json.dumps(ev).encode())
        os.close(fd)


def bench_drain(cv, concurrency, label):
    state = fresh(os.path.join(WORK, "state-drain"))
    os.rmdir(state)
    os.makedirs(state, mode=0o700)
    write_outbox(state, NODES)
    conf = os.path.join(WORK, "drain.conf")
    write_conf(conf, cv.port, state, ["MaxConcurrentRequests=%d" % concurrency] if concurrency else [])
    cv.reset()
    cv.set_mode("delay", delay_ms=DELAY_MS)
    wall, cpu, rss, rc = run_rusage([BIN, "flush", "--config", conf],
                                    stderr=open(os.path.join(WORK, "flush.stderr"), "w"))
    n = stored(cv, "jobs")
    ideal = NODES * DELAY_MS / 1000 / (concurrency or 16)
    ok = n == NODES and rc == 0
    note = "" if ok else " [%d/%d stored, exit %d]" % (n, NODES, rc)
    row("outbox drain (flush) %d events @%d ms, %s: wall%s" % (NODES, DELAY_MS, label, note),
        "%.2f s" % wall, "ideal %.2f s (at %d)" % (ideal, concurrency or 16),
        "%.2f" % (wall / ideal), "<= 10 s", ok and wall <= 10)
    row("outbox drain, %s: CPU / peak RSS" % label, "%.2f s / %.1f MiB" % (cpu, rss / 1024),
        "-", "-", "-", True)


def main():
    if not os.access(BIN, os.X_OK):
        raise SystemExit("no binary at %s (run tests/bench/run.sh)" % BIN)
    fresh(WORK)
    src = os.path.join(HERE, "rusage.c")
    if "BENCH_RUSAGE" not in os.environ and subprocess.run(
            ["cc", "-O2", "-static", "-o", RUSAGE, src]).returncode != 0:
        subprocess.run(["cc", "-O2", "-o", RUSAGE, src], check=True)
    with open(os.path.join(WORK, "token"), "w") as f:
        f.write(TOKEN)
    os.chmod(os.path.join(WORK, "token"), 0o600)
    print("binary: %s" % BIN, file=sys.stderr)
    if "size" in ONLY:
        bench_size()
    if "version" in ONLY:
        bench_version()
    cv = standin_client.start(os.path.join(WORK, "cv"), token=TOKEN)
    try:
        if "hook" in ONLY:
            bench_hook(cv)
        if "inventory" in ONLY:
            bench_inventory(cv, 0, "MaxConcurrentRequests default")
            bench_inventory(cv, 32, "MaxConcurrentRequests=32")
            bench_inventory(cv, 32, "=32, first 50 answers 429 Retry-After 1", rate_limit=50)
        if "drain" in ONLY:
            bench_drain(cv, 0, "MaxConcurrentRequests default")
            bench_drain(cv, 32, "MaxConcurrentRequests=32")
        if "monitor" in ONLY:
            bench_monitor(cv)
    finally:
        cv.stop()
    print()
    print("cvslurm benchmarks (%s; loopback TLS to the CloudVision stand-in; %d-node figures use"
          % (os.uname().nodename, NODES))
    print("the BENCHMARK STAND-INS tests/bench/fake-slurm/{sinfo,srun,scontrol}: simulated scale)")
    print()
    head = ("figure", "cvslurm", "comparison", "ratio", "target", "pass/fail")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0 if all(r[-1] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
