#!/usr/bin/env bash
# Stop the single-node SLURM that tests/system/slurm/start.sh started: cancel the jobs left on it,
# then stop slurmd, slurmctld and munged by the pid files start.sh kept (a daemon that
# start.sh found already running, e.g. a munged of the system, has no pid file there and is
# left alone). Packages and /etc/slurm/slurm.conf stay, so a later start.sh is quick.
set -uo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        exec sudo -n --preserve-env=ADADAMP_SLURM_STATE "$0" "$@"
    fi
    echo "tests/system/slurm/stop.sh: needs root (or password-less sudo)" >&2
    exit 1
fi
STATE=${ADADAMP_SLURM_STATE:-/run/adadamp-slurm}

alive() { # pidfile program
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$2"
}

stop() { # pidfile program
    local pid
    if ! alive "$1" "$2"; then
        rm -f "$1"
        return 0
    fi
    pid=$(cat "$1")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "tests/system/slurm/stop.sh: $2 (pid $pid) ignored SIGTERM; killing it" >&2
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$1"
    echo "tests/system/slurm/stop.sh: stopped $2 (pid $pid)"
}

if alive "$STATE/slurmctld.pid" slurmctld; then
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
        echo "tests/system/slurm/stop.sh: cancelling jobs $(echo $jobs)"
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs 2>/dev/null || true
        for _ in $(seq 50); do
            [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
fi
stop "$STATE/slurmd.pid" slurmd
stop "$STATE/slurmctld.pid" slurmctld
stop "$STATE/munged.pid" munged
exit 0
