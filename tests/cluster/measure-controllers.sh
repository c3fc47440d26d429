#!/usr/bin/env bash
# Measures a pair of controllers on the real daemons (tests/cluster/FACTS-controllers.md):
#   SLURM=22.05|24.11|26.05 tests/cluster/measure-controllers.sh
# Brings up `cluster.sh up --controllers 2 2` with a PrologSlurmctld/EpilogSlurmctld that logs
# the host it runs on, then goes through: scontrol takeover, a wait for a failback, kill -9 of
# the controller in control, its return, a power-off and power-on of the backup. Prints what
# it sees (scontrol ping, the heartbeat's bytes, where the hooks ran, how long each change
# took) and copies the heartbeat after each transition to
# tests/fixtures/slurm-<ver>/heartbeat-<step>-<controller in control>.bin. Takes the cluster down at the end.
# Needs root and the test cluster to itself (run it under the cluster's lock).
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VER="${SLURM:-22.05}"
C="$REPO/tests/cluster/cluster.sh"
W=/var/tmp/cvslurm-cluster
M=/var/tmp/cvslurm-ctlmeasure
FIX="$REPO/tests/fixtures/slurm-$VER"
unset CVSLURM_CLUSTER_DIR
# with accounting (both controllers reach slurmdbd on the host through the bridge)
export WITH_DBD="${WITH_DBD:-1}"

