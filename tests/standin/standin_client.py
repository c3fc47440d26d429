"""Start and drive the CloudVision stand-in (cv_standin.py) from Python tests.

    import sys; sys.path.insert(0, "tests/standin")
    import standin_client

    cv = standin_client.start("/tmp/cvtest", token="tok", delay_ms=5)
    try:
        ...  # point cvslurm at cv.url with CA file cv.ca and token cv.token
        cv.wait_for(lambda reqs: any(r["status"] == 200 for r in reqs))
        assert "42" in cv.state()["jobs"]
        cv.set_mode("status", status=500, count=3)
    finally:
        cv.stop()

Standard library only.
"""

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "cv_standin.py")


class StandinError(RuntimeError):
    pass


class Standin:
    """A running stand-in.  Attributes: proc, dir, port, host, ca, url, token."""

    def __init__(self, proc, d, port, host, token, stderr_path):
        self.proc = proc
        self.dir = d
        self.port = port
        self.host = host
        self.token = token
        self.ca = os.path.join(d, "ca.pem")
        h = "[%s]" % host if ":" in host else host
        self.url = "https://%s:%d" % (h, port)
        self.stderr_path = stderr_path
        self._ctx = ssl.create_default_context(cafile=self.ca)

    # -- control API ------------------------------------------------------
    def _call(self, method, path, body=None, timeout=10):
        conn = http.client.HTTPSConnection(self.host, self.port, context=self._ctx, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            if resp.status != 200:
                raise StandinError("%s %s -> %d %s" % (method, path, resp.status, raw[:500]))
            return json.loads(raw) if raw.strip() else None
        finally:
            conn.close()

    def requests(self, since=0):
        """The request log (list of dicts), optionally only entries with seq > since."""
        return self._call("GET", "/_standin/requests" + ("?since=%d" % since if since else ""))

    def api_requests(self, kind=None, method=None):
        """Log entries filtered by resource kind ("JobConfig"/"NodeConfig") and method."""
        out = []
        for r in self.requests():
            if kind and not r["path"].rstrip("/").endswith("/" + kind):
                continue
            if method and r["method"] != method:
                continue
            out.append(r)
        return out

    def counts(self):
        """What a --counts-only stand-in keeps (any stand-in answers): {"requests": N,
        "counts": {"POST JobConfig 200": N, …}, "keys": {"JobConfig": distinct accepted keys,
        "NodeConfig": …}, "first_time", "last_time", "counts_only"}."""
        return self._call("GET", "/_standin/counts")

    def state(self):
        """{"jobs": {id: JobConfig}, "nodes": {id: NodeConfig}}"""
        return self._call("GET", "/_standin/state")

    def mode(self):
        return self._call("GET", "/_standin/mode")

    def set_mode(self, mode="ok", **kw):
        """set_mode("ok"), set_mode("status", status=500, count=3),
        set_mode("status", status=429, retry_after=1, count=5), set_mode("hang"),
        set_mode("close", count=1), set_mode("delay", delay_ms=20)."""
        body = {"mode": mode}
        body.update(kw)
        return self._call("POST", "/_standin/mode", body)

    def set_token(self, token):
        self._call("POST", "/_standin/token", {"token": token})
        self.token = token

    def behaviour(self):
        """The behaviours in force (see README.md, "Behaviours")."""
        return self._call("GET", "/_standin/behaviour")

    def set_behaviour(self, **kw):
        """set_behaviour(set="replace", get_without_key=200, profile="arista", ...); returns
        all in force."""
        return self._call("POST", "/_standin/behaviour", kw)

    def stored_job(self, kid):
        """The stored JobConfig (snake_case, after merging), or None."""
        return self.state()["jobs"].get(kid)

    def stored_node(self, kid):
        """The stored NodeConfig (snake_case), or None."""
        return self.state()["nodes"].get(kid)

    def reset(self, everything=False):
        """Clear log and state; everything=True also resets mode, delay, token and
        behaviours."""
        self._call("POST", "/_standin/reset", {"everything": True} if everything else {})

    def wait_for(self, predicate, timeout=10.0, interval=0.05):
        """Poll the log until predicate(requests) is true; returns the log."""
        deadline = time.monotonic() + timeout
        while True:
            reqs = self.requests()
            if predicate(reqs):
                return reqs
            if time.monotonic() > deadline:
                raise StandinError("timed out after %.1fs waiting on the stand-in; %d requests logged: %s"
                                   % (timeout, len(reqs), json.dumps(reqs[-5:])[:2000]))
            time.sleep(interval)

    def wait_for_requests(self, n, timeout=10.0):
        return self.wait_for(lambda r: len(r) >= n, timeout)

    def stderr(self):
        try:
            with open(self.stderr_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # -- lifecycle ----------------------------------------------------------
    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=5.0):
        """SIGTERM, wait, SIGKILL if needed.  Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start(d, port=0, host="127.0.0.1", token="test-token", token_file=None,
          delay_ms=None, mode=None, record=None, verbose=False, extra_args=(),
          timeout=15.0, python=None, profile=None):
    """Start cv_standin.py as a subprocess on DIR d and wait for DIR/port.

    profile: "cloudvision" (default), "arista", "web" or "web200" (--profile; README.md,
    "Profiles"); at run time set_behaviour(profile=...).

    Returns a Standin.  Raises StandinError (with the server's stderr) if it
    exits or does not write DIR/port within `timeout` seconds."""
    d = os.path.abspath(d)
    os.makedirs(d, exist_ok=True)
    port_file = os.path.join(d, "port")
    try:
        os.unlink(port_file)  # stale file from a killed run
    except FileNotFoundError:
        pass
    cmd = [python or sys.executable, SERVER, "--dir", d, "--port", str(port), "--host", host]
    if token_file:
        cmd += ["--token-file", token_file]
    elif token is not None:
        cmd += ["--token", token]
    if delay_ms is not None:
        cmd += ["--delay-ms", str(delay_ms)]
    if mode is not None:
        cmd += ["--mode", mode]
    if record is not None:
        cmd += ["--record", record]
    if profile is not None:
        cmd += ["--profile", profile]
    if verbose:
        cmd.append("-v")
    cmd += list(extra_args)
    stderr_path = os.path.join(d, "standin.stderr")
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, start_new_session=True)
    if token_file:
        with open(token_file) as f:
            token = f.read().strip()

    def fail(why):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            with open(stderr_path, errors="replace") as f:
                e = f.read()
        except OSError:
            e = ""
        raise StandinError("cv_standin failed to start (%s): %s\ncommand: %s\nstderr:\n%s"
                           % (why, "exit code %s" % proc.returncode, " ".join(cmd), e))

    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail("process exited")
        try:
            with open(port_file) as f:
                txt = f.read().strip()
            if txt:
                got = int(txt)
                break
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)
    if got is None:
        fail("no %s after %.0fs" % (port_file, timeout))
    return Standin(proc, d, got, host, token, stderr_path)


def unused_port(host="127.0.0.1"):
    """A port with nothing listening: use it for the 'connection refused' case."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    # quick self-check: python3 tests/standin/standin_client.py [DIR]
    import tempfile
    d = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="cvstandin-")
    with start(d) as cv:
        print("up at", cv.url, "ca", cv.ca)
        print("mode", cv.mode())
        print("behaviour", cv.behaviour())
        print("state", cv.state())
        print("requests", cv.requests())
    print("stopped, exit code", cv.proc.returncode)
