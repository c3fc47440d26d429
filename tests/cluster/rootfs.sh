#!/usr/bin/env bash
# Builds (once) the Debian root filesystem that holds a newer Slurm for the test cluster:
#   tests/cluster/rootfs.sh 24.11   Debian trixie  (Slurm 24.11)
#   tests/cluster/rootfs.sh 26.05   Debian sid     (Slurm 26.05)
# and prints its path. Slurm 22.05 is the host's own (Debian 12): nothing to build.
#
# The root filesystem is made by Debian's mmdebstrap from the mirror apt already uses (read from
# /etc/apt/sources.list and /etc/apt/sources.list.d), under $CVSLURM_ROOTFS_CACHE (default
# /var/cache/cvslurm-rootfs/<suite>). A finished one carries a stamp naming its package list; a
# re-run with the same list only checks the stamp (well under a second). Daemons never start
# inside it (policy-rc.d exits 101); cluster.sh starts them itself, chrooted.
#
# Needs root and the mirror; installs mmdebstrap on the host if it is missing.
set -euo pipefail
export LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin

# Everything the daemons, the clients and the tests need inside; the cvslurm binary itself is
# static and comes from the host through a bind mount.
readonly PKGS="slurmctld slurmd slurm-client munge slurmdbd mariadb-server iproute2 procps util-linux mount hostname slurm-wlm-elasticsearch-plugin"
readonly CACHE="${CVSLURM_ROOTFS_CACHE:-/var/cache/cvslurm-rootfs}"

fail() { printf 'rootfs.sh: %s\n' "$*" >&2; exit 1; }

suite_of() {
    case "$1" in
        24.11) echo trixie ;;
        26.05) echo sid ;;
        22.05) fail "Slurm 22.05 is the host's own (Debian 12): no root filesystem to build" ;;
        *) fail "unknown Slurm version '$1' (want 24.11 or 26.05)" ;;
    esac
}

# The Debian mirror apt uses: the URI of the host's own release suite (not -security), from
# one-line .list files or deb822 .sources files; deb.debian.org when none is found.
host_mirror() {
    local codename f uri="" line
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r "$f" ]] || continue
        line="$(awk -v c="$codename" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                 if ($(i + 1) == c) { print $i; exit } }' "$f")"
        [[ -n "$line" ]] && { uri="$line"; break; }
    done
    if [[ -z "$uri" ]]; then
        for f in /etc/apt/sources.list.d/*.sources; do
            [[ -r "$f" ]] || continue
            # deb822 stanzas: the URIs of the first stanza whose Suites name the codename
            line="$(awk -v c="$codename" 'BEGIN { RS = ""; FS = "\n" }
                { u = ""; s = 0; en = 1
                  for (i = 1; i <= NF; i++) {
                    if ($i ~ /^URIs:/) { u = $i; sub(/^URIs:[ \t]*/, "", u); split(u, a, /[ \t]+/); u = a[1] }
                    if ($i ~ /^Suites:/) { n = split($i, b, /[ \t]+/); for (j = 2; j <= n; j++) if (b[j] == c) s = 1 }
                    if ($i ~ /^Enabled:[ \t]*no/) en = 0
                  }
                  if (u != "" && s && en) { print u; exit } }' "$f")"
            [[ -n "$line" ]] && { uri="$line"; break; }
        done
    fi
    printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

build() { # version
    local version="$1" suite root stamp want mirror t0=$SECONDS
    suite="$(suite_of "$version")"
    root="$CACHE/$suite"
    stamp="$root/.cvslurm-rootfs"
    want="$suite: $PKGS"
    if [[ -f "$stamp" ]] && [[ "$(head -n 1 "$stamp")" == "$want" ]]; then
        printf '%s\n' "$root"
        return 0
    fi
    [[ "$(id -u)" -eq 0 ]] || fail "must run as root"
    if [[ -f "$stamp" ]]; then
        # built before with another package list: top it up with what is missing
        local missing="" p
        for p in $PKGS; do
            chroot "$root" dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=" $p"
        done
        if [[ -n "$missing" ]]; then
            printf 'rootfs.sh: adding%s to %s\n' "$missing" "$root" >&2
            # shellcheck disable=SC2086
            chroot "$root" apt-get update -qq >&2 && chroot "$root" apt-get install -y -qq --no-install-recommends $missing >&2 \
                || fail "apt-get install$missing in $root failed"
        fi
        printf '%s\nslurm %s\n' "$want" "$(chroot "$root" dpkg-query -W -f='${Version}' slurmctld)" >"$stamp"
        printf '%s\n' "$root"
        return 0
    fi
    # never rebuild over a root filesystem that a running cluster still has mounts in
    if grep -q " $root/" /proc/self/mounts; then
        fail "$root has mounts (a test cluster is up?): run tests/cluster/cluster.sh down first"
    fi
    command -v mmdebstrap >/dev/null || apt-get install -y -qq --no-install-recommends mmdebstrap >&2
    mirror="$(host_mirror)"
    printf 'rootfs.sh: building Slurm %s root filesystem (Debian %s from %s) in %s\n' "$version" "$suite" "$mirror" "$root" >&2
    rm -rf "$root.tmp"
    mkdir -p "$CACHE"
    # Check-Valid-Until=false: a frozen mirror's sid Release file counts as expired. The option
    # also lands in the root's apt.conf.d, so later apt runs inside keep working.
    mmdebstrap --mode=root --variant=apt --components=main \
        --aptopt='APT::Install-Recommends "false"' \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --include="${PKGS// /,}" \
        "$suite" "$root.tmp" "$mirror" >&2 || { rm -rf "$root.tmp"; fail "mmdebstrap $suite failed"; }
    printf '#!/bin/sh\nexit 101\n' >"$root.tmp/usr/sbin/policy-rc.d"
    chmod 0755 "$root.tmp/usr/sbin/policy-rc.d"
    printf '%s\nslurm %s\n' "$want" "$(chroot "$root.tmp" dpkg-query -W -f='${Version}' slurmctld)" >"$root.tmp/.cvslurm-rootfs"
    rm -rf "$root"
    mv "$root.tmp" "$root"
    printf 'rootfs.sh: %s ready (%s, %s s)\n' "$root" "$(du -sh --one-file-system "$root" | cut -f1)" "$((SECONDS - t0))" >&2
    printf '%s\n' "$root"
}

[[ $# -eq 1 ]] || fail "usage: tests/cluster/rootfs.sh 24.11|26.05"
build "$1"
