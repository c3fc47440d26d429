#!/usr/bin/env bash
# Install cvslurm on the Slurm controller: binary + mode symlinks, cloudvision.conf, the API
# token file, StateDir/LogFile, the PrologSlurmctld hook (and, by the set-up, Slurm's
# job-completion plugin posting to the service, or the EpilogSlurmctld hook) in slurm.conf,
# the cvslurm service, then `scontrol reconfigure` (slurmctld is never restarted).
#
# A site's own PrologSlurmctld/EpilogSlurmctld: on Slurm >= 24.05 install.sh adds its own
# line of the same key beside it (Slurm runs them all); before 24.05 (one hook only) it
# refuses and prints the line to add to the site's script. The hook path exists and is
# executable whenever slurm.conf names it (Slurm 24.11+ does not start otherwise): the binary
# is installed (atomically, by rename) before slurm.conf is changed, and on --uninstall
# slurm.conf is restored (and applied) before the binary is removed.
#
# Usage: sudo ./install.sh --api-server HOST[:PORT] --api-token-file FILE [options]
#   --api-server HOST[:PORT]  CloudVision server (or $API_SERVER; default: the existing config's)
#   --api-token-file FILE     file holding the API token (or the token in $API_TOKEN;
#                             default: the existing token file)
#   --ca-file FILE            PEM CA that signed CloudVision's certificate (CaFile)
#   --insecure                turn TLS verification off (lab use only)
#   --offline                 warn instead of failing when CloudVision does not answer
#   --dry-run                 show every change (unified diffs, lists); change nothing
#   --uninstall               remove what install.sh added (see the manifest); keeps the
#                             token and cloudvision.conf unless --purge
#   --purge                   with --uninstall: also the token, cloudvision.conf, StateDir, log
#   --binary PATH             the cvslurm binary to install (default: a prebuilt
#                             target/x86_64-unknown-linux-musl/release/cvslurm, else build it)
#   --no-service              do not install the cvslurm systemd service
#   --epilog                  both hooks, PrologSlurmctld and EpilogSlurmctld (ends within a
#                             second; an EpilogSlurmctld can make slurmctld miss a scheduling
#                             pass: README "Without EpilogSlurmctld"). The default is no
#                             EpilogSlurmctld: --jobcomp where the site has no JobCompType and
#                             Slurm's plugin is installed, else --no-epilog (and --epilog with
#                             --no-service)
#   --no-epilog               PrologSlurmctld only: no EpilogSlurmctld line, and the service
#                             sends each end from slurmctld (ReconcileInterval=5); for
#                             clusters whose scheduler must never wait on an epilog
#                             (README, "Without EpilogSlurmctld"). Needs the service
#   --jobcomp                 job ends from Slurm's job-completion plugin, not from an
#                             EpilogSlurmctld: JobCompType=jobcomp/elasticsearch posting to the
#                             service's receiver (JobCompLoc=http://127.0.0.1:PORT/slurm/jobcomp,
#                             cloudvision.conf JobCompPort=PORT), PrologSlurmctld for starts, no
#                             EpilogSlurmctld (README, "Job ends from Slurm's job-completion
#                             plugin"). Refused where slurm.conf sets another JobCompType.
#                             Needs the service and Slurm's jobcomp/elasticsearch plugin
#   --jobcomp-port PORT       the receiver's port with --jobcomp (default 9250)
#   --no-reconfigure          do not run `scontrol reconfigure`
#   --no-hooks                install everything but leave slurm.conf alone: for the other
#                             controllers of an HA pair, before the install that writes the
#                             hook lines (README, "Two controllers")
#   -h, --help                this text
#
# Environment: API_SERVER, API_TOKEN, SLURM_CONF (slurm.conf; default $SLURM_CONF_DIR/slurm.conf),
# SLURM_CONF_DIR (default: directory of $SLURM_CONF, else /etc/slurm), INSTALL_DIR (default
# /opt/slurm/cloudvision), LOG_DIR (default /var/log/slurm), STATE_DIR (default
# /var/spool/cvslurm), SYSTEMD_UNIT_DIR (default /etc/systemd/system), LOGROTATE_DIR (default
# /etc/logrotate.d), SLURM_VERSION (override the detected Slurm version, e.g. 24.05),
# TEXTFILE_DIRS (node_exporter textfile directories to look for, space-separated; default
# "/var/lib/prometheus/node-exporter /var/lib/node_exporter/textfile_collector": the first
# that exists is suggested for MetricsFile, never set), CVSLURM_REMOTE (how to run a command
# on another SlurmctldHost, the host name first; default "ssh -o BatchMode=yes -o
# ConnectTimeout=5 --").
#
# Two controllers (several SlurmctldHost lines): before it writes the hook lines, install.sh
# checks on every other SlurmctldHost that the hook is there (`test -x` through
# CVSLURM_REMOTE) and refuses if one lacks it: from Slurm 23.02 a slurmctld whose slurm.conf
# names a hook it cannot run does not start. A host it cannot reach is a warning. A
# SlurmctldHost name that is not a host name (letters, digits, '-', '.', '_'; not starting
# with '-') is refused before anything runs: it would reach ssh as an option.
#
# Idempotent: a second run with the same options changes nothing and says "no change".
# What it adds is recorded in $INSTALL_DIR/.install-manifest; the lines it adds to slurm.conf
# end with "# added by cvslurm install.sh".
set -euo pipefail

readonly MARK="# added by cvslurm install.sh"
readonly MARK_RE=' # added by cvslurm install\.sh$'
# a site's JobCompLoc line that --jobcomp took over (JobCompForward): kept, byte for byte, after
# this prefix; --uninstall and the other set-ups take the prefix off
readonly OFF_PREFIX='#cvslurm-jobcompforward# '
SRC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SRC_DIR

say() { printf 'install.sh: %s\n' "$*"; }
warn() { printf 'install.sh: WARNING: %s\n' "$*" >&2; }
die() {
    printf 'install.sh: ERROR: %s\n' "$*" >&2
    exit 1
}
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# ---------- options ----------
OPT_SERVER="${API_SERVER:-}"
OPT_TOKEN_FILE=""
OPT_CA=""
OPT_INSECURE=0
OFFLINE=0
DRY=0
UNINSTALL=0
PURGE=0
OPT_BINARY=""
SERVICE=1
RECONFIGURE=1
NO_EPILOG=0
NO_HOOKS=0
JOBCOMP=0
EPILOG=0
JOBCOMP_PORT=9250
while (($#)); do
    case "$1" in
        --api-server) OPT_SERVER="${2:?--api-server needs HOST[:PORT]}"; shift ;;
        --api-server=*) OPT_SERVER="${1#*=}" ;;
        --api-token-file) OPT_TOKEN_FILE="${2:?--api-token-file needs a file}"; shift ;;
        --api-token-file=*) OPT_TOKEN_FILE="${1#*=}" ;;
        --ca-file) OPT_CA="${2:?--ca-file needs a file}"; shift ;;
        --ca-file=*) OPT_CA="${1#*=}" ;;
        --insecure) OPT_INSECURE=1 ;;
        --offline) OFFLINE=1 ;;
        --dry-run) DRY=1 ;;
        --uninstall) UNINSTALL=1 ;;
        --purge) PURGE=1 ;;
        --binary) OPT_BINARY="${2:?--binary needs a path}"; shift ;;
        --binary=*) OPT_BINARY="${1#*=}" ;;
        --no-service) SERVICE=0 ;;
        --no-epilog) NO_EPILOG=1 ;;
        --jobcomp) JOBCOMP=1 ;;
        --epilog) EPILOG=1 ;;
        --jobcomp-port) JOBCOMP_PORT="${2:?--jobcomp-port needs a port}"; shift ;;
        --jobcomp-port=*) JOBCOMP_PORT="${1#*=}" ;;
        --no-reconfigure) RECONFIGURE=0 ;;
        --no-hooks) NO_HOOKS=1 ;;
        -h | --help) usage; exit 0 ;;
        --api-token | --api-token=*) die "--api-token would put the secret on the command line; use --api-token-file FILE or API_TOKEN" ;;
        *) die "unknown option $1 (see ./install.sh --help)" ;;
    esac
    shift
