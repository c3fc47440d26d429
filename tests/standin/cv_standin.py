#!/usr/bin/env python3
"""CloudVision stand-in for cvslurm tests (standard library only).

A local HTTPS server that answers like CloudVision's resource API for the
computejob service (JobConfig / NodeConfig), records every request, and lets
tests inject faults (error status, 429 with Retry-After, hang, close, delay)
through a small control API under /_standin/.

It is as strict as the contract (README.md, "CloudVision compatibility") by
default: a Set merges the fields present into the stored record, GetOne needs key.id (400 without, 404 for an unknown key), unknown
fields are refused.  Each of these can be switched to another behaviour with
/_standin/behaviour or --behaviour (see BEHAVIOURS).  The behaviour "profile" (or
--profile) makes it play another server: "arista" (the rules of Arista's own fake
CloudVision), "web" / "web200" (a plain web server); see PROFILES.

This is the only fake the project allows.  See tests/standin/README.md.

Run:  python3 tests/standin/cv_standin.py --dir DIR [--port 0] [--host 127.0.0.1]
          [--token TOKEN | --token-file F] [--delay-ms N] [--mode ok] [--record FILE]
          [--behaviour JSON] [--profile cloudvision|arista|web|web200] [-v]
"""

import argparse
import datetime
import fcntl
import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

API_PREFIX = "/api/resources/computejob/v1/"
JOB_PATH = API_PREFIX + "JobConfig"
NODE_PATH = API_PREFIX + "NodeConfig"
CONTROL_PREFIX = "/_standin/"

JOB_STATES = {
    "JOB_STATE_RUNNING",
    "JOB_STATE_COMPLETED",
    "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLED",
}
JOB_TYPES = {"JOB_TYPE_TENANT", "JOB_TYPE_CONFIGURED"}
JOB_FIELDS = {"key", "state", "start_time", "end_time", "name", "location",
              "type", "nodes", "interfaces"}
NODE_FIELDS = {"key", "location", "hostname", "data_interfaces"}
IFACE_FIELDS = {"name", "mac_address", "ip_addresses"}

TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")

MAX_BODY = 4 * 1024 * 1024

# How the stand-in answers where CloudVision's behaviour is not settled: name -> (default,
# allowed values).  The defaults are the contract; the others are what a test (or the
# contract check's tests) switches to.
BEHAVIOURS = {
    # "merge": a Set updates only the fields present; "replace": the whole record (old stand-in)
    "set": ("merge", ("merge", "replace")),
    # an empty {"values":[]} wrapper in a merging Set: "clears" the stored list, or "keeps" it
    "empty_list": ("clears", ("clears", "keeps")),
    # GET of a resource without key.id: 400 (GetOne needs a full key) or 200 (GetAll stream)
    "get_without_key": (400, (400, 200)),
    # GetOne of an unknown key: 404 {"code":5,...} or 200 {}
    "get_unknown_key": (404, (404, 200)),
    # a field the schema does not know: "reject" (400) or "ignore" (dropped, not stored)
    "unknown_fields": ("reject", ("reject", "ignore")),
    # NodeConfig hostname: "any", or "must_match_key" (Arista's stub: hostname == key.id)
    "hostname": ("any", ("any", "must_match_key")),
    # a merging JobConfig Set of state RUNNING without end_time: the stored end_time is "kept"
    # (the contract) or "cleared" (a server that resets it with the state)
    "end_time_on_running": ("kept", ("kept", "cleared")),
    # DELETE ...JobConfig?key.id=: "allowed" (404 if absent) or "unsupported" (405)
    "delete_job": ("allowed", ("allowed", "unsupported")),
    # which server the stand-in plays (see PROFILES): "cloudvision" (everything above),
    # "arista" (the rules of Arista's own fake CloudVision; the switches above don't apply),
    # "web" / "web200" (a plain web server: HTML 404 / 200 for every API request)
    "profile": ("cloudvision", ("cloudvision", "arista", "web", "web200")),
}

# profile -> what it is (README.md, "Profiles")
PROFILES = {
    "cloudvision": "CloudVision's resource API, as strict as the contract (the default)",
    "arista": "the rules of Arista's fake CloudVision (cloudvision-job-kubernetes, "
              "tests/integration/cv_stub.py), written from the project's issue",
    "web": "a plain web server: 404 text/html for every API request",
    "web200": "a plain web server: 200 text/html for every API request",
}
WEB_PAGES = {
    "web": (404, b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1>"
                 b"</body></html>"),
    "web200": (200, b"<html><body><h1>It works!</h1></body></html>"),
}


def default_behaviour():
    return {k: v[0] for k, v in BEHAVIOURS.items()}

# HTTP status -> gRPC code, as grpc-gateway maps them.
GRPC_CODE = {
    400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 409: 10, 412: 9, 413: 8,
    429: 8, 499: 1, 500: 13, 501: 12, 502: 14, 503: 14, 504: 4,
}
GRPC_MESSAGE = {
    400: "invalid argument", 401: "unauthenticated: invalid token",
    403: "permission denied", 404: "not found", 409: "aborted",
    429: "resource exhausted: too many requests", 500: "internal error",
    502: "unavailable: bad gateway", 503: "unavailable: service unavailable",
    504: "deadline exceeded",
}
REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
    413: "Payload Too Large", 429: "Too Many Requests",
    500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Gateway Timeout",
}

VERBOSE = False


