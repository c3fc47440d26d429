#!/usr/bin/env bash
# Tests of install.sh: fresh install, idempotent second run, --dry-run, refusing a site's own
# PrologSlurmctld on Slurm < 24.05, adding its own line beside it on 24.05+, Include + spacing,
# offline, uninstall leaving slurm.conf byte-identical.
#
# Usage: sudo tests/install/test_install.sh
# Needs root, python3 (the CloudVision stand-in), curl, and a cvslurm binary ($CVSLURM_BIN, else
# target/x86_64-unknown-linux-musl/release/cvslurm, else it is built).
#
# Everything goes to a scratch dir (INSTALL_DIR, STATE_DIR, LOG_DIR, the systemd unit and
# logrotate dirs, cloudvision.conf), so it does not clash with other tests. slurm.conf is a copy
# of the test cluster's /etc/slurm/slurm.conf (tests/cluster/cluster.sh up) when there is one,
# else a minimal one. With LIVE=1 and a running test cluster, the fresh install/uninstall also
# run against the real /etc/slurm/slurm.conf with `scontrol reconfigure`; the file is restored
# byte for byte at the end (checked by sha256). The live checks restart slurmctld
# (tests/cluster/cluster.sh restart-slurmctld) after every change and require it to come up:
# fresh install, second run, uninstall, then a site's own hooks (installed beside them on Slurm
# 24.05+, refused with the line to add on older Slurm). Slurm commands come from PATH: put the
# cluster's bin dir first (tests/run-all.sh does) to test another version than the host's.
#
# Prints "ok - NAME" / "not ok - NAME" per check and "N passed, M failed"; exits 1 on failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
INSTALL="$ROOT/install.sh"
MARK="# added by cvslurm install.sh"
TOKEN="tok-$RANDOM$RANDOM-secret"
PASS=0
FAIL=0

ok() { PASS=$((PASS + 1)); printf 'ok - %s\n' "$1"; }
notok() { FAIL=$((FAIL + 1)); printf 'not ok - %s\n' "$1"; [[ -z "${2:-}" ]] || printf '#   %s\n' "$2"; }
check() { # NAME CMD...: ok when CMD succeeds
    local name="$1"
    shift
    if "$@" >/dev/null 2>&1; then ok "$name"; else notok "$name" "failed: $*"; fi
}

[[ "$(id -u)" == 0 ]] || { echo "test_install.sh: must run as root" >&2; exit 2; }
if ! command -v python3 >/dev/null || ! command -v curl >/dev/null; then
    echo "test_install.sh: needs python3 and curl" >&2
    exit 2
fi

BIN="${CVSLURM_BIN:-$ROOT/target/x86_64-unknown-linux-musl/release/cvslurm}"
if [[ ! -x "$BIN" ]]; then
    echo "# building $BIN"
    (cd "$ROOT" && cargo build --release --target x86_64-unknown-linux-musl) >&2
fi

S="$(mktemp -d /tmp/cvslurm-install-test.XXXXXX)"
# slurmctld (SlurmUser) must reach the hooks installed under it
chmod 0755 "$S"
STANDIN_PID=""
LIVE_BACKUP=""
cleanup() {
    local rc=$?
    [[ -z "$STANDIN_PID" ]] || kill "$STANDIN_PID" 2>/dev/null || true
    if [[ -n "$LIVE_BACKUP" && -f "$LIVE_BACKUP" ]]; then
        if ! cmp -s "$LIVE_BACKUP" /etc/slurm/slurm.conf; then
            cat "$LIVE_BACKUP" >/etc/slurm/slurm.conf
            echo "# restored /etc/slurm/slurm.conf"
            "$ROOT/tests/cluster/cluster.sh" restart-slurmctld >/dev/null 2>&1 || true
        fi
    fi
    rm -rf "$S"
    exit "$rc"
}
trap cleanup EXIT

# ---------- the stand-in ----------
mkdir -p "$S/standin"
python3 "$ROOT/tests/standin/cv_standin.py" --dir "$S/standin" --port 0 --token "$TOKEN" >"$S/standin.log" 2>&1 &
STANDIN_PID=$!
for _ in $(seq 100); do [[ -s "$S/standin/port" ]] && break; sleep 0.1; done
[[ -s "$S/standin/port" ]] || { echo "test_install.sh: the stand-in did not start: $(cat "$S/standin.log")" >&2; exit 1; }
PORT="$(cat "$S/standin/port")"
CA="$S/standin/ca.pem"
printf '%s\n' "$TOKEN" >"$S/token.in"
chmod 600 "$S/token.in"

