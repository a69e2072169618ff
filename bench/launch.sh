#!/usr/bin/env bash
# Launch latency of `berth run` against MPICH's mpiexec (hydra) and Slurm's srun, on this
# machine, end to end: builds, brings local clusters up and down, starts and stops the Slurm
# peer, prints a summary. Needs root. Output: bench/results/launch-<date>.txt.
#   bash bench/launch.sh
# Env: RUNS (20) small-launch rounds; SETTLE (0) seconds of pause before each timed small
#      launch; LARGE_RUNS (5) runs per fanout and program at 1,024 ranks (0: skip the large launch);
#      SKIP_SLURM=1; NO_BUILD=1; BERTH (binary, default target/release/berth);
#      PEER (default ../shared/peers/slurm/slurm-peer.sh).
#
# 1. Small launch, 4 agents of "package:1 core:16 pu:1", RUNS rounds, each in a random order:
#    berth run -n 2 true   interactive (outside a job: allocates and frees an allocation)
#    berth run -n 2 true   in a job (--job of a running 1-node x 2-task batch job)
#    mpiexec -n 2 true     MPICH hydra, local fork
#    srun -n 2 true        Slurm peer (one slurmd, 2 CPUs)
#    then a batch job that itself loops RUNS times over `berth run -n 2 true` (date +%s%N).
# 2. Large launch, 64 agents of 16 cores, one batch job of 64 nodes x 16 tasks running
#    `berth run --timing --fanout F PROG` for F in 2 8 32 flat, PROG in `true`, `sleep 1`,
#    LARGE_RUNS rounds, alternating; plus probes (16 ranks on one node; 64 ranks, one per node)
#    and the fork/exec floor of this machine (bench/launch_floor.c).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
RUNS=${RUNS:-20}
SETTLE=${SETTLE:-0}
LARGE_RUNS=${LARGE_RUNS:-5}
PEER=${PEER:-$REPO/../shared/peers/slurm/slurm-peer.sh}
if [ "${NO_BUILD:-0}" != 1 ]; then bash scripts/build.sh >&2; fi
B=$(realpath "${BERTH:-target/release/berth}")
mkdir -p bench/results
OUT=$REPO/bench/results/launch-$(date +%Y%m%d-%H%M%S).txt
WORK=$(mktemp -d /tmp/berth-launch.XXXXXX)
chmod 755 "$WORK" # munged (user munge) must reach the peer's files under it
C4=$WORK/c4
C64=$WORK/c64
export BASE=$WORK/slurm # the Slurm peer's directory
SLURM_UP=0

cleanup() {
  "$B" --dir "$C4" down >/dev/null 2>&1 || true
  "$B" --dir "$C64" down >/dev/null 2>&1 || true
  if [ "$SLURM_UP" = 1 ]; then bash "$PEER" down >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

exec > >(tee "$OUT") 2>&1
say() { echo "$*"; }
ms_since() { echo "($EPOCHREALTIME - $1) * 1000" | bc -l; }
# stats FILE: "median p90 min max n p10" (nearest rank), of the numbers in FILE.
stats() {
  sort -g "$1" | awk '{v[NR]=$1} END {
    if (NR == 0) { print "- - - - 0 -"; exit }
    m = int((NR + 1) / 2); p = int(NR * 0.9 + 0.999999); if (p < 1) p = 1
    q = int(NR * 0.1 + 0.999999); if (q < 1) q = 1
    printf "%.1f %.1f %.1f %.1f %d %.1f\n", v[m], v[p], v[1], v[NR], NR, v[q] }'
}
fmt_stats() { # label file
  read -r med p90 min max n p10 < <(stats "$2")
  printf "  %-44s median %7s ms  p10 %7s  p90 %7s  [%s-%s]  n=%s\n" "$1" "$med" "$p10" "$p90" "$min" "$max" "$n"
}
job_state() {
  "$B" --dir "$1" jobs --all --json | python3 -c "import json,sys
for j in json.load(sys.stdin):
    if str(j['id']) == '$2': print(j['state'])"
}
wait_job() { # dir id seconds
  local s=""
  for _ in $(seq "$3"); do
    s=$(job_state "$1" "$2")
    case "$s" in pending | running | "") sleep 1 ;; *) echo "$s"; return 0 ;; esac
  done
  echo "timeout($s)"
}
wait_running() { # dir id
  for _ in $(seq 100); do [ "$(job_state "$1" "$2")" = running ] && return 0; sleep 0.1; done
  return 1
}

