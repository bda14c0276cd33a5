#!/usr/bin/env bash
# Start a single-node SLURM (munged, slurmctld, slurmd on localhost) for the test suite.
#
# Idempotent: installs Debian's slurm-wlm and munge with apt-get only when they are missing,
# writes /etc/slurm/slurm.conf from tests/system/slurm/slurm.conf.in (RealMemory = 90% of MemTotal), starts each daemon only when it
# is not already running, waits (bounded) until the node is idle and runs one job through
# srun. Exits non-zero with a message on stderr when SLURM cannot be started.
# The last line on stdout is "SLURM ready (started: ...)" naming the daemons started by this
# call ("nothing" when all were running); tests/system/slurm/stop.sh stops them again.
#
# Environment: ADADAMP_SLURM_STATE (default /run/adadamp-slurm: pid files, logs, spool),
# ADADAMP_SLURM_TIMEOUT (default 60: seconds to wait for the node), ADADAMP_SLURM_CPUS
# (default 8: CPUs the node claims, more than the machine has, so that several 1-core
# worker jobs run at once).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

die() {
    echo "tests/system/slurm/start.sh: $*" >&2
    exit 1
}
log() { echo "tests/system/slurm/start.sh: $*"; }

if [ "$(id -u)" != 0 ]; then
    # Installing packages and starting slurmd need root.
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        exec sudo -n --preserve-env=ADADAMP_SLURM_STATE,ADADAMP_SLURM_TIMEOUT,ADADAMP_SLURM_CPUS "$0" "$@"
    fi
    die "needs root (or password-less sudo) to install and start SLURM; running as $(id -un)"
fi

STATE=${ADADAMP_SLURM_STATE:-/run/adadamp-slurm}
TIMEOUT=${ADADAMP_SLURM_TIMEOUT:-60}
CPUS=${ADADAMP_SLURM_CPUS:-8}
CONF=/etc/slurm/slurm.conf
MARK="# adadamp-test-slurm"
mkdir -p "$STATE"
chmod 755 "$STATE"

# ------------------------------------------------------------------ packages
missing=()
for cmd in munged munge unmunge slurmctld slurmd srun sbatch squeue scancel scontrol sinfo; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install slurm-wlm and munge"
    log "installing slurm-wlm and munge with apt-get (missing: ${missing[*]})"
    # Keep the packages' init scripts from starting daemons during the install
    # (policy-rc.d exit 101 = "action forbidden"); this script starts them itself.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        made_policy=1
    fi
    rc=0
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold slurm-wlm munge
    } >"$STATE/apt.log" 2>&1 || rc=$?
    [ "$made_policy" = 1 ] && rm -f "$policy"
    if [ "$rc" != 0 ]; then
        tail -n 20 "$STATE/apt.log" >&2
        die "apt-get install slurm-wlm munge failed (exit $rc; log: $STATE/apt.log)"
    fi
    for cmd in "${missing[@]}"; do
        command -v "$cmd" >/dev/null 2>&1 || die "apt-get installed slurm-wlm and munge but $cmd is still missing"
    done
fi
id slurm >/dev/null 2>&1 || die "user 'slurm' does not exist (the slurm-wlm packages create it)"
id munge >/dev/null 2>&1 || die "user 'munge' does not exist (the munge package creates it)"

# A pid file names a live process running the given program.
running() { # pidfile program
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$2"
}
started=()

# -------------------------------------------------------------------- munge
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge
install -d -o munge -g munge -m 0755 /run/munge /var/log/munge
if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile=/etc/munge/munge.key --force
    else
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
    fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge_ok; then
    rm -f /run/munge/munged.pid
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid >"$STATE/munged.out" 2>&1 ||
        { cat "$STATE/munged.out" >&2; die "munged failed to start"; }
    cp /run/munge/munged.pid "$STATE/munged.pid" 2>/dev/null || pgrep -n -u munge -x munged >"$STATE/munged.pid"
    started+=(munged)
    for _ in $(seq 50); do
        munge_ok && break
        sleep 0.2
    done
    munge_ok || { tail -n 20 /var/log/munge/munged.log >&2 2>/dev/null; die "munged started but 'munge -n | unmunge' fails"; }
