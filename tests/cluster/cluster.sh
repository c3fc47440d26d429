#!/usr/bin/env bash
# Real multi-node Slurm test cluster on one machine (one network namespace per node).
#
# Usage: tests/cluster/cluster.sh <command> [args]
#   up [--reuse] [--controllers 2] [N]
#                        full `down`, then start munged, (MariaDB + slurmdbd), slurmctld and
#                        N static nodes n1..nN (default 4), wait until they are idle.
#                        --reuse: keep the running cluster instead when it was brought up with
#                        the same settings (N, SLURM and the variables below) and is still as
#                        `up` left it (every daemon alive, same slurm.conf, partitions and
#                        nodes): its jobs are cancelled and every slurmd restarted (what a
#                        test mounted in a slurmd's namespace is gone); else a full `up`
#   down                 stop everything this script started (by PID), delete namespaces,
#                        bridge and managed /etc/slurm files; idempotent
#   status               print what is running (and the settings `up` was given)
#   add-node NAME        start a dynamic node (slurmd -Z) in a new namespace, wait for sinfo
#   del-node NAME        stop a dynamic node's slurmd, scontrol delete it, remove namespace
#   stop-slurmd NAME     stop one node's slurmd (node becomes idle*/down* after SlurmdTimeout)
#   start-slurmd NAME    start it again (ReturnToService=2 brings the node back)
#   restart-slurmctld    stop slurmctld and start it again from /etc/slurm/slurm.conf; returns
#                        once every node with a running slurmd answers it again; fails (with
#                        its log) when it does not come up or a node does not come back
#   exec NAME CMD...     run CMD inside NAME's namespace with NAME as hostname
#   wait-idle [TIMEOUT]  wait until all static nodes are idle (default 60 s)
#
# Two controllers (`up --controllers 2 [N]`, a Slurm HA pair; the default is one, as above):
#   ctl1 (primary) and ctl2 (backup) are two "hosts": each its own network namespace
#   (cvslurm-ctlK, eth0 10.99.0.(1+K) on the bridge), hostname, munged and slurmctld, and its
#   own local /opt, /var/spool, /run, /var/log and /etc/hosts (bind mounts of
#   $CVSLURM_CLUSTER_DIR/hosts/ctlK/* in a private mount namespace, made again for every
#   process started in it: what one controller writes there the other never sees).
#   StateSaveLocation ($CVSLURM_CLUSTER_DIR/state) is one directory both see, as NFS gives
#   them; SlurmctldTimeout is 10 s (as with one controller). slurmctld's log:
#   hosts/ctlK/log/slurm/slurmctld.log. `up --reuse` always brings a pair up afresh.
#   in-control           print the controller in control (from StateSaveLocation/heartbeat)
#   stop-slurmctld CTL   stop CTL's slurmctld gracefully (SIGTERM; the other one takes over
#                        after SlurmctldTimeout)
#   kill-slurmctld CTL   kill -9 CTL's slurmctld (slurmscriptd and running hooks die with it)
#   start-slurmctld CTL  start CTL's slurmctld (and its munged); wait until it answers ping
#   takeover             `scontrol takeover` (the backup takes control); wait until the
#                        heartbeat names it, print how long that took
#   power-off CTL        kill -9 every process in CTL's namespaces (slurmctld, munged, hooks,
#                        whatever `exec CTL` started), as a power cut
#   power-on CTL         start CTL's munged and slurmctld again (same local directories)
#   exec CTL CMD...      run CMD as on that host (its namespaces, hostname, directories)
#   restart-slurmctld    stop both, start ctl1 then ctl2
#
# Environment:
#   CVSLURM_CLUSTER_DIR  work dir (default /var/tmp/cvslurm-cluster)
#   CVSLURM_HOOK         if set: PrologSlurmctld=EpilogSlurmctld=$CVSLURM_HOOK
#   CVSLURM_HOOKS        which of the two get it: both (default) or prolog (PrologSlurmctld only)
#   WITH_DBD=1           MariaDB + slurmdbd, AccountingStorageType=accounting_storage/slurmdbd
#   CLUSTER_NAME         default cvtest
#   MIN_JOB_AGE          default 5 (seconds a finished job stays visible to scontrol)
#   MAX_JOB_COUNT        default 10000, Slurm's (MaxJobCount: the most jobs slurmctld holds;
#                        tests/bench/array.py --held raises it)
#   MAX_ARRAY_SIZE       default 1001, Slurm's (MaxArraySize)
#   MAX_JOB_ID           if set: Slurm's MaxJobId (ids start over at FirstJobId=1 past it;
#                        tests/bench/idreuse.py)
#   BF_INTERVAL          seconds between backfill passes (default: Slurm's, 30). Heterogeneous
#                        jobs are started only by backfill, as is a pending job no other event
#                        schedules before the periodic pass (60 s)
#   HEALTH_CHECK         if set: HealthCheckProgram=$HEALTH_CHECK, HealthCheckInterval=3600
#                        (slurmd runs it at its start, before it registers: `cvslurm publish`)
#   JOBCOMP_LOC          a URL: JobCompType=jobcomp/elasticsearch, JobCompLoc=that URL (default
#                        jobcomp/none)
#   SLURMD_TIMEOUT       default 30 (seconds until a silent slurmd makes its node DOWN). Not
#                        less: measured on 24.11 (CI), slurmctld's ping of a node whose slurmd
#                        is gone keeps retrying the refused connection for about 15 s, and no
#                        other ping pass runs meanwhile, so with 5 s every other node went
#                        stale and DOWN ("Nodes n[1-3] not responding") while one slurmd was
#                        stopped, again at every pass.
#   SLURMCTLD_DEBUG      default info (slurmctld's log level: debug, debug2, … to see its RPCs)
#   WITH_GPUS=1          8 GPUs per static node as GRES (gres.conf over device nodes in the work dir)
#   FORCE=1              overwrite an unmanaged /etc/slurm/slurm.conf (backed up, restored on down)
#   SLURM                22.05 (default: the host's Debian 12 packages), 24.11 (Debian trixie) or
#                        26.05 (Debian sid); the last two run every daemon chrooted into a root
#                        filesystem built once by tests/cluster/rootfs.sh (cached, < 1 s when built)
#   CVSLURM_SHARE        more host directories (space-separated) to bind into the root filesystem
#   CVSLURM_CTL_OPT      a pair only: a directory copied (cp -a) into each controller's own /opt
#                        before its slurmctld first starts (cvslurm installed on every
#                        controller before slurm.conf names the hook)
#
# RebootProgram ($CVSLURM_CLUSTER_DIR/reboot-node, `sbatch --reboot`, `scontrol reboot`)
# restarts a static node's slurmd with -b; while run/reboot-NODE.hold exists (at most 60 s)
# the node stays down.
#
# Every version: $CVSLURM_CLUSTER_DIR/bin holds the version's own commands (sbatch, squeue,
# scontrol, sacct, srun, salloc, sinfo, scancel, sacctmgr, slurmctld -V...): put it first in
# PATH, or use it as SlurmBinDir; they work on the host and inside the root filesystem alike.
# With a root filesystem, these host paths are bind-mounted into it at the same place, so the
# hooks of the chrooted slurmctld and the jobs on the chrooted slurmd see them: /etc/slurm,
# /tmp, /var/tmp, the repository, the cluster dir and $CVSLURM_SHARE.
#
# Node I (index I, static nodes 1..N, dynamic nodes get the next free index) has:
#   netns  cvslurm-<name>, root-side veth cvh<I> on bridge cvbr0 (10.99.0.1/24)
#   eth0   veth        MAC 02:99:00:00:<II>:01  10.99.0.(10+I)/24
#   ens1f0 macvlan     MAC 02:99:00:00:<II>:02  10.98.I.1/24 + secondary 10.98.I.2/24
#   virbr0 bridge      MAC 02:99:00:00:<II>:03  10.97.I.1/24   (excluded by name filter)
#   ens2   macvlan     MAC 02:99:00:00:<II>:04  no IPv4        (skipped by "require IP")
#   (<II> = I as two lower-case hex digits; ens1f0/ens2 are macvlans on eth0 because this
#   kernel has no dummy links; they also get IPv6 link-local addresses)
set -euo pipefail

