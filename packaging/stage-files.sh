# shellcheck shell=bash
# stage_files DIR BINARY: lay out the files of the cvslurm package under DIR (shared by
# build-deb.sh and build-rpm.sh, so both packages hold the same files).
stage_files() {
    local d="$1" bin="$2" pkg m
    pkg="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    install -d -m 0755 "$d/opt/slurm/cloudvision" "$d/lib/systemd/system" "$d/etc/slurm" \
        "$d/etc/logrotate.d" "$d/usr/share/man/man8" "$d/usr/share/man/man5" \
        "$d/usr/share/bash-completion/completions" "$d/usr/share/doc/cvslurm" \
        "$d/usr/share/cvslurm/prometheus"
    install -m 0755 "$bin" "$d/opt/slurm/cloudvision/cvslurm"
    # the mode links: every name the binary lists (`cvslurm --list-modes`: mode, then link names)
    local -a links
    mapfile -t links < <("$bin" --list-modes | cut -d' ' -f2- | tr ' ' '\n' | grep -v '^$')
    ((${#links[@]} > 0)) || { echo "stage_files: $bin --list-modes printed no mode" >&2; return 1; }
    for m in "${links[@]}"; do
        ln -sfn cvslurm "$d/opt/slurm/cloudvision/$m"
        # bash-completion loads completions by command name
        [[ "$m" == *.py ]] || ln -sfn cvslurm "$d/usr/share/bash-completion/completions/$m"
    done
    install -m 0644 "$pkg/cvslurm.service" "$d/lib/systemd/system/cvslurm.service"
    install -m 0644 "$pkg/cloudvision.conf.example" "$d/etc/slurm/cloudvision.conf.example"
    install -m 0644 "$pkg/cvslurm.logrotate" "$d/etc/logrotate.d/cvslurm"
    # example Prometheus alert rules for MetricsFile, and their promtool test (README: Monitoring)
    install -m 0644 "$pkg/prometheus/cvslurm-alerts.yml" "$pkg/prometheus/cvslurm-alerts.test.yml" \
        "$d/usr/share/cvslurm/prometheus/"
    install -m 0644 "$pkg/completions/cvslurm.bash" "$d/usr/share/bash-completion/completions/cvslurm"
    gzip -9n <"$pkg/man/cvslurm.8" >"$d/usr/share/man/man8/cvslurm.8.gz"
    gzip -9n <"$pkg/man/cloudvision.conf.5" >"$d/usr/share/man/man5/cloudvision.conf.5.gz"
    chmod 0644 "$d/usr/share/man/man8/cvslurm.8.gz" "$d/usr/share/man/man5/cloudvision.conf.5.gz"
    if [[ -f "$pkg/../README.md" ]]; then install -m 0644 "$pkg/../README.md" "$d/usr/share/doc/cvslurm/README.md"; fi
}