# ---------- a scratch environment per case ----------
# env_for DIR: exports the scratch locations under DIR; slurm.conf is DIR/etc/slurm.conf
env_for() {
    local d="$1"
    mkdir -p "$d/etc" "$d/units" "$d/logrotate"
    export SLURM_CONF_DIR="$d/etc" SLURM_CONF="$d/etc/slurm.conf" INSTALL_DIR="$d/opt/cloudvision" \
        STATE_DIR="$d/spool/cvslurm" LOG_DIR="$d/log/slurm" SYSTEMD_UNIT_DIR="$d/units" LOGROTATE_DIR="$d/logrotate" \
        TEXTFILE_DIRS="$d/none $d/node-exporter"
    unset SLURM_VERSION API_TOKEN API_SERVER
}
base_conf() { # a slurm.conf without PrologSlurmctld/EpilogSlurmctld
    if [[ -r /etc/slurm/slurm.conf ]] && grep -qi '^ClusterName' /etc/slurm/slurm.conf; then
        grep -vi -e '^[[:space:]]*prologslurmctld' -e '^[[:space:]]*epilogslurmctld' /etc/slurm/slurm.conf
    else
        printf 'ClusterName=cvtest\nSlurmctldHost=localhost\nSlurmUser=slurm\nNodeName=n1 CPUs=1\nPartitionName=debug Nodes=ALL Default=YES\n'
    fi
}
run_install() { # LOGFILE ARGS...
    local log="$1"
    shift
    "$INSTALL" --api-server "127.0.0.1:$PORT" --api-token-file "$S/token.in" --ca-file "$CA" \
        --binary "$BIN" --no-reconfigure "$@" >"$log" 2>&1
}
# snapshot DIR: every file under DIR with its mode, owner and content hash
snapshot() {
    find "$1" -mindepth 1 \( -path "$1/snap*" -o -name '*.log' -o -name 'out*' \) -prune -o -printf '%p %m %u %g %l\n' | sort
    find "$1" -type f ! -name '*.log' ! -name 'out*' ! -name 'snap*' -exec sha256sum {} + | sort
}

# ========== 1. fresh install (dry run first) ==========
A="$S/a"
env_for "$A"
base_conf >"$SLURM_CONF"
mkdir -p "$A/node-exporter" # node_exporter's textfile directory: suggested, never set
sha_before="$(sha256sum <"$SLURM_CONF")"
snapshot "$A" >"$A/snap0"
if run_install "$A/out.dry" --dry-run; then ok "dry run before install exits 0"; else notok "dry run before install exits 0" "$(tail -3 "$A/out.dry")"; fi
snapshot "$A" >"$A/snap1"
check "dry run changes nothing" cmp -s "$A/snap0" "$A/snap1"
check "dry run shows the slurm.conf diff" grep -q "^+PrologSlurmctld=$INSTALL_DIR/cvslurm-hook  $MARK" "$A/out.dry"
check "dry run shows the cloudvision.conf diff" grep -q "^+ApiServer=127.0.0.1:$PORT" "$A/out.dry"
if grep -qF "$TOKEN" "$A/out.dry"; then notok "dry run does not show the token"; else ok "dry run does not show the token"; fi

