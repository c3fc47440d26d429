# bash completion for cvslurm and its mode names (cvslurm-send, cv-job-send, ...)
# shellcheck shell=bash

_cvslurm_mode_opts() {
    case "$1" in
        hook) echo "--config --help" ;;
        send) echo "--config --api-server --api-token --api-token-file --dry-run --verbose -v --tenant --name --location --state --start --end --nodes --interfaces --help" ;;
        inventory) echo "--config --api-server --api-token --api-token-file --dry-run --verbose -v --monitor --poll-interval --help" ;;
        publish) echo "--node-name --foreground --help" ;;
        discover) echo "--node-name --interface-regex --physical-only --require-ip --sys-class-net --sys-root --topology --expect-sha256 --help" ;;
        flush) echo "--config --no-reconcile --verbose -v --help" ;;
        status) echo "--config --json --max-age --offline --help" ;;
        check) echo "--config --contract --slurm-facts --hook --slurm-version --help" ;;
    esac
}

_cvslurm() {
    local cur prev mode="" i base
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    base="${COMP_WORDS[0]##*/}"
    base="${base%.py}"
    case "$base" in
        cvslurm-hook | cv-job-hook) mode=hook ;;
        cvslurm-send | cv-job-send) mode=send ;;
        cvslurm-inventory | cv-node-inventory) mode=inventory ;;
        cvslurm-discover | interface_discovery) mode=discover ;;
        cvslurm-publish) mode=publish ;;
        cvslurm-flush) mode=flush ;;
        cvslurm-status) mode=status ;;
        cvslurm-check) mode=check ;;
    esac

    case "$prev" in
        --config | --api-token-file | --hook)
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
            return 0
            ;;
        --sys-class-net | --sys-root)
            mapfile -t COMPREPLY < <(compgen -d -- "$cur")
            return 0
            ;;
        --physical-only | --require-ip)
            mapfile -t COMPREPLY < <(compgen -W "yes no" -- "$cur")
            return 0
            ;;
        --state)
            mapfile -t COMPREPLY < <(compgen -W "running completed failed cancelled" -- "$cur")
            return 0
            ;;
        --node-name)
            mapfile -t COMPREPLY < <(compgen -W "$(sinfo -h -N -o '%N' 2>/dev/null | sort -u)" -- "$cur")
            return 0
            ;;
        --api-server | --api-token | --tenant | --name | --location | --start | --end | --nodes | --interfaces | --poll-interval | --max-age | --interface-regex | --expect-sha256 | --list-flags | --slurm-version)
            return 0
            ;;
    esac

    if [[ -z "$mode" ]]; then
        for ((i = 1; i < COMP_CWORD; i++)); do
            case "${COMP_WORDS[i]}" in
                hook | send | inventory | discover | publish | flush | status | check)
                    mode="${COMP_WORDS[i]}"
                    break
                    ;;
            esac
        done
    fi
    if [[ -z "$mode" ]]; then
        mapfile -t COMPREPLY < <(compgen -W "hook send inventory discover publish flush status check help --version --list-modes --list-config-keys --list-flags --help" -- "$cur")
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_cvslurm_mode_opts "$mode")" -- "$cur")
    elif [[ "$mode" == send ]]; then
        # job ids of jobs still known to slurmctld
        mapfile -t COMPREPLY < <(compgen -W "$(squeue -h -o '%i' 2>/dev/null)" -- "$cur")
    fi
    return 0
}

complete -F _cvslurm cvslurm cvslurm-hook cvslurm-send cvslurm-inventory cvslurm-discover cvslurm-publish \
    cvslurm-flush cvslurm-status cvslurm-check cv-job-hook cv-job-send cv-node-inventory interface_discovery \
    cv-job-hook.py cv-job-send.py cv-node-inventory.py interface_discovery.py
