#!/usr/bin/env bash
# Regenerates tests/fixtures/slurm-22.05/ from a real cluster (takes ~3 minutes).
#   sudo tests/cluster/capture-fixtures.sh
#   sudo SLURM=24.11 tests/cluster/capture-fixtures.sh   (or 26.05: the cluster of that version;
#        the captures then go to /var/tmp/cvslurm-captures/slurm-VERSION unless FIXTURES_OUT)
# Starts the cluster with a capture hook (PrologSlurmctld/EpilogSlurmctld) and WITH_DBD=1,
# runs one job per scenario, saves raw command outputs, and takes the cluster down again.
# Its scontrol show job/nodes text is raw evidence no test reads (but scontrol-job-gpu-shell.txt):
# the committed copies are in tests/fixtures/raw/slurm-22.05/.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CL="$HERE/cluster.sh"
V="${SLURM:-22.05}"
if [[ "$V" == 22.05 ]]; then
    OUT="${FIXTURES_OUT:-$ROOT/tests/fixtures/slurm-22.05}"
else
    OUT="${FIXTURES_OUT:-/var/tmp/cvslurm-captures/slurm-$V}"
fi
CAP=/var/tmp/cvslurm-capture
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset SLURM_CONF SLURM_TIME_FORMAT

log() { printf '[capture] %s\n' "$*"; }
die() { printf '[capture] ERROR: %s (cluster left up for inspection; run cluster.sh down)\n' "$*" >&2; exit 1; }

# ---------- capture hook ----------
rm -rf "$CAP"
install -d -m 0755 "$CAP"
install -d -o slurm -g slurm -m 0755 "$CAP/out"
cat >"$CAP/hook.sh" <<'EOF'
#!/bin/sh
# capture hook: records the exact environment slurmctld gave us (from /proc/$$/environ, so
# nothing the shell adds), what scontrol says about the job at this moment, uid and cwd.
o=/var/tmp/cvslurm-capture/out
k="${SLURM_JOB_ID:-nojob}-${SLURM_SCRIPT_CONTEXT:-nocontext}"
/usr/bin/date +%s.%N >"$o/$k.time"
/usr/bin/tr '\0' '\n' </proc/$$/environ >"$o/$k.env"
/usr/bin/scontrol show job -o "$SLURM_JOB_ID" >"$o/$k.job" 2>"$o/$k.job.err"
echo "rc=$?" >>"$o/$k.job.err"
SLURM_TIME_FORMAT=%s /usr/bin/scontrol show job -o "$SLURM_JOB_ID" >"$o/$k.job-epoch" 2>&1
/usr/bin/scontrol --json show job "$SLURM_JOB_ID" >"$o/$k.json" 2>&1
{ /usr/bin/id; echo "cwd=$(pwd)"; echo "ppid_comm=$(cat /proc/$PPID/comm)"; } >"$o/$k.who"
exit 0
EOF
chmod 0755 "$CAP/hook.sh"

rm -rf "$OUT"
mkdir -p "$OUT"
log "cluster up (hook, dbd, MinJobAge=600)"
CVSLURM_HOOK="$CAP/hook.sh" WITH_DBD=1 MIN_JOB_AGE=600 "$CL" up 4
# the cluster's own Slurm commands (the version's, also for a root filesystem)
export PATH="${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}/bin:$PATH"
WORK="$(mktemp -d /tmp/cvcapture.XXXXXX)"
cd "$WORK"

