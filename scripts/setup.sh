#!/usr/bin/env bash
# Installs what berth needs to build and run on Debian 12 (idempotent; needs root for apt).
set -euo pipefail
need=()
# python3-venv: the real-tools system test installs submitit and dask-jobqueue from PyPI
# into a virtual environment (crates/cli/tests/system_real_tools.rs).
# libpmix-dev: the agents host a PMIx server (OpenPMIx 4.2) for Open MPI (`berth run --mpi pmix`);
# openmpi-bin, libopenmpi-dev: the Open MPI system tests (crates/cli/tests/system_openmpi.rs).
for pkg in libhwloc-dev libudev-dev pkg-config hwloc mpich libmpich-dev libpmi2-0-dev libpmix-dev openmpi-bin \
  libopenmpi-dev sqlite3 python3 python3-venv; do
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
# Installing Open MPI makes its mpicc/mpiexec the default (higher alternatives priority): keep
# MPICH's as the plain names (the MPICH tests and bench/launch.sh use them); Open MPI's stay
# reachable as mpicc.openmpi, mpiexec.openmpi.
if [ "$(id -u)" -eq 0 ]; then
  for alt in "mpi /usr/bin/mpicc.mpich" "mpirun /usr/bin/mpirun.mpich" \
    "mpi-x86_64-linux-gnu /usr/include/x86_64-linux-gnu/mpich"; do
    set -- $alt
    if [ -e "$2" ] && [ "$(readlink -f "/etc/alternatives/$1")" != "$(readlink -f "$2")" ]; then
      update-alternatives --quiet --set "$1" "$2"
    fi
  done
fi
