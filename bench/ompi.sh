#!/usr/bin/env bash
# Issue 21's benchmarks, one run: Open MPI programs launched by berth (PMIx in the agents)
# against Open MPI's own mpirun, wire-up of 256 ranks on 16 agents, PMIx fence latency.
# Needs root, openmpi-bin libopenmpi-dev libpmix-dev (scripts/setup.sh). Output:
# bench/results/ompi-<date>.txt.
#   bash bench/ompi.sh
# Env: RUNS (20) small rounds; NO_BUILD=1; BIN (directory of berth and berthd, default
#      target/release); FENCE_ROUNDS (50).
#
# 1. Small launch, 4 agents of "package:1 core:16 pu:1", RUNS rounds alternating:
#    berth run --job HOLD -n 2 --mpi pmix hello   (a running 1-node x 2-task job)
#    mpirun.openmpi -n 2 hello                     (Open MPI's own launcher, local fork)
#    and the same with `true` (launch alone): the difference is MPI_Init's wire-up.
# 2. 16 agents, one job of 16 nodes x 16 tasks: `berth run -n 256 hello` and `-n 256 true`
#    (3 rounds each): wire-up of 256 ranks = hello minus true.
# 3. PMIx fence latency (bench/pmix_fence.c): 2 ranks on 2 nodes, 16 ranks on 16 nodes,
#    256 ranks on 16 nodes; median/p90 of FENCE_ROUNDS fences without and with data.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
RUNS=${RUNS:-20}
FENCE_ROUNDS=${FENCE_ROUNDS:-50}
if [ "${NO_BUILD:-0}" != 1 ]; then bash scripts/build.sh >&2; fi
BIN=$(realpath "${BIN:-target/release}")
B=$BIN/berth
mkdir -p bench/results
OUT=$REPO/bench/results/ompi-$(date +%Y%m%d-%H%M%S).txt
WORK=$(mktemp -d /tmp/berth-ompi.XXXXXX)
chmod 755 "$WORK"
C4=$WORK/c4
C16=$WORK/c16
cleanup() {
  "$B" --dir "$C4" down >/dev/null 2>&1 || true
  "$B" --dir "$C16" down >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
exec > >(tee "$OUT") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo

mpicc.openmpi -O2 -o "$WORK/hello" crates/agent/tests/mpi/hello.c
# shellcheck disable=SC2046
cc -O2 -o "$WORK/pmix_fence" bench/pmix_fence.c $(pkg-config --cflags pmix) -lpmix

ms_since() { echo "($EPOCHREALTIME - $1) * 1000" | bc -l; }
stats() { # FILE -> "median p10 p90 n"
  sort -g "$1" | awk '{v[NR]=$1} END { if (NR == 0) { print "- - - 0"; exit }
    m = int((NR + 1) / 2); p = int(NR * 0.9 + 0.999999); q = int(NR * 0.1 + 0.999999); if (q < 1) q = 1
    printf "%.1f %.1f %.1f %d\n", v[m], v[q], v[p], NR }'
}
show() { read -r med p10 p90 n < <(stats "$2"); printf "  %-52s median %8s ms  p10 %8s  p90 %8s  n=%s\n" "$1" "$med" "$p10" "$p90" "$n"; }
job_state() {
  "$B" --dir "$1" jobs --all --json | python3 -c "import json,sys
for j in json.load(sys.stdin):
    if str(j['id']) == '$2': print(j['state'])"
}
wait_running() { for _ in $(seq 300); do [ "$(job_state "$1" "$2")" = running ] && return 0; sleep 0.1; done; return 1; }
timed() { # name cmd... : appends ms to $WORK/t/name; fails loudly
  local t0=$EPOCHREALTIME
  if ! "${@:2}" >"$WORK/last.out" 2>"$WORK/last.err"; then
    echo "!!! $1 failed: $(tail -3 "$WORK/last.err")"
    echo "$1" >>"$WORK/t/fail"
    return 0
  fi
  ms_since "$t0" >>"$WORK/t/$1"
}
mkdir -p "$WORK/t"
: >"$WORK/t/fail"

echo "# berth Open MPI benchmark, $(date -Is)"
echo "# machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem/{print $2}') GiB, kernel $(uname -r)"
echo "# berth: $B, commit $(git rev-parse --short HEAD)"
echo "# mpirun: $(mpirun.openmpi --version 2>/dev/null | head -1); libpmix $(pkg-config --modversion pmix)"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"

