#!/usr/bin/env bash
# Start a dask-gateway-server on localhost for the test suite: the UnsafeLocalBackend (clusters
# are local processes of this user, no per-user accounts), simple authentication, its proxy on
# one free port, its state (configuration, clusters' working directories, log) in a new
# temporary directory.  tests/system/gateway/stop.sh stops it (and the clusters it runs) again.
#
# Exits non-zero with a message on stderr when the gateway cannot be started (dask-gateway-server
# missing, or it does not answer within the timeout).  The last line on stdout is
#   Gateway ready: http://127.0.0.1:PORT (pid PID, state DIR)
#
# Environment: ADADAMP_GATEWAY_PYTHON (default python3: the Python that has dask-gateway-server,
# distributed and adadamp; the clusters' schedulers and workers run with it too),
# ADADAMP_GATEWAY_TIMEOUT (default 60: seconds to wait for the gateway's health check),
# ADADAMP_GATEWAY_HEARTBEAT (default 3: seconds between a cluster's heartbeats to the gateway),
# ADADAMP_GATEWAY_MAX_WORKERS (default 4: most workers per cluster).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${ADADAMP_GATEWAY_PYTHON:-python3}
TIMEOUT=${ADADAMP_GATEWAY_TIMEOUT:-60}

die() {
    echo "tests/system/gateway/start.sh: $*" >&2
    exit 1
}

command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON (set ADADAMP_GATEWAY_PYTHON)"
"$PYTHON" -c "import dask_gateway_server, dask_gateway" 2>/dev/null ||
    die "$PYTHON has no dask-gateway-server and dask-gateway: pip install dask-gateway 'dask-gateway-server[local]'"

STATE=$(mktemp -d "${TMPDIR:-/tmp}/adadamp-gateway-XXXXXX")
mkdir -p "$STATE/clusters"
PORT=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1]); s.close()")
cp "$HERE/gateway_config.py" "$STATE/dask_gateway_config.py"

# Its own session: the test session's signals (Ctrl-C) do not reach it; stop.sh stops it.
ADADAMP_GATEWAY_STATE=$STATE ADADAMP_GATEWAY_PORT=$PORT \
    setsid "$PYTHON" -m dask_gateway_server -f "$STATE/dask_gateway_config.py" \
    >"$STATE/gateway.log" 2>&1 </dev/null &
PID=$!
echo "$PID" >"$STATE/gateway.pid"

URL="http://127.0.0.1:$PORT"
deadline=$((SECONDS + TIMEOUT))
until "$PYTHON" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/api/health', timeout=2)" "$URL" 2>/dev/null; do
    if ! kill -0 "$PID" 2>/dev/null; then
        tail -n 20 "$STATE/gateway.log" >&2
        die "dask-gateway-server exited (log: $STATE/gateway.log)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        tail -n 20 "$STATE/gateway.log" >&2
        bash "$HERE/stop.sh" "$STATE" >/dev/null 2>&1 || true
        die "dask-gateway-server did not answer $URL/api/health within ${TIMEOUT}s"
    fi
    sleep 0.3
done
echo "Gateway ready: $URL (pid $PID, state $STATE)"