say "# berth launch benchmark, $(date -Is)"
say "# machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem/{print $2}') GiB, kernel $(uname -r)"
say "# berth: $B, commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' + uncommitted changes in crates/')"
say "# mpiexec: $(mpiexec --version 2>/dev/null | awk '/Version:/{print "MPICH hydra " $2; exit}')"
say "# srun: $(dpkg-query -W -f 'Slurm ${Version}' slurm-client 2>/dev/null || echo 'not installed')"
say "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"

############################################################################ 1. small launch
say ""
say "## 1. small launch: -n 2 true, $RUNS rounds, each in a random order (SEED ${SEED:-1}), a pause of ${SETTLE} s before each launch, cluster of 4 agents (package:1 core:16 pu:1)"
"$B" --dir "$C4" up --agents 4 --topology "package:1 core:16 pu:1" >/dev/null
if [ "${SKIP_SLURM:-0}" != 1 ]; then
  if ! command -v srun >/dev/null || ! [ -x /usr/sbin/slurmctld ]; then bash "$PEER" install >/dev/null 2>&1 || true; fi
  SLURM_UP=1
  if up_err=$(bash "$PEER" up 2>&1) && eval "$(bash "$PEER" env)" && timeout 30 srun -n 2 true; then
    :
  else
    say "!!! SLURM PEER DID NOT RUN: srun figures missing. Error:"
    echo "$up_err" | tail -5
    SLURM_UP=0
    bash "$PEER" down >/dev/null 2>&1 || true
  fi
else
  say "!!! SKIP_SLURM=1: no srun figures"
fi
printf '#!/bin/sh\nsleep 1800\n' >"$WORK/hold.sh"
HOLD=$("$B" --dir "$C4" submit --nodes 1 --tasks-per-node 2 --walltime 40:00 --output "$WORK/hold.out" "$WORK/hold.sh")
wait_running "$C4" "$HOLD" || { say "hold job $HOLD did not start"; exit 1; }
S=$WORK/small
mkdir -p "$S"
: >"$S/fail"
# Job cgroups on this host (Slurm's, berth's): a launch's aftermath is its job's cgroups
# being removed, which holds the kernel's cgroup lock that the next launch needs to start its
# processes in cgroups (Slurm's stay 6-15 ms after srun returns).
count_job_cgroups() { # into N_CG; no subshell, so that checking costs next to nothing
  # Job cgroups of either system, and berth's agents' job records: a job's end is done when
  # its outcome, synced to disk by the agent, has been acknowledged by the controller (after
  # its own commit) and the record removed.
  # (An agent keeps a spare cgroup, named spare, for its next job: not a job's.)
  # An agent also keeps a spare cgroup for its next job, made again after each job's end:
  # settled is also every spare back (N_SPARE).
  local d=(/sys/fs/cgroup/*/slurm*/uid_*/job_*/ /sys/fs/cgroup/*/berth/*/*/job_*/ "$C4"/agents/*/jobs/* "$C4"/agents/*/ended/*)
  N_CG=${#d[@]}
  local s=(/sys/fs/cgroup/*/berth/*/*/spare/)
  N_SPARE=${#s[@]}
}
shopt -s nullglob
run_timed() { # name cmd...
  sleep "$SETTLE"
  local t0=$EPOCHREALTIME rc=0
  "${@:2}" >/dev/null 2>>"$S/$1.err" || rc=$?
  ms_since "$t0" >>"$S/$1"
  [ $rc = 0 ] || echo "$1 exit $rc" >>"$S/fail"
  # Each launch starts on a settled machine: the previous one's aftermath is not charged to
  # the next; how long it lasted is reported.
  t0=$EPOCHREALTIME
  local polls=0
  while count_job_cgroups && { [ "$N_CG" -gt "$CG_BASE" ] || [ "$N_SPARE" -lt "$SPARE_BASE" ]; } && [ $polls -lt 2000 ]; do
    polls=$((polls + 1))
    sleep 0.001
  done
  echo "$t0 $EPOCHREALTIME" >>"$S/$1.aftermath-raw"
}
for _ in 1 2; do # warm-up, not counted
  "$B" --dir "$C4" run -n 2 true
  "$B" --dir "$C4" run --job "$HOLD" -n 2 true
  mpiexec -n 2 true
  if [ "$SLURM_UP" = 1 ]; then srun -n 2 true; fi
done
sleep 1
count_job_cgroups
CG_BASE=$N_CG SPARE_BASE=$N_SPARE # the hold job's; every agent's spare
say "(settled: $CG_BASE job cgroups and records, the hold job's; $SPARE_BASE spare cgroup directories)"
# Each round runs the contenders in a fresh random order (seeded: SEED, default 1), so none
# always follows the same one: what runs right after srun would pay for Slurm's step teardown
# (its cgroups stay 6-15 ms after srun returns, holding the kernel's cgroup lock; run_timed
# also waits for every launch's job cgroups to be gone).
RANDOM=${SEED:-1}
contenders=(berth-interactive berth-in-job mpiexec)
if [ "$SLURM_UP" = 1 ]; then contenders+=(srun); fi
for round in $(seq "$RUNS"); do
  order=("${contenders[@]}")
  for ((i = ${#order[@]} - 1; i > 0; i--)); do
    j=$((RANDOM % (i + 1)))
    t=${order[$i]} && order[$i]=${order[$j]} && order[$j]=$t
  done
  for who in "${order[@]}"; do
    # Filed by what ran just before (the last of the previous round for the first).
    echo "${prev:-none}" >>"$S/$who.prev"
    prev=$who
    case $who in
      berth-interactive) run_timed berth-interactive "$B" --dir "$C4" run --timing -n 2 true ;;
      berth-in-job) run_timed berth-in-job "$B" --dir "$C4" run --timing --job "$HOLD" -n 2 true ;;
      mpiexec) run_timed mpiexec mpiexec -n 2 true ;;
      srun) run_timed srun srun -n 2 true ;;
    esac
  done