echo ""
echo "## 1. small launch, -n 2, $RUNS rounds alternating, 4 agents (package:1 core:16 pu:1)"
"$B" --dir "$C4" up --agents 4 --topology "package:1 core:16 pu:1" >/dev/null
printf '#!/bin/sh\nsleep 1800\n' >"$WORK/hold.sh"
HOLD=$("$B" --dir "$C4" submit --nodes 1 --tasks-per-node 2 --walltime 40:00 --output "$WORK/hold.out" "$WORK/hold.sh")
wait_running "$C4" "$HOLD" || { echo "hold job $HOLD did not start"; exit 1; }
for _ in $(seq "$RUNS"); do
  timed berth_hello "$B" --dir "$C4" run --job "$HOLD" -n 2 --mpi pmix "$WORK/hello"
  timed mpirun_hello mpirun.openmpi -n 2 "$WORK/hello"
  timed berth_true "$B" --dir "$C4" run --job "$HOLD" -n 2 --mpi pmix true
  timed mpirun_true mpirun.openmpi -n 2 true
done
show "berth run -n 2 --mpi pmix hello (in a job)" "$WORK/t/berth_hello"
show "mpirun.openmpi -n 2 hello" "$WORK/t/mpirun_hello"
show "berth run -n 2 --mpi pmix true (in a job)" "$WORK/t/berth_true"
show "mpirun.openmpi -n 2 true" "$WORK/t/mpirun_true"
"$B" --dir "$C4" down >/dev/null

echo ""
# Oversubscribed from here on (256 ranks, few CPUs): Open MPI's ranks yield while they wait,
# as Open MPI does by itself when mpirun knows the node is oversubscribed.
export OMPI_MCA_mpi_yield_when_idle=1
echo "## 2. 256 ranks on 16 agents (package:1 core:16 pu:1), one job of 16 nodes x 16 tasks, 3 rounds"
# 256 ranks busy in MPI_Init on this machine's few CPUs starve the daemons: the agents'
# heartbeat and the controller's renewal can take seconds, past `berth up`'s 2 s lease, and
# the nodes fence themselves. Real nodes have their own CPUs; here the lease is lengthened
# (heartbeat_misses 30: node timeout 30 s), written before the cluster's first start.
"$B" --dir "$C16" up --agents 16 --topology "package:1 core:16 pu:1" >/dev/null
"$B" --dir "$C16" down >/dev/null
sed -i 's/^heartbeat_misses = .*/heartbeat_misses = 30/' "$C16/berth.toml"
"$B" --dir "$C16" up --agents 16 --topology "package:1 core:16 pu:1" >/dev/null
BIG=$("$B" --dir "$C16" submit --nodes 16 --tasks-per-node 16 --walltime 40:00 --output "$WORK/big.out" "$WORK/hold.sh")
wait_running "$C16" "$BIG" || { echo "job $BIG did not start"; exit 1; }
for _ in 1 2 3; do
  timed big_hello "$B" --dir "$C16" run --job "$BIG" -n 256 --mpi pmix "$WORK/hello"
  echo "    hello lines: $(grep -c "^hello from rank" "$WORK/last.out" || true)"
  timed big_true "$B" --dir "$C16" run --job "$BIG" -n 256 --mpi pmix true
done
show "berth run -n 256 --mpi pmix hello" "$WORK/t/big_hello"
show "berth run -n 256 --mpi pmix true" "$WORK/t/big_true"
read -r hm _ < <(stats "$WORK/t/big_hello")
read -r tm _ < <(stats "$WORK/t/big_true")
echo "  wire-up of 256 ranks (median hello - median true): $(echo "$hm - $tm" | bc -l) ms"

echo ""
echo "## 3. PMIx fence latency ($FENCE_ROUNDS fences each; microseconds median/p90)"
for spec in "2 2" "16 16" "256 16"; do
  read -r n nodes <<<"$spec"
  if "$B" --dir "$C16" run --job "$BIG" -n "$n" -N "$nodes" --mpi pmix "$WORK/pmix_fence" "$FENCE_ROUNDS" >"$WORK/last.out" 2>"$WORK/last.err"; then
    sed "s/^/  nodes=$nodes /" "$WORK/last.out"
  else
    echo "!!! fence run of $n ranks on $nodes nodes failed: $(tail -3 "$WORK/last.err")"
    echo fence >>"$WORK/t/fail"
  fi
done
echo ""
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -s "$WORK/t/fail" ]; then echo "!!! failures: $(sort "$WORK/t/fail" | uniq -c | xargs)"; exit 1; fi