def vlog(msg):
    if VERBOSE:
        sys.stderr.write("[cv_standin %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
        sys.stderr.flush()


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------
# certificates
# --------------------------------------------------------------------------

OPENSSL_CNF = """\
[ req ]
distinguished_name = dn
prompt = no
[ dn ]
CN = unused
[ v3_ca ]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[ v3_server ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1, IP:10.99.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


def _run_openssl(args, cwd):
    res = subprocess.run(["openssl"] + args, cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise RuntimeError("openssl %s failed: %s" % (" ".join(args), res.stderr.strip()))


def _cert_ok(path, min_seconds=3600):
    res = subprocess.run(["openssl", "x509", "-noout", "-checkend", str(min_seconds),
                          "-in", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return res.returncode == 0


def ensure_certs(d):
    """Create DIR/ca.pem, DIR/ca.key, DIR/server.pem, DIR/server.key if missing
    (or expiring within an hour).  Safe against concurrent stand-ins on one DIR."""
    os.makedirs(d, exist_ok=True)
    names = ["ca.pem", "server.pem", "server.key"]
    with open(os.path.join(d, ".certs.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(os.path.exists(os.path.join(d, n)) for n in names) and \
                _cert_ok(os.path.join(d, "server.pem")) and _cert_ok(os.path.join(d, "ca.pem")):
            return False
        tmp = tempfile.mkdtemp(prefix=".certs-", dir=d)
        try:
            with open(os.path.join(tmp, "openssl.cnf"), "w") as f:
                f.write(OPENSSL_CNF)
            ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
            _run_openssl(["genpkey"] + ec + ["-out", "ca.key"], tmp)
            _run_openssl(["req", "-config", "openssl.cnf", "-x509", "-new", "-key", "ca.key",
                          "-sha256", "-days", "10", "-subj", "/CN=cvslurm test CA",
                          "-extensions", "v3_ca",
                          "-set_serial", "0x%s" % ("7" + secrets.token_hex(15)),
                          "-out", "ca.pem"], tmp)
            _run_openssl(["genpkey"] + ec + ["-out", "server.key"], tmp)
            _run_openssl(["req", "-config", "openssl.cnf", "-new", "-key", "server.key",
                          "-subj", "/CN=localhost", "-out", "server.csr"], tmp)
            _run_openssl(["x509", "-req", "-in", "server.csr", "-CA", "ca.pem",
                          "-CAkey", "ca.key", "-sha256", "-days", "10",
                          "-set_serial", "0x%s" % ("5" + secrets.token_hex(15)),
                          "-extfile", "openssl.cnf", "-extensions", "v3_server",
                          "-out", "server.pem"], tmp)
            for n in ["ca.key", "server.key", "server.pem", "ca.pem"]:
                os.replace(os.path.join(tmp, n), os.path.join(d, n))
        finally:
            for n in os.listdir(tmp):
                os.unlink(os.path.join(tmp, n))
            os.rmdir(tmp)
        return True


# --------------------------------------------------------------------------
# validation (CloudVision-like: 400 {"code":3,"message":...})
# --------------------------------------------------------------------------

class Invalid(Exception):
    pass


def _present(obj, k):
    return k in obj and obj[k] is not None


# Under the stand-in's lock: True while validating with "unknown_fields":"ignore".
_IGNORE_UNKNOWN = [False]


def _check_only(obj, allowed, where):
    if not isinstance(obj, dict):
        raise Invalid("%s: expected a JSON object" % where)
    for k in list(obj):
        if k not in allowed:
            if _IGNORE_UNKNOWN[0]:
                del obj[k]
                continue
            raise Invalid('%s: unknown field "%s"' % (where, k))


def _check_str(obj, k, where, nonempty=False):
    if _present(obj, k):
        v = obj[k]
        if not isinstance(v, str):
            raise Invalid("%s.%s: expected a string" % (where, k))
        if nonempty and v == "":
            raise Invalid("%s.%s: must not be empty" % (where, k))


def _check_key(body, where):
    if not _present(body, "key"):
        raise Invalid("%s: key.id is required" % where)
    key = body["key"]
    _check_only(key, {"id"}, where + ".key")
    if not _present(key, "id") or not isinstance(key["id"], str) or key["id"] == "":
        raise Invalid("%s: key.id must be a non-empty string" % where)
    return key["id"]


def _check_time(body, k, where):
    if not _present(body, k):
        return
    v = body[k]
    if not isinstance(v, str) or not TIME_RE.match(v):
        raise Invalid("%s.%s: bad timestamp %r, want UTC YYYY-MM-DDTHH:MM:SSZ" % (where, k, v))
    try:
        datetime.datetime.strptime(v, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise Invalid("%s.%s: bad timestamp %r" % (where, k, v))


def _check_str_list(body, k, where):
    if not _present(body, k):
        return
    v = body[k]
    _check_only(v, {"values"}, "%s.%s" % (where, k))
    vals = v.get("values")
    if vals is None:
        return
    if not isinstance(vals, list):
        raise Invalid("%s.%s.values: expected a list" % (where, k))
    for i, s in enumerate(vals):
        if not isinstance(s, str) or s == "":
            raise Invalid("%s.%s.values[%d]: expected a non-empty string" % (where, k, i))


def validate_job(body):
    w = "JobConfig"
    _check_only(body, JOB_FIELDS, w)
    kid = _check_key(body, w)
    if not _present(body, "state"):
        raise Invalid("JobConfig.state is required")
    if body["state"] not in JOB_STATES:
        raise Invalid("JobConfig.state: invalid value %r" % (body["state"],))
    _check_time(body, "start_time", w)
    _check_time(body, "end_time", w)
    _check_str(body, "name", w)
    _check_str(body, "location", w)
    if _present(body, "type") and body["type"] not in JOB_TYPES:
        raise Invalid("JobConfig.type: invalid value %r" % (body["type"],))
    _check_str_list(body, "nodes", w)
    _check_str_list(body, "interfaces", w)
    # Arista's clients send one of them; an empty wrapper beside the other (to clear a list
    # stored earlier) is a partial update's way to switch.
    if _wrapper_values(body, "nodes") and _wrapper_values(body, "interfaces"):
        raise Invalid("JobConfig: only one of nodes or interfaces may be set")
    return kid


def _wrapper_values(body, k):
    """The values of a present {"values":[...]} wrapper, [] for an empty one, None if absent."""
    if not _present(body, k):
        return None
    return body[k].get("values") or []


def validate_node(body, hostname_must_match=False):
    w = "NodeConfig"
    _check_only(body, NODE_FIELDS, w)
    kid = _check_key(body, w)
    _check_str(body, "location", w)
    _check_str(body, "hostname", w)
    if hostname_must_match and _present(body, "hostname") and body["hostname"] != kid:
        raise Invalid("NodeConfig.hostname %r must equal key.id %r" % (body["hostname"], kid))
    if _present(body, "data_interfaces"):
        di = body["data_interfaces"]
        _check_only(di, {"values"}, w + ".data_interfaces")
        vals = di.get("values")
        if vals is not None:
            if not isinstance(vals, list):
                raise Invalid(w + ".data_interfaces.values: expected a list")
            for i, it in enumerate(vals):
                iw = "%s.data_interfaces.values[%d]" % (w, i)
                _check_only(it, IFACE_FIELDS, iw)
                _check_str(it, "name", iw, nonempty=True)
                if not _present(it, "name"):
                    raise Invalid(iw + ".name is required")
                if _present(it, "mac_address"):
                    m = it["mac_address"]
                    if not isinstance(m, str) or not MAC_RE.match(m):
                        raise Invalid("%s.mac_address: bad MAC %r, want aa:bb:cc:dd:ee:ff" % (iw, m))
                if _present(it, "ip_addresses"):
                    ips = it["ip_addresses"]
                    _check_only(ips, {"values"}, iw + ".ip_addresses")
                    ivals = ips.get("values")
                    if ivals is not None:
                        if not isinstance(ivals, list):
                            raise Invalid(iw + ".ip_addresses.values: expected a list")
                        for j, ip in enumerate(ivals):
                            try:
                                if not isinstance(ip, str):
                                    raise ValueError
                                ipaddress.IPv4Address(ip)
                            except ValueError:
                                raise Invalid("%s.ip_addresses.values[%d]: bad IPv4 address %r"
                                              % (iw, j, ip))
    return kid


def merge_set(old, body, empty_list):
    """A Set as CloudVision's resource API documents it: the fields present (not null) in
    `body` replace the stored ones, absent fields keep theirs.  A present {"values":[]}
    wrapper clears the stored list (the field is removed) unless empty_list == "keeps"."""
    rec = dict(old or {})
    for k, v in body.items():
        if v is None:
            continue
        if isinstance(v, dict) and set(v) <= {"values"} and k != "key":
            if not v.get("values"):
                if empty_list == "keeps":
                    continue
                rec.pop(k, None)
                continue
        rec[k] = v
    return rec


# --------------------------------------------------------------------------
# profile "arista": the rules of Arista's fake CloudVision, written from the list in the
# project's issue (not copied).  Every POST is a whole record, checked in full; each failure
# is one message in {"errors":[...]}.
# --------------------------------------------------------------------------

ARISTA_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})$")
ARISTA_MAC_RE = re.compile(r"^([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}$")
ARISTA_JOB_FIELDS = ("key", "name", "state", "start_time", "location", "interfaces", "nodes",
                     "end_time", "type")
ARISTA_NODE_FIELDS = ("key", "location", "hostname", "data_interfaces")


def _nonempty_str(v):
    return isinstance(v, str) and v != ""


def _arista_key_id(body, errs):
    key = body.get("key")
    if not isinstance(key, dict) or not _nonempty_str(key.get("id")):
        errs.append("key.id must be a non-empty string")
        return None
    return key["id"]


def _arista_time(body, k, errs):
    v = body.get(k)
    if not _nonempty_str(v):
        errs.append("%s must be a non-empty string" % k)
    elif not ARISTA_TIME_RE.match(v):
        errs.append("%s %r is not an ISO-8601 timestamp" % (k, v))


def _arista_values(body, k, errs):
    """The list under body[k]["values"], or None (with an error) if it isn't a non-empty
    list."""
    w = body.get(k)
    vals = w.get("values") if isinstance(w, dict) else None
    if not isinstance(vals, list) or not vals:
        errs.append("%s.values must be a non-empty list" % k)
        return None
    return vals


def arista_job_errors(body):
    """The messages for everything wrong with a JobConfig POST body ([] if it is good)."""
    if not isinstance(body, dict):
        return ["JobConfig body must be a JSON object"]
    errs = []
    unknown = sorted(k for k in body if k not in ARISTA_JOB_FIELDS)
    if unknown:
        errs.append("unknown JobConfig fields: %s" % unknown)
    _arista_key_id(body, errs)
    for k in ("name", "location"):
        if not _nonempty_str(body.get(k)):
            errs.append("%s must be a non-empty string" % k)
    state = body.get("state")
    if state not in JOB_STATES:
        errs.append("state must be one of %s, got %r" % (", ".join(sorted(JOB_STATES)), state))
    _arista_time(body, "start_time", errs)
    has_if, has_nodes = "interfaces" in body, "nodes" in body
    if has_if and has_nodes:
        errs.append("exactly one of interfaces or nodes must be set, not both")
    elif not has_if and not has_nodes:
        errs.append("exactly one of interfaces or nodes must be set")
    if has_if:
        vals = _arista_values(body, "interfaces", errs)
        for i, m in enumerate(vals or ()):
            if not isinstance(m, str) or not ARISTA_MAC_RE.match(m):
                errs.append("interfaces.values[%d] %r is not a MAC address" % (i, m))
    if has_nodes:
        vals = _arista_values(body, "nodes", errs)
        for i, n in enumerate(vals or ()):
            if not _nonempty_str(n):
                errs.append("nodes.values[%d] must be a non-empty string" % i)
    if state == "JOB_STATE_RUNNING":
        if "end_time" in body:
            errs.append("end_time must not be set for JOB_STATE_RUNNING")
    elif state in JOB_STATES:
        _arista_time(body, "end_time", errs)
    if "type" in body and body["type"] != "JOB_TYPE_TENANT":
        errs.append("type must be JOB_TYPE_TENANT, got %r" % (body["type"],))
    return errs


def arista_node_errors(body):
    """The messages for everything wrong with a NodeConfig POST body ([] if it is good)."""
    if not isinstance(body, dict):
        return ["NodeConfig body must be a JSON object"]
    errs = []
    unknown = sorted(k for k in body if k not in ARISTA_NODE_FIELDS)
    if unknown:
        errs.append("unknown NodeConfig fields: %s" % unknown)
    kid = _arista_key_id(body, errs)
    if not _nonempty_str(body.get("location")):
        errs.append("location must be a non-empty string")
    host = body.get("hostname")
    if not _nonempty_str(host):
        errs.append("hostname must be a non-empty string")
    elif kid is not None and host != kid:
        errs.append("hostname %r must equal key.id %r" % (host, kid))
    di = body.get("data_interfaces")
    if not isinstance(di, dict):
        errs.append("data_interfaces must be an object")
        return errs
    vals = _arista_values(body, "data_interfaces", errs)
    for i, it in enumerate(vals or ()):
        w = "data_interfaces.values[%d]" % i
        if not isinstance(it, dict):
            errs.append("%s must be an object" % w)
            continue
        if not _nonempty_str(it.get("name")):
            errs.append("%s.name must be a non-empty string" % w)
        mac = it.get("mac_address")
        if not isinstance(mac, str) or not ARISTA_MAC_RE.match(mac):
            errs.append("%s.mac_address %r is not a MAC address" % (w, mac))
        ips = it.get("ip_addresses")
        ivals = ips.get("values") if isinstance(ips, dict) else None
        if not isinstance(ivals, list):
            errs.append("%s.ip_addresses.values must be a list" % w)
            continue
        for j, ip in enumerate(ivals):
            if not _nonempty_str(ip):
                errs.append("%s.ip_addresses.values[%d] must be a non-empty string" % (w, j))
    return errs


def camel(obj):
    """snake_case field names to CloudVision's lowerCamelCase answers (recursively)."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            parts = k.split("_")
            out[parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])] = camel(v)
        return out
    if isinstance(obj, list):
        return [camel(v) for v in obj]
    return obj