readonly MARKER="# managed by cvslurm tests/cluster/cluster.sh"
readonly W="${CVSLURM_CLUSTER_DIR:-/var/tmp/cvslurm-cluster}"
readonly LOCK=/run/cvslurm-cluster.lock
readonly ETC=/etc/slurm
readonly BRIDGE=cvbr0
readonly BRIDGE_IP=10.99.0.1
readonly NS_PREFIX=cvslurm-
readonly DB_NAME=cvslurm_acct_db
readonly DB_USER=cvslurm
readonly DB_PASS=cvslurm
readonly MYSQL_SOCK=/run/mysqld/mysqld.sock
# sh -c script used to enter a node ($0 = hostname, $1 = root filesystem or ""): set the
# (private UTS) hostname; with a root filesystem, mount a sysfs of the node's own network
# namespace on its /sys (in the private mount namespace of `ip netns exec`), then exec the
# command chrooted with a clean environment
# shellcheck disable=SC2016
readonly ENTER='h=$0 r=$1; shift; hostname "$h" || exit 112
[ -z "$r" ] && exec "$@"
mount -t sysfs sysfs "$r/sys" || exit 111
exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root "$@"'
# sh -c script used to enter a controller of a pair ($0 = hostname, $1 = root filesystem or "",
# $2 = the controller's own directory): as ENTER, after binding its local directories over
# /opt, /var/spool, /run, /var/log and /etc/hosts (in the private mount namespace of
# `ip netns exec`, so only this process and its children see them)
# shellcheck disable=SC2016
readonly ENTER_CTL='h=$0 r=$1 d=$2; shift 2; hostname "$h" || exit 112
mount --bind "$d/opt" "$r/opt" && mount --bind "$d/spool" "$r/var/spool" &&
mount --bind "$d/run" "$r/run" && mount --bind "$d/log" "$r/var/log" &&
mount --bind "$d/hosts" "$r/etc/hosts" || exit 113
[ -z "$r" ] && exec "$@"
mount -t sysfs sysfs "$r/sys" || exit 111
exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root "$@"'
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly REPO
readonly CLIENTS="sbatch squeue scontrol sacct srun salloc sinfo scancel sacctmgr sstat sprio sshare sreport sdiag"
CLUSTER_NAME="${CLUSTER_NAME:-cvtest}"
CTLD_HOST="$(hostname -s)"
SLURM_VER="${SLURM:-22.05}"
# R: the root filesystem the daemons run in ("" = the host's own Slurm 22.05)
R=""
# NCTL: how many controllers (1, or 2 with `up --controllers 2`)
NCTL=1
if [[ "${1:-}" != up ]]; then
    [[ -s "$W/run/cluster.name" ]] && CLUSTER_NAME="$(cat "$W/run/cluster.name")"
    [[ -s "$W/run/slurm.version" ]] && SLURM_VER="$(cat "$W/run/slurm.version")"
    [[ -s "$W/run/rootfs" ]] && R="$(cat "$W/run/rootfs")"
    [[ -s "$W/run/controllers" ]] && NCTL="$(cat "$W/run/controllers")"
fi
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset SLURM_CONF SLURM
# Descriptors inherited from the caller (the lock of `flock LOCK cluster.sh up`) must not pass
# to the daemons, which outlive this script and would keep the lock. 255: bash's own script.
for _fd in /proc/$$/fd/*; do
    _fd="${_fd##*/}"
    if [[ "$_fd" =~ ^[0-9]+$ ]] && ((_fd > 2 && _fd != 255)); then eval "exec $_fd>&-"; fi
done
unset _fd

log() { printf '[cluster] %s\n' "$*"; }
warn() { printf '[cluster] WARNING: %s\n' "$*" >&2; }

show_logs() {
    local f
    for f in "$W/log/slurmctld.log" "$W"/hosts/ctl*/log/slurm/slurmctld.log "$W/log/slurmdbd.log" "$W/log"/slurmd-*.log "$W/log/mariadb.out" "$W/mariadb/mariadb.log"; do
        [[ -s "$f" ]] || continue
        printf '===== tail %s =====\n' "$f" >&2
        grep -v -e 'mpi/pmix' -e 'MPI: Cannot create context' "$f" | tail -n 12 >&2 || true
    done
}

die() {
    printf '[cluster] ERROR: %s\n' "$*" >&2
    show_logs
    exit 1
}

# error without log dump (usage errors, bad arguments)
fail() {
    printf '[cluster] ERROR: %s\n' "$*" >&2
    exit 1
}

need_root() { [[ "$(id -u)" -eq 0 ]] || fail "must run as root"; }

take_lock() {
    exec 9>"$LOCK"
    flock -w 300 9 || die "could not get lock $LOCK (another cluster.sh running?)"
}

# ---------- node bookkeeping ----------
# $W/nodes/<name> contains: NAME= IDX= NS= DYN=0|1
node_file() { printf '%s/nodes/%s' "$W" "$1"; }
node_exists() { [[ -f "$(node_file "$1")" ]]; }
node_get() { # name key
    local line
    line="$(grep -E "^$2=" "$(node_file "$1")")" || return 1
    printf '%s' "${line#*=}"
}
all_nodes() { # sorted by index
    local f
    [[ -d "$W/nodes" ]] || return 0
    for f in "$W/nodes"/*; do
        [[ -f "$f" ]] || continue
        printf '%s %s\n' "$(grep '^IDX=' "$f" | cut -d= -f2)" "${f##*/}"
    done | sort -n | awk '{print $2}'
}
static_nodes() { local n; for n in $(all_nodes); do [[ "$(node_get "$n" DYN)" == 0 ]] && printf '%s\n' "$n"; done; return 0; }
dbd_active() { if [[ -f "$W/run/dbd.used" ]]; then echo 1; else echo 0; fi; }
hexidx() { printf '%02x' "$1"; }
node_ip() { printf '10.99.0.%d' $((10 + $1)); }
node_mac() { printf '02:99:00:00:%s:%s' "$(hexidx "$1")" "$2"; }

