#!/usr/bin/env bash
# Stop the dask-gateway-server that tests/system/gateway/start.sh started with state directory $1:
# SIGTERM (the gateway stops its clusters' schedulers and workers first), SIGKILL after 20 s to it and
# to any cluster process left, then remove the state directory.
set -uo pipefail
STATE=${1:?usage: stop.sh STATE_DIR}
[ -s "$STATE/gateway.pid" ] || { rm -rf "$STATE"; exit 0; }
PID=$(cat "$STATE/gateway.pid")
if kill -0 "$PID" 2>/dev/null && tr '\0' ' ' <"/proc/$PID/cmdline" 2>/dev/null | grep -q dask_gateway_server; then
    kill -TERM "$PID" 2>/dev/null
    for _ in $(seq 100); do
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$PID" 2>/dev/null; then
        echo "tests/system/gateway/stop.sh: gateway (pid $PID) ignored SIGTERM; killing it" >&2
        kill -KILL "$PID" 2>/dev/null
    fi
fi
# Each cluster process runs in its own session, in a working directory under $STATE/clusters:
# any left (a gateway killed before it stopped them) are found by that directory.
for proc in /proc/[0-9]*; do
    case "$(readlink "$proc/cwd" 2>/dev/null)" in
    "$STATE"/clusters/*) kill -KILL "${proc#/proc/}" 2>/dev/null ;;
    esac
done
echo "tests/system/gateway/stop.sh: stopped the gateway (pid $PID)"
rm -rf "$STATE"
exit 0
