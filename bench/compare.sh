#!/usr/bin/env bash
# berth and Slurm side by side, in one run on this machine. Appends JSON lines to
# bench/results/<date>.jsonl and prints them. Needs root; Slurm via ../shared/peers/slurm.
#   bash bench/compare.sh            # berth + Slurm
#   SKIP_SLURM=1 bash bench/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --bin berth --bin berthd --bin berth-bench
mkdir -p bench/results
OUT=bench/results/$(date +%Y%m%d-%H%M%S).jsonl
B=./target/release/berth-bench
echo "# machine: $(nproc) cpus, $(free -g | awk '/Mem/{print $2}') GiB, $(uname -r)" | tee -a "$OUT"
$B submit-api 10000 8 | tee -a "$OUT"
$B submit-api 10000 1 | tee -a "$OUT"
$B submit-batch 10000 100 | tee -a "$OUT"
$B submit-cli 2000 1 | tee -a "$OUT"
$B submit-cli 2000 4 | tee -a "$OUT"
$B submit-cli-multi 10000 100 | tee -a "$OUT"
# Same slots as the Slurm peer's 4 emulated nodes of 2 CPUs each, then larger emulated nodes.
BERTH_BENCH_TOPOLOGY="package:1 core:2 pu:1" $B e2e 2000 4 | tee -a "$OUT"
$B e2e 2000 4 | tee -a "$OUT"
if [ "${SKIP_SLURM:-0}" != 1 ]; then
  PEER=${PEER:-../shared/peers/slurm/slurm-peer.sh}
  bash "$PEER" install >/dev/null
  OUT_ABS=$(pwd)/$OUT
  OUT=$OUT_ABS bash bench/slurm/run_series.sh 1 "n1 n2 n3 n4" submit_rate.sh 2000 1
  OUT=$OUT_ABS bash bench/slurm/run_series.sh 1 "n1 n2 n3 n4" submit_rate.sh 2000 4
  OUT=$OUT_ABS bash bench/slurm/run_series.sh 1 "n1 n2 n3 n4" e2e.sh 500
  HTC=1 OUT=$OUT_ABS bash bench/slurm/run_series.sh 1 "n1 n2 n3 n4" e2e.sh 500
  bash "$PEER" down
fi
echo "results in $OUT"
