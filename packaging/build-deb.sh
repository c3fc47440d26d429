#!/usr/bin/env bash
# Build target/packages/cvslurm_<version>_amd64.deb with dpkg-deb (no cargo-deb, no debhelper),
# from the static binary (built here if missing), then list it and test-install it into a
# scratch root.
#
# Usage: packaging/build-deb.sh            (CVSLURM_BIN=PATH to package another binary)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PKG="$ROOT/packaging"
OUT="$ROOT/target/packages"
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n 1)"
[[ -n "$VERSION" ]] || { echo "build-deb.sh: no version in Cargo.toml" >&2; exit 1; }
BIN="${CVSLURM_BIN:-$ROOT/target/x86_64-unknown-linux-musl/release/cvslurm}"
if [[ ! -x "$BIN" ]]; then
    echo "build-deb.sh: building $BIN"
    (cd "$ROOT" && cargo build --release --target x86_64-unknown-linux-musl)
fi
command -v dpkg-deb >/dev/null || { echo "build-deb.sh: dpkg-deb not found (apt-get install dpkg)" >&2; exit 1; }

STAGE="$(mktemp -d)"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$STAGE" "$SCRATCH"' EXIT
chmod 755 "$STAGE"

# shellcheck source=stage-files.sh source-path=SCRIPTDIR
. "$PKG/stage-files.sh"
stage_files "$STAGE" "$BIN"

mkdir -p "$STAGE/DEBIAN"
size_kb="$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)"
cat >"$STAGE/DEBIAN/control" <<CONTROL
Package: cvslurm
Version: $VERSION
Architecture: amd64
Maintainer: cvslurm maintainers <root@localhost>
Section: admin
Priority: optional
Installed-Size: $size_kb
Recommends: slurm-client
Suggests: slurmctld
Homepage: https://www.arista.com/en/products/eos/eos-cloudvision
Description: bridge between a Slurm cluster and Arista CloudVision
 cvslurm tells CloudVision which Slurm job runs on which nodes (JobConfig, from
 the PrologSlurmctld/EpilogSlurmctld hook) and which network interfaces each node
 has (NodeConfig, from the cvslurm service). One static binary, no dependencies.
 .
 After installing: write /etc/slurm/cloudvision.conf (see the .example), put the
 API token in /etc/slurm/cloudvision.token (mode 0600, owned by SlurmUser), add
 PrologSlurmctld/EpilogSlurmctld=/opt/slurm/cloudvision/cvslurm-hook to slurm.conf,
 run scontrol reconfigure, and systemctl enable --now cvslurm.
CONTROL
printf '%s\n' /etc/slurm/cloudvision.conf.example /etc/logrotate.d/cvslurm >"$STAGE/DEBIAN/conffiles"
# Maintainer scripts honour DPKG_ROOT (dpkg --root --force-script-chrootless).
cat >"$STAGE/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    # StateDir for the hook (SlurmUser) and the service.
    if getent passwd slurm >/dev/null 2>&1 && [ ! -d "$DPKG_ROOT/var/spool/cvslurm" ]; then
        install -d -m 0750 -o slurm -g "$(id -gn slurm)" "$DPKG_ROOT/var/spool/cvslurm" || true
    fi
    if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
    fi
    # Prometheus: suggest (never set) MetricsFile where node_exporter's textfile directory exists.
    for d in /var/lib/prometheus/node-exporter /var/lib/node_exporter/textfile_collector; do
        if [ -d "$DPKG_ROOT$d" ]; then
            if ! grep -qsE '^[[:space:]]*MetricsFile[[:space:]]*=' "$DPKG_ROOT/etc/slurm/cloudvision.conf"; then
                echo "cvslurm: for Prometheus metrics, add MetricsFile=$d/cvslurm.prom to /etc/slurm/cloudvision.conf (SlurmUser must be able to write $d) and load /usr/share/cvslurm/prometheus/cvslurm-alerts.yml (README: Monitoring)"
            fi
            break
        fi
    done
fi
exit 0
SCRIPT
cat >"$STAGE/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ]; then
    # slurm.conf first, binary last: Slurm 24.11+ does not start while slurm.conf names a
    # missing hook, so refuse to remove the hook that slurm.conf still names.
    conf="$DPKG_ROOT${SLURM_CONF:-/etc/slurm/slurm.conf}"
    if [ -f "$conf" ] && grep -qiE '^[[:space:]]*(prolog|epilog)slurmctld[[:space:]]*=.*/opt/slurm/cloudvision/(cvslurm-hook|cv-job-hook)' "$conf"; then
        echo "cvslurm: $conf still names /opt/slurm/cloudvision/cvslurm-hook: remove those PrologSlurmctld/EpilogSlurmctld lines (or run install.sh --uninstall), run scontrol reconfigure, then remove the package" >&2
        exit 1
    fi
    if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
        systemctl disable --now cvslurm.service >/dev/null 2>&1 || true
    fi
