#!/usr/bin/env bash
# Debian's Chromium for the browser tests, installed as root like tests/system/slurm/start.sh installs SLURM.
# Prints "chromium ready: <version>" last; exits non-zero with the reason where it cannot.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "chromium is not installed and this is not root (apt-get install chromium as root)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
fi
echo "chromium ready: $(chromium --version 2>/dev/null)"