done
((PURGE == 0 || UNINSTALL == 1)) || die "--purge goes with --uninstall"
((NO_EPILOG == 0 || SERVICE == 1)) || die "--no-epilog needs the cvslurm service (it sends the ends): drop --no-service"
((JOBCOMP == 0 || SERVICE == 1)) || die "--jobcomp needs the cvslurm service (its receiver takes the ends): drop --no-service"
((JOBCOMP + NO_EPILOG + EPILOG <= 1)) || die "--jobcomp, --no-epilog and --epilog are three set-ups: give one"
[[ "$JOBCOMP_PORT" =~ ^[0-9]{1,5}$ ]] && ((JOBCOMP_PORT >= 1 && JOBCOMP_PORT <= 65535)) \
    || die "--jobcomp-port $JOBCOMP_PORT is not a port (1 to 65535)"

if [[ -n "${SLURM_CONF_DIR:-}" ]]; then
    SLURM_CONF_FILE="${SLURM_CONF:-$SLURM_CONF_DIR/slurm.conf}"
elif [[ -n "${SLURM_CONF:-}" ]]; then
    SLURM_CONF_DIR="$(dirname "$SLURM_CONF")"
    SLURM_CONF_FILE="$SLURM_CONF"
else
    SLURM_CONF_DIR=/etc/slurm
    SLURM_CONF_FILE=/etc/slurm/slurm.conf
