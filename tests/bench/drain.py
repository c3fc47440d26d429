#!/usr/bin/env python3
"""The service's sender: sustained rate, live hooks, and a large backlog.

    tests/bench/drain.py                          # sustained (100,000 events) and live (30 s)
    tests/bench/drain.py --only backlog           # 1,000,000-event backlog (~25 min)
    tests/bench/drain.py --only sustained --events 20000 --delay-ms 20
    BENCH_BIN=/path/to/cvslurm BENCH_WORK=/var/tmp/drain-bench tests/bench/drain.py

Figures, not timed tests: nothing here fails on a number. What each part does:

* sustained: fills StateDir/outbox with N JobConfig events in the documented format (the
  same writer as outbox_status.py), starts the service (`cvslurm inventory --monitor`,
  `ReconcileInterval=0`, the fake Slurm tools of tests/bench/fake-slurm with 4 nodes, so
  inventory does next to nothing) against the CloudVision stand-in answering every request
  after --delay-ms (20), and samples once a second what the stand-in accepted. It prints the
  events/s from the service's start until every event was accepted, the best 10 s, the
  service's CPU and peak RSS (VmHWM), and the stand-in's CPU (one Python process: when it
  nears 1 s of CPU per second it is the limit, not cvslurm).
* live: the service runs on an empty outbox; hooks are fired straight at `cvslurm-hook`
  (as slurmctld runs them: SLURM_* environment, prolog then epilog of each job) at
  --live-rate a second for --live-seconds, and the script reports the rate it really fired
  at, what was delivered per second, and the delay from each hook to CloudVision's 200 as
  the service logs it per delivery (p50/p99).
* backlog: the same as sustained with --backlog events (1,000,000), plus `cvslurm status`
  at full depth (`--offline` without the service, and with and without `--offline` while the
  service runs), and the outbox's disk use (`du -s --apparent-size`, `du -s`, the
  filesystem from `stat -f`).

The stand-in runs with --counts-only (tests/standin/README.md): it keeps counts and the set
of accepted keys, not every request, so a million requests fit in its memory. Timed parts
hold `flock BENCH_LOCK` (default /var/lock/cvslurm-dev-cluster.lock, when it exists), the
lock the cluster benchmarks hold; filling the outbox happens outside it. The binary defaults
to the static release build.
"""
import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "standin"))
sys.path.insert(0, HERE)
import standin_client  # noqa: E402
from outbox_status import fill  # noqa: E402

