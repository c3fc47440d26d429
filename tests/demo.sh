#!/usr/bin/env bash
# See cvslurm work on this machine, in its default set-up: builds the static binary, stands up
# a local Slurm cluster (4 nodes in network namespaces) and the CloudVision stand-in, installs
# cvslurm with install.sh (PrologSlurmctld/EpilogSlurmctld hooks, cloudvision.conf, token,
# StateDir), starts the service (`cvslurm inventory --monitor`, as its systemd unit does), runs
# a few jobs and prints what CloudVision received: the hooks queue, the service sends. Needs
# root. `tests/demo.sh down` tears it all down again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
DEMO=/var/tmp/cvslurm-demo
CONF=/etc/slurm/cloudvision.conf
# install.sh's locations: everything of the demo under $DEMO but the files slurmctld's hook
# reads from /etc/slurm (cloudvision.conf, the token); the host's systemd and logrotate are
# left alone.
export INSTALL_DIR="$DEMO/opt" STATE_DIR="$DEMO/state" LOG_DIR="$DEMO/log" LOGROTATE_DIR="$DEMO/logrotate"
INST="$INSTALL_DIR"

down() {
  for p in "$DEMO/service.pid" "$DEMO/standin.pid"; do
    [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
  done
  if [ -f "$INST/.install-manifest" ]; then
    ./install.sh --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true
  fi
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
mkdir -p "$DEMO/cv" "$LOGROTATE_DIR"

echo "demo: starting the CloudVision stand-in"
python3 tests/standin/cv_standin.py --dir "$DEMO/cv" --port 0 --token demo-token >"$DEMO/standin.out" 2>&1 &
echo $! >"$DEMO/standin.pid"
for _ in $(seq 100); do [ -s "$DEMO/cv/port" ] && break; sleep 0.1; done
PORT=$(cat "$DEMO/cv/port")
chmod 0644 "$DEMO/cv/ca.pem"
umask 077; echo demo-token >"$DEMO/token.in"; umask 022

echo "demo: starting a 4-node Slurm cluster"
WITH_DBD=1 tests/cluster/cluster.sh up 4 | tail -1

# install.sh sets its own keys (ApiServer, ApiTokenFile, CaFile, StateDir, LogFile) and keeps
# these.
mkdir -p /etc/slurm
cat >"$CONF" <<CONF
# cvslurm demo (tests/demo.sh): CloudVision is the local stand-in
# The demo's nodes have virtual NICs only.
InterfacePhysicalOnly=no
# Reconciliation every 5 s (default 300) so the demo shows its corrections: on Slurm 22.05 a
# job cancelled while running can look like a success to the epilog; Slurm's final record
# corrects it.
ReconcileInterval=5
CONF

echo "demo: ./install.sh (hooks in slurm.conf, applied with scontrol reconfigure)"
./install.sh --api-server "127.0.0.1:$PORT" --api-token-file "$DEMO/token.in" --ca-file "$DEMO/cv/ca.pem" \
  --binary "$PWD/target/x86_64-unknown-linux-musl/release/cvslurm" --no-service | sed 's/^/  /'

# Slurm before 23.11 (the host's 22.05) runs the PrologSlurmctld/EpilogSlurmctld slurmctld
# started with until it restarts, as install.sh warns: restart it, as an admin would.
tests/cluster/cluster.sh restart-slurmctld >/dev/null

# install.sh installs and starts cvslurm.service where systemd runs; the demo leaves the
# host's systemd alone (--no-service above) and starts the same command itself.
echo "demo: starting the service: $INST/cvslurm inventory --monitor"
nice -n 10 "$INST/cvslurm" inventory --monitor </dev/null >"$DEMO/service.out" 2>&1 &
echo $! >"$DEMO/service.pid"
for _ in $(seq 100); do [ -S "$STATE_DIR/wake.sock" ] && break; sleep 0.1; done
[ -S "$STATE_DIR/wake.sock" ] || { echo "demo: the service did not start:" >&2; cat "$DEMO/service.out" >&2; exit 1; }
echo "demo: the service's first inventory (an srun of cvslurm discover on every node)"
for _ in $(seq 120); do
  n=$(grep -c 'sending NodeConfig' "$LOG_DIR/cvjob.log" 2>/dev/null || true)
  [ "${n:-0}" -ge 4 ] && break
  sleep 0.5
done
grep -o 'node .*: appeared; sending NodeConfig.*' "$LOG_DIR/cvjob.log" | sed 's/^/  /' || true

echo "demo: running jobs (each hook queues its event in StateDir and wakes the service)"
ok=$(sbatch --parsable -J train -N2 -o /dev/null --wrap 'sleep 2')
bad=$(sbatch --parsable -J eval -o /dev/null --wrap 'exit 3')
long=$(sbatch --parsable -J sweep -p gpu -o /dev/null --wrap 'sleep 300')
srun -J hello -N3 hostname | sort | tr '\n' ' '; echo
sleep 2; scancel "$long"
for _ in $(seq 60); do [ -z "$(squeue -h -j "$ok,$bad,$long" 2>/dev/null)" ] && break; sleep 0.5; done

echo "demo: waiting for the service to send everything (and to check the ends against Slurm's record)"
for _ in $(seq 120); do
  [ -z "$(find "$STATE_DIR/outbox" "$STATE_DIR/inflight" "$STATE_DIR/verify" -type f 2>/dev/null)" ] && break
  sleep 0.5
done
"$INST/cvslurm-status" --offline | sed 's/^/  /' || true
echo
echo "demo: what CloudVision received (POST/DELETE, in order):"
python3 - "$DEMO/cv" <<'PY'
import json, ssl, sys, urllib.request
d = sys.argv[1]
port = open(f"{d}/port").read().strip()
ctx = ssl.create_default_context(cafile=f"{d}/ca.pem")
reqs = json.load(urllib.request.urlopen(f"https://127.0.0.1:{port}/_standin/requests", context=ctx))
for r in reqs:
    if r["method"] not in ("POST", "DELETE"):
        continue  # install.sh's check of the token (GET)
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
echo "demo: log of the hooks and the service: $LOG_DIR/cvjob.log; stand-in state: https://127.0.0.1:$PORT/_standin/state"
echo "demo: the cluster and the service stay up (try: sbatch --wrap 'sleep 5'; $INST/cvslurm-status); tear down with: tests/demo.sh down"
