#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests of the Checkpoints page, if missing.
#
# Needs root (or passwordless sudo) and apt-get; elsewhere it prints how to install it and
# the browser tests skip, naming the missing /usr/bin/chromium.
set -euo pipefail

if [[ -x /usr/bin/chromium ]]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser: no apt-get; install Chromium so that /usr/bin/chromium exists to run the browser tests" >&2
    exit 0
fi
if [[ $(id -u) -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "install-browser: not root; run 'apt-get install chromium' to run the browser tests" >&2
    exit 0
fi
echo "install-browser: installing Debian's chromium (for the Checkpoints page tests)"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get install -y -q chromium >/dev/null \
    || { "${sudo[@]}" apt-get update -q >/dev/null && "${sudo[@]}" apt-get install -y -q chromium >/dev/null; }
echo "install-browser: $(/usr/bin/chromium --version 2>/dev/null || echo 'chromium did not install')"
