#!/usr/bin/env bash
# Captures what slurmctld says about jobs holding GPUs (GRES), for the GRES parsers.
#   sudo [SLURM=24.11] flock /var/lock/cvslurm-dev-cluster.lock tests/cluster/capture-gres.sh
# Brings the cluster up with WITH_GPUS=1 (8 GPUs per node), runs jobs that share n1's GPUs,
# a two-node GPU job, a whole-node GPU job and a job without GPUs, saves the raw outputs in
# tests/fixtures/slurm-VERSION-gres/ (VERSION: SLURM, default 22.05), and takes the cluster
# down.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${FIXTURES_OUT:-$HERE/../fixtures/slurm-${SLURM:-22.05}-gres}"
CL="$HERE/cluster.sh"
# the version's own commands (cluster.sh's wrappers), then the system's
export PATH="${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}/bin:/usr/sbin:/usr/bin:/sbin:/bin"
unset SLURM_CONF SLURM_TIME_FORMAT
trap '"$CL" down >/dev/null 2>&1 || true' EXIT
WITH_GPUS=1 MIN_JOB_AGE=600 "$CL" up 3 >/dev/null
mkdir -p "$OUT"
cd /tmp
sub() { sbatch --parsable -o /dev/null "$@" --wrap 'sleep 60'; }
a=$(sub -w n1 --gres=gpu:4 -J share-a)
b=$(sub -w n1 --gres=gpu:4 -J share-b)
c=$(sub -N2 -w n2,n3 --gres=gpu:2 -J two-nodes)
d=$(sub -w n3 --gres=gpu:6 -J six)
e=$(sub -w n2 -J nogpu)
for _ in $(seq 100); do
    [[ -z "$(squeue -h -t PENDING -o %i)" ]] && break
    sleep 0.2
done
for j in "$a" "$b" "$c" "$d" "$e"; do
    name=$(squeue -h -j "$j" -o %j)
    scontrol show job -d -o "$j" >"$OUT/scontrol-job-d-o-$name.txt"
    scontrol show job -d "$j" >"$OUT/scontrol-job-d-$name.txt"
done
squeue --json >"$OUT/squeue.json"
scontrol show node -d n1 >"$OUT/scontrol-node-d-n1.txt"
printf '%s\n' "share-a=$a share-b=$b two-nodes=$c six=$d nogpu=$e" >"$OUT/jobs.txt"
scancel "$a" "$b" "$c" "$d" "$e"
