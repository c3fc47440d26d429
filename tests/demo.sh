#!/usr/bin/env bash
# See cvslurm work on this machine: builds the static binary, stands up a local Slurm cluster
# (4 nodes in network namespaces) and the CloudVision stand-in, installs cvslurm as the
# cluster's PrologSlurmctld/EpilogSlurmctld, runs a few jobs and an inventory, and prints what
# CloudVision received. Needs root. `tests/demo.sh down` tears it all down again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
DEMO=/var/tmp/cvslurm-demo
CONF=/etc/slurm/cloudvision.conf

down() {
  [ -f "$DEMO/standin.pid" ] && kill "$(cat "$DEMO/standin.pid")" 2>/dev/null || true
  tests/cluster/cluster.sh down >/dev/null 2>&1 || true
  if [ -f "$CONF" ] && grep -q '^# cvslurm demo' "$CONF"; then rm -f "$CONF"; fi
  rm -rf "$DEMO"
}
if [ "${1:-}" = down ]; then down; echo "demo: torn down"; exit 0; fi
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it starts Slurm daemons and network namespaces)" >&2; exit 1; }

tests/deps.sh
echo "demo: building the static binary"
cargo build --release --target x86_64-unknown-linux-musl --quiet
down
mkdir -p "$DEMO/cv" "$DEMO/state" "$DEMO/log"
install -m 0755 target/x86_64-unknown-linux-musl/release/cvslurm "$DEMO/cvslurm"
for m in hook send inventory discover flush status check; do ln -sf cvslurm "$DEMO/cvslurm-$m"; done

echo "demo: starting the CloudVision stand-in"
python3 tests/standin/cv_standin.py --dir "$DEMO/cv" --port 0 --token demo-token >"$DEMO/standin.out" 2>&1 &
echo $! >"$DEMO/standin.pid"
for _ in $(seq 100); do [ -s "$DEMO/cv/port" ] && break; sleep 0.1; done
PORT=$(cat "$DEMO/cv/port")
chmod 0644 "$DEMO/cv/ca.pem"
umask 077; echo demo-token >"$DEMO/cloudvision.token"; umask 022
chown slurm:slurm "$DEMO/cloudvision.token" "$DEMO/state" "$DEMO/log"
mkdir -p /etc/slurm
cat >"$CONF" <<CONF
# cvslurm demo (tests/demo.sh): CloudVision is the local stand-in
ApiServer=127.0.0.1:$PORT
ApiTokenFile=$DEMO/cloudvision.token
CaFile=$DEMO/cv/ca.pem
StateDir=$DEMO/state
LogFile=$DEMO/log/cvjob.log
# The demo's nodes have virtual NICs only.
InterfacePhysicalOnly=no
CONF

echo "demo: starting a 4-node Slurm cluster with cvslurm-hook as PrologSlurmctld/EpilogSlurmctld"
CVSLURM_HOOK="$DEMO/cvslurm-hook" WITH_DBD=1 tests/cluster/cluster.sh up 4 | tail -1

echo "demo: running jobs"
ok=$(sbatch --parsable -J train -N2 -o /dev/null --wrap 'sleep 2')
bad=$(sbatch --parsable -J eval -o /dev/null --wrap 'exit 3')
long=$(sbatch --parsable -J sweep -p gpu -o /dev/null --wrap 'sleep 300')
srun -J hello -N3 hostname | sort | tr '\n' ' '; echo
sleep 2; scancel "$long"
for _ in $(seq 60); do [ -z "$(squeue -h -j "$ok,$bad,$long" 2>/dev/null)" ] && break; sleep 0.5; done
sleep 1

echo "demo: inventory of the nodes"
"$DEMO/cvslurm-inventory"

# Without the service, 'cvslurm flush' (from cron) reconciles with Slurm and sends what is
# queued: a job cancelled while running can look like a success to the epilog on Slurm
# 22.05; Slurm's final record corrects it.
sleep 5
echo "demo: cvslurm flush (reconcile with Slurm, send what is queued)"
"$DEMO/cvslurm-flush"

echo
echo "demo: what CloudVision received (POST/DELETE, in order):"
python3 - "$DEMO/cv" <<'PY'
import json, ssl, sys, urllib.request
d = sys.argv[1]
port = open(f"{d}/port").read().strip()
ctx = ssl.create_default_context(cafile=f"{d}/ca.pem")
reqs = json.load(urllib.request.urlopen(f"https://127.0.0.1:{port}/_standin/requests", context=ctx))
for r in reqs:
    b = r.get("body") or {}
    if r["path"].endswith("JobConfig"):
        print(f'  {r["method"]} JobConfig  {b["key"]["id"]:<12} {b["state"]:<20} {b.get("name",""):<14} nodes={",".join(b["nodes"]["values"])} {b.get("start_time","")} {b.get("end_time","")}  -> {r["status"]}')
    elif r["method"] == "POST":
        ifs = "; ".join(f'{i["name"]} {i["mac_address"]} {",".join(i["ip_addresses"]["values"])}' for i in b["data_interfaces"]["values"])
        print(f'  POST NodeConfig {b["key"]["id"]:<4} {ifs}  -> {r["status"]}')
    else:
        print(f'  {r["method"]} {r["path"]} {r.get("query")} -> {r["status"]}')
PY
echo
echo "demo: hook log: $DEMO/log/cvjob.log; stand-in state: https://127.0.0.1:$PORT/_standin/state"
echo "demo: the cluster stays up (try: sbatch --wrap 'sleep 5'; $DEMO/cvslurm-status); tear down with: tests/demo.sh down"