# --------------------------------------------------------------------------
# shared state
# --------------------------------------------------------------------------

class Standin:
    def __init__(self, token, delay_ms=0, record=None, counts_only=False):
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.initial_token = token
        self.token = token
        self.delay_ms = delay_ms          # latency added to every API answer
        self.fault = {"mode": "ok"}       # ok | status | hang | close | delay
        self.remaining = None             # requests left for the fault, None = forever
        self.after = 0                    # API requests answered normally before the fault
        self.generation = 0               # bumped on every mode change (releases hangs)
        self.log = []
        self.seq = 0
        self.jobs = {}
        self.nodes = {}
        self.behaviour = default_behaviour()
        self.stopping = False
        self.record_path = record
        self.record = open(record, "w", buffering=1 << 16) if record else None
        # --counts-only: no request log and no stored records, only counts (for benchmarks
        # of a million requests, where the log would take gigabytes).
        self.counts_only = counts_only
        self.counts = {}                  # "METHOD Kind STATUS" -> requests
        self.keys = {"JobConfig": set(), "NodeConfig": set()}  # accepted Set keys
        self.first_time = None            # time of the first and last API request
        self.last_time = None

    # -- mode ---------------------------------------------------------------
    def mode_view(self):
        m = dict(self.fault)
        if m["mode"] == "ok" and self.delay_ms:
            m["mode"] = "delay"
        m["delay_ms"] = self.delay_ms if self.fault["mode"] != "delay" else self.fault["delay_ms"]
        m["base_delay_ms"] = self.delay_ms
        m["count"] = self.remaining
        return m

    def set_mode(self, req):
        """Apply a /_standin/mode body; raises Invalid."""
        if not isinstance(req, dict):
            raise Invalid("mode body must be a JSON object")
        mode = req.get("mode", "ok")
        count = req.get("count")
        if count is not None and (not isinstance(count, int) or count < 0):
            raise Invalid("count must be a non-negative integer")
        delay = req.get("delay_ms")
        if delay is not None and (not isinstance(delay, (int, float)) or delay < 0):
            raise Invalid("delay_ms must be a non-negative number")
        after = req.get("after", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise Invalid("after must be a non-negative integer")
        with self.cond:
            self.after = after
            if mode == "ok":
                self.fault = {"mode": "ok"}
                self.remaining = None
                self.delay_ms = delay or 0
            elif mode == "delay":
                if delay is None:
                    raise Invalid("mode delay needs delay_ms")
                if count is None:
                    self.fault = {"mode": "ok"}
                    self.remaining = None
                    self.delay_ms = delay
                else:
                    self.fault = {"mode": "delay", "delay_ms": delay}
                    self.remaining = count
            elif mode == "status":
                st = req.get("status")
                if not isinstance(st, int) or not 100 <= st <= 599:
                    raise Invalid("mode status needs an integer status")
                f = {"mode": "status", "status": st}
                ra = req.get("retry_after")
                if ra is not None:
                    f["retry_after"] = ra
                if "body" in req:
                    f["body"] = req["body"]
                if "message" in req:
                    f["message"] = str(req["message"])
                if "code" in req:
                    f["code"] = req["code"]
                if "from" in req:
                    if not isinstance(req["from"], str):
                        raise Invalid("from must be a client address (string)")
                    f["from"] = req["from"]
                self.fault = f
                self.remaining = count
                if delay is not None:
                    self.delay_ms = delay
            elif mode in ("hang", "close"):
                self.fault = {"mode": mode}
                self.remaining = count
                if delay is not None:
                    self.delay_ms = delay
            else:
                raise Invalid("unknown mode %r (ok|status|hang|close|delay)" % (mode,))
            if self.remaining == 0:
                self.fault = {"mode": "ok"}
                self.remaining = None
            self.generation += 1
            self.cond.notify_all()
            return self.mode_view()

    def set_behaviour(self, req):
        """Apply a /_standin/behaviour body (any subset of BEHAVIOURS); raises Invalid.
        Returns the whole behaviour now in force."""
        if not isinstance(req, dict):
            raise Invalid("behaviour body must be a JSON object")
        for k, v in req.items():
            if k not in BEHAVIOURS:
                raise Invalid("unknown behaviour %r (%s)" % (k, "|".join(BEHAVIOURS)))
            if v not in BEHAVIOURS[k][1] or isinstance(v, bool):
                raise Invalid("behaviour %s: %r is not one of %s"
                              % (k, v, ", ".join(repr(x) for x in BEHAVIOURS[k][1])))
        with self.cond:
            self.behaviour.update(req)
            return dict(self.behaviour)

    def take_fault(self, client=None):
        """Called under lock for each API request: the fault to apply (or None). A fault
        with "from" applies only to requests from that client address."""
        if self.fault["mode"] == "ok":
            return None
        f = self.fault
        if "from" in f and client != f["from"]:
            return None
        if self.after > 0:
            self.after -= 1
            return None
        if self.remaining is not None:
            self.remaining -= 1
            if self.remaining <= 0:
                self.fault = {"mode": "ok"}
                self.remaining = None
                self.generation += 1
                self.cond.notify_all()
        return f

    # -- log ----------------------------------------------------------------
    def add_entry(self, entry):
        """Under lock."""
        self.seq += 1
        entry["seq"] = self.seq
        if self.counts_only:
            kind = entry["path"].rstrip("/").rsplit("/", 1)[-1]
            k = "%s %s %s" % (entry["method"], kind, entry["status"] or entry["outcome"])
            self.counts[k] = self.counts.get(k, 0) + 1
            self.first_time = self.first_time or entry["time"]
            self.last_time = entry["time"]
            if self.record is not None:
                self.record.write(json.dumps(entry, separators=(",", ":")) + "\n")
                self.record.flush()
            return entry
        self.log.append(entry)
        if self.record is not None:
            self.record.write(json.dumps(entry, separators=(",", ":")) + "\n")
            self.record.flush()
        return entry

    def reset(self, everything=False):
        with self.cond:
            self.log = []
            self.seq = 0
            self.jobs = {}
            self.nodes = {}
            self.counts = {}
            self.keys = {"JobConfig": set(), "NodeConfig": set()}
            self.first_time = self.last_time = None
            if self.record is not None:
                self.record.seek(0)
                self.record.truncate()
                self.record.flush()
            if everything:
                self.fault = {"mode": "ok"}
                self.remaining = None
                self.after = 0
                self.delay_ms = 0
                self.token = self.initial_token
                self.behaviour = default_behaviour()
                self.generation += 1
                self.cond.notify_all()

    def stop(self):
        with self.cond:
            self.stopping = True
            self.generation += 1
            self.cond.notify_all()
            if self.record is not None:
                self.record.flush()


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------

def err_body(status, message=None, code=None):
    if code is None:
        code = GRPC_CODE.get(status, 2)
    if message is None:
        message = GRPC_MESSAGE.get(status, "error %d" % status)
    return {"code": code, "message": message}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "cv-standin/1"
    sys_version = ""
    disable_nagle_algorithm = True
    timeout = 300  # idle keep-alive connections are dropped after this

    def log_message(self, fmt, *args):
        if VERBOSE:
            sys.stderr.write("[cv_standin] %s - %s\n" % (self.address_string(), fmt % args))

    def log_request(self, code="-", size="-"):
        pass

    # every method goes through one dispatcher
    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    # -- plumbing -----------------------------------------------------------
    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            chunks, total = [], 0
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    raise ConnectionError("eof in chunked body")
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers
                        t = self.rfile.readline(65537)
                        if t in (b"\r\n", b"\n", b""):
                            break
                    break
                total += size
                if total > MAX_BODY:
                    raise ValueError("body too large")
                chunks.append(self.rfile.read(size))
                self.rfile.readline(3)
            return b"".join(chunks)
        n = self.headers.get("Content-Length")
        if not n:
            return b""
        n = int(n)
        if n < 0 or n > MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(n) if n else b""

    def answer(self, status, obj=None, raw=None, extra_headers=None, content_type="application/json"):
        if raw is None:
            raw = b"" if obj is None else (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        head = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "Status")),
                "Server: cv-standin/1",
                "Date: " + self.date_time_string(),
                "Content-Type: " + content_type,
                "Content-Length: %d" % len(raw)]
        if self.close_connection:
            head.append("Connection: close")
        for k, v in (extra_headers or {}).items():
            head.append("%s: %s" % (k, v))
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        if self.command != "HEAD":
            data += raw
        self.wfile.write(data)

    def dispatch(self):
        split = urlsplit(self.path)
        path = split.path
        query = {}
        for k, v in parse_qsl(split.query, keep_blank_values=True):
            if k in query:
                if not isinstance(query[k], list):
                    query[k] = [query[k]]
                query[k].append(v)
            else:
                query[k] = v
        try:
            raw = self.read_body()
        except (ValueError, ConnectionError) as e:
            self.close_connection = True
            self.answer(413 if "large" in str(e) else 400, err_body(400, "bad request body: %s" % e))
            return
        if path.startswith(CONTROL_PREFIX):
            self.control(path, query, raw)
        else:
            self.api(path, query, raw)

    # -- control API --------------------------------------------------------
    def control(self, path, query, raw):
        st = self.server.standin
        name = path[len(CONTROL_PREFIX):].rstrip("/")
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as e:
            self.answer(400, {"error": "invalid JSON: %s" % e})
            return
        m = self.command
        try:
            if name == "requests" and m == "GET":
                since = int(query.get("since", 0) or 0)
                with st.lock:
                    out = [e for e in st.log if e["seq"] > since] if since else list(st.log)
                    data = json.dumps(out, separators=(",", ":"))
                self.answer(200, raw=data.encode())
            elif name == "counts" and m == "GET":
                with st.lock:
                    data = json.dumps({"requests": st.seq, "counts": st.counts,
                                       "keys": {k: len(v) for k, v in st.keys.items()},
                                       "first_time": st.first_time, "last_time": st.last_time,
                                       "counts_only": st.counts_only})
                self.answer(200, raw=data.encode())
            elif name == "state" and m == "GET":
                with st.lock:
                    data = json.dumps({"jobs": st.jobs, "nodes": st.nodes}, separators=(",", ":"))
                self.answer(200, raw=data.encode())
            elif name == "reset" and m == "POST":
                st.reset(everything=bool(isinstance(body, dict)
                                         and (body.get("all") or body.get("everything"))))
                self.answer(200, {"ok": True})
            elif name == "forget" and m == "POST":
                # {"jobs": [key, ...], "nodes": [key, ...]}: those records are gone, as if
                # deleted; the request log and every other record stay
                if not isinstance(body, dict):
                    raise Invalid("forget takes {\"jobs\": [...], \"nodes\": [...]}")
                with st.lock:
                    for k in body.get("jobs") or []:
                        st.jobs.pop(k, None)
                    for k in body.get("nodes") or []:
                        st.nodes.pop(k, None)
                self.answer(200, {"ok": True})
            elif name == "behaviour" and m == "POST":
                self.answer(200, st.set_behaviour(body))
            elif name == "behaviour" and m == "GET":
                with st.lock:
                    self.answer(200, dict(st.behaviour))
            elif name == "mode" and m == "POST":
                self.answer(200, st.set_mode(body))
            elif name == "mode" and m == "GET":
                with st.lock:
                    self.answer(200, st.mode_view())
            elif name == "token" and m == "POST":
                tok = body.get("token") if isinstance(body, dict) else None
                if not isinstance(tok, str) or not tok:
                    raise Invalid("token must be a non-empty string")
                with st.lock:
                    st.token = tok
                self.answer(200, {"ok": True})
            elif name in ("ping", "health") and m == "GET":
                self.answer(200, {"ok": True, "pid": os.getpid(), "port": self.server.server_address[1]})
            else:
                self.answer(404, {"error": "unknown control call %s %s" % (m, path)})
        except Invalid as e:
            self.answer(400, {"error": str(e)})

    # -- CloudVision API ----------------------------------------------------
    def api(self, path, query, raw):
        st = self.server.standin
        auth = self.headers.get("Authorization")
        body = None
        if raw and not st.counts_only:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in self.headers.items()
                   if k.lower() not in ("authorization", "cookie")}
        entry = {
            "seq": 0,
            "time": time.time(),
            "method": self.command,
            "path": path,
            "query": query,
            "auth_header_present": auth is not None,
            "auth_ok": False,
            "status": None,
            "outcome": "answered",
            "body": None if st.counts_only else body,
            "headers": None if st.counts_only else headers,
        }
        extra = {}
        resp = None
        status = 200
        ctype = "application/json"
        with st.cond:
            fault = st.take_fault(self.client_address[0] if self.client_address else None)
            delay_ms = st.delay_ms
            gen = st.generation
            entry["auth_ok"] = auth == "Bearer " + st.token
            if fault is not None and fault["mode"] in ("hang", "close"):
                entry["outcome"] = fault["mode"]
                st.add_entry(entry)
                if fault["mode"] == "close":
                    self.close_connection = True
                    vlog("close %s %s" % (self.command, path))
                    return
                vlog("hang %s %s" % (self.command, path))
                while st.generation == gen and not st.stopping:
                    st.cond.wait(1.0)
                self.close_connection = True
                return
            if fault is not None and fault["mode"] == "status":
                status = fault["status"]
                resp = fault["body"] if "body" in fault else \
                    err_body(status, fault.get("message"), fault.get("code"))
                if "retry_after" in fault:
                    extra["Retry-After"] = str(fault["retry_after"])
                entry["outcome"] = "injected"
            else:
                if fault is not None and fault["mode"] == "delay":
                    delay_ms = fault["delay_ms"]
                profile = st.behaviour["profile"]
                if profile == "arista":
                    status, resp = self.handle_arista(st, path, query, raw)
                elif profile in WEB_PAGES:
                    status, resp = WEB_PAGES[profile]
                    ctype = "text/html"
                else:
                    status, resp = self.handle_api(st, path, query, raw, entry["auth_ok"])
            entry["status"] = status
            st.add_entry(entry)
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        vlog("%s %s -> %d" % (self.command, self.path, status))
        if isinstance(resp, bytes):
            self.answer(status, raw=resp, extra_headers=extra, content_type=ctype)
        else:
            self.answer(status, resp, extra_headers=extra, content_type=ctype)

    def handle_arista(self, st, path, query, raw):
        """Profile "arista", under lock: the rules of Arista's fake CloudVision.  No token
        check; every POST is a whole record that replaces the stored one; GET is never
        served.  Returns (status, body obj)."""
        m = self.command
        if m in ("GET", "HEAD"):
            return 404, {"errors": ["GET not supported by CV stub"]}
        if m not in ("POST", "DELETE"):
            return 501, {"errors": ["method %s not supported by CV stub" % m]}
        if m == "DELETE":
            if path != NODE_PATH:
                return 404, {"errors": ["unknown path %s" % path]}
            kid = query.get("key.id")
            if isinstance(kid, list):
                kid = kid[0]
            if not kid:
                return 400, {"errors": ["key.id query param required"]}
            st.nodes.pop(kid, None)  # (with --counts-only nothing is stored)
            return 200, {}
        if path == JOB_PATH:
            kind, store, check = "JobConfig", st.jobs, arista_job_errors
        elif path == NODE_PATH:
            kind, store, check = "NodeConfig", st.nodes, arista_node_errors
        else:
            return 404, {"errors": ["unknown path %s" % path]}
        try:
            body = json.loads(raw)
        except ValueError as e:
            return 400, {"errors": ["invalid JSON: %s" % e]}
        errs = check(body)
        if errs:
            return 400, {"errors": errs}
        kid = body["key"]["id"]
        if st.counts_only:
            st.keys[kind].add(kid)
        else:
            store[kid] = body
        return 200, {"key": body["key"], "revision": "1"}

    def handle_api(self, st, path, query, raw, auth_ok):
        """Under lock.  Returns (status, body obj or bytes)."""
        p = path.rstrip("/")
        getall = False
        if p.endswith("/all"):
            p, getall = p[:-4], True
        if p == JOB_PATH:
            store, validate, kind = st.jobs, validate_job, "JobConfig"
        elif p == NODE_PATH:
            store, validate, kind = st.nodes, validate_node, "NodeConfig"
        else:
            return 404, err_body(404, "Not Found")
        if not auth_ok:
            return 401, err_body(401)
        m = self.command
        b = st.behaviour
        if m == "GET" or m == "HEAD":
            kid = query.get("key.id")
            if getall or (kid is None and b["get_without_key"] == 200):
                # GetAll: one {"result":{...}} JSON object per line; `{}` when nothing matches.
                items = [(k, v) for k, v in store.items() if kid is None or k == kid]
                if not items:
                    return 200, b"{}\n"
                t = now_rfc3339()
                lines = [json.dumps({"result": {"value": camel(v), "time": t, "type": "INITIAL"}},
                                    separators=(",", ":")) for _, v in items]
                return 200, ("\n".join(lines) + "\n").encode()
            # GetOne: the key must be fully specified.
            if not isinstance(kid, str) or not kid:
                return 400, err_body(400, "%s: GetOne needs key.id (a fully specified key); "
                                          "GetAll is %s/all" % (kind, p))
            if kid not in store:
                if b["get_unknown_key"] == 200:
                    return 200, {}
                return 404, err_body(404, "%s %r not found" % (kind, kid))
            return 200, {"value": camel(store[kid]), "time": now_rfc3339()}
        if getall:
            return 405, err_body(405, "Method Not Allowed")
        if m == "POST" or m == "PUT":
            try:
                body = json.loads(raw)
            except ValueError as e:
                return 400, err_body(400, "invalid JSON: proto: syntax error: %s" % e)
            _IGNORE_UNKNOWN[0] = b["unknown_fields"] == "ignore"
            try:
                if kind == "NodeConfig":
                    kid = validate_node(body, b["hostname"] == "must_match_key")
                else:
                    kid = validate(body)
            except Invalid as e:
                return 400, err_body(400, str(e))
            finally:
                _IGNORE_UNKNOWN[0] = False
            if st.counts_only:
                st.keys[kind].add(kid)
            elif b["set"] == "replace":
                store[kid] = body
            else:
                store[kid] = merge_set(store.get(kid), body, b["empty_list"])
                if (kind == "JobConfig" and b["end_time_on_running"] == "cleared"
                        and body.get("state") == "JOB_STATE_RUNNING" and "end_time" not in body):
                    store[kid].pop("end_time", None)
            return 200, {"value": camel(body), "time": now_rfc3339()}
        if m == "DELETE":
            if kind == "JobConfig" and b["delete_job"] == "unsupported":
                return 405, err_body(405, "Method Not Allowed")
            kid = query.get("key.id")
            if not isinstance(kid, str) or not kid:
                return 400, err_body(400, "%s: key.id query parameter is required" % kind)
            if kid not in store:
                return 404, err_body(404, "not found")
            del store[kid]
            return 200, {"key": {"id": kid}, "time": now_rfc3339()}
        return 405, err_body(405, "Method Not Allowed")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr, ssl_ctx, standin):
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.ssl_ctx = ssl_ctx
        self.standin = standin
        super().__init__(addr, Handler)

    def server_bind(self):
        # skip HTTPServer.server_bind's getfqdn() (can be slow)
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port

    def finish_request(self, request, client_address):
        # TLS handshake in the worker thread so a slow client never blocks accept().
        try:
            request.settimeout(10)
            conn = self.ssl_ctx.wrap_socket(request, server_side=True,
                                            do_handshake_on_connect=False)
        except OSError:
            return
        try:
            conn.do_handshake()
            conn.settimeout(None)
            self.RequestHandlerClass(conn, client_address, self)
        except (OSError, ssl.SSLError) as e:
            vlog("connection %s: %s" % (client_address, e))
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def handle_error(self, request, client_address):
        if VERBOSE:
            super().handle_error(request, client_address)