fi
INSTALL_DIR="${INSTALL_DIR:-/opt/slurm/cloudvision}"
LOG_DIR="${LOG_DIR:-/var/log/slurm}"
STATE_DIR="${STATE_DIR:-/var/spool/cvslurm}"
UNIT_DIR="${SYSTEMD_UNIT_DIR:-/etc/systemd/system}"
LOGROTATE_DIR="${LOGROTATE_DIR:-/etc/logrotate.d}"
TEXTFILE_DIRS="${TEXTFILE_DIRS:-/var/lib/prometheus/node-exporter /var/lib/node_exporter/textfile_collector}"
for v in SLURM_CONF_DIR SLURM_CONF_FILE INSTALL_DIR LOG_DIR STATE_DIR UNIT_DIR LOGROTATE_DIR; do
    [[ "${!v}" == /* ]] || die "$v must be an absolute path (got ${!v})"
done
readonly CV_CONF="$SLURM_CONF_DIR/cloudvision.conf"
readonly TOKEN_DEST="$SLURM_CONF_DIR/cloudvision.token"
readonly HOOK="$INSTALL_DIR/cvslurm-hook"
readonly MANIFEST="$INSTALL_DIR/.install-manifest"
readonly UNIT="$UNIT_DIR/cvslurm.service"
readonly LOGROTATE="$LOGROTATE_DIR/cvslurm"
export SLURM_CONF="$SLURM_CONF_FILE"

if ((DRY == 0)) && [[ "$(id -u)" != 0 ]]; then
    die "must run as root (sudo ./install.sh ...), or add --dry-run to only see the changes"
fi

WORK="$(mktemp -d)"
chmod 700 "$WORK"
trap 'rm -rf "$WORK"' EXIT

systemd_running() { [[ -d /run/systemd/system ]]; }

# ---------- manifest ----------
# Lines: "<kind> <path>" (file, link, dir, conf, token, unit, logrotate, service) and
# "slurmconf <path> <noeol 0|1>".
declare -a MAN_NEW=()
man_old() { if [[ -f "$MANIFEST" ]]; then grep -v '^#' "$MANIFEST" || true; fi; }
man_has() { man_old | grep -qxF "$1"; }
man_add() { MAN_NEW+=("$1"); }

# ---------- slurm.conf facts ----------
# The binary reads slurm.conf (Includes followed), the Slurm version and the hooks with the
# parser it uses itself: `cvslurm check --slurm-facts` prints key=value lines.
# fact KEY: every value of KEY, one per line.
fact() { awk -v k="$1" 'index($0, k "=") == 1 { print substr($0, length(k) + 2) }' "$WORK/facts"; }

# ---------- change helpers (record changes; apply unless dry run) ----------
CHANGES=0
changed() { CHANGES=$((CHANGES + 1)); say "$*"; }

# show_diff OLD NEW LABEL: unified diff (OLD may not exist)
show_diff() {
    local old="$1" new="$2" label="$3"
    if [[ -e "$old" ]]; then
        diff -u --label "$label" --label "$label (new)" "$old" "$new" || true
    else
        diff -u --label "$label (absent)" --label "$label (new)" /dev/null "$new" || true
    fi
}

# put_text NEW DEST MODE OWNER[:GROUP] KIND [secret]: install a text file when it differs
# (a secret's diff is never shown)
put_text() {
    local new="$1" dest="$2" mode="$3" owner="$4" kind="$5" secret="${6:-}" existed=0
    [[ -e "$dest" ]] && existed=1
    if ((existed)) && cmp -s "$new" "$dest"; then
        fix_meta "$dest" "$mode" "$owner"
    else
        changed "$( ((existed)) && echo update || echo create) $dest"
        if ((DRY)); then
            if [[ -n "$secret" ]]; then say "  (content not shown: it is a secret; mode $mode, owner $owner)"; else show_diff "$dest" "$new" "$dest"; fi
        else
            install -D -m "$mode" -o "${owner%%:*}" -g "$(owner_group "$owner")" "$new" "$dest.cvslurm-new"
            mv -f "$dest.cvslurm-new" "$dest"
        fi
    fi
    # the token and cloudvision.conf are ours even when an earlier uninstall kept them
    if ((existed == 0)) || man_has "$kind $dest" || [[ "$kind" == conf || "$kind" == token ]]; then
        man_add "$kind $dest"
    fi
}
owner_group() { if [[ "$1" == *:* ]]; then echo "${1#*:}"; else id -gn "$1"; fi; }
fix_meta() { # path mode owner[:group]
    local p="$1" mode="$2" owner="${3%%:*}" group cur
    group="$(owner_group "$3")"
    cur="$(stat -c '%a %U %G' "$p")"
    if [[ "$cur" != "$(printf '%o' $((8#$mode))) $owner $group" ]]; then
        changed "set $p to mode $mode, owner $owner:$group (was $cur)"
        ((DRY)) || { chown "$owner:$group" "$p"; chmod "$mode" "$p"; }
    fi
}

# ---------- uninstall ----------
do_uninstall() {
    [[ -f "$MANIFEST" ]] || die "no $MANIFEST: cvslurm was not installed by install.sh into $INSTALL_DIR (set INSTALL_DIR?)"
    local kind path extra reconf=0
    # the service first, so nothing runs the binary while it goes
    while read -r kind path extra; do
        case "$kind" in
            service)
                if systemd_running; then
                    changed "systemctl disable --now cvslurm"
                    ((DRY)) || systemctl disable --now cvslurm.service || warn "could not stop the cvslurm service"
                fi
                ;;
            slurmconf)
                [[ -f "$path" ]] || { warn "$path is gone; nothing to remove from it"; continue; }
                { grep -v -e "$MARK_RE" "$path" || true; } | sed "s/^$OFF_PREFIX//" >"$WORK/slurm.conf.new"
                if [[ "$extra" == 1 && -s "$WORK/slurm.conf.new" && "$(tail -c 1 "$WORK/slurm.conf.new" | od -An -c | tr -d ' ')" == '\n' ]]; then
                    truncate -s -1 "$WORK/slurm.conf.new"
                fi
                if ! cmp -s "$path" "$WORK/slurm.conf.new"; then
                    changed "remove the lines marked \"$MARK\" from $path"
                    show_diff "$path" "$WORK/slurm.conf.new" "$path"
                    if ((DRY == 0)); then
                        cat "$WORK/slurm.conf.new" >"$path.cvslurm-new"
                        chmod --reference="$path" "$path.cvslurm-new"
                        chown --reference="$path" "$path.cvslurm-new"
                        mv -f "$path.cvslurm-new" "$path"
                    fi
                    reconf=1
                fi
                ;;
        esac
    done < <(man_old)
    # slurm.conf no longer names the hook: apply that before the binary goes
    if ((reconf)); then
        apply_reconfigure
        reconf=0
    fi
    while read -r kind path extra; do
        case "$kind" in
            file | link | unit | logrotate)
                if [[ -e "$path" || -L "$path" ]]; then
                    changed "remove $path"
                    ((DRY)) || rm -f "$path"
                fi
                ;;
            conf | token | log)
                if ((PURGE)) && [[ -e "$path" ]]; then
                    changed "remove $path (--purge)"
                    ((DRY)) || rm -f "$path"
                elif [[ -e "$path" ]]; then
                    say "keeping $path (add --purge to remove it)"
                fi
                ;;
        esac
    done < <(man_old)
    if systemd_running && man_old | grep -q '^unit '; then
        ((DRY)) || systemctl daemon-reload || true
    fi
    # directories last, deepest first
    while read -r kind path extra; do
        [[ "$kind" == dir && -d "$path" ]] || continue
        if [[ "$path" == "$STATE_DIR" || "$path" == "$LOG_DIR" ]] && ((PURGE)); then
            if [[ "$path" == "$LOG_DIR" ]]; then
                changed "remove $path/cvjob.log* (--purge)"
                ((DRY)) || rm -f "$path"/cvjob.log*
            else
                changed "remove $path and the events in it (--purge)"
                ((DRY)) || rm -rf "$path"
                continue
            fi
        fi
        if [[ "$path" == "$INSTALL_DIR" ]]; then continue; fi
        if [[ -z "$(ls -A "$path")" ]]; then
            changed "remove empty directory $path"
            ((DRY)) || rmdir "$path"
        else
            say "keeping $path (not empty; --purge removes StateDir and the log)"
        fi
    done < <(man_old | sort -r -k2)
    changed "remove $MANIFEST"
    if ((DRY == 0)); then
        rm -f "$MANIFEST"
        if man_has_dir_install; then rmdir "$INSTALL_DIR" 2>/dev/null || say "keeping $INSTALL_DIR (not empty)"; fi
    fi
    if ((reconf)); then apply_reconfigure; fi
    if ((DRY)); then say "dry run: nothing changed"; else say "uninstalled"; fi
}
man_has_dir_install() { [[ "${UNINSTALL_HAD_INSTALL_DIR:-0}" == 1 ]]; }

apply_reconfigure() {
    if ((RECONFIGURE == 0)); then
        say "not running scontrol reconfigure (--no-reconfigure): run it to apply the slurm.conf change"
    elif ! command -v scontrol >/dev/null 2>&1; then
        say "scontrol not found: run scontrol reconfigure on the controller to apply the slurm.conf change"
    elif ! scontrol ping 2>/dev/null | grep -q 'is UP'; then
        say "slurmctld is not reachable: run scontrol reconfigure once it is up (slurmctld reads slurm.conf when it starts anyway)"
    elif ((DRY)); then
        changed "would run: scontrol reconfigure"
    else
        say "running scontrol reconfigure (slurmctld is not restarted)"
        scontrol reconfigure || die "scontrol reconfigure failed: fix slurm.conf (see the slurmctld log), then run scontrol reconfigure"
        restart_note
    fi
}

# Before 23.11, `scontrol reconfigure` re-reads slurm.conf but slurmctld keeps the
# PrologSlurmctld/EpilogSlurmctld it started with (its prep/script plugin decides at start-up
# whether they exist; measured on 22.05: hooks added by a reconfigure never ran until a
# restart). From 23.11 a reconfigure restarts slurmctld in place.
restart_note() {
    local v major minor
    v="$(scontrol --version 2>/dev/null | awk '{print $2}')"
    major="${v%%.*}"; minor="${v#*.}"; minor="${minor%%.*}"
    [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] || return 0
    # two controllers, hooks written: pair_restart_note names every slurmctld to restart
    if ((UNINSTALL == 0)) && (($(fact controller 2>/dev/null | wc -l) > 1)); then return 0; fi
    if ((major < 23 || (major == 23 && minor < 11))); then
        warn "Slurm $v: slurmctld runs the PrologSlurmctld/EpilogSlurmctld it started with until it restarts; restart it now for this change to take effect: systemctl restart slurmctld (running jobs keep running)"
    fi
}

# Two controllers: slurmctld reads PrologSlurmctld/EpilogSlurmctld when it starts, and a
# reconfigure restarts (from 23.11) only the controller in control: a standby started before
# slurm.conf named the hooks never runs them, not even after a takeover (measured on 24.11);
# before 23.11 no controller runs them until restarted. One line naming each to restart.
pair_restart_note() {
    local -a all=() need=()
    local host whose ic major=0 minor=0
    while read -r host whose; do all+=("$host"); done < <(fact controller)
    ((${#all[@]} > 1)) || return 0
    ic="$(fact in_control)"
    if [[ "$VERSION" =~ ^([0-9]+)\.([0-9]+)$ ]]; then major=$((10#${BASH_REMATCH[1]})); minor=$((10#${BASH_REMATCH[2]})); fi
    if ((major > 23 || (major == 23 && minor >= 11))); then
        while read -r host whose; do
            if [[ -n "$ic" && "$host" != "$ic" ]] || [[ -z "$ic" && "$whose" != this ]]; then need+=("$host"); fi
        done < <(fact controller)
        warn "two controllers: restart slurmctld on ${need[*]} (${ic:+$ic is in control; }a slurmctld started before slurm.conf named the hooks never runs them, not even after a takeover, and a reconfigure restarts only the controller in control; restarting a standby does not disturb it): on each: systemctl restart slurmctld, then cvslurm check"
    else
        warn "two controllers, Slurm ${VERSION:-(unknown)}: restart slurmctld on every controller, ${all[*]}, the standby first (before 23.11 a slurmctld runs only the hooks it started with; a reconfigure loads none): on each: systemctl restart slurmctld (running jobs keep running), then cvslurm check"
    fi
}

if ((UNINSTALL)); then
    if man_has "dir $INSTALL_DIR"; then UNINSTALL_HAD_INSTALL_DIR=1; fi
    do_uninstall
    exit 0
fi

# ---------- checks (before anything changes) ----------
[[ -r "$SLURM_CONF_FILE" ]] || die "cannot read $SLURM_CONF_FILE: set SLURM_CONF (or SLURM_CONF_DIR) to the slurm.conf slurmctld uses"
# the binary
BINARY="$OPT_BINARY"
if [[ -z "$BINARY" ]]; then
    for c in "$SRC_DIR/target/x86_64-unknown-linux-musl/release/cvslurm" "$SRC_DIR/cvslurm"; do
        [[ -x "$c" ]] && { BINARY="$c"; break; }
    done
fi
if [[ -z "$BINARY" ]]; then
    if ((DRY)); then
        die "no prebuilt binary: --dry-run needs one to read slurm.conf; build it (cargo build --release --target x86_64-unknown-linux-musl) or give --binary PATH"
    else
        [[ -f "$SRC_DIR/Cargo.toml" ]] || die "no cvslurm binary: give --binary PATH"
        command -v cargo >/dev/null 2>&1 || die "no prebuilt binary and no cargo: build it elsewhere and give --binary PATH"
        say "building the static binary (cargo build --release --target x86_64-unknown-linux-musl)"
        (cd "$SRC_DIR" && cargo build --release --target x86_64-unknown-linux-musl) || die "the build failed: see the cargo output above"
        BINARY="$SRC_DIR/target/x86_64-unknown-linux-musl/release/cvslurm"
    fi
fi
if [[ -n "$BINARY" ]]; then
    [[ -x "$BINARY" ]] || die "$BINARY is not an executable file"
    "$BINARY" --version >/dev/null 2>&1 || die "$BINARY --version failed: is it a cvslurm binary for this machine?"
fi

facts_args=(check --slurm-facts --hook "$HOOK")
[[ -z "${SLURM_VERSION:-}" ]] || facts_args+=(--slurm-version "$SLURM_VERSION")
"$BINARY" "${facts_args[@]}" >"$WORK/facts" 2>"$WORK/facts.err" \
    || die "$BINARY check --slurm-facts failed: $(head -c 500 "$WORK/facts.err")"
while IFS= read -r p; do warn "$p"; done < <(fact problem)
# SlurmctldHost names go to CVSLURM_REMOTE (ssh) as its host argument: one that ssh would
# take for an option (-oProxyCommand=...) would run a command as root, --dry-run included.
# Only what a host name holds: letters, digits, '-', '.', '_' (spelled out: a range such as
# a-z depends on the locale), not starting with '-', at most 253 characters (a DNS name).
readonly HOST_CHARS='abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-'
while read -r host _; do
    if [[ -z "$host" || "$host" == -* || ${#host} -gt 253 || "$host" == *[!$HOST_CHARS]* ]]; then
        die "SlurmctldHost \"${host//[^[:print:]]/?}\" in slurm.conf is not a host name (letters, digits, '-', '.', '_'; not starting with '-'; at most 253 characters): fix that line of $SLURM_CONF_FILE; nothing was run or changed"
    fi
done < <(fact controller)
CLUSTER="$(fact cluster_name)"
[[ -n "$CLUSTER" ]] || die "no ClusterName in $SLURM_CONF_FILE: set ClusterName= (CloudVision uses it as the job's location)"
SLURM_USER="$(fact slurm_user)"
getent passwd "$SLURM_USER" >/dev/null || die "SlurmUser $SLURM_USER (from $SLURM_CONF_FILE) is not a known user: create it or fix SlurmUser"
SLURM_GROUP="$(id -gn "$SLURM_USER")"
say "cluster $CLUSTER, SlurmUser $SLURM_USER, slurm.conf $SLURM_CONF_FILE"

# existing cloudvision.conf values are the defaults
cv_conf_get() {
    [[ -f "$CV_CONF" ]] || return 0
    awk -F= -v k="${1,,}" '{ sub(/#.*/, "") } tolower($1) ~ "^[ \t]*" k "[ \t]*$" { v = $2; sub(/^[ \t"]+/, "", v); sub(/[ \t"]+$/, "", v) } END { print v }' "$CV_CONF"
}
SERVER="${OPT_SERVER:-$(cv_conf_get ApiServer)}"
SERVER="${SERVER#https://}"
SERVER="${SERVER%/}"
[[ -n "$SERVER" ]] || die "no CloudVision server: give --api-server HOST[:PORT] (or API_SERVER)"
[[ "$SERVER" != http://* ]] || die "CloudVision is reached over HTTPS only: give --api-server without http://"
host_re='^[][A-Za-z0-9._:-]+$'
[[ "$SERVER" =~ $host_re ]] || die "--api-server $SERVER is not HOST[:PORT]"
CA="$OPT_CA"
[[ -n "$CA" ]] || CA="$(cv_conf_get CaFile)"
if [[ -n "$CA" ]]; then
    [[ -r "$CA" ]] || die "cannot read the CA file $CA: give --ca-file with the PEM CA of CloudVision's certificate"
    CA="$(readlink -f "$CA")"
fi
INSECURE="$OPT_INSECURE"
if ((INSECURE == 0)); then
    case "$(cv_conf_get Insecure)" in yes | true | on | 1) INSECURE=1 ;; esac
fi

# the token: from API_TOKEN, --api-token-file or the installed token file
umask 077
if [[ -n "${API_TOKEN:-}" ]]; then
    printf '%s\n' "$API_TOKEN" >"$WORK/token"
elif [[ -n "$OPT_TOKEN_FILE" ]]; then
    [[ -r "$OPT_TOKEN_FILE" ]] || die "cannot read the token file $OPT_TOKEN_FILE"
    cat "$OPT_TOKEN_FILE" >"$WORK/token"
elif [[ -r "$TOKEN_DEST" ]]; then
    cat "$TOKEN_DEST" >"$WORK/token"
else
    die "no API token: give --api-token-file FILE (or API_TOKEN in the environment)"
fi
umask 022
TOKEN="$(tr -d '[:space:]' <"$WORK/token")"
[[ -n "$TOKEN" ]] || die "the API token is empty: put the CloudVision service-account token in the token file"
printf '%s\n' "$TOKEN" >"$WORK/token"
chmod 600 "$WORK/token"
printf 'Authorization: Bearer %s\n' "$TOKEN" >"$WORK/auth-header"
chmod 600 "$WORK/auth-header"
unset TOKEN API_TOKEN

# CloudVision answers with the token? (token via a header file, never on the command line)
# The probe is cvslurm's own (src/cloudvision/mod.rs `probe`): a GetOne of a JobConfig key no job
# has. CloudVision needs a full key for a GET of JobConfig, so its not-found answer (404 with
# the gRPC-gateway body {"code":5,...}) proves the server and the token; 200 with JSON is as
# good. Any other 404, or a 200 page that is not JSON, is a web server, not CloudVision.
check_cloudvision() {
    local -a tls=()
    local code why
    if ((INSECURE)); then tls=(--insecure); elif [[ -n "$CA" ]]; then tls=(--cacert "$CA"); fi
    command -v curl >/dev/null 2>&1 || { echo "curl is not installed"; return 1; }
    code="$(curl -sS -o "$WORK/probe.body" -w '%{http_code}' --connect-timeout 5 --max-time 15 "${tls[@]}" \
        -H @"$WORK/auth-header" -H 'Accept: application/json' \
        "https://$SERVER/api/resources/computejob/v1/JobConfig?key.id=cvslurm-probe-key-that-no-job-has" \
        2>"$WORK/curl.err")" || true
    # the server's message, one line, printable only
    why="$(head -c 2000 "$WORK/probe.body" 2>/dev/null | sed -n 's/.*"message" *: *"\([^"]*\)".*/\1/p' | head -n 1 | tr -cd '[:print:]' | head -c 300 || true)"
    # the first bytes of the body, one line, printable only
    local head
    head="$(head -c 120 "$WORK/probe.body" 2>/dev/null | tr '\n\t' '  ' | tr -cd '[:print:]' || true)"
    local not_cv="CloudVision $SERVER: the server is not answering as CloudVision: HTTP $code \"$head\": set --api-server (ApiServer) to CloudVision's own address (not a web server, proxy or stub in front of it)"
    case "$code" in
        2??)
            if [[ -z "${head//[[:space:]]/}" ]] || [[ "$(tr -d '[:space:]' <"$WORK/probe.body" | head -c 1)" == "{" ]]; then
                return 0
            fi
            echo "$not_cv" ;;
        404)
            if grep -Eq '"code"[[:space:]]*:[[:space:]]*5[^0-9]' "$WORK/probe.body" 2>/dev/null; then
                return 0
            fi
            echo "$not_cv" ;;
        401 | 403) echo "CloudVision $SERVER refused the token (HTTP $code${why:+: $why}): use a service-account token with JobConfig/NodeConfig permission" ;;
        000 | "") echo "CloudVision $SERVER is not reachable: $(head -c 300 "$WORK/curl.err" | tr '\n' ' ')(check the name, port, firewall and --ca-file)" ;;
        *) echo "CloudVision $SERVER answered HTTP $code${why:+ ($why)} to a GetOne of JobConfig: is it CloudVision with the computejob API?" ;;
    esac
    return 1
}
if msg="$(check_cloudvision)"; then
    say "CloudVision $SERVER answers with the token"
