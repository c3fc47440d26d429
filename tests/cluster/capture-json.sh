#!/usr/bin/env bash
# Captures what cvslurm's JSON readers read, from the real host Slurm, into
# tests/fixtures/slurm-<version>/json/ (takes ~2 minutes; run as root inside the cluster flock):
#   flock -o /var/lock/cvslurm-dev-cluster.lock tests/cluster/capture-json.sh
# (-o: the daemons cluster.sh starts must not inherit the lock's file descriptor)
# Starts the cluster (WITH_DBD=1, MinJobAge=600) with a capture hook as PrologSlurmctld and
# EpilogSlurmctld that dumps, inside each hook, the JSON cvslurm asks slurmctld for; runs one job
# per ending plus jobs with hostile names; saves squeue/sacct JSON, the sinfo/squeue/scontrol
# view of a Hidden=YES partition, and how long each call took. Takes the cluster down again.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CL="$HERE/cluster.sh"
CAP=/var/tmp/cvslurm-capture-json
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset SLURM_CONF SLURM_TIME_FORMAT

log() { printf '[capture-json] %s\n' "$*"; }
die() { printf '[capture-json] ERROR: %s (cluster left up; run cluster.sh down)\n' "$*" >&2; exit 1; }

rm -rf "$CAP"
install -d -m 0755 "$CAP"
install -d -o slurm -g slurm -m 0755 "$CAP/out"
# The hook asks what cvslurm asks: squeue --json on Slurm without `scontrol --json` (22.05),
# else scontrol --json show job ID; and the text form for comparison.
cat >"$CAP/hook.sh" <<'EOF'
#!/bin/sh
o=/var/tmp/cvslurm-capture-json/out
k="${SLURM_JOB_ID:-nojob}-${SLURM_SCRIPT_CONTEXT:-nocontext}"
/usr/bin/tr '\0' '\n' </proc/$$/environ >"$o/$k.env"
if /usr/bin/scontrol --json show job "$SLURM_JOB_ID" >"$o/$k.scontrol.json" 2>"$o/$k.scontrol.err"; then :; else
  /usr/bin/rm -f "$o/$k.scontrol.json"
fi
t0=$(/usr/bin/date +%s%N)
/usr/bin/squeue --all --json >"$o/$k.squeue.json" 2>"$o/$k.squeue.err"
t1=$(/usr/bin/date +%s%N)
echo "squeue_json_ms=$(( (t1 - t0) / 1000000 ))" >"$o/$k.timing"
SLURM_TIME_FORMAT=%s /usr/bin/scontrol show job -o "$SLURM_JOB_ID" >"$o/$k.job-epoch" 2>&1
exit 0
EOF
chmod 0755 "$CAP/hook.sh"

log "cluster up (hook, dbd, MinJobAge=600)"
CVSLURM_HOOK="$CAP/hook.sh" WITH_DBD=1 MIN_JOB_AGE=600 "$CL" up 4
VER="$(scontrol --version | awk '{print $2}')"
OUT="${FIXTURES_OUT:-$ROOT/tests/fixtures/slurm-${VER%.*}/json}"
rm -rf "$OUT"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/cvcapture-json.XXXXXX)"
cd "$WORK"

sub() { sbatch --parsable -o "$WORK/slurm-%j.out" "$@" | cut -d';' -f1; }
jstate() { squeue -h -a -t all -j "$1" -o '%T' 2>/dev/null | head -n 1; }
wait_state() { # id regex timeout
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        [[ "$(jstate "$1")" =~ ^($2)$ ]] && return 0
        sleep 0.1
    done
    die "job $1 did not reach $2 (is $(jstate "$1"))"
}
declare -A JOBS=()
JOBS[timeout]="$(sub -t 1 -J timelimit -w n1 --wrap 'sleep 300')"
JOBS[completed]="$(sub -J completed --wrap 'echo hello')"
JOBS[exit3]="$(sub -J exit3 --wrap 'exit 3')"
JOBS[sigkill]="$(sub -J sigkill --wrap 'kill -9 $$')"
JOBS[cancelled]="$(sub -J cancelled -w n2 --wrap 'sleep 300')"
JOBS[multinode]="$(sub -J multinode -N2 -w n3,n4 --wrap 'sleep 2')"
# shellcheck disable=SC2016
JOBS[array]="$(sub -J arr --array=1-2 --wrap 'sleep 1; exit $SLURM_ARRAY_TASK_ID')"
# Hostile names: a newline and Key=Value words, quotes and non-ASCII, a comment and a script
# line with Key=Value words (the job runs on n2; the words name n1 and "evil").
JOBS[evil-newline]="$(sub -w n2 --job-name=$'x\nJobId=1 JobState=FAILED NodeList=evil' --wrap 'sleep 6')"
JOBS[evil-quotes]="$(sub -w n2 --job-name="q\"uo'te ünï JobState=CANCELLED NodeList=n1 |1|" \
    --comment='NodeList=evil JobState=FAKE' --wrap 'sleep 6 # NodeList=evil JobState=FAKE')"