def write_atomic(path, text):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None):
    global VERBOSE
    ap = argparse.ArgumentParser(description="CloudVision stand-in for cvslurm tests")
    ap.add_argument("--dir", required=True, help="working dir: certs, port, pid files")
    ap.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    ap.add_argument("--host", default="127.0.0.1")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--token", default=None, help="accepted bearer token (default test-token)")
    g.add_argument("--token-file", default=None)
    ap.add_argument("--delay-ms", type=float, default=0, help="latency added to every API answer")
    ap.add_argument("--mode", default="ok", choices=["ok", "status", "hang", "close", "delay"])
    ap.add_argument("--status", type=int, default=None, help="with --mode status")
    ap.add_argument("--retry-after", default=None, help="with --mode status")
    ap.add_argument("--count", type=int, default=None, help="fault applies to this many requests")
    ap.add_argument("--record", default=None, help="write every API request as JSONL here")
    ap.add_argument("--counts-only", action="store_true",
                    help="keep no request log and no records: only counts and accepted keys "
                         "(GET /_standin/counts), for benchmarks of millions of requests")
    ap.add_argument("--gen-certs-only", action="store_true")
    ap.add_argument("--cert", default=None,
                    help="serve this certificate (PEM) instead of DIR/server.pem (with --key)")
    ap.add_argument("--key", default=None, help="the key of --cert")
    ap.add_argument("--behaviour", default=None,
                    help='JSON object of behaviours, e.g. {"set":"replace"} (see BEHAVIOURS)')
    ap.add_argument("--profile", default=None, choices=BEHAVIOURS["profile"][1],
                    help='the server to play: same as --behaviour \'{"profile":"NAME"}\' '
                         '(wins over a profile in --behaviour)')
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    VERBOSE = a.verbose

    d = os.path.abspath(a.dir)
    made = ensure_certs(d)
    if a.gen_certs_only:
        print("%s certificates in %s (ca.pem, server.pem, server.key)"
              % ("generated" if made else "kept", d), flush=True)
        return 0

    if a.token_file:
        with open(a.token_file) as f:
            token = f.read().strip()
    else:
        token = a.token if a.token is not None else "test-token"

    st = Standin(token, delay_ms=a.delay_ms, record=a.record, counts_only=a.counts_only)
    if a.mode != "ok" or a.count is not None:
        req = {"mode": a.mode}
        if a.status is not None:
            req["status"] = a.status
        if a.retry_after is not None:
            req["retry_after"] = int(a.retry_after) if a.retry_after.isdigit() else a.retry_after
        if a.count is not None:
            req["count"] = a.count
        if a.mode in ("delay", "ok"):
            req["delay_ms"] = a.delay_ms
        try:
            st.set_mode(req)
        except Invalid as e:
            ap.error(str(e))

    if a.behaviour is not None:
        try:
            st.set_behaviour(json.loads(a.behaviour))
        except (ValueError, Invalid) as e:
            ap.error("--behaviour: %s" % e)
    if a.profile is not None:
        st.set_behaviour({"profile": a.profile})

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(a.cert or os.path.join(d, "server.pem"),
                        a.key or os.path.join(d, "server.key"))
    ctx.set_alpn_protocols(["http/1.1"])

    srv = Server((a.host, a.port), ctx, st)
    port = srv.server_address[1]
    port_file = os.path.join(d, "port")
    pid_file = os.path.join(d, "pid")

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    t.start()
    write_atomic(pid_file, "%d\n" % os.getpid())
    write_atomic(port_file, "%d\n" % port)
    host = "[%s]" % a.host if ":" in a.host else a.host
    print("listening https://%s:%d" % (host, port), flush=True)

    while not stop.wait(0.5):
        pass
    st.stop()
    srv.shutdown()
    srv.server_close()
    # remove DIR/port and DIR/pid, unless another stand-in has taken them over
    for f, mine in ((port_file, str(port)), (pid_file, str(os.getpid()))):
        try:
            with open(f) as fh:
                if fh.read().strip() != mine:
                    continue
            os.unlink(f)
        except OSError:
            pass
    if st.record is not None:
        st.record.close()
    vlog("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
