#!/bin/bash
# Run one benchmark R times, each on a freshly restarted peer (down; CLEAN=1 up NODES), appending the
# JSON lines to $OUT (default bench/slurm/results.jsonl).
#   run_series.sh R "n1 n2 n3 n4" e2e.sh 500            (stock)
#   HTC=1 run_series.sh R "n1 n2 n3 n4" submit_rate.sh 2000 4
# NODES "vm" reproduces the README's single-node setup.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEER=${PEER:-/work/shared/peers/slurm/slurm-peer.sh}
OUT=${OUT:-$HERE/results.jsonl}
R=$1; NODES=$2; shift 2
eval "$(bash "$PEER" env)"; export SLURM_CONF
cd /tmp
for ((r = 1; r <= R; r++)); do
  bash "$PEER" down
  # shellcheck disable=SC2086
  CLEAN=1 bash "$PEER" up $NODES >/dev/null
  bash "$HERE/$1" "${@:2}" | tee -a "$OUT"
done