wait_state "${JOBS[cancelled]}" RUNNING 20
wait_state "${JOBS[evil-newline]}" RUNNING 20
wait_state "${JOBS[evil-quotes]}" RUNNING 20
sleep 1
squeue --all --json >"$OUT/squeue-running.json"
scancel "${JOBS[cancelled]}"
JOBS[cancelled-at-once]="$(sub -J cancel0 -w n1 --wrap 'sleep 300')"
wait_state "${JOBS[cancelled-at-once]}" RUNNING 20
scancel "${JOBS[cancelled-at-once]}"

# A Hidden=YES partition with a job in it: who lists it without --all?
scontrol create partitionname=hid nodes=n4 hidden=yes state=up maxtime=infinite
JOBS[hidden]="$(sub -J hiddenjob -p hid --wrap 'sleep 8')"
wait_state "${JOBS[hidden]}" RUNNING 20
{
    echo "## sinfo -h -N -o '%N %T %P'"; sinfo -h -N -o '%N %T %P'
    echo "## sinfo --all -h -N -o '%N %T %P'"; sinfo --all -h -N -o '%N %T %P'
    echo "## squeue -h -o '%i %P'"; squeue -h -o '%i %P'
    echo "## squeue --all -h -o '%i %P'"; squeue --all -h -o '%i %P'
    echo "## squeue --json | jobs"; squeue --json | python3 -c 'import json,sys; print(sorted(j["job_id"] for j in json.load(sys.stdin)["jobs"]))'
    echo "## squeue --all --json | jobs"; squeue --all --json | python3 -c 'import json,sys; print(sorted(j["job_id"] for j in json.load(sys.stdin)["jobs"]))'
    echo "## scontrol show job -o ${JOBS[hidden]} | JobId"; scontrol show job -o "${JOBS[hidden]}" 2>&1 | cut -c1-20
    echo "## scontrol --all show job -o ${JOBS[hidden]} | JobId"; scontrol --all show job -o "${JOBS[hidden]}" 2>&1 | cut -c1-20
} >"$OUT/hidden-partition.txt" 2>&1

for c in completed exit3 sigkill cancelled multinode evil-newline evil-quotes cancelled-at-once hidden; do
    wait_state "${JOBS[$c]}" 'COMPLETED|FAILED|CANCELLED|TIMEOUT' 60
done
for t in 1 2; do wait_state "${JOBS[array]}_$t" 'COMPLETED|FAILED' 60; done
log "waiting for the time-limit job (about 90 s)"
wait_state "${JOBS[timeout]}" TIMEOUT 150
sleep 3

ids="$(printf '%s,' "${JOBS[@]}")"
ids="${ids%,}"
squeue --all --json >"$OUT/squeue-all-ended.json"
squeue --all --json -j "${JOBS[completed]}" >"$OUT/squeue-one-job.json"
sacct --json -j "$ids" >"$OUT/sacct.json" 2>"$WORK/sacct.err" || cp "$WORK/sacct.err" "$OUT/sacct-json-error.txt"
SLURM_TIME_FORMAT=%s sacct -X -P -n -j "$ids" --format=JobIDRaw,JobName,Partition,State,Start,End,NodeList,ExitCode >"$OUT/sacct-parsable.txt"
if scontrol --json show job >"$OUT/scontrol-json.json" 2>"$WORK/scj.err"; then :; else
    { echo "## scontrol --json show job"; cat "$WORK/scj.err"; } >"$OUT/scontrol-json-error.txt"
    rm -f "$OUT/scontrol-json.json"
fi
{
    echo "## scontrol --version"; scontrol --version
    echo "## sinfo --version"; sinfo --version
    for cmd in "scontrol --version" "squeue --all --json" "squeue --all --json -j ${JOBS[completed]}" "sacct --json -j $ids"; do
        t0=$(date +%s%N); $cmd >/dev/null 2>&1 || true; t1=$(date +%s%N)
        echo "$cmd: $(( (t1 - t0) / 1000000 )) ms"
    done
} >"$OUT/versions-and-timings.txt"

# Hook captures: the epilog's JSON of every ending.
for c in "${!JOBS[@]}"; do
    id="${JOBS[$c]}"
    [[ "$c" == array ]] && id="${JOBS[array]}"
    for ctx in prolog epilog; do
        k="$CAP/out/$id-${ctx}_slurmctld"
        [[ -f "$k.env" ]] || continue
        cp "$k.env" "$OUT/hookenv-$c-$ctx.txt"
        [[ -f "$k.squeue.json" ]] && cp "$k.squeue.json" "$OUT/squeue-$c-$ctx.json"
        [[ -f "$k.scontrol.json" ]] && cp "$k.scontrol.json" "$OUT/scontrol-$c-$ctx.json"
        cp "$k.job-epoch" "$OUT/scontrol-text-$c-$ctx.txt"
        cat "$k.timing" >>"$OUT/versions-and-timings.txt"
    done
done
printf '%s\n' "$(for c in $(printf '%s\n' "${!JOBS[@]}" | sort); do printf '%s=%s ' "$c" "${JOBS[$c]}"; done)" >"$OUT/job-ids.txt"
cp -a "$CAP/out" "$WORK/hook-out"
"$CL" down
log "done; fixtures in $OUT, raw hook output in $WORK/hook-out"