fi

# ------------------------------------------------------------------- config
if [ -e "$CONF" ] && ! head -n 1 "$CONF" | grep -qF "$MARK"; then
    die "$CONF exists and was not written by this script; refusing to replace another SLURM's configuration"
fi
mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
[ -n "$mem_mb" ] && [ "$mem_mb" -gt 0 ] || die "cannot read MemTotal from /proc/meminfo"
real_memory=$((mem_mb * 9 / 10))
mkdir -p "$(dirname "$CONF")"
sed -e "s|@STATE@|$STATE|g" -e "s|@CPUS@|$CPUS|g" -e "s|@REALMEMORY@|$real_memory|g" \
    "$HERE/slurm.conf.in" >"$CONF.tmp"
chmod 644 "$CONF.tmp"
conf_changed=1
cmp -s "$CONF.tmp" "$CONF" && conf_changed=0
mv "$CONF.tmp" "$CONF"
install -d -o slurm -g slurm -m 0755 "$STATE/slurmctld"
install -d -m 0755 "$STATE/slurmd"
touch "$STATE/slurmctld.log" "$STATE/slurmd.log"
chown slurm:slurm "$STATE/slurmctld.log"

show_logs() {
    echo "--- sinfo -R / scontrol show node:" >&2
    timeout 5 sinfo -R >&2 2>&1 || true
    timeout 5 scontrol show node localhost >&2 2>&1 || true
    for f in slurmctld slurmd; do
        echo "--- tail $STATE/$f.log:" >&2
        tail -n 15 "$STATE/$f.log" >&2 2>/dev/null || true
    done
}

# ------------------------------------------------------------------- daemons
if running "$STATE/slurmctld.pid" slurmctld; then
    [ "$conf_changed" = 1 ] && log "slurm.conf changed; reconfiguring" && (timeout 10 scontrol reconfigure || true)
else
    # -c: start from a clean state (no jobs or node states left from an earlier run).
    slurmctld -c >"$STATE/slurmctld.out" 2>&1 || { cat "$STATE/slurmctld.out" >&2; show_logs; die "slurmctld failed to start"; }
    started+=(slurmctld)
fi
if ! running "$STATE/slurmd.pid" slurmd; then
    slurmd >"$STATE/slurmd.out" 2>&1 || { cat "$STATE/slurmd.out" >&2; show_logs; die "slurmd failed to start"; }
    started+=(slurmd)
fi

# ---------------------------------------------------------------- wait idle
deadline=$((SECONDS + TIMEOUT))
resumed=0
state=""
while :; do
    if timeout 5 scontrol ping 2>/dev/null | grep -q "is UP"; then
        state=$(timeout 5 sinfo -h -N -n localhost -o %T 2>/dev/null | head -n 1 || true)
        case "$state" in
        idle | mixed | allocated | completing) break ;;
        down* | drain* | inval* | fail*)
            if [ "$resumed" = 0 ]; then
                timeout 5 scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
                resumed=1
            fi
            ;;
        esac
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        show_logs
        die "the SLURM node did not become idle within ${TIMEOUT}s (last state: '${state:-slurmctld not answering}')"
    fi
    sleep 0.5
done

# ---------------------------------------------------------------- smoke test
if ! out=$(timeout 60 srun -N1 -n1 -t 1 -J adadamp-smoke true 2>&1); then
    echo "$out" >&2
    show_logs
    die "the smoke test 'srun -N1 -n1 true' failed"
fi

log "slurmctld, slurmd and munged are up; node localhost is $state (conf $CONF, state $STATE)"
echo "SLURM ready (started: ${started[*]:-nothing})"
