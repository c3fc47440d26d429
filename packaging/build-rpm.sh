#!/usr/bin/env bash
# Build target/packages/cvslurm-<version>-1.x86_64.rpm with rpmbuild (Debian: apt-get install
# rpm) from the prebuilt static binary (built here if missing; nothing is compiled inside
# rpmbuild), then list it with rpm -qlp.
#
# Usage: packaging/build-rpm.sh            (CVSLURM_BIN=PATH to package another binary)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PKG="$ROOT/packaging"
OUT="$ROOT/target/packages"
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n 1)"
[[ -n "$VERSION" ]] || { echo "build-rpm.sh: no version in Cargo.toml" >&2; exit 1; }
command -v rpmbuild >/dev/null || { echo "build-rpm.sh: rpmbuild not found: apt-get install -y rpm" >&2; exit 1; }
BIN="${CVSLURM_BIN:-$ROOT/target/x86_64-unknown-linux-musl/release/cvslurm}"
if [[ ! -x "$BIN" ]]; then
    echo "build-rpm.sh: building $BIN"
    (cd "$ROOT" && cargo build --release --target x86_64-unknown-linux-musl)
fi

TOP="$(mktemp -d)"
trap 'rm -rf "$TOP"' EXIT
STAGE="$TOP/stage"
# shellcheck source=stage-files.sh source-path=SCRIPTDIR
. "$PKG/stage-files.sh"
stage_files "$STAGE" "$BIN"
# %doc needs at least one file
[[ -n "$(ls -A "$STAGE/usr/share/doc/cvslurm")" ]] || printf 'cvslurm %s: see cvslurm(8) and cloudvision.conf(5).\n' "$VERSION" >"$STAGE/usr/share/doc/cvslurm/README"

mkdir -p "$OUT"
rpmbuild -bb --quiet \
    --define "_topdir $TOP/rpmbuild" \
    --define "_rpmdir $OUT" \
    --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
    --define "cvslurm_version $VERSION" \
    --define "cvslurm_stage $STAGE" \
    --target x86_64 \
    "$PKG/cvslurm.spec"
RPM="$OUT/cvslurm-$VERSION-1.x86_64.rpm"
[[ -f "$RPM" ]] || { echo "build-rpm.sh: rpmbuild made no $RPM" >&2; exit 1; }
echo "build-rpm.sh: built $RPM"
rpm -qip "$RPM" 2>/dev/null | grep -E '^(Name|Version|Release|Architecture|Size)'
echo "--- contents (rpm -qlp)"
rpm -qlvp "$RPM" 2>/dev/null
LISTING="$(rpm -qlp "$RPM" 2>/dev/null)"
for f in /opt/slurm/cloudvision/cvslurm /opt/slurm/cloudvision/cvslurm-hook /lib/systemd/system/cvslurm.service \
    /etc/slurm/cloudvision.conf.example /etc/logrotate.d/cvslurm /usr/share/man/man8/cvslurm.8.gz \
    /usr/share/cvslurm/prometheus/cvslurm-alerts.yml; do
    # One listing, searched with a here-string: `rpm | grep -q` dies of SIGPIPE under pipefail.
    grep -qx "$f" <<<"$LISTING" || { echo "build-rpm.sh: $f missing from the package" >&2; exit 1; }
done
while read -r _ names; do
    for m in $names; do
        grep -qx "/opt/slurm/cloudvision/$m" <<<"$LISTING" || { echo "build-rpm.sh: the mode link /opt/slurm/cloudvision/$m is missing from the package" >&2; exit 1; }
    done
done < <("$BIN" --list-modes)
echo "build-rpm.sh: ok"
