#!/usr/bin/env bash
# Captures what slurmctld says about a job whose node reboots first (`sbatch --reboot`), for
# reconciliation's boot notes (src/service/reconcile.rs).
#   sudo [SLURM=24.11] flock /var/tmp/cvslurm-cluster.lock tests/cluster/capture-reboot.sh
# Brings a 2-node cluster up (RebootProgram restarts a node's slurmd with -b), holds n2 down
# mid-reboot ($W/run/reboot-n2.hold), submits `sbatch --reboot -w n2`, saves slurmctld's JSON
# of the job while it waits (booting-*.json) and once it runs (booted-*.json) into
# tests/fixtures/slurm-VERSION/reboot/ (VERSION: SLURM, default 22.05), the times (the start
# at the allocation, Slurm's reset start, slurmctld's log lines) into
# tests/fixtures/raw/slurm-VERSION/reboot/times.txt, and takes the cluster down.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VER="${SLURM:-22.05}"
OUT="${FIXTURES_OUT:-$HERE/../fixtures/slurm-$VER/reboot}"
RAW="${FIXTURES_OUT:-$HERE/../fixtures/raw/slurm-$VER/reboot}"
CL="$HERE/cluster.sh"
W="${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}"
export PATH="$W/bin:/usr/sbin:/usr/bin:/sbin:/bin"
unset SLURM_CONF SLURM_TIME_FORMAT
trap 'rm -f "$W/run/reboot-n2.hold"; "$CL" down >/dev/null 2>&1 || true' EXIT
MIN_JOB_AGE=600 "$CL" up 2 >/dev/null
mkdir -p "$OUT" "$RAW"
cd /tmp
touch "$W/run/reboot-n2.hold"
j=$(sbatch --parsable -o /dev/null --reboot -w n2 -J reboot --wrap 'sleep 30')
for _ in $(seq 100); do
    [[ "$(squeue -h -j "$j" -o %T)" == CONFIGURING ]] && break
    sleep 0.2
done
booting_start=$(squeue -h -j "$j" -o %S)
if [[ "$VER" == 22.05 ]]; then
    squeue --json >"$OUT/booting-squeue.json"
else
    squeue --only-job-state --json >"$OUT/booting-only-job-state.json"
    scontrol show job --json "$j" >"$OUT/booting-scontrol.json"
fi
sleep 2
rm -f "$W/run/reboot-n2.hold"
for _ in $(seq 300); do
    [[ "$(squeue -h -j "$j" -o %T)" == RUNNING ]] && break
    sleep 0.2
done
if [[ "$VER" == 22.05 ]]; then
    squeue --json >"$OUT/booted-squeue.json"
else
    squeue --only-job-state --json >"$OUT/booted-only-job-state.json"
    scontrol show job --json "$j" >"$OUT/booted-scontrol.json"
fi
{
    printf 'job %s\nstart while booting (squeue %%S): %s\nstart once running: %s\n' \
        "$j" "$booting_start" "$(squeue -h -j "$j" -o %S)"
    grep -h "JobId=$j " "$W/log/slurmctld.log" | grep -i "reset\|reboot\|complete" || true
} >"$RAW/times.txt"
scancel "$j"
cat "$RAW/times.txt"
