#!/usr/bin/env bash
# A/B of two berth builds on the small interactive launch, with MPICH's mpiexec as the
# reference, all interleaved (the VM's speed drifts: only launches next to each other compare).
#   bash bench/ab.sh N DIR_A DIR_B
# DIR_A, DIR_B: each holds a `berth` and a `berthd` (e.g. copies of target/release after
# `bash scripts/build.sh` at two commits). Each gets its own local cluster of 4 agents of
# "package:1 core:16 pu:1"; N rounds of `berth run -n 2 true` on A, on B and `mpiexec -n 2 true`,
# in 6 rotating orders, 20 ms apart, after 20 warm-up rounds. Prints median / p10 / p90 (ms).
# Needs root (cgroups).
set -euo pipefail
N=${1:?rounds}
A=$(realpath "${2:?dir of build A}")
B=$(realpath "${3:?dir of build B}")
W=$(mktemp -d /tmp/berth-ab.XXXXXX)
down() { for x in A B; do "${!x}/berth" --dir "$W/c$x" down >/dev/null 2>&1 || true; done; }
trap 'down; rm -rf "$W"' EXIT
for x in A B; do "${!x}/berth" --dir "$W/c$x" up --agents 4 --topology "package:1 core:16 pu:1" >/dev/null; done
one() {
  case $1 in
    A) "$A/berth" --dir "$W/cA" run -n 2 true ;;
    B) "$B/berth" --dir "$W/cB" run -n 2 true ;;
    M) mpiexec -n 2 true ;;
  esac
}
for _ in $(seq 20); do one A; one B; one M; done
orders=("A B M" "B M A" "M A B" "B A M" "A M B" "M B A")
for i in $(seq "$N"); do
  for w in ${orders[$((i % 6))]}; do
    sleep 0.02
    t0=$EPOCHREALTIME
    one "$w"
    echo "($EPOCHREALTIME - $t0) * 1000" | bc -l >>"$W/$w"
  done
done
for w in A B M; do
  sort -g "$W/$w" | awk -v w="$w" '{v[NR]=$1} END {
    printf "%s median %.2f p10 %.2f p90 %.2f n=%d\n", w, v[int((NR+1)/2)], v[int(NR*0.1)+1], v[int(NR*0.9)], NR }'
done