elif ((OFFLINE)); then
    warn "$msg; continuing (--offline)"
else
    die "$msg; or add --offline to install anyway"
fi

# the hooks: ours, none, or the site's own
VERSION="$(fact slurm_version)"
VERSION="${VERSION%.*}"
MULTI=0
if [[ "$(fact several_hooks)" == yes ]]; then MULTI=1; fi
declare -a ADD_LINES=()
TAKEOVER=0
JOBCOMP_LOC="http://127.0.0.1:$JOBCOMP_PORT/slurm/jobcomp"
# the site's own JobCompType (not a line of ours): one per cluster, so never replaced; its
# JobCompLoc as the site wrote it (a line an earlier --jobcomp took over included)
site_conf() { sed "s/^$OFF_PREFIX//" "$SLURM_CONF_FILE" | grep -v -e "$MARK" || true; }
JOBCOMP_LOC_RE='^[[:space:]]*[Jj][Oo][Bb][Cc][Oo][Mm][Pp][Ll][Oo][Cc][[:space:]]*='
site_jobcomp="$(site_conf | sed -n 's/^[[:space:]]*[Jj][Oo][Bb][Cc][Oo][Mm][Pp][Tt][Yy][Pp][Ee][[:space:]]*=[[:space:]]*\([^[:space:]#]*\).*/\1/p' | tail -n 1)"
site_jobcomp_loc="$(site_conf | sed -n 's/^[[:space:]]*[Jj][Oo][Bb][Cc][Oo][Mm][Pp][Ll][Oo][Cc][[:space:]]*=[[:space:]]*\([^[:space:]#]*\).*/\1/p' | tail -n 1)"
jobcomp_plugin() {
    compgen -G "/usr/lib*/slurm*/jobcomp_elasticsearch.so" >/dev/null \
        || compgen -G "/usr/lib*/*/slurm*/jobcomp_elasticsearch.so" >/dev/null \
        || compgen -G "/usr/local/lib*/slurm/jobcomp_elasticsearch.so" >/dev/null
}
# The default set-up: no EpilogSlurmctld (its end can make slurmctld miss a scheduling pass:
# README "Without EpilogSlurmctld"). Ends from Slurm's job-completion plugin where the site
# has no JobCompType of its own and the plugin is there, else from reconciliation.
if ((JOBCOMP + NO_EPILOG + EPILOG == 0)); then
    if ((SERVICE == 0)); then
        EPILOG=1
        say "set-up: both hooks (--no-service: each hook sends its own event)"
    elif [[ "$site_jobcomp" == jobcomp/elasticsearch && "${site_jobcomp_loc%/}" == "$JOBCOMP_LOC" ]]; then
        JOBCOMP=1
        say "set-up: PrologSlurmctld for starts, job ends from Slurm's job-completion plugin (--jobcomp; slurm.conf already posts to $JOBCOMP_LOC)"
    elif [[ "$site_jobcomp" == jobcomp/elasticsearch ]] && grep -q "^$OFF_PREFIX" "$SLURM_CONF_FILE"; then
        JOBCOMP=1
        say "set-up: PrologSlurmctld for starts, job ends from Slurm's job-completion plugin (--jobcomp; slurm.conf's JobCompLoc was taken over by an earlier --jobcomp, its documents forwarded)"
    elif [[ -n "$site_jobcomp" && "$site_jobcomp" != jobcomp/none ]]; then
        NO_EPILOG=1
        say "set-up: PrologSlurmctld only; slurm.conf keeps its JobCompType=$site_jobcomp (a cluster has one), so the service sends each end from slurmctld (--no-epilog)"
        [[ "$site_jobcomp" != jobcomp/elasticsearch ]] \
            || say "  (--jobcomp would take its JobCompLoc and forward every document there, unchanged: JobCompForward)"
    elif jobcomp_plugin; then
        JOBCOMP=1
        say "set-up: PrologSlurmctld for starts, job ends from Slurm's job-completion plugin (--jobcomp)"
    else
        NO_EPILOG=1
        say "set-up: PrologSlurmctld only; Slurm's jobcomp/elasticsearch plugin was not found (Debian/Ubuntu: slurm-wlm-elasticsearch-plugin), so the service sends each end from slurmctld (--no-epilog); install the plugin and run install.sh again for ends from Slurm itself"
    fi