write_nodes_desc() {
    local n idx ns dyn first=1 json="" env
    env="# generated by cluster.sh; source it from bash
CLUSTER_NAME=$CLUSTER_NAME
CTLD_HOST=$CTLD_HOST
CTLD_ADDR=$BRIDGE_IP
BRIDGE=$BRIDGE
CLUSTER_DIR=$W
WITH_DBD=$(dbd_active)
NODES=\"$(all_nodes | tr '\n' ' ' | sed 's/ $//')\"
STATIC_NODES=\"$(static_nodes | tr '\n' ' ' | sed 's/ $//')\"
"
    for n in $(all_nodes); do
        idx="$(node_get "$n" IDX)"; ns="$(node_get "$n" NS)"; dyn="$(node_get "$n" DYN)"
        env+="NODE_${n}_INDEX=$idx
NODE_${n}_NETNS=$ns
NODE_${n}_DYNAMIC=$dyn
NODE_${n}_ETH0_MAC=$(node_mac "$idx" 01)
NODE_${n}_ETH0_IP=$(node_ip "$idx")
NODE_${n}_ENS1F0_MAC=$(node_mac "$idx" 02)
NODE_${n}_ENS1F0_IPS=\"10.98.$idx.1 10.98.$idx.2\"
NODE_${n}_VIRBR0_MAC=$(node_mac "$idx" 03)
NODE_${n}_VIRBR0_IP=10.97.$idx.1
NODE_${n}_ENS2_MAC=$(node_mac "$idx" 04)
"
        [[ $first == 1 ]] || json+=","
        first=0
        json+="
    {\"name\": \"$n\", \"index\": $idx, \"netns\": \"$ns\", \"dynamic\": $([[ $dyn == 1 ]] && echo true || echo false),
     \"interfaces\": [
       {\"name\": \"eth0\", \"mac\": \"$(node_mac "$idx" 01)\", \"ipv4\": [\"$(node_ip "$idx")/24\"]},
       {\"name\": \"ens1f0\", \"mac\": \"$(node_mac "$idx" 02)\", \"ipv4\": [\"10.98.$idx.1/24\", \"10.98.$idx.2/24\"]},
       {\"name\": \"virbr0\", \"mac\": \"$(node_mac "$idx" 03)\", \"ipv4\": [\"10.97.$idx.1/24\"]},
       {\"name\": \"ens2\", \"mac\": \"$(node_mac "$idx" 04)\", \"ipv4\": []}
     ]}"
    done
    local ctls="" c k
    if ((NCTL > 1)); then
        # a pair: the controllers, in SlurmctldHost order (the host keeps CTLD_HOST/CTLD_ADDR)
        env+="CONTROLLERS=\"$(ctl_names | tr '\n' ' ' | sed 's/ $//')\"
"
        for c in $(ctl_names); do
            k="${c#ctl}"
            env+="CTL_${c}_INDEX=$((k - 1))
CTL_${c}_ADDR=$(ctl_ip "$k")
CTL_${c}_NETNS=$(ctl_ns "$c")
CTL_${c}_DIR=$(ctl_dir "$c")
"
            ctls+="${ctls:+, }{\"host\": \"$c\", \"addr\": \"$(ctl_ip "$k")\", \"netns\": \"$(ctl_ns "$c")\", \"dir\": \"$(ctl_dir "$c")\"}"
        done
        ctls="
  \"controllers\": [$ctls],"
    fi
    printf '%s' "$env" >"$W/nodes.env.tmp" && mv "$W/nodes.env.tmp" "$W/nodes.env"
    printf '{\n  "cluster_name": "%s",\n  "controller": {"host": "%s", "addr": "%s"},%s\n  "bridge": "%s",\n  "with_dbd": %s,\n  "nodes": [%s\n  ]\n}\n' \
        "$CLUSTER_NAME" "$CTLD_HOST" "$BRIDGE_IP" "$ctls" "$BRIDGE" "$([[ $(dbd_active) == 1 ]] && echo true || echo false)" "$json" \
        >"$W/nodes.json.tmp" && mv "$W/nodes.json.tmp" "$W/nodes.json"
}

# ---------- the root filesystem (SLURM=24.11|26.05) ----------
# inroot CMD...: CMD from the version's Slurm (chrooted into R, clean environment), else the host's
inroot() {
    if [[ -n "$R" ]]; then
        chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root "$@"
    else
        "$@"
    fi
}

# the host paths that hooks and jobs inside R need, at the same place
shared_paths() {
    local p
    printf '%s\n' /etc/slurm /tmp /var/tmp "$REPO" "$W"
    for p in ${CVSLURM_SHARE:-}; do [[ "$p" == /* ]] && printf '%s\n' "$p"; done
    return 0
}

mount_rootfs() {
    local p d skip
    local -a done_paths=()
    mountpoint -q "$R/proc" || mount -t proc proc "$R/proc"
    mountpoint -q "$R/sys" || mount -t sysfs sysfs "$R/sys"
    if ! mountpoint -q "$R/dev"; then
        mount --rbind /dev "$R/dev"
        mount --make-rslave "$R/dev"
    fi
    mkdir -p /etc/slurm
    while read -r p; do
        p="$(realpath -m "$p")"
        skip=0
        for d in "${done_paths[@]}"; do [[ "$p" == "$d" || "$p" == "$d"/* ]] && skip=1; done
        [[ $skip == 0 && -d "$p" ]] || continue
        mkdir -p "$R$p"
        mountpoint -q "$R$p" || mount --bind "$p" "$R$p"
        done_paths+=("$p")
    done < <(shared_paths | awk '{ print length($0), $0 }' | sort -n | cut -d' ' -f2-)
    # the host's names, so munged and slurmctld resolve the controller as on the host; and
    # every cluster address, because slurmctld 24.11+ names the host of each allocation and
    # submission by a reverse lookup of its peer address: left to DNS, one dropped query costs
    # 5 s (resolv.conf's timeout), MessageTimeout here, and srun or sbatch gives up with
    # "Socket timed out on send/recv operation" (measured: 100 concurrent lookups of
    # 10.99.0.1 against this machine's resolver, the slowest took 5.1 s)
    {
        cat /etc/hosts
        echo "$MARKER"
        echo "$BRIDGE_IP $CTLD_HOST"
        local i
        for ((i = 1; i <= 64; i++)); do echo "$(node_ip "$i") n$i"; done
        for ((i = 1; i <= NCTL && NCTL > 1; i++)); do echo "$(ctl_ip "$i") ctl$i"; done
    } >"$R/etc/hosts"
}

umount_rootfs() { # everything mounted under $1, deepest first
    local root="$1" m
    [[ -n "$root" && -d "$root" ]] || return 0
    while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || warn "could not unmount $m"
    done < <(awk -v r="$root/" 'index($2, r) == 1 { print length($2), $2 }' /proc/self/mounts | sort -rn | cut -d' ' -f2-)
}

# $W/bin: the version's own commands, usable from the host and from inside R alike
write_wrappers() {
    local c dir="$W/bin" path
    rm -rf "$dir"
    mkdir -p "$dir"
    if [[ -n "$R" ]]; then
        # cvslurm run as root drops to SlurmUser (StateDir's owner) before it calls Slurm, as
        # the hooks run as SlurmUser: the wrappers must chroot for SlurmUser too. A copy of
        # chroot with CAP_SYS_CHROOT, usable by root and group slurm only, removed by `down`
        # (test machines only).
        install -m 0750 -o root -g slurm /usr/sbin/chroot "$dir/.chroot"
        setcap cap_sys_chroot+ep "$dir/.chroot" || die "setcap cap_sys_chroot on $dir/.chroot failed (libcap2-bin)"
    fi
    for c in $CLIENTS slurmctld slurmd slurmdbd; do
        case "$c" in slurmctld | slurmd | slurmdbd) path=/usr/sbin/$c ;; *) path=/usr/bin/$c ;; esac
        if [[ -n "$R" ]]; then
            # shellcheck disable=SC2016
            printf '#!/bin/sh\n# Slurm %s: %s from %s (tests/cluster/cluster.sh)\n[ -e /.cvslurm-rootfs ] && exec %s "$@"\nexec %s %s /bin/sh -c '"'"'cd "$0" 2>/dev/null || cd /; exec "$@"'"'"' "$PWD" %s "$@"\n' \
                "$SLURM_VER" "$c" "$R" "$path" "$dir/.chroot" "$R" "$path" >"$dir/$c"
        else
            # shellcheck disable=SC2016
            printf '#!/bin/sh\n# Slurm %s: the host'"'"'s %s (tests/cluster/cluster.sh)\nexec %s "$@"\n' "$SLURM_VER" "$c" "$path" >"$dir/$c"
        fi
        chmod 0755 "$dir/$c"
    done
}

# ---------- process helpers ----------
# alive = exists and is not a zombie waiting for PID 1 to reap it
pid_alive() {
    [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null || return 1
    local st
    st="$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" || return 1
    [[ -n "$st" && "$st" != Z ]]
}

# stop_pidfiles FILE:COMM...: TERM all (only if /proc/PID/comm still matches), wait up to
# 10 s, then KILL the rest. Removes the pid files.
stop_pidfiles() {
    local spec f comm pid i alive
    local -a pids=() names=()
    for spec in "$@"; do
        f="${spec%%:*}"; comm="${spec#*:}"
        [[ -f "$f" ]] || continue
        pid="$(cat "$f" 2>/dev/null || true)"
        rm -f "$f"
        pid_alive "$pid" || continue
        if [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$comm"* ]]; then
            warn "pid $pid from $f is not $comm any more; not killing"
            continue
        fi
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid"); names+=("$comm")
    done
    [[ ${#pids[@]} -gt 0 ]] || return 0
    for ((i = 0; i < 100; i++)); do
        alive=0
        for pid in "${pids[@]}"; do pid_alive "$pid" && alive=1; done
        [[ $alive == 1 ]] || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        if pid_alive "$pid"; then
            warn "pid $pid ignored SIGTERM for 10 s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    log "stopped ${names[*]} (pids ${pids[*]}) in $((i / 10)).$((i % 10)) s"
}

# kill every process living in network namespace $1 (all of them were started by us)
kill_netns_pids() {
    local ns="$1" pids i
    pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)"
    [[ -n "${pids// /}" ]] || return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < 30; i++)); do
        pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)"
        [[ -n "${pids// /}" ]] || return 0
        sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
}

# ---------- /etc/slurm management ----------
managed_files() { printf '%s\n' slurm.conf cgroup.conf slurmdbd.conf gres.conf; }

claim_etc_file() { # refuse to overwrite unmanaged files unless FORCE=1
    local f="$ETC/$1"
    [[ -e "$f" ]] || return 0
    head -n 1 "$f" | grep -qxF "$MARKER" && return 0
    if [[ "${FORCE:-0}" == 1 ]]; then
        mkdir -p "$W/etc-backup"
        cp -a "$f" "$W/etc-backup/$1"
        log "backed up unmanaged $f to $W/etc-backup/$1 (FORCE=1)"
    else
        fail "$f exists and is not managed by this script (no marker line); set FORCE=1 to back it up and overwrite"
    fi
}

release_etc_files() {
    local b f
    while read -r b; do
        f="$ETC/$b"
        if [[ -e "$f" ]] && head -n 1 "$f" | grep -qxF "$MARKER"; then
            rm -f "$f"
        fi
        if [[ -e "$W/etc-backup/$b" ]]; then
            if [[ -e "$f" ]]; then
                warn "$f exists and is not ours; leaving backup in $W/etc-backup/$b"
            else
                mv "$W/etc-backup/$b" "$f"
                log "restored $f from backup"
            fi
        fi
    done < <(managed_files)
    rmdir "$W/etc-backup" 2>/dev/null || true
}

# ---------- network ----------
setup_bridge() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$BRIDGE_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
}

create_node_netns() { # name idx
    local name="$1" idx="$2" ns="$NS_PREFIX$1" hv="cvh$2" tmp="cvn$2"
    ip netns del "$ns" 2>/dev/null || true
    ip link del "$hv" 2>/dev/null || true
    ip netns add "$ns"
    ip link add "$hv" type veth peer name "$tmp"
    ip link set "$hv" master "$BRIDGE"
    ip link set "$hv" up
    ip link set "$tmp" netns "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$tmp" name eth0
    ip -n "$ns" link set eth0 address "$(node_mac "$idx" 01)"
    ip -n "$ns" addr add "$(node_ip "$idx")/24" dev eth0
    ip -n "$ns" link set eth0 up
    # this kernel has no "dummy" link type: the data interfaces are macvlans on eth0,
    # virbr0 is an (empty) bridge like the libvirt one
    ip -n "$ns" link add ens1f0 link eth0 address "$(node_mac "$idx" 02)" type macvlan mode bridge
    ip -n "$ns" addr add "10.98.$idx.1/24" dev ens1f0
    ip -n "$ns" addr add "10.98.$idx.2/24" dev ens1f0
    ip -n "$ns" link set ens1f0 up
    ip -n "$ns" link add virbr0 address "$(node_mac "$idx" 03)" type bridge
    ip -n "$ns" addr add "10.97.$idx.1/24" dev virbr0
    ip -n "$ns" link set virbr0 up
    ip -n "$ns" link add ens2 link eth0 address "$(node_mac "$idx" 04)" type macvlan mode bridge
    ip -n "$ns" link set ens2 up
    mkdir -p "$W/nodes"
    printf 'NAME=%s\nIDX=%s\nNS=%s\nDYN=%s\n' "$name" "$idx" "$ns" "${3:-0}" >"$(node_file "$name")"
}

delete_node_netns() { # name
    local name="$1" ns idx
    ns="$(node_get "$name" NS 2>/dev/null || printf '%s%s' "$NS_PREFIX" "$name")"
    idx="$(node_get "$name" IDX 2>/dev/null || true)"
    kill_netns_pids "$ns"
    ip netns del "$ns" 2>/dev/null || true
    [[ -z "$idx" ]] || ip link del "cvh$idx" 2>/dev/null || true
    rm -f "$(node_file "$name")"
}

# ---------- daemons ----------
# Daemons of a root filesystem run chrooted with a clean environment; ROOTED is that prefix.
rooted() { if [[ -n "$R" ]]; then ROOTED=(chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root); else ROOTED=(); fi; }

munge_ok() { inroot sh -c 'munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1'; }

start_munged() {
    if [[ -S "$R/run/munge/munge.socket.2" ]] && munge_ok; then
        log "munged already running (not started by us, will not stop it)"
        return 0
    fi
    # the version's own munge user (ids differ between the host and a root filesystem)
    inroot install -d -o munge -g munge -m 0755 /run/munge
    rm -f "$R/run/munge/munged.pid"
    inroot runuser -u munge -- /usr/sbin/munged --force 9>&-
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s "$R/run/munge/munged.pid" ]] && munge_ok && break
        sleep 0.1
    done
    [[ -s "$R/run/munge/munged.pid" ]] || die "munged did not start (see $R/var/log/munge/munged.log)"
    cp "$R/run/munge/munged.pid" "$W/run/munged.pid.ours"
    log "munged started (pid $(cat "$W/run/munged.pid.ours"))"
}

# MariaDB: the host's on its socket; a root filesystem's with its own my.cnf defaults (trixie
# /run/mysqld, sid /run/mariadbd: forcing one socket breaks the other's clients)
db_admin() { if [[ -n "$R" ]]; then inroot mariadb-admin "$@"; else mysqladmin --socket="$MYSQL_SOCK" "$@"; fi; }
db_sql() { if [[ -n "$R" ]]; then inroot mariadb -u root "$@"; else mysql --socket="$MYSQL_SOCK" -u root "$@"; fi; }

start_mariadb() {
    if db_admin ping >/dev/null 2>&1; then
        log "MariaDB already running (not started by us, will not stop it)"
    else
        local -a sock=()
        if [[ -n "$R" ]]; then
            inroot install -d -o mysql -g mysql -m 0755 /run/mysqld /run/mariadbd "$W/mariadb"
        else
            install -d -o mysql -g mysql -m 0755 /run/mysqld "$W/mariadb"
            sock=(--socket="$MYSQL_SOCK")
        fi
        rooted
        setsid "${ROOTED[@]}" /usr/sbin/mariadbd --user=mysql --skip-networking "${sock[@]}" \
            --pid-file="$W/mariadb/mariadbd.pid" --log-error="$W/mariadb/mariadb.log" </dev/null >>"$W/log/mariadb.out" 2>&1 9>&- &
        echo $! >"$W/run/mariadbd.pid.ours"
        local i
        for ((i = 0; i < 300; i++)); do
            db_admin ping >/dev/null 2>&1 && break
            pid_alive "$(cat "$W/run/mariadbd.pid.ours")" || die "mariadbd exited"
            sleep 0.1
        done
        db_admin ping >/dev/null 2>&1 || die "MariaDB did not come up"
        log "MariaDB started (pid $(cat "$W/run/mariadbd.pid.ours"))"
    fi
    db_sql <<EOF
DROP DATABASE IF EXISTS $DB_NAME;
CREATE DATABASE $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON $DB_NAME.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;
EOF
    log "accounting database $DB_NAME recreated"
}

start_slurmdbd() {
    rooted
    setsid "${ROOTED[@]}" /usr/sbin/slurmdbd -D </dev/null >>"$W/log/slurmdbd.out" 2>&1 9>&- &
    echo $! >"$W/run/slurmdbd.pid.ours"
    local i
    for ((i = 0; i < 300; i++)); do
        inroot sacctmgr -n -P list cluster >/dev/null 2>&1 && break
        pid_alive "$(cat "$W/run/slurmdbd.pid.ours")" || die "slurmdbd exited"
        sleep 0.1
    done
    inroot sacctmgr -n -P list cluster >/dev/null 2>&1 || die "slurmdbd did not answer"
    inroot sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
    log "slurmdbd started (pid $(cat "$W/run/slurmdbd.pid.ours")), cluster $CLUSTER_NAME registered"
}

ctld_up() { inroot scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurmctld() {
    rooted
    setsid "${ROOTED[@]}" /usr/sbin/slurmctld -D -s </dev/null >>"$W/log/slurmctld.out" 2>&1 9>&- &
    echo $! >"$W/run/slurmctld.pid.ours"
    local i
    for ((i = 0; i < 300; i++)); do
        ctld_up && break
        pid_alive "$(cat "$W/run/slurmctld.pid.ours")" || die "slurmctld exited"
        sleep 0.1
    done
    ctld_up || die "slurmctld did not answer"
    log "slurmctld started (pid $(cat "$W/run/slurmctld.pid.ours"))"
}

start_slurmd() { # name
    local name="$1" ns dyn idx
    node_exists "$name" || fail "unknown node $name"
    ns="$(node_get "$name" NS)"; dyn="$(node_get "$name" DYN)"; idx="$(node_get "$name" IDX)"
    if pid_alive "$(cat "$W/run/slurmd-$name.pid.ours" 2>/dev/null || true)"; then
        log "slurmd $name already running"
        return 0
    fi
    install -d -o root -g root "$W/spool/$name"
    local -a args=(/usr/sbin/slurmd -D -s -N "$name")
    if [[ "$dyn" == 1 ]]; then
        args+=(-Z --conf "NodeAddr=$(node_ip "$idx") CPUs=8 RealMemory=1000")
    fi
    setsid ip netns exec "$ns" unshare --uts -- sh -c "$ENTER" "$name" "$R" "${args[@]}" \
        </dev/null >>"$W/log/slurmd-$name.out" 2>&1 9>&- &
    echo $! >"$W/run/slurmd-$name.pid.ours"
}

stop_slurmd() { # name
    stop_pidfiles "$W/run/slurmd-$1.pid.ours:slurmd"
}

# note: `sinfo -n NODE` can report a stale state (seen: mixed* for 80 s after the node was
# DOWN), so filter the full node list instead
node_state() { inroot sinfo -h -N -o '%N %T' 2>/dev/null | awk -v n="$1" '$1 == n { print $2; exit }'; }

wait_nodes_idle() { # timeout nodes...
    local timeout="$1" n st ok start
    shift
    start=$SECONDS
    while :; do
        ok=1
        for n in "$@"; do
            st="$(node_state "$n")"
            [[ "$st" == idle ]] || { ok=0; break; }
        done
        [[ $ok == 1 ]] && return 0
        ((SECONDS - start < timeout)) || return 1
        sleep 0.2
    done
}

# ---------- two controllers (up --controllers 2) ----------
ctl_names() { local i; for ((i = 1; i <= NCTL && NCTL > 1; i++)); do echo "ctl$i"; done; }
ctl_ip() { printf '10.99.0.%d' $((1 + $1)); }
ctl_ns() { printf '%s%s' "$NS_PREFIX" "$1"; }
ctl_dir() { printf '%s/hosts/%s' "$W" "$1"; }
ctl_pidfile() { printf '%s/run/slurmctld-%s.pid.ours' "$W" "$1"; }
is_ctl() { ctl_names | grep -qxF -- "$1"; }
need_ctl() { # name
    ((NCTL > 1)) || fail "the cluster has one controller (bring it up with: up --controllers 2)"
    is_ctl "${1:-}" || fail "unknown controller '${1:-}' (want one of: $(ctl_names | tr '\n' ' '))"
}

# CTL's own local directories and its network namespace (eth0 on the bridge, no data links)
create_ctl() { # name
    local name="$1" k="${1#ctl}" ns d f
    ns="$(ctl_ns "$name")"; d="$(ctl_dir "$name")"
    install -d -m 0755 "$d" "$d/opt" "$d/spool" "$d/run" "$d/log"
    # what the admin installed on this host before slurm.conf names it (the hook's binary)
    if [[ -n "${CVSLURM_CTL_OPT:-}" ]]; then
        [[ -d "$CVSLURM_CTL_OPT" ]] || die "CVSLURM_CTL_OPT=$CVSLURM_CTL_OPT is not a directory"
        cp -a "$CVSLURM_CTL_OPT/." "$d/opt/"
    fi
    inroot install -d -o slurm -g slurm -m 0755 "$d/log/slurm"
    inroot install -d -o munge -g munge -m 0700 "$d/log/munge"
    inroot install -d -o munge -g munge -m 0755 "$d/run/munge"
    # its own /etc/hosts: the host's (or the root filesystem's) names, then the cluster's
    if [[ -n "$R" ]]; then f="$R/etc/hosts"; else f=/etc/hosts; fi
    {
        grep -vxF "$MARKER" "$f" | grep -v -E '^10\.99\.0\.' || true
        echo "$MARKER"
        echo "$BRIDGE_IP $CTLD_HOST"
        for ((k = 1; k <= NCTL; k++)); do echo "$(ctl_ip "$k") ctl$k"; done
        for ((k = 1; k <= 64; k++)); do echo "$(node_ip "$k") n$k"; done
    } >"$d/hosts"
    chmod 0644 "$d/hosts"
    k="${name#ctl}"
    ip netns del "$ns" 2>/dev/null || true
    ip link del "cvc$k" 2>/dev/null || true
    ip netns add "$ns"
    ip link add "cvc$k" type veth peer name "cvt$k"
    ip link set "cvc$k" master "$BRIDGE"
    ip link set "cvc$k" up
    ip link set "cvt$k" netns "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "cvt$k" name eth0
    ip -n "$ns" link set eth0 address "$(printf '02:99:00:01:%02x:01' "$k")"
    ip -n "$ns" addr add "$(ctl_ip "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
}

# ctl_run CTL CMD...: CMD on that controller (its namespaces, hostname and local directories)
ctl_run() {
    local name="$1"
    shift
    ip netns exec "$(ctl_ns "$name")" unshare --uts -- sh -c "$ENTER_CTL" "$name" "$R" "$(ctl_dir "$name")" "$@"
}

ctl_munge_ok() { ctl_run "$1" sh -c 'munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1'; }

start_ctl_munged() { # name: the controller's own munged (same key), socket in its own /run
    local name="$1" d i
    d="$(ctl_dir "$name")"
    if pid_alive "$(cat "$d/run/munge/munged.pid" 2>/dev/null || true)" && ctl_munge_ok "$name"; then return 0; fi
    rm -f "$d/run/munge/munged.pid"
    ctl_run "$name" setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --force </dev/null 9>&- ||
        die "munged did not start on $name (see $d/log/munge/munged.log)"
    for ((i = 0; i < 50; i++)); do
        [[ -s "$d/run/munge/munged.pid" ]] && ctl_munge_ok "$name" && return 0
        sleep 0.1
    done
    die "munged did not start on $name (see $d/log/munge/munged.log)"
}

# does CTL's slurmctld answer `scontrol ping` (as primary/backup, in control or standby)?
ctl_answers() { inroot scontrol ping 2>/dev/null | grep -q "at $1 is UP"; }

start_ctl() { # name: munged, then slurmctld; wait until it answers ping
    local name="$1" pf i
    pf="$(ctl_pidfile "$name")"
    start_ctl_munged "$name"
    if pid_alive "$(cat "$pf" 2>/dev/null || true)"; then
        log "slurmctld on $name already running"
        return 0
    fi
    setsid ip netns exec "$(ctl_ns "$name")" unshare --uts -- sh -c "$ENTER_CTL" "$name" "$R" "$(ctl_dir "$name")" \
        /usr/sbin/slurmctld -D -s </dev/null >>"$W/log/slurmctld-$name.out" 2>&1 9>&- &
    echo $! >"$pf"
    for ((i = 0; i < 300; i++)); do
        ctl_answers "$name" && break
        pid_alive "$(cat "$pf")" || die "slurmctld on $name exited (log: $(ctl_dir "$name")/log/slurm/slurmctld.log)"
        sleep 0.1
    done
    ctl_answers "$name" || die "slurmctld on $name did not answer ping"
    log "slurmctld on $name started (pid $(cat "$pf"))"
}

# The controller in control, from StateSaveLocation/heartbeat (16 bytes: big-endian u64 Unix
# time, big-endian u64 index into the SlurmctldHost list): "ctlK AGE" (AGE in s), or fails.
heartbeat_owner() {
    local f="$W/state/heartbeat" hex t k
    [[ -f "$f" && "$(stat -c %s "$f")" == 16 ]] || return 1
    hex="$(od -An -v -tx1 "$f" | tr -d ' \n')"
    t=$((16#${hex:0:16})); k=$((16#${hex:16:16}))
    ((k >= 0 && k < NCTL)) || return 1
    printf 'ctl%d %d\n' $((k + 1)) $(($(date +%s) - t))
}

# wait until the heartbeat names CTL and is fresh (written within 5 s); timeout in s
wait_in_control() { # name timeout
    local t0=$SECONDS o
    while ((SECONDS - t0 < $2)); do
        o="$(heartbeat_owner || true)"
        [[ "${o% *}" == "$1" && "${o#* }" -le 5 ]] && return 0
        sleep 0.2
    done
    return 1
}

# Every node named answers slurmctld and is not DOWN: its state has no `*` (not responding)
# and is not down/drained-down (it may run jobs: mixed, allocated, completing are fine).
wait_nodes_responding() { # timeout nodes...
    local timeout="$1" n st ok start
    shift
    start=$SECONDS
    while :; do
        ok=1
        for n in "$@"; do
            st="$(node_state "$n")"
            [[ -n "$st" && "$st" != *'*' && "$st" != down* ]] || { ok=0; break; }
        done
        [[ $ok == 1 ]] && return 0
        ((SECONDS - start < timeout)) || return 1
        sleep 0.2
    done
}

# ---------- config ----------
write_configs() { # nnodes hook with_dbd
    local n="$1" hook="$2" dbd="$3" i gpu_from nodelines="" gpu=""
    claim_etc_file slurm.conf
    claim_etc_file cgroup.conf
    [[ "$dbd" == 1 ]] && claim_etc_file slurmdbd.conf
    mkdir -p "$ETC"
    for ((i = 1; i <= n; i++)); do
        nodelines+="NodeName=n$i NodeAddr=$(node_ip "$i") CPUs=8 RealMemory=1000 State=UNKNOWN
"
    done
    # one controller: this host; a pair: ctl1 then ctl2, each writing its pid file and log into
    # its own local /run and /var/log, and reaching slurmdbd on the host through the bridge
    local ctlds="SlurmctldHost=$CTLD_HOST($BRIDGE_IP)" ctld_pid="$W/run/slurmctld.pid"
    local ctld_log="$W/log/slurmctld.log" dbd_host=localhost c
    if ((NCTL > 1)); then
        ctlds=""
        for c in $(ctl_names); do ctlds+="${ctlds:+$'\n'}SlurmctldHost=$c($(ctl_ip "${c#ctl}"))"; done
        ctld_pid=/run/slurmctld.pid
        ctld_log=/var/log/slurm/slurmctld.log
        dbd_host="$BRIDGE_IP"
    fi
    gpu_from=$((n > 1 ? n - 1 : 1))
    for ((i = gpu_from; i <= n; i++)); do gpu+="${gpu:+,}n$i"; done
    {
        printf '%s\n' "$MARKER"
        printf '# generated %s for CVSLURM_CLUSTER_DIR=%s; do not edit\n' "$(date -u +%FT%TZ)" "$W"
        cat <<EOF
ClusterName=$CLUSTER_NAME
$ctlds
SlurmUser=slurm
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
# A requeued job may run again cred_expire + 1 s after its requeue (job_mgr.c): 121 s with
# the default; 16 s here, so a requeue test does not wait two minutes.
AuthInfo=cred_expire=15
CredType=cred/munge
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool/%n
SlurmctldPidFile=$ctld_pid
SlurmdPidFile=$W/run/slurmd-%n.pid
SlurmctldLogFile=$ctld_log
SlurmdLogFile=$W/log/slurmd-%n.log
SlurmctldDebug=${SLURMCTLD_DEBUG:-info}
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0${BF_INTERVAL:+,bf_interval=$BF_INTERVAL}
SlurmdParameters=config_overrides
MaxNodeCount=64
TreeWidth=65533
ReturnToService=2
SlurmdTimeout=${SLURMD_TIMEOUT:-30}
SlurmctldTimeout=10
MessageTimeout=5
MinJobAge=${MIN_JOB_AGE:-5}
MaxJobCount=${MAX_JOB_COUNT:-10000}
MaxArraySize=${MAX_ARRAY_SIZE:-1001}
${MAX_JOB_ID:+FirstJobId=1
MaxJobId=$MAX_JOB_ID}
KillWait=2
OverTimeLimit=0
InactiveLimit=0
JobRequeue=1
MailProg=/bin/true
RebootProgram=$W/reboot-node
EOF
        # JOBCOMP_LOC=URL: Slurm's job-completion plugin posts each finished job there
        # (jobcomp/elasticsearch: cvslurm's receiver, `install.sh --jobcomp`)
        if [[ -n "${JOBCOMP_LOC:-}" ]]; then
            printf 'JobCompType=jobcomp/elasticsearch\nJobCompLoc=%s\n' "$JOBCOMP_LOC"
        else
            printf 'JobCompType=jobcomp/none\n'
        fi
        # HEALTH_CHECK=PATH: slurmd runs it as root at its start (cvslurm-publish)
        if [[ -n "${HEALTH_CHECK:-}" ]]; then
            printf 'HealthCheckProgram=%s\nHealthCheckInterval=3600\n' "$HEALTH_CHECK"
        fi
        # switch/none is gone in 23.11+ (no SwitchType means none)
        [[ "$SLURM_VER" == 22.05 ]] && printf 'SwitchType=switch/none\n'
        if [[ "$dbd" == 1 ]]; then
            printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=%s\nAccountingStoragePort=6819\n' "$dbd_host"
        else
            printf 'AccountingStorageType=accounting_storage/none\n'
        fi
        if [[ -n "$hook" ]]; then
            printf 'PrologSlurmctld=%s\n' "$hook"
            [[ "${CVSLURM_HOOKS:-both}" == prolog ]] || printf 'EpilogSlurmctld=%s\n' "$hook"
        fi
        printf '%s' "$nodelines"
        printf 'PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n'
        printf 'PartitionName=gpu Nodes=%s MaxTime=INFINITE State=UP\n' "$gpu"
    } >"$ETC/slurm.conf"
    chmod 0644 "$ETC/slurm.conf"
    write_reboot_program
    # WITH_GPUS=1: every static node has 8 GPUs as GRES (gres.conf Name=gpu File=..., no
    # autodetection) over character devices made here (major 195 as /dev/nvidiaN; nothing
    # opens them: TaskPlugin=task/none).
    if [[ "${WITH_GPUS:-0}" == 1 ]]; then
        claim_etc_file gres.conf
        mkdir -p "$W/dev"
        for i in 0 1 2 3 4 5 6 7; do
            [[ -c "$W/dev/nvidia$i" ]] || mknod -m 0666 "$W/dev/nvidia$i" c 195 "$i"
        done
        sed -i 's/ RealMemory=1000 State=UNKNOWN$/ RealMemory=1000 Gres=gpu:8 State=UNKNOWN/' "$ETC/slurm.conf"
        printf 'GresTypes=gpu\n' >>"$ETC/slurm.conf"
        printf '%s\nAutoDetect=off\nName=gpu File=%s/dev/nvidia[0-7]\n' "$MARKER" "$W" >"$ETC/gres.conf"
        chmod 0644 "$ETC/gres.conf"
    fi
    if [[ "$SLURM_VER" == 22.05 ]]; then
        printf '%s\nCgroupPlugin=cgroup/v1\nCgroupAutomount=no\n' "$MARKER" >"$ETC/cgroup.conf"
    else
        # no cgroup filesystem in the root filesystem; "disabled" exists since 23.x
        printf '%s\nCgroupPlugin=disabled\n' "$MARKER" >"$ETC/cgroup.conf"
    fi
    chmod 0644 "$ETC/cgroup.conf"
    if [[ "$dbd" == 1 ]]; then
        cat >"$ETC/slurmdbd.conf" <<EOF
$MARKER
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=slurm
LogFile=$W/log/slurmdbd.log
PidFile=$W/run/slurmdbd.self.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
        inroot chown slurm:slurm "$ETC/slurmdbd.conf"
        chmod 0600 "$ETC/slurmdbd.conf"
    fi
}

# RebootProgram (`sbatch --reboot`, `scontrol reboot`): slurmd runs it on its node (in the
# node's namespaces and root filesystem) and waits for it. It "reboots" the node: it starts
# itself again in a session of its own (slurmd kills what is left of the program's process
# group when it returns, on 26.05), which stops that slurmd and starts it again with -b (it
# registers as rebooted, and Slurm starts the job that waited for the boot), recording the
# new pid where `up` did. While $W/run/reboot-NODE.hold exists (at most 60 s) the node stays
# down: a test that must see a job wait for its nodes holds it there. Static nodes only.
write_reboot_program() {
    cat >"$W/reboot-node" <<EOF
#!/bin/sh
$MARKER
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
node=\${SLURM_NODE_NAME:-\$(hostname)}
pidfile=$W/run/slurmd-\$node.pid.ours
detached=$W/run/reboot-\$node.detached
if [ "\${1:-}" != --restart ]; then
    echo "\$(date +%FT%T) reboot of \$node" >>"$W/log/reboot-\$node.log"
    rm -f "\$detached"
    setsid "\$0" --restart </dev/null >>"$W/log/reboot-\$node.log" 2>&1 &
    # Returns once the restart runs in its own session: slurmd kills this program's process
    # group when it returns, and a child not yet past setsid would die with it.
    i=0
    while [ ! -e "\$detached" ] && [ \$i -lt 100 ]; do sleep 0.05; i=\$((i + 1)); done
    exit 0
fi
: >"\$detached"
# nothing of slurmd's stays open here (slurmd 26.05 reads its program's output to the end)
for fd in 3 4 5 6 7 8 9; do eval "exec \$fd>&-"; done
old=\$(cat "\$pidfile" 2>/dev/null) || { echo "\$(date +%FT%T) \$node: no \$pidfile: nothing restarted"; exit 0; }
kill "\$old" 2>/dev/null
i=0
while kill -0 "\$old" 2>/dev/null && [ \$i -lt 50 ]; do sleep 0.1; i=\$((i + 1)); done
if kill -9 "\$old" 2>/dev/null; then echo "\$(date +%FT%T) \$node: slurmd \$old killed after 5 s"; sleep 0.5; fi
i=0
while [ -e "$W/run/reboot-\$node.hold" ] && [ \$i -lt 600 ]; do sleep 0.1; i=\$((i + 1)); done
# the cluster went down meanwhile: no slurmd
[ -e "\$pidfile" ] || exit 0
/usr/sbin/slurmd -D -s -N "\$node" -b </dev/null >>"$W/log/slurmd-\$node.out" 2>&1 &
echo \$! >"\$pidfile"
echo "\$(date +%FT%T) \$node: slurmd \$old stopped, \$! started"
EOF
    chmod 0755 "$W/reboot-node"
}

# ---------- reuse (up --reuse) ----------
# The settings `up N` is given, one per line: `up --reuse` keeps a running cluster only when
# it came up with these ($W/run/up.env).
up_description() { # nnodes
    printf 'SLURM=%s\nNODES=%s\nCLUSTER_NAME=%s\nWITH_DBD=%s\nWITH_GPUS=%s\nCVSLURM_HOOK=%s\n' \
        "$SLURM_VER" "$1" "$CLUSTER_NAME" "${WITH_DBD:-0}" "${WITH_GPUS:-0}" "${CVSLURM_HOOK:-}"
    printf 'CVSLURM_HOOKS=%s\nMIN_JOB_AGE=%s\nSLURMD_TIMEOUT=%s\nSLURMCTLD_DEBUG=%s\n' \
        "${CVSLURM_HOOKS:-both}" "${MIN_JOB_AGE:-5}" "${SLURMD_TIMEOUT:-30}" "${SLURMCTLD_DEBUG:-info}"
    printf 'CVSLURM_SHARE=%s\nREPO=%s\n' "${CVSLURM_SHARE:-}" "$REPO"
    printf 'MAX_JOB_COUNT=%s\nMAX_ARRAY_SIZE=%s\nJOBCOMP_LOC=%s\nBF_INTERVAL=%s\n' "${MAX_JOB_COUNT:-10000}" "${MAX_ARRAY_SIZE:-1001}" "${JOBCOMP_LOC:-}" "${BF_INTERVAL:-}"
    [[ -z "${MAX_JOB_ID:-}" ]] || printf 'MAX_JOB_ID=%s\n' "$MAX_JOB_ID"
    [[ -z "${HEALTH_CHECK:-}" ]] || printf 'HEALTH_CHECK=%s\n' "$HEALTH_CHECK"
    if ((NCTL > 1)); then printf 'CONTROLLERS=%s\n' "$NCTL"; fi
}

# The cluster as `up` left it ($W/run/up.snapshot): the managed files in /etc/slurm, the nodes
# and slurmctld's partitions. A test that changed one and could not put it back (killed midway)
# leaves a cluster that `up --reuse` does not take.
cluster_snapshot() {
    local f
    for f in $(managed_files); do
        if [[ -f "$ETC/$f" ]]; then printf '%s %s\n' "$f" "$(sha256sum <"$ETC/$f" | cut -d' ' -f1)"; fi
    done
    printf 'nodes: %s\n' "$(all_nodes | tr '\n' ' ')"
    inroot scontrol show partition -o 2>&1 || true
}

# Why the running cluster cannot serve `up --reuse N` (prints nothing when it can).
reuse_obstacle() { # nnodes
    local f pid
    if [[ ! -s "$W/run/up.env" || ! -s "$W/run/up.snapshot" ]]; then
        echo "no cluster is up (or one from an older cluster.sh)"
        return 0
    fi
    if [[ "$(up_description "$1")" != "$(cat "$W/run/up.env")" ]]; then
        echo "it came up with other settings ($(grep -vxF -f "$W/run/up.env" <(up_description "$1") | tr '\n' ' ' || true)wanted)"
        return 0
    fi
    for f in "$W"/run/*.pid.ours; do
        [[ -f "$f" ]] || continue
        pid="$(cat "$f" 2>/dev/null || true)"
        if ! pid_alive "$pid"; then
            echo "${f##*/} (pid $pid) is not running"
            return 0
        fi
    done
    if ! ctld_up; then
        echo "slurmctld does not answer"
        return 0
    fi
    if [[ "$(cluster_snapshot)" != "$(cat "$W/run/up.snapshot")" ]]; then
        echo "its configuration, partitions or nodes changed since it came up"
    fi
    return 0
}

# `up --reuse`: the running cluster made as a fresh one would be: no jobs, every slurmd
# restarted (a new mount namespace), every node idle. Returns 1 when it cannot.
reuse_cluster() { # nnodes
    local n="$1" i ids t0=$SECONDS cancelled=""
    local -a nodes=() specs=()
    mapfile -t nodes < <(static_nodes)
    ids="$(inroot squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
    if [[ -n "${ids// /}" ]]; then
        # shellcheck disable=SC2086
        inroot scancel $ids 2>/dev/null || true
        for ((i = 0; i < 300; i++)); do
            [[ -z "$(inroot squeue -h -o %i 2>/dev/null)" ]] && break
            sleep 0.2
        done
        if [[ -n "$(inroot squeue -h -o %i 2>/dev/null)" ]]; then
            warn "jobs still listed 60 s after scancel: $(inroot squeue -h -o '%i %T' | tr '\n' ' ')"
            return 1
        fi
        cancelled="jobs ${ids% } cancelled, "
    fi
    for i in "${nodes[@]}"; do specs+=("$W/run/slurmd-$i.pid.ours:slurmd"); done
    stop_pidfiles "${specs[@]}"
    for i in "${nodes[@]}"; do start_slurmd "$i"; done
    if ! wait_nodes_idle 60 "${nodes[@]}"; then
        warn "nodes not idle after their slurmd restarted: $(inroot sinfo -h -N -o '%N %T' | tr '\n' ' ')"
        return 1
    fi
    log "up: reused the running Slurm $SLURM_VER cluster (${cancelled}$n nodes, slurmd restarted, idle in $((SECONDS - t0)) s)"
}

# ---------- commands ----------
do_down() {
    local n ns
    local -a specs=()
    for n in $(all_nodes); do specs+=("$W/run/slurmd-$n.pid.ours:slurmd"); done
    for n in "$W"/run/slurmctld-ctl*.pid.ours; do [[ -f "$n" ]] && specs+=("$n:slurmctld"); done
    stop_pidfiles "${specs[@]}" "$W/run/slurmctld.pid.ours:slurmctld"
    for n in $(all_nodes); do delete_node_netns "$n"; done
    # leftovers from runs whose state was lost
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS_PREFIX" || true); do
        kill_netns_pids "$ns"
        ip netns del "$ns" 2>/dev/null || true
    done
    for n in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^cv[hc][0-9]+$' || true); do
        ip link del "$n" 2>/dev/null || true
    done
    rm -f "$W"/run/slurmd-*.pid.ours
    stop_pidfiles "$W/run/slurmdbd.pid.ours:slurmdbd"
    if [[ -f "$W/run/mariadbd.pid.ours" || -f "$W/run/dbd.used" ]]; then
        db_sql -e "DROP DATABASE IF EXISTS $DB_NAME" 2>/dev/null || true
    fi
    stop_pidfiles "$W/run/mariadbd.pid.ours:mariadbd" "$W/run/munged.pid.ours:munged"
    ip link del "$BRIDGE" 2>/dev/null || true
    release_etc_files
    # every root filesystem's mounts (also those of a run whose state was lost)
    local root
    for root in "${CVSLURM_ROOTFS_CACHE:-/var/cache/cvslurm-rootfs}"/*; do umount_rootfs "$root"; done
    [[ -z "$R" ]] || umount_rootfs "$R"
    rm -rf "$W/state" "$W/spool" "$W/run" "$W/nodes" "$W/nodes.env" "$W/nodes.json" "$W/mariadb" "$W/bin" "$W/hosts"
}

cmd_down() {
    need_root
    take_lock
    do_down
    log "down: everything stopped and removed (logs kept in $W/log)"
}

cmd_up() {
    local reuse=0 why c
    while [[ "${1:-}" == --* ]]; do
        case "$1" in
            --reuse) reuse=1; shift ;;
            --controllers)
                [[ "${2:-}" == [12] ]] || fail "--controllers: want 1 or 2"
                NCTL="$2"
                shift 2
                ;;
            *) fail "up: unknown option $1" ;;
        esac
    done
    local n="${1:-4}" i t0=$SECONDS nodes=()
    if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n < 1 || n > 32)); then fail "node count must be 1..32"; fi
    need_root
    take_lock
    [[ -z "${CVSLURM_HOOK:-}" || "${CVSLURM_HOOK}" == /* ]] || fail "CVSLURM_HOOK must be an absolute path"
    case "$SLURM_VER" in 22.05 | 24.11 | 26.05) ;; *) fail "SLURM=$SLURM_VER: want 22.05 (the host's), 24.11 or 26.05" ;; esac
    if [[ $reuse == 1 && $NCTL -gt 1 ]]; then
        log "--reuse: a pair of controllers is always brought up afresh"
        reuse=0
    fi
    if [[ $reuse == 1 ]]; then
        # the running cluster's root filesystem (the settings compared include the version)
        R="$(cat "$W/run/rootfs" 2>/dev/null || true)"
        why="$(reuse_obstacle "$n")"
        if [[ -z "$why" ]]; then
            if reuse_cluster "$n"; then return 0; fi
            why="it could not be emptied (above)"
        fi
        log "--reuse: not reusing the running cluster: $why; bringing it up afresh"
        R=""
    fi
    log "down (cleaning up previous run)"
    do_down
    mkdir -p "$W"
    if [[ "$SLURM_VER" != 22.05 ]]; then
        R="$("$REPO/tests/cluster/rootfs.sh" "$SLURM_VER")" || fail "no root filesystem for Slurm $SLURM_VER"
        mount_rootfs
    fi
    if [[ -n "${CVSLURM_HOOK:-}" ]] && ! inroot runuser -u slurm -- test -x "$CVSLURM_HOOK"; then
        warn "CVSLURM_HOOK $CVSLURM_HOOK is not executable by user slurm (hooks run as SlurmUser)"
    fi
    mkdir -p "$W"
    rm -rf "$W/log"
    install -d -m 0755 "$W" "$W/run" "$W/spool"
    inroot install -d -o slurm -g slurm -m 0755 "$W/state" "$W/log"
    printf '%s\n' "$SLURM_VER" >"$W/run/slurm.version"
    if ((NCTL > 1)); then printf '%s\n' "$NCTL" >"$W/run/controllers"; fi
    [[ -z "$R" ]] || printf '%s\n' "$R" >"$W/run/rootfs"
    write_wrappers
    WITH_DBD_ACTIVE="${WITH_DBD:-0}"
    [[ "$WITH_DBD_ACTIVE" == 1 ]] && touch "$W/run/dbd.used"
    printf '%s\n' "$CLUSTER_NAME" >"$W/run/cluster.name"
    log "writing $ETC/slurm.conf (Slurm $SLURM_VER, $n nodes, hook=${CVSLURM_HOOK:-none}, dbd=$WITH_DBD_ACTIVE)"
    write_configs "$n" "${CVSLURM_HOOK:-}" "$WITH_DBD_ACTIVE"
    log "network: bridge $BRIDGE $BRIDGE_IP/24 + $n namespaces"
    setup_bridge
    for ((i = 1; i <= n; i++)); do
        create_node_netns "n$i" "$i" 0
        nodes+=("n$i")
    done
    for c in $(ctl_names); do create_ctl "$c"; done
    write_nodes_desc
    start_munged
    if [[ "$WITH_DBD_ACTIVE" == 1 ]]; then
        start_mariadb
        start_slurmdbd
    fi
    if ((NCTL > 1)); then
        # the primary first: a backup that starts alone takes control after SlurmctldTimeout
        for c in $(ctl_names); do start_ctl "$c"; done
        wait_in_control ctl1 15 || die "the heartbeat does not name ctl1 15 s after it started"
    else
        start_slurmctld
    fi
    for i in "${nodes[@]}"; do start_slurmd "$i"; done
    log "slurmd started on ${nodes[*]}; waiting for idle"
    wait_nodes_idle 60 "${nodes[@]}" || die "nodes did not become idle: $(inroot sinfo -h -N -o '%N %T' | tr '\n' ' ')"
    if ((NCTL > 1)) && [[ ! -f "$W/state/assoc_usage" ]]; then
        # A pair as a running site has it: the primary has saved its whole state once. A
        # fresh one saves its association usage only at a graceful stop or at its periodic
        # checkpoint (minutes later); killed before that, the 26.05 backup cannot take over
        # ("fatal: No Assoc usage file (.../assoc_usage) to recover", measured).
        log "a graceful restart of the pair, so that the primary's whole state is saved once"
        cmd_restart_slurmctld
        wait_in_control ctl1 15 || die "the heartbeat does not name ctl1 15 s after the restart"
        [[ -f "$W/state/assoc_usage" ]] || die "no $W/state/assoc_usage after a graceful restart"
    fi
    up_description "$n" >"$W/run/up.env"
    cluster_snapshot >"$W/run/up.snapshot"
    log "up: Slurm $SLURM_VER ($(inroot sinfo --version)),$( ((NCTL > 1)) && printf ' controllers %s (ctl1 in control),' "$(ctl_names | tr '\n' ' ' | sed 's/ $//')") $n nodes idle in $((SECONDS - t0)) s; description in $W/nodes.env and $W/nodes.json"
}

cmd_status() {
    local f pid name
    if [[ ! -d "$W/run" ]]; then
        log "cluster is down"
        return 0
    fi
    for f in "$W"/run/*.pid.ours; do
        [[ -f "$f" ]] || continue
        name="${f##*/}"; name="${name%.ours}"; name="${name%.pid}"
        pid="$(cat "$f")"
        if pid_alive "$pid"; then printf '%-16s pid %-8s running\n' "$name" "$pid"; else printf '%-16s pid %-8s DEAD\n' "$name" "$pid"; fi
    done
    if ((NCTL > 1)); then
        printf 'controllers: %s; in control (heartbeat): %s\n' "$(ctl_names | tr '\n' ' ')" "$(heartbeat_owner | sed 's/ \(.*\)/, written \1 s ago/' || echo unknown)"
        inroot scontrol ping 2>&1 || true
    fi
    printf 'namespaces: %s\n' "$(ip netns list | awk '{print $1}' | grep "^$NS_PREFIX" | tr '\n' ' ' || true)"
    printf 'Slurm %s%s, commands in %s/bin\n' "$SLURM_VER" "${R:+ (root filesystem $R)}" "$W"
    [[ ! -s "$W/run/up.env" ]] || printf 'brought up with: %s\n' "$(tr '\n' ' ' <"$W/run/up.env")"
    inroot sinfo -N -o '%N %P %T' 2>&1 || true
    inroot squeue 2>&1 || true
}

cmd_add_node() {
    local name="${1:?usage: add-node NAME}" idx max=0 n
    [[ "$name" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || fail "bad node name $name"
    need_root
    take_lock
    [[ -d "$W/nodes" ]] || fail "cluster is not up"
    node_exists "$name" && fail "node $name already exists"
    for n in $(all_nodes); do idx="$(node_get "$n" IDX)"; ((idx > max)) && max=$idx; done
    idx=$((max + 1))
    ((idx <= 63)) || fail "too many nodes"
    log "add-node $name: namespace $NS_PREFIX$name, eth0 $(node_ip "$idx")"
    create_node_netns "$name" "$idx" 1
    write_nodes_desc
    start_slurmd "$name"
    wait_nodes_idle 30 "$name" || die "dynamic node $name did not become idle"
    log "add-node $name: idle"
}

cmd_del_node() {
    local name="${1:?usage: del-node NAME}" i
    need_root
    take_lock
    node_exists "$name" || fail "unknown node $name"
    [[ "$(node_get "$name" DYN)" == 1 ]] || fail "$name is a static node; only dynamic nodes can be deleted"
    log "del-node $name: stopping slurmd"
    stop_slurmd "$name"
    kill_netns_pids "$(node_get "$name" NS)"
    for ((i = 0; i < 50; i++)); do
        inroot scontrol delete nodename="$name" 2>/dev/null && break
        sleep 0.2
    done
    inroot sinfo -h -N -o '%N' | grep -qx "$name" && die "scontrol delete nodename=$name failed"
    delete_node_netns "$name"
    write_nodes_desc
    log "del-node $name: deleted"
}

cmd_stop_slurmd() {
    local name="${1:?usage: stop-slurmd NAME}"
    need_root
    take_lock
    node_exists "$name" || fail "unknown node $name"
    stop_slurmd "$name"
    log "stop-slurmd $name: stopped (state now: $(node_state "$name"))"
}

cmd_restart_slurmctld() {
    need_root
    take_lock
    if ((NCTL > 1)); then
        local c
        local -a specs=()
        for c in $(ctl_names); do specs+=("$(ctl_pidfile "$c"):slurmctld"); done
        stop_pidfiles "${specs[@]}"
        for c in $(ctl_names); do start_ctl "$c"; done
    else
        [[ -f "$W/run/slurmctld.pid.ours" ]] || fail "cluster is not up"
        stop_pidfiles "$W/run/slurmctld.pid.ours:slurmctld"
        start_slurmctld
    fi
    # A restarted slurmctld reads each node's last response from its state file. Its first
    # ping pass sets every node whose last response is older than SlurmdTimeout DOWN ("down",
    # no star: seen in CI when a test ran 30 s between two restarts, and the next test's sinfo
    # read n1-n3 "down"), then asks the nodes to register, and a registration brings a node
    # back (ReturnToService=2). So the restart ends once the new slurmctld has counted a
    # registration per running slurmd (sdiag's counters start with it; every DOWN it sets
    # comes before) and every such node answers again.
    local n up=() i
    for n in $(all_nodes); do
        pid_alive "$(cat "$W/run/slurmd-$n.pid.ours" 2>/dev/null || true)" && up+=("$n")
    done
    [[ ${#up[@]} -gt 0 ]] || return 0
    for ((i = 0; i < 300; i++)); do
        (($(registrations) >= ${#up[@]})) && break
        sleep 0.2
    done
    (($(registrations) >= ${#up[@]})) || die "slurmctld counted $(registrations) node registrations in 60 s, wanted ${#up[@]}"
    wait_nodes_responding 60 "${up[@]}" \
        || die "nodes not back 60 s after the restart: $(inroot sinfo -h -N -o '%N %T' | tr '\n' ' ')"
    log "slurmctld restarted; nodes registered and responding: ${up[*]}"
}

# Node registrations slurmctld has counted since it started (sdiag; 0 before the first).
registrations() {
    inroot sdiag 2>/dev/null | awk '/MESSAGE_NODE_REGISTRATION_STATUS/ {
        for (i = 1; i <= NF; i++) if ($i ~ /^count:/) { sub(/^count:/, "", $i); print $i + 0; exit } }
        END { }' | grep . || echo 0
}

# ---------- commands on one controller of a pair ----------
cmd_in_control() {
    local o
    ((NCTL > 1)) || fail "the cluster has one controller (bring it up with: up --controllers 2)"
    o="$(heartbeat_owner)" || fail "no readable heartbeat in $W/state"
    printf '%s (heartbeat written %s s ago)\n' "${o% *}" "${o#* }"
}

cmd_stop_slurmctld() {
    need_root
    take_lock
    need_ctl "${1:-}"
    stop_pidfiles "$(ctl_pidfile "$1"):slurmctld"
}

cmd_kill_slurmctld() {
    local pf pid i
    need_root
    take_lock
    need_ctl "${1:-}"
    pf="$(ctl_pidfile "$1")"
    pid="$(cat "$pf" 2>/dev/null || true)"
    pid_alive "$pid" || fail "slurmctld on $1 is not running"
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == slurmctld* ]] || fail "pid $pid from $pf is not slurmctld any more"
    kill -KILL "$pid"
    for ((i = 0; i < 50; i++)); do pid_alive "$pid" || break; sleep 0.1; done
    rm -f "$pf"
    log "kill-slurmctld $1: pid $pid killed (SIGKILL)"
}

cmd_start_slurmctld() {
    need_root
    take_lock
    need_ctl "${1:-}"
    start_ctl "$1"
}

cmd_takeover() {
    local before t0 o
    need_root
    take_lock
    ((NCTL > 1)) || fail "the cluster has one controller (bring it up with: up --controllers 2)"
    before="$(heartbeat_owner || true)"
    t0="$(date +%s%N)"
    inroot scontrol takeover || die "scontrol takeover failed"
    # the backup (ctl2) takes control; wait until its heartbeat says so
    wait_in_control ctl2 30 || die "30 s after scontrol takeover the heartbeat says: $(heartbeat_owner || echo nothing)"
    o="$(heartbeat_owner)"
    log "takeover: ${before% *} -> ${o% *}; heartbeat names it after $((($(date +%s%N) - t0) / 1000000)) ms"
    # the old controller may exit (measured on 22.05) or stay as a standby
    sleep 1
    if pid_alive "$(cat "$(ctl_pidfile ctl1)" 2>/dev/null || true)"; then
        log "takeover: ctl1's slurmctld still runs (standby)"
    else
        log "takeover: ctl1's slurmctld exited; start-slurmctld ctl1 brings it back (and it takes control back)"
    fi
}

cmd_power_off() {
    local ns pids i
    need_root
    take_lock
    need_ctl "${1:-}"
    ns="$(ctl_ns "$1")"
    for ((i = 0; i < 20; i++)); do
        pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
        [[ -n "${pids// /}" ]] || break
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] || die "processes left in $ns: $(ip netns pids "$ns" | tr '\n' ' ')"
    rm -f "$(ctl_pidfile "$1")"
    log "power-off $1: every process in its namespaces killed (SIGKILL)"
}

cmd_power_on() {
    need_root
    take_lock
    need_ctl "${1:-}"
    [[ -z "$(ip netns pids "$(ctl_ns "$1")" 2>/dev/null)" ]] || fail "$1 is not powered off (processes run in $(ctl_ns "$1"))"
    start_ctl "$1"
}

cmd_start_slurmd() {
    local name="${1:?usage: start-slurmd NAME}" i st
    need_root
    take_lock
    node_exists "$name" || fail "unknown node $name"
    start_slurmd "$name"
    for ((i = 0; i < 100; i++)); do
        st="$(node_state "$name")"
        [[ "$st" != *'*' && "$st" != down* && -n "$st" ]] && break
        sleep 0.2
    done
    log "start-slurmd $name: started (state now: $(node_state "$name"))"
}

cmd_exec() {
    local name="${1:?usage: exec NAME CMD...}"
    shift
    [[ $# -gt 0 ]] || fail "usage: exec NAME CMD..."
    if ((NCTL > 1)) && is_ctl "$name"; then
        exec ip netns exec "$(ctl_ns "$name")" unshare --uts -- sh -c "$ENTER_CTL" "$name" "$R" "$(ctl_dir "$name")" "$@"
    fi
    node_exists "$name" || fail "unknown node $name"
    exec ip netns exec "$(node_get "$name" NS)" unshare --uts -- sh -c "$ENTER" "$name" "$R" "$@"
}

cmd_wait_idle() {
    local timeout="${1:-60}" nodes
    mapfile -t nodes < <(static_nodes)
    [[ ${#nodes[@]} -gt 0 ]] || fail "cluster is not up"
    wait_nodes_idle "$timeout" "${nodes[@]}" || die "not all nodes idle after $timeout s: $(inroot sinfo -h -N -o '%N %T' | tr '\n' ' ')"
    log "all static nodes idle"
}

main() {
    local cmd="${1:-}"
    [[ $# -gt 0 ]] && shift
    case "$cmd" in
        up | down | add-node | del-node | stop-slurmd | start-slurmd | restart-slurmctld | \
            stop-slurmctld | kill-slurmctld | start-slurmctld | takeover | power-off | power-on)
            set -o errtrace
            trap 'die "command failed (line $LINENO): $BASH_COMMAND"' ERR
            ;;
    esac
    case "$cmd" in
        up) cmd_up "$@" ;;
        down) cmd_down ;;
        status) cmd_status ;;
        add-node) cmd_add_node "$@" ;;
        del-node) cmd_del_node "$@" ;;
        stop-slurmd) cmd_stop_slurmd "$@" ;;
        start-slurmd) cmd_start_slurmd "$@" ;;
        restart-slurmctld) cmd_restart_slurmctld ;;
        exec) cmd_exec "$@" ;;
        wait-idle) cmd_wait_idle "$@" ;;
        in-control) cmd_in_control ;;
        stop-slurmctld) cmd_stop_slurmctld "$@" ;;
        kill-slurmctld) cmd_kill_slurmctld "$@" ;;
        start-slurmctld) cmd_start_slurmctld "$@" ;;
        takeover) cmd_takeover ;;
        power-off) cmd_power_off "$@" ;;
        power-on) cmd_power_on "$@" ;;
        *)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
            exit 2
            ;;
    esac
}

main "$@"
