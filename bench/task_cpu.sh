#!/usr/bin/env bash
# CPU per task of a job array of `true` (issue 19): a local cluster of 4 agents
# ("package:1 core:2 pu:1", as bench/arrays.sh), an N-task array and an `afterany` job after it;
# utime+stime of the controller and of the agents, and of the agents' reaped children (each
# job's shim and script), read from /proc/PID/stat before the submission and once the
# `afterany` job started, divided by N. Independent of other load, unlike tasks/s.
#   bash bench/task_cpu.sh BINDIR N     (needs root; BINDIR holds berth and berthd)
# Env: PERF=1 also records `perf record -a -g` of the run into ./perf.data.
set -euo pipefail
BIN=$(realpath "$1"); N=$2
W=$(mktemp -d /tmp/berth-task-cpu.XXXXXX); C=$W/c
mkdir -p "$C"; printf '[scheduler]\nmax_array_size = 100001\n' > "$C/berth.toml"
printf '#!/bin/sh\ntrue\n' > "$W/true.sh"; chmod 755 "$W" "$W/true.sh"
printf '#!/bin/sh\ndate +%%s.%%N > %s/done\n' "$W" > "$W/done.sh"
"$BIN/berth" --dir "$C" up --agents 4 --topology "package:1 core:2 pu:1" >/dev/null
trap '"$BIN/berth" --dir "$C" down >/dev/null 2>&1; rm -rf "$W"' EXIT
sleep 1
CP=$(cat "$C/run/server.pid"); AP="$(for f in "$C"/run/node*.pid; do cat "$f"; echo; done)"
HZ=$(getconf CLK_TCK)
st() { awk '{print $14+$15, $16+$17}' "/proc/$1/stat"; }
snap() { local s=""; for p in $CP $AP; do s="$s $(st "$p")"; done; echo "$s"; }
read -r -a b <<< "$(snap)"; t0=$(date +%s.%N); l0=$(cut -d' ' -f1 /proc/loadavg)
if [ "${PERF:-0}" = 1 ]; then perf record -F 999 -g -a -o perf.data 2>/dev/null & PP=$!; sleep 0.5; fi
A=$("$BIN/berth" --dir "$C" submit --array "0-$((N - 1))" --output /dev/null --error /dev/null "$W/true.sh")
"$BIN/berth" --dir "$C" submit --dependency "afterany:$A" --output /dev/null --error /dev/null "$W/done.sh" >/dev/null
while [ ! -s "$W/done" ]; do sleep 0.2; done
t2=$(cat "$W/done")
read -r -a a <<< "$(snap)"
if [ "${PERF:-0}" = 1 ]; then kill -INT "$PP"; wait "$PP" || true; fi
ms() { echo "($1) * 1000 / $HZ / $N" | bc -l | xargs printf '%.2f'; }
ag_self=0; ag_ch=0
for i in 1 2 3 4; do ag_self=$((ag_self + a[2*i] - b[2*i])); ag_ch=$((ag_ch + a[2*i+1] - b[2*i+1])); done
wall=$(echo "$t2 - $t0" | bc -l)
echo "N=$N in $(printf %.2f "$wall") s: $(echo "$N / $wall" | bc -l | xargs printf %.0f) tasks/s, load $l0 -> $(cut -d' ' -f1 /proc/loadavg)"
echo "CPU ms per task: controller $(ms $((a[0] - b[0]))), agents $(ms $ag_self), jobs' shims and scripts $(ms $ag_ch)"