fi
if ((JOBCOMP)); then
    case "$site_jobcomp" in
        "" | jobcomp/none) ;;
        jobcomp/elasticsearch)
            if [[ "${site_jobcomp_loc%/}" != "$JOBCOMP_LOC" ]]; then
                # the takeover: cvslurm's receiver gets JobCompLoc and forwards every document
                # to the site's URL (JobCompForward); only a line that says JobCompLoc and
                # nothing else is taken
                shown_loc="$(printf '%s' "$site_jobcomp_loc" | sed -E 's|(://[^/@:]*):[^/@]*@|\1:***@|')"
                loc_lines="$(site_conf | grep -c -e "$JOBCOMP_LOC_RE" || true)"
                simple_lines="$(site_conf | grep -E -c -e "${JOBCOMP_LOC_RE}[[:space:]]*[^[:space:]#]+[[:space:]]*(#.*)?\$" || true)"
                if ! [[ "$site_jobcomp_loc" =~ ^[Hh][Tt][Tt][Pp][Ss]?://[^[:space:]/]+ ]] || [[ "$loc_lines" != "$simple_lines" ]]; then
                    die "$(printf 'slurm.conf sets JobCompType=jobcomp/elasticsearch with JobCompLoc=%s, which --jobcomp cannot take over (it needs one http(s):// URL alone on its JobCompLoc line).\n  Nothing was changed. Put it that way and run this again, or keep yours and install with --no-epilog' "$shown_loc")"
                fi
                TAKEOVER=1
                say "--jobcomp takes over slurm.conf's JobCompLoc=$shown_loc: slurmctld posts to the service's receiver ($JOBCOMP_LOC), which forwards every document there, unchanged (cloudvision.conf JobCompForward); --uninstall gives the line back as it was"
            fi
            ;;
        *) die "$(printf 'slurm.conf sets JobCompType=%s, and a cluster has one: --jobcomp would take it.\n  Nothing was changed. Keep yours and install without --jobcomp (--no-epilog: the service sends each end from slurmctld), or give up %s and add these lines to slurm.conf yourself:\n    JobCompType=jobcomp/elasticsearch\n    JobCompLoc=%s' "$site_jobcomp" "$site_jobcomp" "$JOBCOMP_LOC")" ;;
    esac
    if ! jobcomp_plugin; then
        warn "Slurm's jobcomp/elasticsearch plugin (jobcomp_elasticsearch.so) was not found here: install it (Debian/Ubuntu: slurm-wlm-elasticsearch-plugin; RHEL: Slurm built with libcurl), or slurmctld will not start with JobCompType=jobcomp/elasticsearch"
    fi
    case "$(fact slurm_version)" in
        2[0-2].* | 23.0[0-9]*) warn "Slurm $(fact slurm_version): restart slurmctld for JobCompType to take effect (systemctl restart slurmctld; scontrol reconfigure restarts it only from 23.11)" ;;
    esac
    if ((TAKEOVER)); then
        ADD_LINES+=("JobCompLoc=$JOBCOMP_LOC  $MARK")
    elif [[ "$site_jobcomp" == jobcomp/elasticsearch ]]; then
        say "slurm.conf already posts job ends to $JOBCOMP_LOC"
    else
        ADD_LINES+=("JobCompType=jobcomp/elasticsearch  $MARK" "JobCompLoc=$JOBCOMP_LOC  $MARK")
    fi
fi
for key in PrologSlurmctld EpilogSlurmctld; do
    if ((JOBCOMP)) && [[ "$key" == EpilogSlurmctld ]]; then
        while read -r kind v; do
            if [[ "$kind" == calls ]]; then
                warn "EpilogSlurmctld $v calls cvslurm-hook: --jobcomp leaves it; remove that call (the ends come from the job-completion plugin)"
            fi
        done < <(fact "$key.program")
        say "--jobcomp: no EpilogSlurmctld for cvslurm; Slurm's job-completion plugin posts each job's end to the service at $JOBCOMP_LOC"
        continue
    fi
    if ((NO_EPILOG)) && [[ "$key" == EpilogSlurmctld ]]; then
        # our own marked line (an earlier install) goes with the rebuild below; a site's
        # script that calls the hook is the site's to change
        while read -r kind v; do
            if [[ "$kind" == calls ]]; then
                warn "EpilogSlurmctld $v calls cvslurm-hook: --no-epilog leaves it; remove that call for the PrologSlurmctld-only set-up"
            fi
        done < <(fact "$key.program")
        say "--no-epilog: no EpilogSlurmctld for cvslurm; the service sends each job's end from slurmctld every 5 s"
        continue
    fi
    current="$(fact "$key")"
    ours=0; foreign=()
    while read -r kind v; do
        case "$kind" in
            ours) ours=1 ;;
            calls) ours=1; say "$key $v already calls cvslurm-hook" ;;
            *) foreign+=("$v") ;;
        esac
    done < <(fact "$key.program")
    if ((ours)); then continue; fi
    if ((${#foreign[@]} == 0)); then
        ADD_LINES+=("$key=$HOOK  $MARK")
    elif ((MULTI)); then
        # its own line: Slurm >= 24.05 runs every line of the key (in parallel); a comma list
        # would be read as one path, and slurmctld 24.11+ does not start with a missing hook
        say "$key is $current: Slurm $VERSION runs several, adding a $key line for cvslurm-hook beside it"
        ADD_LINES+=("$key=$HOOK  $MARK")
    else
        die "$(printf '%s is already set to %s and Slurm %s runs only one %s.\n  Nothing was changed. Add this line at the end of %s (it reads the job from the environment and always exits 0):\n    %s\n  then run ./install.sh again (it will see the call and leave %s alone)' \
            "$key" "$current" "${VERSION:-(unknown version)}" "$key" "$current" "\"$HOOK\"" "$key")"
    fi
done

# Two controllers: the hook must be on every SlurmctldHost before slurm.conf names it.
if ((NO_HOOKS)); then
    ADD_LINES=()
    say "--no-hooks: slurm.conf is left as it is; install on this host's other controllers the same way, then run install.sh without --no-hooks on the last one"
elif ((${#ADD_LINES[@]} > 0)); then
    # "--" ends ssh's options: the host name that follows is never read as one.
    read -r -a REMOTE <<<"${CVSLURM_REMOTE:-ssh -o BatchMode=yes -o ConnectTimeout=5 --}"
    missing=()
    while read -r host whose; do
        [[ "$whose" == other ]] || continue
        rc=0
        "${REMOTE[@]}" "$host" test -x "$HOOK" </dev/null >"$WORK/remote.out" 2>&1 || rc=$?
        case "$rc" in
            0) say "controller $host has $HOOK" ;;
            1) missing+=("$host") ;;
            *) warn "cannot check controller $host (${REMOTE[0]} exited $rc: $(head -c 200 "$WORK/remote.out" | tr '\n' ' ')): install cvslurm there before slurmctld starts on it with this slurm.conf (from Slurm 23.02 it does not start without $HOOK)" ;;
        esac
    done < <(fact controller)
    if ((${#missing[@]} > 0)); then
        die "$(printf 'controller(s) %s lack %s, and slurm.conf would name it: from Slurm 23.02 slurmctld does not start there without it.\n  Nothing was changed. Install there first without touching slurm.conf:\n    ./install.sh --no-hooks <the same options>\n  then run this again.' "${missing[*]}" "$HOOK")"
    fi
fi

# ---------- plan + apply ----------
# directories
ensure_dir() { # path mode owner
    local d="$1" mode="$2" owner="$3"
    if [[ -d "$d" ]]; then
        if man_has "dir $d"; then man_add "dir $d"; fi
        return 0
    fi
    changed "create directory $d (owner $owner, mode $mode)"
    ((DRY)) || install -d -m "$mode" -o "$owner" -g "$(id -gn "$owner")" "$d"
    man_add "dir $d"
}
ensure_dir "$INSTALL_DIR" 0755 root
ensure_dir "$STATE_DIR" 0750 "$SLURM_USER"
if [[ -d "$STATE_DIR" && "$(stat -c %U "$STATE_DIR")" != "$SLURM_USER" ]]; then
    changed "chown $SLURM_USER:$SLURM_GROUP $STATE_DIR (the hook writes the outbox there)"
    ((DRY)) || chown -R "$SLURM_USER:$SLURM_GROUP" "$STATE_DIR"
fi
ensure_dir "$LOG_DIR" 0755 "$SLURM_USER"
LOG_FILE="$LOG_DIR/cvjob.log"
if [[ -d "$LOG_DIR" ]] && ! runuser -u "$SLURM_USER" -- test -w "$LOG_DIR" 2>/dev/null; then
    # a log directory we do not own: give SlurmUser its own log file in it
    if [[ ! -e "$LOG_FILE" ]]; then
        changed "create $LOG_FILE owned by $SLURM_USER ($LOG_DIR is not writable for it)"
        ((DRY)) || install -m 0640 -o "$SLURM_USER" -g "$SLURM_GROUP" /dev/null "$LOG_FILE"
        man_add "log $LOG_FILE"
    fi
fi
if man_has "log $LOG_FILE"; then man_add "log $LOG_FILE"; fi

# binary + symlinks
if [[ -n "$BINARY" ]]; then
    if [[ -f "$INSTALL_DIR/cvslurm" ]] && cmp -s "$BINARY" "$INSTALL_DIR/cvslurm"; then
        fix_meta "$INSTALL_DIR/cvslurm" 0755 root
    else
        changed "install $BINARY as $INSTALL_DIR/cvslurm ($("$BINARY" --version))"
        BINARY_CHANGED=1
        if ((DRY == 0)); then
            install -m 0755 -o root -g root "$BINARY" "$INSTALL_DIR/.cvslurm.new"
            mv -f "$INSTALL_DIR/.cvslurm.new" "$INSTALL_DIR/cvslurm"
        fi
    fi
    man_add "file $INSTALL_DIR/cvslurm"
fi
# the mode links: every name `cvslurm --list-modes` gives (the mode, then its link names)
mapfile -t MODE_LINKS < <("$BINARY" --list-modes | cut -d' ' -f2- | tr ' ' '\n' | grep -v '^$')
((${#MODE_LINKS[@]} > 0)) || die "$BINARY --list-modes printed no mode: is it a cvslurm binary of this version?"
for m in "${MODE_LINKS[@]}"; do
    link="$INSTALL_DIR/$m"
    if [[ -L "$link" && "$(readlink "$link")" == cvslurm ]]; then :; else
        [[ -e "$link" && ! -L "$link" ]] && die "$link exists and is not a symlink: move it away"
        changed "symlink $link -> cvslurm"
        ((DRY)) || ln -sfn cvslurm "$link"
    fi
    man_add "link $link"
done

# the token file
put_text "$WORK/token" "$TOKEN_DEST" 0600 "$SLURM_USER:$SLURM_GROUP" token secret

# cloudvision.conf: our keys set, the site's other keys kept
{
    if [[ -f "$CV_CONF" ]]; then
        cat "$CV_CONF"
    else
        printf '# cvslurm configuration (see cloudvision.conf(5); every key with its default:\n'
        printf '# %s/cloudvision.conf.example). Written by install.sh; other keys you add are kept.\n' "$SLURM_CONF_DIR"
    fi
} >"$WORK/cv.conf.old"
set_keys=("ApiServer=$SERVER" "ApiTokenFile=$TOKEN_DEST" "LogFile=$LOG_FILE" "StateDir=$STATE_DIR")
[[ -n "$CA" ]] && set_keys+=("CaFile=$CA")
((INSECURE)) && set_keys+=("Insecure=yes")
((NO_EPILOG)) && set_keys+=("ReconcileInterval=5")
((JOBCOMP)) && set_keys+=("JobCompPort=$JOBCOMP_PORT")
((TAKEOVER)) && set_keys+=("JobCompForward=$site_jobcomp_loc")
printf '%s\n' "${set_keys[@]}" | awk -F= '
    NR == FNR { want[tolower($1)] = $0; order[++n] = tolower($1); next }
    {
        line = $0; k = line; sub(/#.*/, "", k); split(k, kv, "="); key = tolower(kv[1]); gsub(/[ \t]/, "", key)
        if (key in want) { if (!(key in done)) { print want[key]; done[key] = 1 }; next }
        print
    }
    END { for (i = 1; i <= n; i++) if (!(order[i] in done)) print want[order[i]] }
' - "$WORK/cv.conf.old" >"$WORK/cv.conf"
put_text "$WORK/cv.conf" "$CV_CONF" 0644 root:root conf

# packaging files: the example, the service, logrotate, the Prometheus alert rules
if [[ -f "$SRC_DIR/packaging/cloudvision.conf.example" ]]; then
    put_text "$SRC_DIR/packaging/cloudvision.conf.example" "$SLURM_CONF_DIR/cloudvision.conf.example" 0644 root:root file
fi
if [[ -f "$SRC_DIR/packaging/prometheus/cvslurm-alerts.yml" ]]; then
    put_text "$SRC_DIR/packaging/prometheus/cvslurm-alerts.yml" "$INSTALL_DIR/cvslurm-alerts.yml" 0644 root:root file
fi
if ((SERVICE)) && [[ -f "$SRC_DIR/packaging/cvslurm.service" ]]; then
    sed -e "s|/opt/slurm/cloudvision/cvslurm|$INSTALL_DIR/cvslurm|g" \
        -e "s|^User=.*|User=$SLURM_USER|" -e "s|^Group=.*|Group=$SLURM_GROUP|" \
        -e "s|^ReadWritePaths=.*|ReadWritePaths=$STATE_DIR $LOG_DIR|" \
        "$SRC_DIR/packaging/cvslurm.service" >"$WORK/unit"
    if [[ "$CV_CONF" != /etc/slurm/cloudvision.conf ]]; then
        sed -i "s|^ExecStart=|Environment=CVSLURM_CONF=$CV_CONF SLURM_CONF=$SLURM_CONF_FILE\nExecStart=|" "$WORK/unit"
    fi
    if [[ -d "$UNIT_DIR" ]]; then
        if ! { [[ -f "$UNIT" ]] && cmp -s "$WORK/unit" "$UNIT"; }; then UNIT_CHANGED=1; fi
        put_text "$WORK/unit" "$UNIT" 0644 root:root unit
    else
        say "no $UNIT_DIR: not installing the cvslurm service (run $INSTALL_DIR/cvslurm inventory --monitor under your supervisor)"
    fi
fi
if [[ -d "$LOGROTATE_DIR" && -f "$SRC_DIR/packaging/cvslurm.logrotate" ]]; then
    sed -e "s|/var/log/slurm/cvjob.log|$LOG_FILE|" -e "s|^\( *\)su .*|\1su $SLURM_USER $SLURM_GROUP|" \
        "$SRC_DIR/packaging/cvslurm.logrotate" >"$WORK/logrotate"
    put_text "$WORK/logrotate" "$LOGROTATE" 0644 root:root logrotate
fi

# slurm.conf: our marked lines at the end (--no-hooks: left as it is)
if ((NO_HOOKS)); then
    cp "$SLURM_CONF_FILE" "$WORK/slurm.base"
else
    { grep -v -e "$MARK_RE" "$SLURM_CONF_FILE" || true; } | sed "s/^$OFF_PREFIX//" >"$WORK/slurm.base"
    if ((TAKEOVER)); then
        sed -i "s/\($JOBCOMP_LOC_RE\)/$OFF_PREFIX\1/" "$WORK/slurm.base"
    fi
fi
noeol=0
if [[ -s "$SLURM_CONF_FILE" && "$(tail -c 1 "$SLURM_CONF_FILE" | od -An -c | tr -d ' ')" != '\n' ]] \
    && ! grep -q -e "$MARK_RE" "$SLURM_CONF_FILE"; then
    noeol=1
fi
old_noeol="$(man_old | awk -v p="$SLURM_CONF_FILE" '$1 == "slurmconf" && $2 == p { print $3 }')"
[[ "$old_noeol" == 1 ]] && noeol=1
{
    cat "$WORK/slurm.base"
    ((${#ADD_LINES[@]} == 0)) || printf '%s\n' "${ADD_LINES[@]}"
} >"$WORK/slurm.conf.new"
if ((${#ADD_LINES[@]} == 0)) && ! grep -q -e "$MARK_RE" "$SLURM_CONF_FILE"; then
    cp "$SLURM_CONF_FILE" "$WORK/slurm.conf.new"
fi
SLURM_CONF_CHANGED=0
if ! cmp -s "$SLURM_CONF_FILE" "$WORK/slurm.conf.new"; then
    SLURM_CONF_CHANGED=1
    changed "update $SLURM_CONF_FILE (lines marked \"$MARK\")"
    ((DRY)) && show_diff "$SLURM_CONF_FILE" "$WORK/slurm.conf.new" "$SLURM_CONF_FILE"
    if ((DRY == 0)); then
        cat "$WORK/slurm.conf.new" >"$SLURM_CONF_FILE.cvslurm-new"
        chmod --reference="$SLURM_CONF_FILE" "$SLURM_CONF_FILE.cvslurm-new"
        chown --reference="$SLURM_CONF_FILE" "$SLURM_CONF_FILE.cvslurm-new"
        mv -f "$SLURM_CONF_FILE.cvslurm-new" "$SLURM_CONF_FILE"
    fi
fi
if ((NO_HOOKS == 0)) && grep -q -e "$MARK_RE" "$WORK/slurm.conf.new"; then
    man_add "slurmconf $SLURM_CONF_FILE $noeol"
fi
if [[ "$SLURM_CONF_DIR" != /etc/slurm ]]; then
    warn "the hook reads /etc/slurm/cloudvision.conf; with SLURM_CONF_DIR=$SLURM_CONF_DIR make sure slurmctld's hook finds $CV_CONF (e.g. a symlink)"
fi

# the service
if ((SERVICE)) && [[ -f "$UNIT" || "${UNIT_CHANGED:-0}" == 1 ]]; then
    man_add "service cvslurm.service"
    if systemd_running; then
        if ((DRY)); then
            say "would run: systemctl daemon-reload; systemctl enable cvslurm; systemctl (re)start cvslurm"
        else
            [[ "${UNIT_CHANGED:-0}" == 1 ]] && systemctl daemon-reload
            if ! systemctl is-enabled --quiet cvslurm.service; then changed "systemctl enable cvslurm"; systemctl enable cvslurm.service; fi
            if [[ "${UNIT_CHANGED:-0}" == 1 || "${BINARY_CHANGED:-0}" == 1 || "$CHANGES" -gt 0 ]] || ! systemctl is-active --quiet cvslurm.service; then
                systemctl restart cvslurm.service || warn "the cvslurm service did not start: journalctl -u cvslurm"
            fi
        fi
    else
        say "systemd is not running: the unit file is in place but not started; run '$INSTALL_DIR/cvslurm inventory --monitor' under your service manager"
    fi
fi

# the manifest
{
    printf '# cvslurm install manifest: what install.sh added; ./install.sh --uninstall removes it\n'
    printf '%s\n' "${MAN_NEW[@]}" | sort -u
} >"$WORK/manifest"
if ! { [[ -f "$MANIFEST" ]] && cmp -s "$WORK/manifest" "$MANIFEST"; }; then
    if ((CHANGES == 0)); then changed "update $MANIFEST"; fi
    ((DRY)) || install -m 0644 -o root -g root "$WORK/manifest" "$MANIFEST"
fi

# apply the hooks
if ((SLURM_CONF_CHANGED)); then
    apply_reconfigure
    if [[ " ${ADD_LINES[*]:-} " == *logSlurmctld=* ]]; then pair_restart_note; fi
fi

if ((DRY)); then
    if ((CHANGES == 0)); then say "no change"; else say "dry run: $CHANGES change(s) shown, nothing changed"; fi
    exit 0
fi
if ((CHANGES == 0)); then say "no change"; else say "done: $CHANGES change(s)"; fi

# Prometheus: suggest (never set) MetricsFile where node_exporter's textfile directory exists
if ! grep -qsE '^[[:space:]]*MetricsFile[[:space:]]*=' "$CV_CONF"; then
    for d in $TEXTFILE_DIRS; do
        if [[ -d "$d" ]]; then
            say "for Prometheus metrics: add MetricsFile=$d/cvslurm.prom to $CV_CONF (let $SLURM_USER write $d), restart the service, and load $INSTALL_DIR/cvslurm-alerts.yml (README: Monitoring)"
            break
        fi
    done
fi

# ---------- final check ----------
export CVSLURM_CONF="$CV_CONF"
if "$INSTALL_DIR/cvslurm" check --help >/dev/null 2>&1; then
    say "running $INSTALL_DIR/cvslurm check"
    "$INSTALL_DIR/cvslurm" check || warn "cvslurm check found problems (above); fix them, then run $INSTALL_DIR/cvslurm check"
else
    say "running $INSTALL_DIR/cvslurm status --offline"
    "$INSTALL_DIR/cvslurm" status --offline || warn "cvslurm status reported a problem (above)"
fi
