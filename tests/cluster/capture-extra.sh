#!/usr/bin/env bash
# Captures `scontrol show node -o` with records the nodes published (`cvslurm publish` as
# slurmd's HealthCheckProgram) and a site's own Extra, for src/slurm/nodes.rs.
#   cargo build --release --target x86_64-unknown-linux-musl
#   sudo [SLURM=24.11] flock /var/tmp/cvslurm-cluster.lock tests/cluster/capture-extra.sh
# Brings a 2-node cluster up with HEALTH_CHECK=<a copy of the binary>/cvslurm-publish and an
# /etc/slurm/cloudvision.conf of `InterfacePhysicalOnly=no` (the nodes' NICs are virtual),
# waits until both nodes published, sets n2's Extra to `rack=2` and its Comment to words that
# look like a record, saves `SLURM_TIME_FORMAT=%s scontrol --all show node -o` into
# tests/fixtures/slurm-VERSION/scontrol-nodes-extra.txt and takes the cluster down.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VER="${SLURM:-22.05}"
OUT="${FIXTURES_OUT:-$HERE/../fixtures/slurm-$VER}"
CL="$HERE/cluster.sh"
W="${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}"
BIN="${BENCH_BIN:-$HERE/../../target/x86_64-unknown-linux-musl/release/cvslurm}"
PUB=/var/tmp/cvslurm-capture-extra
export PATH="$W/bin:/usr/sbin:/usr/bin:/sbin:/bin"
unset SLURM_CONF SLURM_TIME_FORMAT
[[ -e /etc/slurm/cloudvision.conf ]] && { echo "/etc/slurm/cloudvision.conf exists: not overwritten" >&2; exit 1; }
trap '"$CL" down >/dev/null 2>&1 || true; rm -f /etc/slurm/cloudvision.conf; rm -rf "$PUB"' EXIT
mkdir -p "$PUB" /etc/slurm
install -m 0755 "$BIN" "$PUB/cvslurm"
ln -sf cvslurm "$PUB/cvslurm-publish"
printf 'InterfacePhysicalOnly=no\n' >/etc/slurm/cloudvision.conf
HEALTH_CHECK="$PUB/cvslurm-publish" "$CL" up 2 >/dev/null
for _ in $(seq 1 60); do
    scontrol show node -o n1 | grep -q 'Extra=cvslurm1:' &&
        scontrol show node -o n2 | grep -q 'Extra=cvslurm1:' && break
    sleep 1
done
scontrol update NodeName=n2 Extra=rack=2 Comment="moved from rack 1: Extra=cvslurm1:AAAA"
SLURM_TIME_FORMAT=%s scontrol --all show node -o >"$OUT/scontrol-nodes-extra.txt"
echo "wrote $OUT/scontrol-nodes-extra.txt"
