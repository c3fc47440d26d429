#!/usr/bin/env bash
# Installs what building and testing cvslurm needs on Debian 12 (idempotent, quick when done):
# Slurm 22.05 daemons and clients, munge, MariaDB + slurmdbd (for sacct), Slurm's
# jobcomp/elasticsearch plugin (job ends for cvslurm's receiver), iproute2 (network
# namespaces), musl-tools (the static build), python3 + openssl (the CloudVision stand-in),
# rpm (rpmbuild, to build and inspect the .rpm), mmdebstrap (the Debian root filesystems of
# Slurm 24.11 and 26.05 for the test clusters: tests/cluster/rootfs.sh), prometheus (its
# promtool checks the metrics file and the alert rules: tests/it/metrics.rs; the server itself is
# never run, so the package's service is stopped and disabled), and the Rust musl target.
set -euo pipefail
pkgs=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server slurm-wlm-elasticsearch-plugin iproute2 musl-tools libcap2-bin
      python3 openssl curl procps util-linux ca-certificates rpm mmdebstrap prometheus)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's prometheus package starts its server where systemd runs: only promtool is wanted.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  if systemctl is-enabled --quiet prometheus 2>/dev/null || systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
command -v promtool >/dev/null 2>&1 || { echo "deps: promtool missing after installing prometheus" >&2; exit 1; }
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: no Rust toolchain; install one with rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi
if command -v rustup >/dev/null 2>&1; then
  rustup target list --installed | grep -qx x86_64-unknown-linux-musl \
    || rustup target add x86_64-unknown-linux-musl
fi
echo "deps: ready (slurm $(dpkg-query -W -f='${Version}' slurmctld), $(cargo --version))"
