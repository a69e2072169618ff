#!/usr/bin/env bash
# Installs what berth needs to build and run on Debian 12 (idempotent; needs root for apt).
set -euo pipefail
need=()
# python3-venv: the real-tools system test installs submitit and dask-jobqueue from PyPI
# into a virtual environment (crates/cli/tests/system_real_tools.rs).
for pkg in libhwloc-dev libudev-dev pkg-config hwloc mpich libmpich-dev libpmi2-0-dev sqlite3 python3 python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "berth setup: need root to install ${need[*]} (run as root, or install them first)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || true
  apt-get install -y -qq "${need[@]}"
fi