sub() { sbatch --parsable -o "$WORK/slurm-%j.out" "$@" | cut -d';' -f1; }
jstate() { scontrol show job -o "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -n 1 | cut -d= -f2; }
wait_state() { # id regex timeout
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        [[ "$(jstate "$1")" =~ ^($2)$ ]] && return 0
        sleep 0.1
    done
    die "job $1 did not reach $2 (is $(jstate "$1"))"
}
wait_file() { # path timeout
    local i
    for ((i = 0; i < $2 * 10; i++)); do [[ -s "$1" ]] && return 0; sleep 0.1; done
    die "no $1"
}
shell_job() { # case id
    scontrol show job -o "$2" >"$OUT/scontrol-job-$1-shell.txt"
    SLURM_TIME_FORMAT=%s scontrol show job -o "$2" >"$OUT/scontrol-job-$1-shell-epoch.txt"
}
hook_files() { # case id
    local ctx
    for ctx in prolog_slurmctld epilog_slurmctld; do
        local s="${ctx%_slurmctld}" k="$CAP/out/$2-$ctx"
        [[ -f "$k.env" ]] || continue
        cp "$k.env" "$OUT/hookenv-$1-$s.txt"
        cp "$k.job" "$OUT/scontrol-job-$1-$s.txt"
        cp "$k.job-epoch" "$OUT/scontrol-job-$1-$s-epoch.txt"
        [[ "$V" == 22.05 ]] || cp "$k.json" "$OUT/scontrol-job-$1-$s.json"
    done
}
declare -A JOBS=()

log "scenario jobs"
# time limit first: it needs 60-90 s
JOBS[timeout]="$(sub -t 1 -J timelimit -w n1 --wrap 'sleep 300')"
JOBS[running]="$(sub -J running -w n1 --wrap 'sleep 20')"
JOBS[completed]="$(sub -J completed --wrap 'echo hello')"
JOBS[exit3]="$(sub -J exit3 --wrap 'exit 3')"
JOBS[sigkill]="$(sub -J sigkill --wrap 'kill -9 $$')"
JOBS[cancelled]="$(sub -J cancelled -w n2 --wrap 'sleep 300')"
JOBS[multinode]="$(sub -J multinode -N3 --wrap 'srun hostname; sleep 2')"
# shellcheck disable=SC2016
JOBS[array]="$(sub -J arr --array=1-3 --wrap 'sleep 1; exit $SLURM_ARRAY_TASK_ID')"
JOBS[pending-held]="$(sub -J held -H --wrap 'true')"
JOBS[pending-begin]="$(sub -J later --begin=now+1hour --wrap 'true')"
JOBS[gpu]="$(sub -J gpujob -p gpu -w n3 --wrap 'sleep 3')"

wait_state "${JOBS[running]}" RUNNING 20
wait_state "${JOBS[cancelled]}" RUNNING 20
wait_state "${JOBS[multinode]}" RUNNING 20
sleep 1
shell_job running "${JOBS[running]}"
shell_job multinode-running "${JOBS[multinode]}"
shell_job pending-held "${JOBS[pending-held]}"
shell_job pending-begin "${JOBS[pending-begin]}"
SLURM_TIME_FORMAT=%s squeue -h -t RUNNING -o '%i|%j|%P|%T|%S|%N' >"$OUT/squeue-running-epoch.txt"
squeue -h -t RUNNING -o '%i|%j|%P|%T|%S|%N' >"$OUT/squeue-running.txt"
squeue -h -o '%i|%j|%P|%T|%S|%N|%r' >"$OUT/squeue-all.txt"
if squeue --json >"$OUT/squeue.json" 2>"$WORK/squeue-json.err"; then :; else
    log "squeue --json failed: $(cat "$WORK/squeue-json.err")"
    cp "$WORK/squeue-json.err" "$OUT/squeue-json-error.txt"
    rm -f "$OUT/squeue.json"
fi
if scontrol show job --json >"$OUT/scontrol-job-json-all.json" 2>/dev/null; then :; else rm -f "$OUT/scontrol-job-json-all.json"; fi
scancel "${JOBS[cancelled]}"

# pending because of resources: fill n1 exclusively, then ask for it again
JOBS[excl]="$(sub -J excl -w n4 --exclusive --wrap 'sleep 8')"
wait_state "${JOBS[excl]}" RUNNING 30
JOBS[pending-resources]="$(sub -J waits -w n4 --exclusive --wrap 'true')"
sleep 3
shell_job pending-resources "${JOBS[pending-resources]}"
# array task (running)
wait_state "${JOBS[array]}_1" 'RUNNING|COMPLETED|FAILED' 20
scontrol show job -o "${JOBS[array]}_1" >"$OUT/scontrol-job-array-task1-shell-byarrayid.txt" || true
scontrol show job -o "${JOBS[array]}" >"$OUT/scontrol-job-array-all-shell.txt" || true

for c in running completed exit3 sigkill cancelled multinode gpu excl pending-resources; do
    wait_state "${JOBS[$c]}" 'COMPLETED|FAILED|CANCELLED|TIMEOUT' 60
done
for t in 1 2 3; do wait_state "${JOBS[array]}_$t" 'COMPLETED|FAILED' 60; done
sleep 1
for c in completed exit3 sigkill cancelled multinode gpu; do
    shell_job "$c" "${JOBS[$c]}"
done
shell_job running-finished "${JOBS[running]}"
scontrol show job -o "${JOBS[array]}" >"$OUT/scontrol-job-array-all-finished-shell.txt"
SLURM_TIME_FORMAT=%s scontrol show job -o "${JOBS[array]}" >"$OUT/scontrol-job-array-all-finished-shell-epoch.txt"

# node states
log "node states"
sinfo -h -N -o '%N %T' >"$OUT/sinfo-normal.txt"
scontrol show nodes -o >"$OUT/scontrol-nodes-normal.txt"
scontrol show config >"$OUT/scontrol-config.txt"
"$CL" add-node n5 >/dev/null
sinfo -h -N -o '%N %T' >"$OUT/sinfo-dynamic-node.txt"
scontrol show nodes -o >"$OUT/scontrol-nodes-dynamic.txt"
"$CL" del-node n5 >/dev/null
JOBS[draining]="$(sub -J drainme -w n4 --wrap 'sleep 6')"
wait_state "${JOBS[draining]}" RUNNING 20
scontrol update nodename=n4 state=drain reason="cvslurm test drain"
scontrol update nodename=n3 state=drain reason="maintenance"
sleep 0.5
sinfo -h -N -o '%N %T' >"$OUT/sinfo-drain-draining.txt"
sinfo -h -N -o '%N|%T|%E|%P' >"$OUT/sinfo-drain-draining-reason.txt"
scontrol show nodes -o >"$OUT/scontrol-nodes-drain-draining.txt"
wait_state "${JOBS[draining]}" COMPLETED 30
sleep 0.5
sinfo -h -N -o '%N %T' >"$OUT/sinfo-drained.txt"
scontrol update nodename=n3,n4 state=resume
sleep 1

# requeue after node failure (JobRequeue=1): job on n2, kill n2's slurmd
log "requeue after slurmd stop"
JOBS[nodefail]="$(sub -J nodefail -w n2 --wrap 'sleep 300')"
wait_state "${JOBS[nodefail]}" RUNNING 20
"$CL" stop-slurmd n2 >/dev/null
t0=$(date +%s.%N)
star="" down=""
for ((i = 0; i < 900; i++)); do
    st="$(sinfo -h -N -n n2 -o '%T' | head -n 1)"
    if [[ "$st" != "${prev_st:-}" ]]; then
        printf '+%s %s | %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$st" "$(scontrol show node n2 | grep -o 'State=[^ ]*')" >>"$WORK/n2-states.txt"
        prev_st="$st"
    fi
    if [[ -z "$star" && "$st" == *'*' ]]; then
        star=$(echo "$(date +%s.%N) - $t0" | bc)
        sinfo -h -N -o '%N %T' >"$OUT/sinfo-slurmd-stopped-notresponding.txt"
    fi
    if [[ -z "$down" && "$st" == down* ]]; then down=$(echo "$(date +%s.%N) - $t0" | bc); fi
    [[ -n "$down" && -s "$CAP/out/${JOBS[nodefail]}-epilog_slurmctld.env" ]] && break
    sleep 0.1
done
sinfo -h -N -o '%N %T' >"$OUT/sinfo-slurmd-stopped-down.txt"
sinfo -h -N -o '%N|%T|%E' >"$OUT/sinfo-slurmd-stopped-down-reason.txt"
scontrol show nodes -o >"$OUT/scontrol-nodes-slurmd-stopped.txt"
for ((i = 0; i < 300; i++)); do
    [[ -s "$CAP/out/${JOBS[nodefail]}-epilog_slurmctld.env" ]] && break
    sleep 0.1
done
requeue=$(echo "$(date +%s.%N) - $t0" | bc)
sleep 0.5
shell_job nodefail-requeued "${JOBS[nodefail]}"
echo "star=$star down=$down requeue_epilog=$requeue" >"$WORK/timings.txt"
log "timings: $(cat "$WORK/timings.txt")"
"$CL" start-slurmd n2 >/dev/null
scancel "${JOBS[nodefail]}" || true

log "waiting for the time-limit job"
wait_state "${JOBS[timeout]}" TIMEOUT 150
sleep 1
shell_job timeout "${JOBS[timeout]}"

log "sacct"
sleep 2
fmt=JobID,JobName,Partition,State,Start,End,NodeList,ExitCode
for c in completed exit3 sigkill cancelled timeout multinode array nodefail; do
    SLURM_TIME_FORMAT=%s sacct -j "${JOBS[$c]}" -P -n --format "$fmt" >"$OUT/sacct-$c.txt"
done
SLURM_TIME_FORMAT=%s sacct -a -P -n --format "$fmt,DerivedExitCode" >"$OUT/sacct-all.txt"
sacct -a -P -n --format "$fmt" >"$OUT/sacct-all-isotime.txt"

log "hook captures"
for c in "${!JOBS[@]}"; do hook_files "$c" "${JOBS[$c]}"; done
for t in 1 2 3; do
    id="$(scontrol show job -o "${JOBS[array]}_$t" | grep -o '^JobId=[0-9]*' | cut -d= -f2)"
    hook_files "array-task$t" "$id"
done
{
    printf 'case\tjobid\tSLURM_JOB_EXIT_CODE\tSLURM_JOB_EXIT_CODE2\tSLURM_JOB_DERIVED_EC\tSLURM_SCRIPT_CONTEXT\tJobState\tExitCode\tReason'
    # newer versions: the times from the environment and the state from scontrol --json
    [[ "$V" == 22.05 ]] || printf '\tSLURM_JOB_START_TIME\tSLURM_JOB_END_TIME\tjson job_state'
    printf '\n'
    for c in $(printf '%s\n' "${!JOBS[@]}" | sort); do
        f="$CAP/out/${JOBS[$c]}-epilog_slurmctld.env"
        if [[ -f "$f" ]]; then
            j="${f%.env}.job"
            g() { grep -m1 "^$1=" "$f" | cut -d= -f2- || true; }
            o() { grep -o " $1=[^ ]*" "$j" | head -n 1 | cut -d= -f2- || true; }
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "$c" "${JOBS[$c]}" "$(g SLURM_JOB_EXIT_CODE)" "$(g SLURM_JOB_EXIT_CODE2)" \
                "$(g SLURM_JOB_DERIVED_EC)" "$(g SLURM_SCRIPT_CONTEXT)" "$(o JobState)" "$(o ExitCode)" "$(o Reason)"
            if [[ "$V" != 22.05 ]]; then
                printf '\t%s\t%s\t%s' "$(g SLURM_JOB_START_TIME)" "$(g SLURM_JOB_END_TIME)" \
                    "$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); s=j["jobs"][0]["job_state"]; print(",".join(s) if isinstance(s, list) else s)' "${f%.env}.json" 2>/dev/null || echo '?')"
            fi
            printf '\n'
        fi
    done
} >"$OUT/epilog-summary.tsv"
cp -a "$CAP/out" "$WORK/hook-out"
log "raw hook output kept in $WORK/hook-out"

log "hostnames table"
exprs=(
    'n1' 'n[1-3]' 'n[01-10]' 'n[1,3,5-7]' 'rack[1-2]-n[01-02]' 'a,b c' 'a,b' 'n[1-2],m[3-4]'
    'n[001-003]' 'n[8-11]' 'n[098-102]' 'node.a[1-2]' 'node[1-2].example.com' 'gpu[01-02]-ib'
    'n[3-1]' 'n[1-2' 'n1-2]' 'n[1-9:2]' 'n[]' 'n[a-c]' '' 'n[1-3],n2' 'n[1-2][1-2]' 'n[1-2]x[3-4]'
    'n[0-0]' 'n[9-10]' 'n[1,1]' 'N[1-2]' 'n[-1-2]' 'n[ 1-2]' 'n[1-2] m1' 'n[1-3]-ib,n5' 'x[00008-00010]'
)
: >"$OUT/hostnames.tsv"
: >"$OUT/hostnames-stderr.tsv"
for e in "${exprs[@]}"; do
    set +e
    o="$(scontrol show hostnames "$e" 2>"$WORK/hn.err")"
    rc=$?
    set -e
    printf '%s\t%s\t%s\n' "$e" "$rc" "$(printf '%s' "$o" | tr '\n' ' ')" >>"$OUT/hostnames.tsv"
    printf '%s\t%s\t%s\n' "$e" "$rc" "$(tr '\n' ' ' <"$WORK/hn.err")" >>"$OUT/hostnames-stderr.tsv"
done

log "ids: $(for c in $(printf '%s\n' "${!JOBS[@]}" | sort); do printf '%s=%s ' "$c" "${JOBS[$c]}"; done)"
printf '%s\n' "$(for c in $(printf '%s\n' "${!JOBS[@]}" | sort); do printf '%s=%s ' "$c" "${JOBS[$c]}"; done)" >"$WORK/ids.txt"
"$CL" down
log "done; fixtures in $OUT, scratch in $WORK"
