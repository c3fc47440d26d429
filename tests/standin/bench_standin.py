#!/usr/bin/env python3
"""Throughput check of the stand-in itself (not of cvslurm).

    python3 tests/standin/bench_standin.py [--requests 2000] [--clients 16] [--delay-ms 20] [--dir DIR]

Starts cv_standin.py, sends N JobConfig POSTs from C concurrent keep-alive
http.client connections, prints wall time, req/s, latency percentiles and the
number of TCP connections the server saw (== C when keep-alive works).
"""

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standin_client  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--delay-ms", type=float, default=20)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    d = a.dir or tempfile.mkdtemp(prefix="cvbench-")
    cv = standin_client.start(d, delay_ms=a.delay_ms)
    try:
        ctx = cv._ctx
        per = [a.requests // a.clients + (1 if i < a.requests % a.clients else 0)
               for i in range(a.clients)]
        lat = []
        errors = []
        conns_made = [0]
        lk = threading.Lock()
        barrier = threading.Barrier(a.clients + 1)

        def worker(i, n):
            conn = http.client.HTTPSConnection(cv.host, cv.port, context=ctx, timeout=30)
            conn.connect()
            with lk:
                conns_made[0] += 1
            mine = []
            barrier.wait()
            for j in range(n):
                body = json.dumps({"key": {"id": "job-%d-%d" % (i, j)}, "state": "JOB_STATE_RUNNING",
                                   "start_time": "2024-05-01T10:00:00Z",
                                   "nodes": {"values": ["node%03d" % k for k in range(4)]}})
                t0 = time.perf_counter()
                conn.request("POST", "/api/resources/computejob/v1/JobConfig", body=body,
                             headers={"Authorization": "Bearer " + cv.token,
                                      "Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                mine.append(time.perf_counter() - t0)
                if r.status != 200:
                    errors.append(r.status)
            conn.close()
            with lk:
                lat.extend(mine)

        ts = [threading.Thread(target=worker, args=(i, n)) for i, n in enumerate(per)]
        for t in ts:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        lat.sort()
        logged = len(cv.requests())
        ideal = a.requests * a.delay_ms / 1000.0 / a.clients
        pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
        print("requests=%d clients=%d delay_ms=%g" % (a.requests, a.clients, a.delay_ms))
        print("wall=%.2fs (ideal %.2fs)  rate=%.0f req/s  errors=%d  logged=%d  connections=%d"
              % (wall, ideal, a.requests / wall, len(errors), logged, conns_made[0]))
        print("latency ms: p50=%.1f p90=%.1f p99=%.1f max=%.1f"
              % (pct(0.5), pct(0.9), pct(0.99), lat[-1] * 1000))
    finally:
        cv.stop()


if __name__ == "__main__":
    main()