fi
exit 0
SCRIPT
cat >"$STAGE/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
if [ "$1" = purge ]; then
    rm -rf "$DPKG_ROOT/var/spool/cvslurm"
fi
exit 0
SCRIPT
chmod 0755 "$STAGE/DEBIAN/postinst" "$STAGE/DEBIAN/prerm" "$STAGE/DEBIAN/postrm"

mkdir -p "$OUT"
DEB="$OUT/cvslurm_${VERSION}_amd64.deb"
dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$DEB" >/dev/null
echo "build-deb.sh: built $DEB"
dpkg-deb -I "$DEB" | sed -n '/Package:/,/Description:/p'
echo "--- contents (dpkg-deb -c)"
dpkg-deb -c "$DEB"

# test install into a scratch root
mkdir -p "$SCRATCH/var/lib/dpkg/info" "$SCRATCH/var/lib/dpkg/updates" "$SCRATCH/var/spool"
# node_exporter's textfile directory (Debian's): postinst suggests MetricsFile there
mkdir -p "$SCRATCH/var/lib/prometheus/node-exporter"
: >"$SCRATCH/var/lib/dpkg/status"
if dpkg --root="$SCRATCH" --force-not-root --force-script-chrootless --force-depends \
    --log=/dev/null -i "$DEB" >"$SCRATCH.log" 2>&1; then
    echo "--- dpkg -i into a scratch root: ok"
else
    echo "--- dpkg -i into a scratch root failed:" >&2
    cat "$SCRATCH.log" >&2
    rm -f "$SCRATCH.log"
    exit 1
fi
fail=0
grep -q 'add MetricsFile=/var/lib/prometheus/node-exporter/cvslurm.prom' "$SCRATCH.log" \
    || { echo "postinst did not suggest MetricsFile for /var/lib/prometheus/node-exporter" >&2; fail=1; }
rm -f "$SCRATCH.log"
for f in opt/slurm/cloudvision/cvslurm opt/slurm/cloudvision/cvslurm-hook lib/systemd/system/cvslurm.service \
    etc/slurm/cloudvision.conf.example etc/logrotate.d/cvslurm usr/share/man/man8/cvslurm.8.gz \
    usr/share/man/man5/cloudvision.conf.5.gz usr/share/bash-completion/completions/cvslurm \
    usr/share/cvslurm/prometheus/cvslurm-alerts.yml; do
    [[ -e "$SCRATCH/$f" ]] || { echo "missing after install: /$f" >&2; fail=1; }
done
"$SCRATCH/opt/slurm/cloudvision/cvslurm" --version
while read -r _ names; do
    for m in $names; do
        [[ -L "$SCRATCH/opt/slurm/cloudvision/$m" ]] || { echo "missing after install: the mode link /opt/slurm/cloudvision/$m" >&2; fail=1; }
    done
done < <("$SCRATCH/opt/slurm/cloudvision/cvslurm" --list-modes)
"$SCRATCH/opt/slurm/cloudvision/cvslurm-status" --help >/dev/null
dpkg --root="$SCRATCH" -s cvslurm | grep -E '^(Status|Version):'
# removal: refused while slurm.conf names the hook (Slurm 24.11+ would not start), then done
mkdir -p "$SCRATCH/etc/slurm"
printf 'ClusterName=x\nPrologSlurmctld=/opt/slurm/cloudvision/cvslurm-hook\n' >"$SCRATCH/etc/slurm/slurm.conf"
dpkg_r() { dpkg --root="$SCRATCH" --force-not-root --force-script-chrootless --log=/dev/null -r cvslurm >"$SCRATCH.log" 2>&1; }
if dpkg_r; then
    echo "dpkg -r removed the hook that slurm.conf names" >&2; fail=1
elif ! grep -q 'still names /opt/slurm/cloudvision/cvslurm-hook' "$SCRATCH.log" || [[ ! -x "$SCRATCH/opt/slurm/cloudvision/cvslurm-hook" ]]; then
    echo "dpkg -r refused without the message, or the hook is gone:" >&2; cat "$SCRATCH.log" >&2; fail=1
else
    echo "--- dpkg -r refused while slurm.conf names the hook: ok"
fi
printf 'ClusterName=x\n' >"$SCRATCH/etc/slurm/slurm.conf"
if dpkg_r && [[ ! -e "$SCRATCH/opt/slurm/cloudvision/cvslurm" ]]; then
    echo "--- dpkg -r once slurm.conf no longer names it: ok"
else
    echo "dpkg -r failed with a slurm.conf that does not name the hook:" >&2; cat "$SCRATCH.log" >&2; fail=1
fi
rm -f "$SCRATCH.log"
((fail == 0)) && echo "build-deb.sh: ok"
