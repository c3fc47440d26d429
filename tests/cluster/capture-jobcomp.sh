#!/usr/bin/env bash
# Captures what Slurm's jobcomp/elasticsearch plugin posts for each kind of job end, from a
# real cluster of version $SLURM (22.05, 24.11 or 26.05), into
# tests/fixtures/slurm-<version>/jobcomp/ (run as root; takes the cluster down first and
# leaves it down): one request per line in requests.jsonl (method, path, headers, body as
# sent), and jobs.txt (which job id is which case). A small Python receiver on 127.0.0.1
# answers 200 to every POST, except while $CAP/refuse exists (500: the plugin's retry).
#   SLURM=24.11 tests/cluster/capture-jobcomp.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CL="$HERE/cluster.sh"
V="${SLURM:-22.05}"
OUT="$ROOT/tests/fixtures/slurm-$V/jobcomp"
CAP=/var/tmp/cvslurm-capture-jobcomp
W="${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}"
export PATH="$W/bin:/usr/sbin:/usr/bin:/sbin:/bin"
log() { printf '[capture-jobcomp] %s\n' "$*"; }
rm -rf "$CAP"; mkdir -p "$CAP" "$OUT"
cat >"$CAP/receiver.py" <<'PY'
import http.server, json, os, sys
cap = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode("utf-8", "replace")
        refused = os.path.exists(os.path.join(cap, "refuse"))
        rec = {"method": "POST", "path": self.path, "headers": dict(self.headers.items()),
               "body": body, "answered": 500 if refused else 200}
        with open(os.path.join(cap, "requests.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        out = b'{"result":"created"}'
        self.send_response(500 if refused else 201 if "201" in self.path else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
open(os.path.join(cap, "port"), "w").write(str(s.server_address[1]))
s.serve_forever()
PY
python3 "$CAP/receiver.py" "$CAP" & RPID=$!
trap 'kill $RPID 2>/dev/null; "$CL" down >/dev/null 2>&1 || true' EXIT
for _ in $(seq 50); do [[ -s "$CAP/port" ]] && break; sleep 0.1; done
PORT="$(cat "$CAP/port")"
log "receiver on 127.0.0.1:$PORT; cluster up (Slurm $V)"
SLURM="$V" JOBCOMP_LOC="http://127.0.0.1:$PORT/slurm/jobcomp" WITH_DBD=1 "$CL" up 4 >/dev/null
sb() { sbatch --parsable "$@" | cut -d';' -f1; }
ids=()
note() { printf '%s %s\n' "$1" "$2" >>"$OUT/jobs.txt"; }
: >"$OUT/jobs.txt"
j=$(sb -J ok --wrap 'sleep 1'); note "$j" "completed"
j=$(sb -J fail --wrap 'exit 3'); note "$j" "failed (exit 3)"
j=$(sb -J 'hostile "name" \ </x>' --wrap 'sleep 1'); note "$j" "completed (hostile name)"
j=$(sb -J two -N2 --wrap 'sleep 1'); note "$j" "completed on 2 nodes"
j=$(sb -J cancel --wrap 'sleep 100'); note "$j" "cancelled while running"
j2=$(sb -J held -H --wrap 'sleep 1'); note "$j2" "cancelled while pending (held)"
a=$(sb -J arr -a 1-3 --wrap 'sleep 1'); note "$a" "array 1-3 (completed)"
r=$(sb -J requeue --wrap 'sleep 100'); note "$r" "requeued once while running, then cancelled"
z=$(sb -J resize -N2 --wrap 'sleep 100'); note "$z" "resized to 1 node while running, then cancelled"
h=$(sbatch --parsable -J het -N1 --wrap 'sleep 1' : -N1 2>/dev/null | cut -d';' -f1 || true); [[ -n "$h" ]] && note "$h" "het job of 2 components (completed)"
t=$(sb -J timeout -t 1 --wrap 'sleep 120'); note "$t" "time limit (1 min)"
sleep 5
scancel "$j"; scancel "$j2"
scontrol requeue "$r" || true
scontrol update JobId="$z" NumNodes=1 || true
sleep 8
touch "$CAP/refuse"; log "refusing for 40 s (the plugin retries)"
o=$(sb -J retried --wrap 'sleep 1'); note "$o" "completed while the receiver answered 500"
sleep 40; rm -f "$CAP/refuse"
for _ in $(seq 60); do [[ -z "$(squeue -h -o %i -j "$r" 2>/dev/null | grep -v '^$' || true)" ]] && break; [[ "$(squeue -h -o %T -j "$r")" == RUNNING ]] && break; sleep 1; done
scancel "$r" "$z" || true
log "waiting for the time limit job and the last posts"
for _ in $(seq 120); do [[ -z "$(squeue -h -o %i)" ]] && break; sleep 1; done
sleep 5
cp "$CAP/requests.jsonl" "$OUT/requests.jsonl"
slurmctld -V >"$OUT/version.txt" 2>&1 || true
log "$(wc -l <"$OUT/requests.jsonl") requests saved in $OUT"