BIN = os.path.abspath(os.environ.get(
    "BENCH_BIN", os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/cvslurm")))
WORK = os.path.abspath(os.environ.get("BENCH_WORK", os.path.join(ROOT, "tests/.work/bench")))
WORK = os.path.join(WORK, "drain")
LOCK = os.environ.get("BENCH_LOCK", "/var/lock/cvslurm-dev-cluster.lock")
FAKE = os.path.join(HERE, "fake-slurm")
TOKEN = "bench-token"
CLK = os.sysconf("SC_CLK_TCK")

rows = []


def row(figure, value):
    rows.append((figure, value))
    print("  %s: %s" % (figure, value), file=sys.stderr, flush=True)


class held:
    """flock on BENCH_LOCK for the timed part (no-op when the file does not exist)."""

    def __enter__(self):
        self.f = None
        if LOCK and os.path.exists(LOCK):
            self.f = open(LOCK)
            t = time.monotonic()
            fcntl.flock(self.f, fcntl.LOCK_EX)
            waited = time.monotonic() - t
            if waited > 1:
                print("  (waited %.0f s for %s)" % (waited, LOCK), file=sys.stderr)
        return self

    def __exit__(self, *exc):
        if self.f:
            self.f.close()


def proc_cpu(pid):
    """utime+stime of pid (and its waited-for children) in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / CLK


def proc_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def rusage_helper():
    exe = os.path.join(WORK, "rusage")
    if not os.path.exists(exe):
        subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "rusage.c")], check=True)
    return exe


def setup(tag, delay_ms, slurm_bin=FAKE, extra=()):
    """A fresh StateDir, config and stand-in: (state, conf, log, cv)."""
    base = os.path.join(WORK, tag)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    state = os.path.join(base, "state")
    token = os.path.join(base, "token")
    with open(token, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token, 0o600)
    cv = standin_client.start(os.path.join(base, "cv"), token=TOKEN, delay_ms=delay_ms,
                              extra_args=["--counts-only"])
    log = os.path.join(base, "cvslurm.log")
    conf = os.path.join(base, "cloudvision.conf")
    with open(conf, "w") as f:
        f.write("\n".join([
            "ApiServer=127.0.0.1:%d" % cv.port, "ApiTokenFile=%s" % token, "CaFile=%s" % cv.ca,
            "StateDir=%s" % state, "LogFile=%s" % log, "SlurmBinDir=%s" % slurm_bin,
            "ReconcileInterval=0", "NodeReassertInterval=0", "InterfacePhysicalOnly=no",
        ] + list(extra)) + "\n")
    return state, conf, log, cv


def start_service(conf):
    env = dict(os.environ, BENCH_NODES="4", PATH=FAKE + ":/usr/bin:/bin")
    env.pop("JOURNAL_STREAM", None)
    return subprocess.Popen([BIN, "inventory", "--monitor", "--config", conf], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def accepted(cv):
    """JobConfig Sets the stand-in accepted (200), and distinct keys among them."""
    c = cv.counts()
    return c["counts"].get("POST JobConfig 200", 0), c["keys"]["JobConfig"]


def status(conf, offline):
    """`cvslurm status [--offline] --json`: (wall s, depth, counted_by, peak RSS KiB)."""
    argv = [rusage_helper(), BIN, "status", "--json", "--config", conf] + \
        (["--offline"] if offline else [])
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode()
    body, last = out.rsplit("}", 1)
    wall, _cpu, rss, _rc = last.split()
    try:
        j = json.loads(body + "}")
    except ValueError:
        j = {}
    return float(wall), j.get("outbox_depth"), j.get("outbox_counted_by"), int(rss)


def drain(tag, n, delay_ms, status_every=0.0, stop_after=0.0):
    """Fills n events, then times the service sending them all (under the lock)."""
    state, conf, log, cv = setup(tag, delay_ms)
    try:
        t = time.monotonic()
        fill(state, n)
        print("  filled %d events in %.0f s" % (n, time.monotonic() - t), file=sys.stderr)
        out = os.path.join(state, "outbox")
        if status_every:
            fs = subprocess.run(["stat", "-f", "-c", "%T", out], capture_output=True,
                                text=True).stdout.strip()
            app = subprocess.run(["du", "-s", "--apparent-size", "-B1", out], capture_output=True,
                                 text=True).stdout.split()[0]
            blk = subprocess.run(["du", "-s", "-B1", out], capture_output=True,
                                 text=True).stdout.split()[0]
            row("%s: outbox of %d events on disk (%s): apparent / allocated" % (tag, n, fs),
                "%.1f MB / %.1f MB (%.0f / %.0f bytes per event), %d inodes" % (
                    int(app) / 1e6, int(blk) / 1e6, int(app) / n, int(blk) / n, n + 1))
        with held():
            if status_every:
                w, d, by, rss = status(conf, True)
                row("%s: `status --offline` without the service" % tag,
                    "%.2f s wall, %.1f MiB peak RSS (depth %s, counted by %s)"
                    % (w, rss / 1024, d, by))
            t0 = time.monotonic()
            p = start_service(conf)
            cv_pid = cv.proc.pid
            cv0 = proc_cpu(cv_pid)
            samples = []  # (t, accepted, service cpu)
            statuses = []
            next_status = t0 + 15 if status_every else None
            done_at = None
            try:
                while True:
                    time.sleep(1)
                    now = time.monotonic()
                    if p.poll() is not None:
                        raise SystemExit("the service exited (%s); see %s" % (p.returncode, log))
                    got, keys = accepted(cv)
                    samples.append((now - t0, got, proc_cpu(p.pid)))
                    if keys >= n:
                        done_at = now
                        break
                    if now - t0 > max(600, n / 400) or (stop_after and now - t0 > stop_after):
                        break
                    if next_status and now >= next_status:
                        for offline in (True, False):
                            statuses.append((now - t0, offline) + status(conf, offline))
                        next_status = now + status_every
                # Every key accepted: the outbox must be empty once the last files are removed.
                left = None
                for _ in range(30):
                    left = len([x for x in os.listdir(out) if x.endswith(".json")])
                    if not left:
                        break
                    time.sleep(0.2)
                empty_at = time.monotonic()
                cpu = proc_cpu(p.pid)
                hwm = proc_kib(p.pid, "VmHWM")
                cv_cpu = proc_cpu(cv_pid) - cv0
                cv_hwm = proc_kib(cv_pid, "VmHWM")
            finally:
                stop(p)
        got, keys = accepted(cv)
    finally:
        cv.stop()
    wall = (done_at or time.monotonic()) - t0
    first = next((s for s in samples if s[1] > 0), (0, 0, 0))
    best = 0.0
    for i, s in enumerate(samples):
        j = next((k for k in range(i, len(samples)) if samples[k][0] - s[0] >= 10), None)
        if j is not None:
            best = max(best, (samples[j][1] - s[1]) / (samples[j][0] - s[0]))
    ok = "all %d accepted" % n if keys >= n else "ONLY %d of %d accepted" % (keys, n)
    if stop_after and keys < n:
        ok = "stopped by --stop-after: %d of %d accepted" % (keys, n)
    row("%s: %d events at %g ms, MaxConcurrentRequests default: until every event accepted"
        % (tag, n, delay_ms),
        "%.1f s (%s, %d requests; outbox %s)" % (
            wall, ok, got, "empty" if left == 0 else "NOT empty: %s left" % left))
    row("%s: events/s from the service's start (first accepted at %.1f s); best 10 s"
        % (tag, first[0]), "%.0f/s; %.0f/s" % (keys / wall, best))
    row("%s: service CPU / peak RSS (VmHWM)" % tag,
        "%.1f s (%.0f %% of one core) / %.1f MiB" % (cpu, 100 * cpu / wall, hwm / 1024))
    row("%s: stand-in CPU / peak RSS (Python, one GIL)" % tag,
        "%.1f s (%.0f %% of one core) / %.0f MiB" % (cv_cpu, 100 * cv_cpu / wall, cv_hwm / 1024))
    for (at, offline, w, d, by, rss) in statuses:
        row("%s: `status%s` at %.0f s, service running" % (
            tag, " --offline" if offline else "", at),
            "%.2f s wall, %.1f MiB (depth %s, counted by %s)" % (w, rss / 1024, d, by))
    del empty_at
    shutil.rmtree(os.path.join(WORK, tag), ignore_errors=True)


def live(seconds, rate, delay_ms, parallel):
    """Hooks fired at `rate`/s for `seconds` with the service sending."""
    empty = os.path.join(WORK, "empty-bin")
    os.makedirs(empty, exist_ok=True)
    state, conf, log, cv = setup("live", delay_ms, slurm_bin=empty)
    hookdir = os.path.join(WORK, "live", "bin")
    os.makedirs(hookdir)
    hook = os.path.join(hookdir, "cvslurm-hook")
    os.symlink(BIN, hook)
    try:
        with held():
            p = start_service(conf)
            try:
                until = time.monotonic() + 20
                while not os.path.exists(os.path.join(state, "wake.sock")):
                    if time.monotonic() > until:
                        raise SystemExit("service did not start; see %s" % log)
                    time.sleep(0.05)
                time.sleep(1)
                total = int(seconds * rate)
                # prolog of job i, then its epilog 400 hooks (0.4 s) later: a busy cluster's mix
                work = []
                for i in range(total // 2 + 200):
                    work.append(("prolog_slurmctld", i))
                    if i >= 200:
                        work.append(("epilog_slurmctld", i - 200))
                work = work[:total]
                jobs = len({i for _, i in work})
                lock = threading.Lock()
                nxt = [0]
                failed = [0]
                t0 = time.monotonic()
                cpu0 = proc_cpu(p.pid)

                def fire():
                    while True:
                        with lock:
                            k = nxt[0]
                            if k >= len(work):
                                return
                            nxt[0] += 1
                        due = t0 + k / rate
                        d = due - time.monotonic()
                        if d > 0:
                            time.sleep(d)
                        ctx, i = work[k]
                        env = {"CVSLURM_CONF": conf, "SLURM_SCRIPT_CONTEXT": ctx,
                               "SLURM_JOB_ID": str(300000 + i), "SLURM_CLUSTER_NAME": "bench",
                               "SLURM_JOB_NAME": "bench", "SLURM_JOB_PARTITION": "debug",
                               "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_EXIT_CODE2": "0:0"}
                        if subprocess.run([hook], env=env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL).returncode:
                            with lock:
                                failed[0] += 1
                threads = [threading.Thread(target=fire) for _ in range(parallel)]
                for t in threads:
                    t.start()
                samples = []
                while any(t.is_alive() for t in threads):
                    time.sleep(1)
                    samples.append((time.monotonic() - t0, accepted(cv)[0]))
                for t in threads:
                    t.join()
                fired = time.monotonic() - t0
                until = time.monotonic() + 300

                def pending():
                    return sum(1 for d in ("outbox", "inflight")
                               for x in os.listdir(os.path.join(state, d)) if x.endswith(".json"))
                while (accepted(cv)[1] < jobs or pending()) and time.monotonic() < until:
                    time.sleep(0.5)
                    samples.append((time.monotonic() - t0, accepted(cv)[0]))
                wall = time.monotonic() - t0
                cpu = proc_cpu(p.pid) - cpu0
                hwm = proc_kib(p.pid, "VmHWM")
            finally:
                stop(p)
        got, keys = accepted(cv)
    finally:
        cv.stop()
    text = open(log, errors="replace").read()
    superseded = len(re.findall(r"superseded by a later event already queued", text))
    delays = [int(m) for m in re.findall(r"\(HTTP 200, (\d+) ms after it was queued", text)]
    in_fire = [s for s in samples if s[0] <= fired]
    sent_during = in_fire[-1][1] if in_fire else 0
    row("live: hooks fired (target %d/s for %d s, %d threads)" % (rate, seconds, parallel),
        "%d in %.1f s = %.0f/s (%d failed)" % (len(work), fired, len(work) / fired, failed[0]))
    row("live: delivered while firing / until all accepted",
        "%.0f/s; %d events of %d hooks (%d superseded by their job's end, which a hook fired "
        "first), %d of %d jobs, in %.1f s" % (
            sent_during / fired, got, len(work), superseded, keys, jobs, wall))
    row("live: delay hook -> CloudVision 200 (service's log), p50 / p99 / max",
        "%d / %d / %d ms (%d deliveries logged)" % (
            pct(delays, 50), pct(delays, 99), max(delays or [0]), len(delays)))
    row("live: service CPU while firing and draining / peak RSS",
        "%.1f s (%.0f %% of one core) / %.1f MiB" % (cpu, 100 * cpu / wall, hwm / 1024))
    shutil.rmtree(os.path.join(WORK, "live"), ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="sustained,live", help="sustained,live,backlog")
    ap.add_argument("--events", type=int, default=100000, help="sustained: events (100,000)")
    ap.add_argument("--backlog", type=int, default=1000000, help="backlog: events (1,000,000)")
    ap.add_argument("--delay-ms", type=float, default=20, help="the stand-in's answer time")
    ap.add_argument("--live-seconds", type=int, default=30)
    ap.add_argument("--live-rate", type=int, default=1000, help="hooks a second")
    ap.add_argument("--live-threads", type=int, default=32)
    ap.add_argument("--status-every", type=float, default=120,
                    help="backlog: run status every N s while the service drains")
    ap.add_argument("--stop-after", type=float, default=0,
                    help="backlog: stop after N s (status and memory at full depth only)")
    a = ap.parse_args()
    # SIGTERM (or SIGINT, which a background job ignores) stops the service and the stand-in.

    def interrupted(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    if not os.access(BIN, os.X_OK):
        raise SystemExit("no binary at %s (cargo build --release --target "
                         "x86_64-unknown-linux-musl)" % BIN)
    os.makedirs(WORK, exist_ok=True)
    rusage_helper()
    only = a.only.split(",")
    print("binary: %s; work: %s" % (BIN, WORK), file=sys.stderr)
    if "sustained" in only:
        drain("sustained", a.events, a.delay_ms)
    if "live" in only:
        live(a.live_seconds, a.live_rate, a.delay_ms, a.live_threads)
    if "backlog" in only:
        drain("backlog", a.backlog, a.delay_ms, status_every=a.status_every,
              stop_after=a.stop_after)
    print()
    print("cvslurm sender (%s, %d cores, load %.1f at the end; loopback TLS to the Python "
          "stand-in)" % (os.uname().nodename, os.cpu_count(), os.getloadavg()[0]))
    print()
    print("| figure | measured |")
    print("|---|---|")
    for r in rows:
        print("| %s | %s |" % r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
