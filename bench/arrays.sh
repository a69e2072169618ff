#!/usr/bin/env bash
# Job arrays at scale (issue 19), berth and the Slurm peer in the same run:
#   1. submission of a held 100,000-task array (`submit --hold --array 0-99999`), REPEATS times,
#      each on a fresh controller state; the controller's RSS after it;
#   2. a 10,000-task array of /bin/true on 4 agents: submission to every task ended;
#   3. the same on Slurm (4 emulated nodes, MaxArraySize=100001): `sbatch --hold --array=0-99999
#      --wrap true`, and the 10,000-task array (bounded by SLURM_RUN_SECS: its rate is reported).
#   bash bench/arrays.sh            (needs root; builds unless NO_BUILD=1)
# Env: REPEATS (3), SIZE (100000), RUN_SIZE (10000), SKIP_SLURM=1, SLURM_RUN_SECS (300),
#      WAIT (dep: the end is when an `afterany` job on the array starts; poll: `berth jobs`),
#      SKIP_SUBMIT=1 (only the runs), SKIP_RUN=1 (only the submissions: no 10,000-task runs),
#      BERTH (binary, default target/release/berth), PEER (default ../shared/peers/slurm/slurm-peer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
REPEATS=${REPEATS:-3}
SIZE=${SIZE:-100000}
RUN_SIZE=${RUN_SIZE:-10000}
SLURM_RUN_SECS=${SLURM_RUN_SECS:-300}
PEER=${PEER:-$REPO/../shared/peers/slurm/slurm-peer.sh}
if [ "${NO_BUILD:-0}" != 1 ]; then bash scripts/build.sh >&2; fi
B=$(realpath "${BERTH:-target/release/berth}")
WORK=$(mktemp -d /tmp/berth-arrays.XXXXXX)
chmod 755 "$WORK" # munged (user munge) must reach the peer's files under it
export BASE=$WORK/slurm
CLUSTERS=()
SLURM_UP=0
cleanup() {
  for c in "${CLUSTERS[@]}"; do "$B" --dir "$c" down >/dev/null 2>&1 || true; done
  if [ "$SLURM_UP" = 1 ]; then bash "$PEER" down >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc -l | xargs printf '%.3f'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

printf '#!/bin/sh\ntrue\n' > "$WORK/true.sh"
echo "# job arrays at scale, $(date -Is), $(nproc) CPUs, load $(load)"

up() { # dir agents
  mkdir -p "$1"
  printf '[scheduler]\nmax_array_size = %d\n' $((SIZE + 1)) > "$1/berth.toml"
  "$B" --dir "$1" up --agents "$2" --topology "package:1 core:2 pu:1" >/dev/null
  CLUSTERS+=("$1")
}
rss_kb() { # dir: the controller's VmRSS
  local pid
  pid=$(cat "$1"/run/*server*.pid 2>/dev/null || pgrep -f "berthd server --dir $1\$" | head -1)
  awk '/VmRSS/ {print $2}' "/proc/$pid/status"
}

echo "## berth: submit --hold --array 0-$((SIZE - 1))"
[ "${SKIP_SUBMIT:-0}" = 1 ] && REPEATS_B=0 || REPEATS_B=$REPEATS
for r in $(seq "$REPEATS_B"); do
  C=$WORK/sub$r
  up "$C" 1
  t0=$(now)
  A=$("$B" --dir "$C" submit --hold --array "0-$((SIZE - 1))" --output /dev/null --error /dev/null "$WORK/true.sh")
  t1=$(now)
  echo "  run $r: array $A submitted in $(secs "$t0" "$t1") s; controller RSS $(( $(rss_kb "$C") / 1024 )) MiB; load $(load)"
  "$B" --dir "$C" down >/dev/null
done

if [ "${SKIP_RUN:-0}" != 1 ]; then
echo "## berth: --array 0-$((RUN_SIZE - 1)) of /bin/true on 4 agents (2 cores each), submit to all ended (WAIT=${WAIT:-dep})"
C=$WORK/run
up "$C" 4
t0=$(now)
A=$("$B" --dir "$C" submit --array "0-$((RUN_SIZE - 1))" --output /dev/null --error /dev/null "$WORK/true.sh")
t1=$(now)
if [ "${WAIT:-dep}" = poll ]; then
  # The end: when `berth jobs` lists none of the array's tasks (polled every 0.5 s).
  while [ "$("$B" --dir "$C" jobs | grep -c "^ *${A}_")" -gt 0 ]; do sleep 0.5; done
  t2=$(now)
else
  # The end: a job that waits for the whole array (afterany) writes the time it starts.
  printf '#!/bin/sh\ndate +%%s.%%N > %s/done\n' "$WORK" > "$WORK/done.sh"
  "$B" --dir "$C" submit --dependency "afterany:$A" --output /dev/null --error /dev/null "$WORK/done.sh" >/dev/null
  while [ ! -s "$WORK/done" ]; do sleep 0.2; done
  t2=$(cat "$WORK/done")
fi
total=$(secs "$t0" "$t2")
echo "  submitted in $(secs "$t0" "$t1") s; all $RUN_SIZE ended after $total s: $(echo "$RUN_SIZE / $total" | bc -l | xargs printf '%.0f') tasks/s; load $(load)"
"$B" --dir "$C" down >/dev/null
fi

[ "${SKIP_SLURM:-0}" = 1 ] && exit 0
echo "## Slurm peer: 4 emulated nodes, MaxArraySize=$((SIZE + 1))"
SLURM_UP=1
bash "$PEER" up n1 n2 n3 n4 >/dev/null
eval "$(bash "$PEER" env)"
# The peer script has no config overrides: add ours and restart slurmctld on the same config.
printf 'MaxArraySize=%d\nMaxJobCount=1000000\nMinJobAge=5\n' $((SIZE + 1)) >> "$BASE/etc/slurm.conf"
scontrol shutdown slurmctld >/dev/null 2>&1 || true
for _ in $(seq 100); do [ -s "$BASE/run/slurmctld.pid" ] && kill -0 "$(cat "$BASE/run/slurmctld.pid")" 2>/dev/null || break; sleep 0.1; done
/usr/sbin/slurmctld -f "$SLURM_CONF" </dev/null
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
scontrol show config | grep -E 'MaxArraySize|MaxJobCount' | sed 's/^/  /'
for r in $(seq "$REPEATS"); do
  t0=$(now)
  J=$(sbatch --parsable --hold --array="0-$((SIZE - 1))" -o /dev/null -e /dev/null --wrap true)
  t1=$(now)
  echo "  run $r: sbatch --hold --array=0-$((SIZE - 1)) ($J) in $(secs "$t0" "$t1") s; load $(load)"
  scancel "$J"
done
[ "${SKIP_RUN:-0}" = 1 ] && exit 0
sleep 2
t0=$(now)
J=$(sbatch --parsable --array="0-$((RUN_SIZE - 1))" -o /dev/null -e /dev/null --wrap true)
t1=$(now)
echo "  $RUN_SIZE-task array $J submitted in $(secs "$t0" "$t1") s"
end=$(echo "$t0 + $SLURM_RUN_SECS" | bc -l)
left=$RUN_SIZE
while :; do
  left=$(squeue -h -r -j "$J" 2>/dev/null | wc -l)
  [ "$left" -eq 0 ] && break
  [ "$(echo "$(now) > $end" | bc)" = 1 ] && break
  sleep 1
done
t2=$(now)
done_n=$((RUN_SIZE - left))
echo "  after $(secs "$t0" "$t2") s: $done_n of $RUN_SIZE ended: $(echo "$done_n / ($t2 - $t0)" | bc -l | xargs printf '%.1f') tasks/s; load $(load)"
scancel "$J" 2>/dev/null || true