say() { printf '== %s\n' "$*"; }
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
hb() { # print the heartbeat: hex, time, index, age
    local hex
    hex="$(od -An -v -tx1 "$W/state/heartbeat" | tr -d ' \n')"
    printf 'heartbeat %s: time %d (age %d s) index %d\n' "$hex" $((16#${hex:0:16})) \
        $(($(date +%s) - 16#${hex:0:16})) $((16#${hex:16:16}))
}
owner() { od -An -v -tx1 -j8 -N8 "$W/state/heartbeat" 2>/dev/null | tr -d ' \n' | sed 's/^0*//; s/^$/0/'; }
save() { # step: heartbeat-<step>-<the controller it names>.bin
    local f
    f="heartbeat-$1-ctl$(($(owner) + 1)).bin"
    cp "$W/state/heartbeat" "$FIX/$f"
    printf 'saved %s: ' "$f"
    hb
}
wait_owner() { # index timeout_s [t0] -> prints ms since t0 (default: now)
    local t0="${3:-$(date +%s%N)}" i
    for ((i = 0; i < $2 * 10; i++)); do
        [[ "$(owner)" == "$1" ]] && { ms "$t0"; return 0; }
        sleep 0.1
    done
    echo "never (after $2 s)"
    return 1
}
readyz() { # GET /readyz on both controllers (slurmctld serves HTTP on its port from 25.11)
    local k
    for k in 1 2; do
        printf 'GET http://10.99.0.%d:6817/readyz (ctl%d): %s\n' $((k + 1)) "$k" \
            "$(curl -s -m 3 -o /dev/null -w '%{http_code}' "http://10.99.0.$((k + 1)):6817/readyz" 2>&1 || true)"
    done
}
job() { # run one batch job to its end; print where its hooks ran
    local id
    : >"$M/hook.log"
    chmod 0666 "$M/hook.log"
    id="$("$W/bin/sbatch" --parsable -N1 -o /dev/null --wrap 'sleep 1')" || { echo "  sbatch failed"; return 0; }
    for ((i = 0; i < 300; i++)); do
        [[ "$(grep -c " $id\$" "$M/hook.log" || true)" -ge 2 ]] && break
        sleep 0.1
    done
    sed 's/^/  hook: /' "$M/hook.log"
}

mkdir -p "$FIX" "$M"
chmod 1777 "$M"
cat >"$M/hook.sh" <<'EOF'
#!/bin/sh
echo "$(date +%s.%N) $(hostname) ${SLURM_SCRIPT_CONTEXT:-?} $SLURM_JOB_ID" >>/var/tmp/cvslurm-ctlmeasure/hook.log
EOF
chmod 0755 "$M/hook.sh"
trap '"$C" down >/dev/null 2>&1 || true' EXIT
trap 'exit 1' TERM INT

say "Slurm $VER: up --controllers 2 2"
CVSLURM_HOOK="$M/hook.sh" SLURM="$VER" "$C" up --controllers 2 2
grep -E '^SlurmctldHost|^SlurmctldTimeout' /etc/slurm/slurm.conf
say "scontrol ping, ctl1 in control"
"$W/bin/scontrol" ping
save initial
readyz
say "a job with ctl1 in control"
job

say "scontrol takeover"
t0="$(date +%s%N)"
"$W/bin/scontrol" takeover
echo "scontrol takeover returned after $(ms "$t0") ms"
echo "heartbeat names ctl2 $(wait_owner 1 30 "$t0") ms after scontrol takeover started"
t1="$(date +%s%N)"
for ((i = 0; i < 100; i++)); do "$W/bin/squeue" -h >/dev/null 2>&1 && break; sleep 0.1; done
echo "squeue answers $(ms "$t1") ms later"
"$W/bin/scontrol" ping || true
save takeover
readyz
say "a job with ctl2 in control"
job
say "does ctl1 take control back by itself? (watch 30 s)"
for ((s = 0; s < 6; s++)); do
    sleep 5
    echo "after $(((s + 1) * 5)) s: heartbeat index $(owner); $("$W/bin/scontrol" ping 2>&1 | grep -o 'at ctl1 is [A-Z]*'); ctl1's slurmctld $(pid_of=$(cat "$W/run/slurmctld-ctl1.pid.ours" 2>/dev/null); [[ -n "$pid_of" ]] && kill -0 "$pid_of" 2>/dev/null && echo alive || echo gone)"
done
"$W/bin/scontrol" ping || true
hb
"$C" status | grep -E '^slurmctld|controllers' || true

if ! "$C" status | grep -q '^slurmctld-ctl1 .*running'; then
    say "ctl1's slurmctld is gone after the takeover: start it again (does it take control back?)"
    tail -n 5 "$W/hosts/ctl1/log/slurm/slurmctld.log"
    t0="$(date +%s%N)"
    "$C" start-slurmctld ctl1
    echo "start-slurmctld returned after $(ms "$t0") ms"
    echo "heartbeat names ctl1 $(wait_owner 0 40 "$t0" || true) ms after start-slurmctld began"
    "$W/bin/scontrol" ping || true
    save failback
    "$C" status | grep -E '^slurmctld' || true
    say "a job after the failback"
    job
fi

now="$(owner)"
ctl=$((now + 1))
say "kill -9 the slurmctld in control (ctl$ctl)"
t0="$(date +%s%N)"
"$C" kill-slurmctld "ctl$ctl"
other=$((1 - now))
echo "heartbeat names ctl$((other + 1)) $(wait_owner "$other" 60 "$t0") ms after the kill"
"$W/bin/scontrol" ping || true
save "kill$ctl"
say "a job after the kill"
job
say "ctl$ctl starts again: failback?"
t0="$(date +%s%N)"
"$C" start-slurmctld "ctl$ctl"
echo "start-slurmctld returned after $(ms "$t0") ms"
echo "heartbeat names ctl$ctl $(wait_owner "$now" 40 "$t0" || true) ms after start-slurmctld began"
"$W/bin/scontrol" ping || true
save "back$ctl"
job

say "power-off ctl2 (in control: ctl$(($(owner) + 1)))"
"$C" power-off ctl2
ip netns pids cvslurm-ctl2 | wc -l
"$W/bin/scontrol" ping || true
say "power-on ctl2"
"$C" power-on ctl2
"$W/bin/scontrol" ping || true
"$C" in-control
say "the harness's own commands: takeover, start-slurmctld ctl1 (failback), stop/start ctl2"
"$C" takeover
"$C" start-slurmctld ctl1
"$C" in-control
"$C" stop-slurmctld ctl2
"$W/bin/scontrol" ping || true
"$C" start-slurmctld ctl2
"$C" in-control
say "ctl1's own directories vs ctl2's"
"$C" exec ctl1 sh -c 'hostname; ls /run /var/log; cat /run/slurmctld.pid'
"$C" exec ctl2 sh -c 'hostname; ls /run /var/log; cat /run/slurmctld.pid'
say "accounting (slurmdbd reached from both controllers): the jobs in sacct"
"$W/bin/sacct" -n -X -o JobID,State,NodeList 2>&1 | tail -n 8 || true
say "slurmctld logs (takeover lines)"
grep -hiE 'takeover|control|backup|primary' "$W"/hosts/ctl*/log/slurm/slurmctld.log | tail -n 40 || true
say down
"$C" down
trap - EXIT
echo "netns left: $(ip netns | grep -c cvslurm || true); cvslurm mounts left: $(findmnt -rn -o TARGET | grep -c cvslurm-cluster || true)"