done
"$B" --dir "$C4" cancel "$HOLD" >/dev/null
# The same from a batch job's own script, timed with date +%s%N.
cat >"$WORK/small-job.sh" <<EOF
#!/bin/bash
for i in \$(seq $RUNS); do
  sleep $SETTLE; t0=\$(date +%s%N); "$B" --dir "$C4" run -n 2 true; t1=\$(date +%s%N)
  echo \$(( (t1 - t0) / 1000 )) | awk '{printf "%.3f\n", \$1 / 1000}' >> "$S/berth-batch-script"
done
EOF
chmod +x "$WORK/small-job.sh"
J=$("$B" --dir "$C4" submit --nodes 1 --tasks-per-node 2 --walltime 10:00 --output "$WORK/small-job.out" "$WORK/small-job.sh")
say "  (batch job $J: $(wait_job "$C4" "$J" 300); load now $(cut -d' ' -f1-3 /proc/loadavg))"
for name in berth-interactive berth-in-job; do
  grep -o 'granted_ms=[0-9.]*' "$S/$name.err" | cut -d= -f2 >"$S/$name.granted" || true
  grep -o 'running_ms=[0-9.]*' "$S/$name.err" | cut -d= -f2 >"$S/$name.running" || true
done
say "wall time per launch (command start to exit), nearest-rank median/p10/p90 [min-max]:"
fmt_stats "berth run -n 2 true (interactive)" "$S/berth-interactive"
fmt_stats "  of which granted (allocation made)" "$S/berth-interactive.granted"
fmt_stats "  of which all ranks running" "$S/berth-interactive.running"
fmt_stats "berth run -n 2 true (in a job, --job)" "$S/berth-in-job"
fmt_stats "  of which granted" "$S/berth-in-job.granted"
fmt_stats "  of which all ranks running" "$S/berth-in-job.running"
fmt_stats "berth run -n 2 true (batch script loop)" "$S/berth-batch-script"
fmt_stats "mpiexec -n 2 true (MPICH hydra)" "$S/mpiexec"
if [ "$SLURM_UP" = 1 ]; then fmt_stats "srun -n 2 true (Slurm peer)" "$S/srun"; else say "  srun: NOT MEASURED (Slurm peer did not run)"; fi
say "median by what ran just before (n):"
for who in berth-interactive berth-in-job mpiexec srun; do
  [ -s "$S/$who.prev" ] || continue
  line=$(paste "$S/$who.prev" "$S/$who" | sort -k1,1 -k2g | awk '
    { v[$1] = v[$1] " " $2; n[$1]++ }
    END { for (p in n) { split(substr(v[p], 2), a, " "); printf "  after %s %.1f (%d)", p, a[int((n[p] + 1) / 2)], n[p] } }')
  printf "  %-20s%s\n" "$who" "$line"
done
say "aftermath (from a launch's exit until its job's cgroups and berth's job records are gone; the next launch waits for it):"
for name in berth-interactive berth-in-job mpiexec srun; do
  [ -s "$S/$name.aftermath-raw" ] || continue
  awk '{printf "%.3f\n", ($2 - $1) * 1000}' "$S/$name.aftermath-raw" >"$S/$name.aftermath"
  fmt_stats "$name" "$S/$name.aftermath"
done
[ -s "$S/fail" ] && { say "failures:"; sort "$S/fail" | uniq -c; }
"$B" --dir "$C4" down >/dev/null
if [ "$SLURM_UP" = 1 ]; then bash "$PEER" down >/dev/null; SLURM_UP=0; fi

if [ "$LARGE_RUNS" -gt 0 ]; then
############################################################################ 2. large launch
say ""
say "## 2. large launch: 1,024 ranks on 64 agents x 16 cores, one batch job of 64 nodes x 16 tasks"
"$B" --dir "$C64" up --agents 64 --topology "package:1 core:16 pu:1" >/dev/null
L=$WORK/large
mkdir -p "$L"
cat >"$WORK/large-job.sh" <<EOF
#!/bin/bash
r() { # tag args...
  "$B" --dir "$C64" run --timing "\${@:2}" 2>&1 >/dev/null | sed -n "s/^berth run: timing /\$1 /p" >> "$L/timings"
}
for round in \$(seq $LARGE_RUNS); do
  for f in 2 8 32 flat; do
    r "fanout=\$f prog=true" --fanout \$f true
    r "fanout=\$f prog=sleep1" --fanout \$f sleep 1
  done
  r "probe=16-ranks-1-node" -N 1 -n 16 true
  r "probe=64-ranks-1-per-node" -N 64 -n 64 true
done
EOF
chmod +x "$WORK/large-job.sh"
J=$("$B" --dir "$C64" submit --nodes 64 --tasks-per-node 16 --walltime 15:00 --output "$WORK/large-job.out" --error "$WORK/large-job.err" "$WORK/large-job.sh")
say "  (batch job $J: $(wait_job "$C64" "$J" 900); load now $(cut -d' ' -f1-3 /proc/loadavg))"
say "ms from run's start, median [min-max] of $LARGE_RUNS runs (granted = step granted by the controller,"
say "running = every rank started, total = run exited):"
printf "  %-28s %-22s %-22s %-22s\n" "what" "granted_ms" "running_ms" "total_ms"
for tag in "fanout=2 prog=true" "fanout=8 prog=true" "fanout=32 prog=true" "fanout=flat prog=true" \
  "fanout=2 prog=sleep1" "fanout=8 prog=sleep1" "fanout=32 prog=sleep1" "fanout=flat prog=sleep1" \
  "probe=16-ranks-1-node" "probe=64-ranks-1-per-node"; do
  line="$(printf "  %-28s" "$tag")"
  for k in granted_ms running_ms total_ms; do
    grep "^$tag " "$L/timings" | grep -o "$k=[0-9.]*" | cut -d= -f2 >"$L/v" || true
    read -r med _ min max n _ < <(stats "$L/v")
    line+="$(printf " %-22s" "$med [$min-$max]")"
  done
  say "$line"
done
n1024=$(grep "prog=" "$L/timings" | grep -c 'running_ms=' || true)
under=$(grep "prog=" "$L/timings" | grep -o 'running_ms=[0-9.]*' | cut -d= -f2 | awk '$1 < 1000' | wc -l)
say "  1,024-rank runs with all ranks running in under 1 s: $under of $n1024"
"$B" --dir "$C64" down >/dev/null
fi

############################################################################ floor
say ""
say "## fork/exec floor of this machine (bench/launch_floor.c: one small C process, pipes, setsid, no cgroups)"
if gcc -O2 -o "$WORK/launch_floor" bench/launch_floor.c; then
  for _ in 1 2 3; do "$WORK/launch_floor" 1024 | sed 's/^/  /'; done
fi
say ""
say "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
say "# results: $OUT"