if run_install "$A/out.1"; then ok "fresh install exits 0"; else notok "fresh install exits 0" "$(tail -5 "$A/out.1")"; fi
check "binary installed" test -x "$INSTALL_DIR/cvslurm"
links_ok=1
# every link name the binary lists (`cvslurm --list-modes`: the mode, then its link names)
mapfile -t links < <("$BIN" --list-modes | cut -d' ' -f2- | tr ' ' '\n' | grep -v '^$')
((${#links[@]} >= 7)) || links_ok=0
for m in "${links[@]}"; do
    [[ -L "$INSTALL_DIR/$m" && "$(readlink "$INSTALL_DIR/$m")" == cvslurm ]] || links_ok=0
done
check "every mode symlink installed" test "$links_ok" = 1
check "cloudvision.conf is 0644" test "$(stat -c %a "$SLURM_CONF_DIR/cloudvision.conf")" = 644
check "token file is 0600 and owned by SlurmUser" test "$(stat -c '%a %U' "$SLURM_CONF_DIR/cloudvision.token")" = "600 slurm"
check "token file holds the token" grep -qxF "$TOKEN" "$SLURM_CONF_DIR/cloudvision.token"
leak=0
while IFS= read -r f; do grep -qF "$TOKEN" "$f" && leak=1; done < <(find "$A" -type f -perm -o=r ! -name 'out*')
check "no world-readable file holds the token" test "$leak" = 0
check "StateDir owned by SlurmUser" test "$(stat -c %U "$STATE_DIR")" = slurm
check "LOG_DIR owned by SlurmUser" test "$(stat -c %U "$LOG_DIR")" = slurm
check "the default set-up: our PrologSlurmctld, marked" grep -qxF "PrologSlurmctld=$INSTALL_DIR/cvslurm-hook  $MARK" "$SLURM_CONF"
check "the default set-up: no EpilogSlurmctld" sh -c "! grep -qi '^[[:space:]]*epilogslurmctld' '$SLURM_CONF'"
check "the default set-up: ends from Slurm's job-completion plugin (installed here)" \
    sh -c "grep -qxF 'JobCompType=jobcomp/elasticsearch  $MARK' '$SLURM_CONF' && grep -qx 'JobCompPort=9250' '$SLURM_CONF_DIR/cloudvision.conf' && grep -q 'set-up: PrologSlurmctld for starts, job ends from Slurm' '$A/out.1'"
check "manifest written" test -s "$INSTALL_DIR/.install-manifest"
check "unit installed with our paths" grep -q "^ExecStart=$INSTALL_DIR/cvslurm inventory --monitor" "$SYSTEMD_UNIT_DIR/cvslurm.service"
check "final check ran and passed" grep -q "all checks passed" "$A/out.1"
check "alert rules installed" test -f "$INSTALL_DIR/cvslurm-alerts.yml"
check "MetricsFile suggested for the textfile directory that exists" \
    grep -qF "add MetricsFile=$A/node-exporter/cvslurm.prom to $SLURM_CONF_DIR/cloudvision.conf" "$A/out.1"
check "MetricsFile not set by install.sh" sh -c "! grep -qi '^MetricsFile' '$SLURM_CONF_DIR/cloudvision.conf'"

# ========== 2. second run: no change ==========
snapshot "$A" >"$A/snap2"
if run_install "$A/out.2"; then ok "second run exits 0"; else notok "second run exits 0" "$(tail -3 "$A/out.2")"; fi
snapshot "$A" >"$A/snap3"
check "second run changes nothing" cmp -s "$A/snap2" "$A/snap3"
check "second run says no change" grep -qx "install.sh: no change" "$A/out.2"
run_install "$A/out.3" --dry-run || true
snapshot "$A" >"$A/snap4"
check "dry run after install changes nothing" cmp -s "$A/snap2" "$A/snap4"
check "dry run after install says no change" grep -qx "install.sh: no change" "$A/out.3"

# ========== 3. uninstall ==========
if "$INSTALL" --uninstall --no-reconfigure >"$A/out.u" 2>&1; then ok "uninstall exits 0"; else notok "uninstall exits 0" "$(tail -3 "$A/out.u")"; fi
check "uninstall leaves slurm.conf byte-identical" test "$(sha256sum <"$SLURM_CONF")" = "$sha_before"
check "uninstall removes the install dir" test ! -e "$INSTALL_DIR"
check "uninstall removes the unit" test ! -e "$SYSTEMD_UNIT_DIR/cvslurm.service"
check "uninstall removes the logrotate file" test ! -e "$LOGROTATE_DIR/cvslurm"
check "uninstall keeps the token and the config" test -f "$SLURM_CONF_DIR/cloudvision.token" -a -f "$SLURM_CONF_DIR/cloudvision.conf"
run_install "$A/out.4" >/dev/null 2>&1 || true
"$INSTALL" --uninstall --purge --no-reconfigure >"$A/out.p" 2>&1 || true
check "reinstall + uninstall --purge removes token, config, StateDir" \
    test ! -e "$SLURM_CONF_DIR/cloudvision.token" -a ! -e "$SLURM_CONF_DIR/cloudvision.conf" -a ! -e "$STATE_DIR"
check "after purge slurm.conf is still byte-identical" test "$(sha256sum <"$SLURM_CONF")" = "$sha_before"

# ========== 4. a site's own PrologSlurmctld (in an Include, odd spacing) on 22.05 ==========
B="$S/b"
env_for "$B"
base_conf >"$SLURM_CONF"
printf '#!/bin/sh\nexit 0\n' >"$B/etc/site-prolog.sh"
chmod 755 "$B/etc/site-prolog.sh"
printf 'Include site-hooks.conf\n' >>"$SLURM_CONF"
printf '# site hooks\n  prologslurmctld = %s   # ours\n' "$B/etc/site-prolog.sh" >"$B/etc/site-hooks.conf"
snapshot "$B" >"$B/snap0"
if SLURM_VERSION=22.05 run_install "$B/out.1" --epilog; then notok "own PrologSlurmctld on 22.05 is refused"; else ok "own PrologSlurmctld on 22.05 is refused"; fi
check "refusal shows the line to add" grep -qF "\"$INSTALL_DIR/cvslurm-hook\"" "$B/out.1"
check "refusal names the site's script" grep -qF "$B/etc/site-prolog.sh" "$B/out.1"
snapshot "$B" >"$B/snap1"
check "refusal changes nothing" cmp -s "$B/snap0" "$B/snap1"
# detected version (no override): this machine has Slurm 22.05
if command -v slurmctld >/dev/null && slurmctld -V | grep -q ' 22\.05'; then
    if run_install "$B/out.2" --epilog; then notok "refused with the detected Slurm version"; else ok "refused with the detected Slurm version"; fi
fi
# the site adds our line to its script: install then leaves PrologSlurmctld alone
printf '"%s"\n' "$INSTALL_DIR/cvslurm-hook" >>"$B/etc/site-prolog.sh"
if SLURM_VERSION=22.05 run_install "$B/out.3" --epilog; then ok "install accepts a site script that calls cvslurm-hook"; else notok "install accepts a site script that calls cvslurm-hook" "$(tail -3 "$B/out.3")"; fi
check "only EpilogSlurmctld added then" test "$(grep -c -- "$MARK" "$SLURM_CONF")" = 1
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true

# ========== 5. Slurm 24.05: beside the site's hook; file without final newline ==========
C="$S/c"
env_for "$C"
{ base_conf; printf 'EpilogSlurmctld=/usr/local/sbin/site-epilog'; } >"$SLURM_CONF"
sha_c="$(sha256sum <"$SLURM_CONF")"
if SLURM_VERSION=24.05 run_install "$C/out.1" --epilog; then ok "24.05: install beside the site's EpilogSlurmctld"; else notok "24.05: install beside the site's EpilogSlurmctld" "$(tail -3 "$C/out.1")"; fi
check "no textfile directory: no MetricsFile suggestion" sh -c "! grep -q MetricsFile '$C/out.1'"
check "24.05: our EpilogSlurmctld on its own marked line" grep -qxF "EpilogSlurmctld=$INSTALL_DIR/cvslurm-hook  $MARK" "$SLURM_CONF"
check "24.05: the site's EpilogSlurmctld line kept as it was" grep -qxF "EpilogSlurmctld=/usr/local/sbin/site-epilog" "$SLURM_CONF"
check "24.05: no comma list (Slurm 24.11+ reads it as one path and does not start)" \
    sh -c "! grep -i '^[[:space:]]*[pe][a-z]*logslurmctld[[:space:]]*=.*,' '$SLURM_CONF'"
cp "$SLURM_CONF" "$C/after1"
SLURM_VERSION=24.05 run_install "$C/out.2" --epilog || true
check "24.05: second run no change" cmp -s "$C/after1" "$SLURM_CONF"
"$INSTALL" --uninstall --no-reconfigure >"$C/out.u" 2>&1 || true
check "uninstall restores a slurm.conf without final newline byte for byte" test "$(sha256sum <"$SLURM_CONF")" = "$sha_c"

# ========== 6. CloudVision unreachable / token refused ==========
D="$S/d"
env_for "$D"
base_conf >"$SLURM_CONF"
snapshot "$D" >"$D/snap0"
printf 'wrong-token\n' >"$S/bad.token"
chmod 600 "$S/bad.token"
if "$INSTALL" --api-server "127.0.0.1:$PORT" --api-token-file "$S/bad.token" --ca-file "$CA" --binary "$BIN" --no-reconfigure >"$D/out.1" 2>&1; then
    notok "a refused token fails the install"
else
    ok "a refused token fails the install"
fi
check "the refused-token message says what to do" grep -q "refused the token" "$D/out.1"
dead_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
if "$INSTALL" --api-server "127.0.0.1:$dead_port" --api-token-file "$S/token.in" --ca-file "$CA" --binary "$BIN" --no-reconfigure >"$D/out.2" 2>&1; then
    notok "an unreachable CloudVision fails the install"
else
    ok "an unreachable CloudVision fails the install"
fi
# a web server (404 or 200 pages) or Arista's fake CloudVision (a plain 404 to every GET) is
# not CloudVision: the install refuses, naming what answered
for profile in web web200 arista; do
    curl -sS --cacert "$CA" -X POST -d "{\"profile\":\"$profile\"}" "https://127.0.0.1:$PORT/_standin/behaviour" >/dev/null
    if run_install "$D/out.$profile"; then
        notok "the $profile server fails the install"
    else
        ok "the $profile server fails the install"
    fi
    check "the $profile server is named as not CloudVision" grep -q "the server is not answering as CloudVision: HTTP" "$D/out.$profile"
done
curl -sS --cacert "$CA" -X POST -d '{"profile":"cloudvision"}' "https://127.0.0.1:$PORT/_standin/behaviour" >/dev/null
snapshot "$D" >"$D/snap1"
check "failed checks change nothing" cmp -s "$D/snap0" "$D/snap1"
if "$INSTALL" --api-server "127.0.0.1:$dead_port" --api-token-file "$S/token.in" --ca-file "$CA" --binary "$BIN" --no-reconfigure --offline >"$D/out.3" 2>&1; then
    ok "--offline installs with CloudVision unreachable"
else
    notok "--offline installs with CloudVision unreachable" "$(tail -3 "$D/out.3")"
fi
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true

# ========== 6b. --no-epilog: PrologSlurmctld only, and back ==========
E="$S/e"
env_for "$E"
base_conf >"$SLURM_CONF"
sha_e="$(sha256sum <"$SLURM_CONF")"
if run_install "$E/out.1" --no-epilog; then ok "--no-epilog installs"; else notok "--no-epilog installs" "$(tail -3 "$E/out.1")"; fi
check "--no-epilog: our PrologSlurmctld line" grep -qxF "PrologSlurmctld=$INSTALL_DIR/cvslurm-hook  $MARK" "$SLURM_CONF"
check "--no-epilog: no EpilogSlurmctld line" sh -c "! grep -qi '^[[:space:]]*epilogslurmctld' '$SLURM_CONF'"
check "--no-epilog: the service sends the ends every 5 s" grep -qx "ReconcileInterval=5" "$SLURM_CONF_DIR/cloudvision.conf"
check "--no-epilog: the final check passes and names the set-up" \
    sh -c "grep -q 'all checks passed' '$E/out.1' && grep -q 'the PrologSlurmctld-only set-up' '$E/out.1'"
cp "$SLURM_CONF" "$E/after1"
run_install "$E/out.2" --no-epilog || true
check "--no-epilog: second run no change" grep -qx "install.sh: no change" "$E/out.2"
if run_install "$E/out.3" --epilog; then ok "--epilog after --no-epilog: installs"; else notok "--epilog after --no-epilog: installs" "$(tail -3 "$E/out.3")"; fi
check "--epilog after --no-epilog: both hooks" test "$(grep -c -- "^[PE][a-z]*logSlurmctld=$INSTALL_DIR/cvslurm-hook  $MARK\$" "$SLURM_CONF")" = 2
if run_install "$E/out.4" --no-epilog --no-service; then notok "--no-epilog --no-service is refused"; else ok "--no-epilog --no-service is refused"; fi
check "the refusal says why" grep -q "needs the cvslurm service" "$E/out.4"
"$INSTALL" --uninstall --no-reconfigure >"$E/out.u" 2>&1 || true
check "--no-epilog: uninstall restores slurm.conf byte for byte" test "$(sha256sum <"$SLURM_CONF")" = "$sha_e"
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true

# ========== 6e. --jobcomp: ends from Slurm's job-completion plugin, and back ==========
J="$S/j"
env_for "$J"
base_conf >"$SLURM_CONF"
sha_j="$(sha256sum <"$SLURM_CONF")"
if run_install "$J/out.1" --jobcomp --jobcomp-port 9251; then ok "--jobcomp installs"; else notok "--jobcomp installs" "$(tail -3 "$J/out.1")"; fi
check "--jobcomp: our PrologSlurmctld line" grep -qxF "PrologSlurmctld=$INSTALL_DIR/cvslurm-hook  $MARK" "$SLURM_CONF"
check "--jobcomp: no EpilogSlurmctld line" sh -c "! grep -qi '^[[:space:]]*epilogslurmctld' '$SLURM_CONF'"
check "--jobcomp: JobCompType and JobCompLoc lines" sh -c "grep -qxF 'JobCompType=jobcomp/elasticsearch  $MARK' '$SLURM_CONF' && grep -qxF 'JobCompLoc=http://127.0.0.1:9251/slurm/jobcomp  $MARK' '$SLURM_CONF'"
check "--jobcomp: the receiver's port in cloudvision.conf" grep -qx "JobCompPort=9251" "$SLURM_CONF_DIR/cloudvision.conf"
check "--jobcomp: the final check passes and names the set-up" \
    sh -c "grep -q 'all checks passed' '$J/out.1' && grep -q \"job ends from Slurm's job-completion plugin\" '$J/out.1'"
run_install "$J/out.2" --jobcomp --jobcomp-port 9251 || true
check "--jobcomp: second run no change" grep -qx "install.sh: no change" "$J/out.2"
if run_install "$J/out.3" --jobcomp --no-epilog; then notok "--jobcomp --no-epilog is refused"; else ok "--jobcomp --no-epilog is refused"; fi
"$INSTALL" --uninstall --no-reconfigure >"$J/out.u" 2>&1 || true
check "--jobcomp: uninstall restores slurm.conf byte for byte" test "$(sha256sum <"$SLURM_CONF")" = "$sha_j"
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true
# a site's own JobCompType is never taken
printf 'JobCompType=jobcomp/filetxt\nJobCompLoc=/var/log/slurm/jobcomp.log\n' >>"$SLURM_CONF"
sha_j2="$(sha256sum <"$SLURM_CONF")"
if run_install "$J/out.4" --jobcomp; then notok "--jobcomp refused beside the site's JobCompType"; else ok "--jobcomp refused beside the site's JobCompType"; fi
check "the refusal names it and the lines to add" sh -c "grep -q 'slurm.conf sets JobCompType=jobcomp/filetxt' '$J/out.4' && grep -q 'JobCompLoc=http://127.0.0.1:9250/slurm/jobcomp' '$J/out.4'"
check "the refusal changes nothing" test "$(sha256sum <"$SLURM_CONF")" = "$sha_j2"
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true
# a site's own jobcomp/elasticsearch is taken over: its JobCompLoc goes to cvslurm's receiver,
# which forwards every document to the old URL (JobCompForward); uninstall gives it back
base_conf >"$SLURM_CONF"
SITE_ES='http://elastic:pw-$ecret@es.example.invalid:9200/slurm/jobcomp'
printf 'JobCompType=jobcomp/elasticsearch\nJobCompLoc=%s   # the site ES\nMinJobAge=300\n' "$SITE_ES" >>"$SLURM_CONF"
sha_t="$(sha256sum <"$SLURM_CONF")"
if run_install "$J/out.5" --jobcomp; then ok "--jobcomp takes over the site's jobcomp/elasticsearch"; else notok "--jobcomp takes over the site's jobcomp/elasticsearch" "$(tail -3 "$J/out.5")"; fi
check "takeover: the site's JobCompLoc line kept, byte for byte, after the prefix" \
    grep -qxF "#cvslurm-jobcompforward# JobCompLoc=$SITE_ES   # the site ES" "$SLURM_CONF"
check "takeover: our JobCompLoc line" grep -qxF "JobCompLoc=http://127.0.0.1:9250/slurm/jobcomp  $MARK" "$SLURM_CONF"
check "takeover: the site's JobCompType kept, none added" \
    sh -c "test \"\$(grep -cx 'JobCompType=jobcomp/elasticsearch' '$SLURM_CONF')\" = 1 && ! grep -qF 'JobCompType=jobcomp/elasticsearch  $MARK' '$SLURM_CONF'"
check "takeover: the old URL is JobCompForward" grep -qxF "JobCompForward=$SITE_ES" "$SLURM_CONF_DIR/cloudvision.conf"
check "takeover: says so, the password hidden" \
    sh -c "grep -qF \"takes over slurm.conf's JobCompLoc=http://elastic:***@es.example.invalid:9200/slurm/jobcomp\" '$J/out.5' && ! grep -qF 'pw-\$ecret' '$J/out.5'"
check "takeover: the final check passes and shows the forward target" \
    sh -c "grep -q 'all checks passed' '$J/out.5' && grep -qF 'JobCompForward: http://elastic:***@es.example.invalid:9200/slurm/jobcomp does not answer' '$J/out.5'"
run_install "$J/out.6" --jobcomp || true
check "takeover: second run no change" grep -qx "install.sh: no change" "$J/out.6"
run_install "$J/out.7" || true
check "takeover: a run without a set-up flag keeps it" sh -c "grep -qx 'install.sh: no change' '$J/out.7' && grep -q 'taken over by an earlier --jobcomp' '$J/out.7'"
"$INSTALL" --uninstall --no-reconfigure >"$J/out.u2" 2>&1 || true
check "takeover: uninstall restores slurm.conf byte for byte" test "$(sha256sum <"$SLURM_CONF")" = "$sha_t"
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true
# --no-epilog gives the site its JobCompLoc back
run_install "$J/out.8" --jobcomp || true
run_install "$J/out.9" --no-epilog || true
check "takeover: --no-epilog gives the site's JobCompLoc back" \
    sh -c "grep -qxF 'JobCompLoc=$SITE_ES   # the site ES' '$SLURM_CONF' && ! grep -q '^#cvslurm-jobcompforward# ' '$SLURM_CONF' && ! grep -qi '^jobcomploc=http://127.0.0.1' '$SLURM_CONF'"
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true
check "takeover, --no-epilog: uninstall restores slurm.conf byte for byte" test "$(sha256sum <"$SLURM_CONF")" = "$sha_t"
# a JobCompLoc that is not alone on its line is not taken
base_conf >"$SLURM_CONF"
printf 'JobCompType=jobcomp/elasticsearch JobCompLoc=http://es.example.invalid:9200/slurm/jobcomp\n' >>"$SLURM_CONF"
sha_t2="$(sha256sum <"$SLURM_CONF")"
if run_install "$J/out.10" --jobcomp; then notok "--jobcomp refuses a JobCompLoc it cannot take over"; else ok "--jobcomp refuses a JobCompLoc it cannot take over"; fi
check "that refusal says what to do and changes nothing" \
    sh -c "grep -q 'cannot take over' '$J/out.10' && test \"\$(sha256sum <'$SLURM_CONF')\" = '$sha_t2'"
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true

# ========== 6c. two controllers: the hook on every SlurmctldHost before slurm.conf names it ==========
# The other controllers are reached through CVSLURM_REMOTE (ssh by default). Here it runs the
# command against a directory standing for each host's disk: ctl-other's is $S/hosts/ctl-other;
# ctl-down cannot be reached (ssh's own exit status, 255).
H="$S/h"
env_for "$H"
me="$(hostname -s)"
{
    base_conf | grep -vi -e '^[[:space:]]*slurmctldhost' -e '^[[:space:]]*controlmachine' -e '^[[:space:]]*backupcontroller'
    printf 'SlurmctldHost=%s\nSlurmctldHost=ctl-other(10.99.0.2)\n' "$me"
} >"$SLURM_CONF"
sha_h="$(sha256sum <"$SLURM_CONF")"
{
    printf '#!/bin/sh\n'
    printf 'host="$1"; shift\n'
    printf '[ "$host" = ctl-down ] && { echo "ssh: connect to host ctl-down port 22: Connection refused" >&2; exit 255; }\n'
    printf '[ "$1" = test ] && [ "$2" = -x ] || exit 2\n'
    printf 'test -x "%s/hosts/$host$3"\n' "$S"
} >"$S/remote"
chmod 755 "$S/remote"
export CVSLURM_REMOTE="$S/remote"
if run_install "$H/out.1" --epilog; then notok "two controllers: refused while ctl-other lacks the hook"; else ok "two controllers: refused while ctl-other lacks the hook"; fi
check "two controllers: the refusal names the host and what to run" \
    sh -c "grep -q 'controller(s) ctl-other lack $INSTALL_DIR/cvslurm-hook' '$H/out.1' && grep -q 'install.sh --no-hooks' '$H/out.1'"
check "two controllers: the refusal changes nothing" \
    sh -c "test \"\$(sha256sum <'$SLURM_CONF')\" = '$sha_h' && test ! -e '$INSTALL_DIR/cvslurm'"
if run_install "$H/out.2" --no-hooks; then ok "--no-hooks installs"; else notok "--no-hooks installs" "$(tail -3 "$H/out.2")"; fi
check "--no-hooks: slurm.conf untouched, the binary and hook in place" \
    sh -c "test \"\$(sha256sum <'$SLURM_CONF')\" = '$sha_h' && test -x '$INSTALL_DIR/cvslurm-hook'"
# ctl-other gets its installation (as --no-hooks gave this host)
mkdir -p "$S/hosts/ctl-other$INSTALL_DIR"
cp "$BIN" "$S/hosts/ctl-other$INSTALL_DIR/cvslurm"
ln -sf cvslurm "$S/hosts/ctl-other$INSTALL_DIR/cvslurm-hook"
# slurmctld reads the hooks when it starts: one line names every slurmctld to restart (from
# 23.11 the reconfigure restarts the one in control; before, every one), with the command
for v in 24.11 22.05; do SLURM_VERSION="$v" run_install "$H/out.v$v" --epilog --dry-run || true; done
check "two controllers, 24.11: restart the controllers not in control, with the command" \
    grep -q "WARNING: two controllers: restart slurmctld on ctl-other (a slurmctld started before slurm.conf named the hooks never runs them, not even after a takeover.*: on each: systemctl restart slurmctld" "$H/out.v24.11"
check "two controllers, 22.05: restart every controller, with the command" \
    grep -q "WARNING: two controllers, Slurm 22.05: restart slurmctld on every controller, $me ctl-other, the standby first .*: on each: systemctl restart slurmctld" "$H/out.v22.05"
check "two controllers, 22.05: no second, one-controller restart line" sh -c "! grep -q 'restart it now' '$H/out.v22.05'"
if run_install "$H/out.3" --epilog; then ok "two controllers: installs once ctl-other has the hook"; else notok "two controllers: installs once ctl-other has the hook" "$(tail -3 "$H/out.3")"; fi
check "two controllers: says what it checked" grep -q "controller ctl-other has $INSTALL_DIR/cvslurm-hook" "$H/out.3"
check "two controllers: names the slurmctlds to restart" grep -q "WARNING: two controllers.*restart slurmctld on .*ctl-other.*systemctl restart slurmctld" "$H/out.3"
check "two controllers: both hooks in slurm.conf" \
    test "$(grep -c -- "^[PE][a-z]*logSlurmctld=$INSTALL_DIR/cvslurm-hook  $MARK\$" "$SLURM_CONF")" = 2
printf 'SlurmctldHost=ctl-down\n' >>"$SLURM_CONF"
if run_install "$H/out.4" --epilog --dry-run; then ok "an unreachable controller is not a refusal"; else notok "an unreachable controller is not a refusal" "$(tail -3 "$H/out.4")"; fi
check "an unreachable controller is a warning naming it and why" \
    sh -c "grep -q 'WARNING: cannot check controller ctl-down' '$H/out.4' && grep -q 'Connection refused' '$H/out.4'"
sed -i '/^SlurmctldHost=ctl-down$/d' "$SLURM_CONF"
"$INSTALL" --uninstall --no-reconfigure >"$H/out.u" 2>&1 || true
check "two controllers: uninstall restores slurm.conf byte for byte" test "$(sha256sum <"$SLURM_CONF")" = "$sha_h"
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true
unset CVSLURM_REMOTE

# ========== 6d. a SlurmctldHost name that is an ssh option is refused, nothing run ==========
# Issue 34, round 4: slurm.conf is read as root; a "host name" that ssh takes for an option
# (-oProxyCommand=...) would run a command as root, --dry-run included. install.sh refuses
# any name Slurm would not take for a host name, before anything runs or changes. This uses
# the default CVSLURM_REMOTE (the real ssh): old code ran the ProxyCommand.
X="$S/x"
env_for "$X"
{
    base_conf | grep -vi -e '^[[:space:]]*slurmctldhost' -e '^[[:space:]]*controlmachine' -e '^[[:space:]]*backupcontroller'
    printf 'SlurmctldHost=%s\n' "$me"
    printf 'SlurmctldHost=-oProxyCommand=touch$IFS%s/pwned\n' "$S"
} >"$SLURM_CONF"
sha_x="$(sha256sum <"$SLURM_CONF")"
for mode in --dry-run ""; do
    what="a SlurmctldHost that is an ssh option${mode:+ ($mode)}"
    rm -f "$S/pwned"
    if run_install "$X/out.x$mode" $mode; then notok "$what: refused" "$(tail -3 "$X/out.x$mode")"; else ok "$what: refused"; fi
    check "$what: nothing ran" test ! -e "$S/pwned"
    check "$what: one line naming the value" \
        grep -qF "SlurmctldHost \"-oProxyCommand=touch\$IFS$S/pwned\" in slurm.conf is not a host name" "$X/out.x$mode"
    check "$what: nothing changed" \
        sh -c "test \"\$(sha256sum <'$SLURM_CONF')\" = '$sha_x' && test ! -e '$INSTALL_DIR'"
done
"$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true

# ========== 7. LIVE=1: the test cluster's /etc/slurm/slurm.conf, slurmctld restarted ==========
# restarted NAME: slurmctld really restarted from the current slurm.conf and answering
restarted() {
    local name="$1" out
    if out="$("$ROOT/tests/cluster/cluster.sh" restart-slurmctld 2>&1)" && scontrol ping 2>/dev/null | grep -q 'is UP'; then
        ok "$name"
    else
        notok "$name" "$(printf '%s' "$out" | grep -E 'ERROR|fatal|error' | tail -n 3 | tr '\n' ' ')"
    fi
}
at_least_23_11() { local a1 a2; IFS=. read -r a1 a2 <<<"$1"; ((10#$a1 > 23 || (10#$a1 == 23 && 10#$a2 >= 11))); }
at_least_24_05() { local a1 a2; IFS=. read -r a1 a2 <<<"$1"; ((10#$a1 > 24 || (10#$a1 == 24 && 10#$a2 >= 5))); }
live_install() { # LOG
    "$INSTALL" --api-server "127.0.0.1:$PORT" --api-token-file "$S/token.in" --ca-file "$CA" --binary "$BIN" --no-service >"$1" 2>&1
}
if [[ "${LIVE:-0}" == 1 ]]; then
    if SLURM_CONF=/etc/slurm/slurm.conf scontrol ping 2>/dev/null | grep -q 'is UP' && head -n 1 /etc/slurm/slurm.conf | grep -q 'managed by cvslurm tests/cluster'; then
        LV="$(scontrol --version | grep -oE '[0-9]+\.[0-9]+' | head -n 1)"
        E="$S/e"
        env_for "$E"
        export SLURM_CONF=/etc/slurm/slurm.conf SLURM_CONF_DIR="$E/etc"
        LIVE_BACKUP="$S/slurm.conf.live"
        cp -a /etc/slurm/slurm.conf "$LIVE_BACKUP"
        if grep -qi '^[[:space:]]*[pe][a-z]*logslurmctld' /etc/slurm/slurm.conf; then
            notok "live: the test cluster has no hook of its own" "bring it up without CVSLURM_HOOK"
        fi
        # --- fresh install, restart, second run, uninstall, restart
        if live_install "$E/out.1"; then ok "live $LV: fresh install"; else notok "live $LV: fresh install" "$(tail -3 "$E/out.1")"; fi
        # Before 23.11 a reconfigure leaves slurmctld on the hooks it started with: install.sh
        # says to restart it; from 23.11 the reconfigure restarts slurmctld and it says nothing.
        if at_least_23_11 "$LV"; then
            check "live $LV: no restart asked (the reconfigure restarts slurmctld)" sh -c "! grep -q 'restart it now' '$E/out.1'"
        else
            check "live $LV: install says to restart slurmctld for the hooks to run" grep -q "restart it now for this change to take effect: systemctl restart slurmctld" "$E/out.1"
        fi
        restarted "live $LV: slurmctld restarts after the fresh install"
        check "live $LV: slurmctld runs our PrologSlurmctld" sh -c "scontrol show config | grep -i '^PrologSlurmctld' | grep -qF '$INSTALL_DIR/cvslurm-hook'"
        cp -a /etc/slurm/slurm.conf "$E/installed"
        live_install "$E/out.2" || true
        check "live $LV: second run says no change" grep -qx "install.sh: no change" "$E/out.2"
        check "live $LV: second run leaves slurm.conf alone" cmp -s "$E/installed" /etc/slurm/slurm.conf
        restarted "live $LV: slurmctld restarts after the second run"
        "$INSTALL" --uninstall >"$E/out.u" 2>&1 || true
        check "live $LV: uninstall restores /etc/slurm/slurm.conf byte for byte" cmp -s "$LIVE_BACKUP" /etc/slurm/slurm.conf
        restarted "live $LV: slurmctld restarts after the uninstall"
        "$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true

        # --- the default set-up (with the service): Slurm's job-completion plugin
        if "$INSTALL" --api-server "127.0.0.1:$PORT" --api-token-file "$S/token.in" --ca-file "$CA" --binary "$BIN" >"$E/out.j" 2>&1; then
            ok "live $LV: the default set-up installs"
        else
            notok "live $LV: the default set-up installs" "$(tail -3 "$E/out.j")"
        fi
        check "live $LV: the default is the job-completion plugin, no EpilogSlurmctld" \
            sh -c "grep -q 'job ends from Slurm' '$E/out.j' && ! grep -qi '^[[:space:]]*epilogslurmctld' /etc/slurm/slurm.conf"
        restarted "live $LV: slurmctld restarts with JobCompType=jobcomp/elasticsearch"
        check "live $LV: slurmctld runs Slurm's job-completion plugin towards the receiver" \
            sh -c "scontrol show config | grep -i '^JobCompType' | grep -q 'jobcomp/elasticsearch' && scontrol show config | grep -i '^JobCompLoc' | grep -qF 'http://127.0.0.1:9250/slurm/jobcomp'"
        "$INSTALL" --uninstall >"$E/out.ju" 2>&1 || true
        check "live $LV: uninstall of the default restores /etc/slurm/slurm.conf byte for byte" cmp -s "$LIVE_BACKUP" /etc/slurm/slurm.conf
        restarted "live $LV: slurmctld restarts after that uninstall"
        "$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true

        # --- a site's own hooks (executable, on their own lines)
        F="$S/f"
        env_for "$F"
        export SLURM_CONF=/etc/slurm/slurm.conf SLURM_CONF_DIR="$F/etc"
        printf '#!/bin/sh\nexit 0\n' >"$F/site-prolog.sh"
        printf '#!/bin/sh\nexit 0\n' >"$F/site-epilog.sh"
        chmod 0755 "$F" "$F/site-prolog.sh" "$F/site-epilog.sh"
        printf 'PrologSlurmctld=%s\nEpilogSlurmctld=%s\n' "$F/site-prolog.sh" "$F/site-epilog.sh" >>/etc/slurm/slurm.conf
        restarted "live $LV: slurmctld restarts with the site's own hooks"
        cp -a /etc/slurm/slurm.conf "$F/site.conf"
        if at_least_24_05 "$LV"; then
            if live_install "$F/out.1"; then ok "live $LV: install beside the site's hooks"; else notok "live $LV: install beside the site's hooks" "$(tail -3 "$F/out.1")"; fi
            check "live $LV: our hooks on their own marked lines" \
                test "$(grep -c -- "^[PE][a-z]*logSlurmctld=$INSTALL_DIR/cvslurm-hook  $MARK\$" /etc/slurm/slurm.conf)" = 2
            check "live $LV: the site's lines kept" sh -c "grep -qxF 'PrologSlurmctld=$F/site-prolog.sh' /etc/slurm/slurm.conf && grep -qxF 'EpilogSlurmctld=$F/site-epilog.sh' /etc/slurm/slurm.conf"
            restarted "live $LV: slurmctld restarts with both hooks"
            check "live $LV: slurmctld runs both PrologSlurmctld" sh -c "hooks_out=\$(scontrol show config | grep -i '^PrologSlurmctld'); echo \"\$hooks_out\" | grep -qF '$F/site-prolog.sh' && echo \"\$hooks_out\" | grep -qF '$INSTALL_DIR/cvslurm-hook'"
            cp -a /etc/slurm/slurm.conf "$F/both.conf"
            live_install "$F/out.2" || true
            check "live $LV: second run beside the site's hooks changes nothing" cmp -s "$F/both.conf" /etc/slurm/slurm.conf
            "$INSTALL" --uninstall >"$F/out.u" 2>&1 || true
            check "live $LV: uninstall leaves the site's slurm.conf byte-identical" cmp -s "$F/site.conf" /etc/slurm/slurm.conf
            restarted "live $LV: slurmctld restarts after the uninstall beside the site's hooks"
        else
            if live_install "$F/out.1"; then notok "live $LV: a site's own hook is refused"; else ok "live $LV: a site's own hook is refused"; fi
            check "live $LV: the refusal shows the line to add" grep -qF "\"$INSTALL_DIR/cvslurm-hook\"" "$F/out.1"
            check "live $LV: the refusal leaves slurm.conf alone" cmp -s "$F/site.conf" /etc/slurm/slurm.conf
            restarted "live $LV: slurmctld restarts after the refusal"
        fi
        "$INSTALL" --uninstall --purge --no-reconfigure >/dev/null 2>&1 || true
        cat "$LIVE_BACKUP" >/etc/slurm/slurm.conf
        restarted "live $LV: slurmctld restarts with the cluster's own slurm.conf again"
    else
        echo "# LIVE=1 but no running test cluster (tests/cluster/cluster.sh up): live checks skipped"
    fi
fi

printf '%d passed, %d failed\n' "$PASS" "$FAIL"
((FAIL == 0))
