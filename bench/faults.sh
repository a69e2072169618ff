#!/usr/bin/env bash
# Fault injection on a local cluster of agents in network namespaces, under a job load: node
# failures (links cut with `ip link set down`, agents killed with SIGKILL) and controller kills,
# with detection times and what survived. Needs root. Output: bench/results/faults-<date>.txt.
#   bash bench/faults.sh
# Env: ROUNDS (12) node faults, alternating cut link / killed agent over nodes 2..4;
#      CTL_KILLS (3) controller kills spread over the run; JOBS (300) short jobs submitted;
#      NO_BUILD=1; BERTH (binary, default target/release/berth).
#
# Node 1 is never faulted and runs a long job through everything: it must complete, once.
# Detection time = the controller's `node_down` event time - the injection time (same clock).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
ROUNDS=${ROUNDS:-12}
CTL_KILLS=${CTL_KILLS:-3}
JOBS=${JOBS:-300}
if [ "${NO_BUILD:-0}" != 1 ]; then cargo build --release --bin berth --bin berthd >&2; fi
B=$(realpath "${BERTH:-target/release/berth}")
mkdir -p bench/results
OUT=$REPO/bench/results/faults-$(date +%Y%m%d-%H%M).txt
WORK=$(mktemp -d /tmp/berth-faults.XXXXXX)
chmod 755 "$WORK"
C=$WORK/c
cleanup() {
  "$B" --dir "$C" down >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

now() { date +%s.%N; }
berth() { "$B" --dir "$C" "$@"; }
node_state() { berth nodes --json | jq -r --arg n "$1" '.[] | select(.name == $n) | .state'; }
last_event_id() { berth events --limit 1 --json | jq -r '.[-1].id // 0'; }
# Wait (bounded, 30 s) for a node_down event about $1 after event id $2; print its time.
wait_down() {
  local t0=$SECONDS
  while :; do
    local t
    t=$(berth events --kind node_down --node "$1" --after "$2" --json | jq -r '.[0].time // empty')
    if [ -n "$t" ]; then echo "$t"; return; fi
    if [ $((SECONDS - t0)) -gt 30 ]; then echo "no node_down for $1" >&2; exit 1; fi
    sleep 0.05
  done
}
wait_up() {
  local t0=$SECONDS
  until [ "$(node_state "$1")" = up ]; do
    if [ $((SECONDS - t0)) -gt 60 ]; then echo "$1 did not come back" >&2; exit 1; fi
    sleep 0.2
  done
}

berth up --agents 4 --topology "package:1 core:4 pu:1" --netns >/dev/null
CID=$(jq -r .id "$C/cluster.json")
{
  echo "# berth fault injection, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(uname -r)"
  echo "# cluster: 4 agents in network namespaces, heartbeat 1 s x 3 misses, checked every 0.5 s"
  echo "# ROUNDS=$ROUNDS node faults, CTL_KILLS=$CTL_KILLS controller kills, JOBS=$JOBS short jobs"
} | tee "$OUT"

# The long job on node1 (drain the others for a moment so it lands there).
for n in node2 node3 node4; do berth node drain "$n" >/dev/null; done
cat >"$WORK/long.sh" <<EOF
#!/bin/sh
#BERTH --cores 1
echo \$\$ >> $WORK/long.pids
i=0; while [ ! -f $WORK/long.stop ] && [ \$i -lt 6000 ]; do i=\$((i+1)); echo \$i >> $WORK/long.marks; sleep 0.1; done
EOF
LONG=$(berth submit "$WORK/long.sh" --json | jq -r .id)
until [ -s "$WORK/long.pids" ]; do sleep 0.1; done
for n in node2 node3 node4; do berth node resume "$n" >/dev/null; done

# The load: short jobs, 3 s each, one core, requeued on failure (the default).
printf '#!/bin/sh\n#BERTH --cores 1 --walltime 120\necho $BERTH_JOB_ID >> %s/ran.log\nsleep 3\n' "$WORK" >"$WORK/short.sh"
IDS=()
for _ in $(seq "$JOBS"); do IDS+=("$(berth submit "$WORK/short.sh" --json | jq -r .id)"); done

CUT=() KILL=()
ctl_every=$(( ROUNDS / (CTL_KILLS > 0 ? CTL_KILLS : 1) ))
ctl_done=0
for r in $(seq "$ROUNDS"); do
  n=$(( (r - 1) % 3 + 2 ))
  node=node$n
  after=$(last_event_id)
  if [ $((r % 2)) = 1 ]; then
    kind=cut
    ns=berth-$CID-$node dev=bn$CID$n
    t0=$(now); ip -n "$ns" link set "$dev" down
    td=$(wait_down "$node" "$after")
    ip -n "$ns" link set "$dev" up
    CUT+=("$(awk -v a="$td" -v b="$t0" 'BEGIN { print a - b }')")
  else
    kind=kill
    t0=$(now); kill -9 "$(cat "$C/run/$node.pid")"
    td=$(wait_down "$node" "$after")
    berth up >/dev/null
    KILL+=("$(awk -v a="$td" -v b="$t0" 'BEGIN { print a - b }')")
  fi
  wait_up "$node"
  printf 'round %2d: %-4s %s detected after %.2f s\n' "$r" "$kind" "$node" "$(awk -v a="$td" -v b="$t0" 'BEGIN { print a - b }')" | tee -a "$OUT"
  if [ "$CTL_KILLS" -gt 0 ] && [ $((r % ctl_every)) = 0 ] && [ "$ctl_done" -lt "$CTL_KILLS" ]; then
    kill -9 "$(cat "$C/run/server.pid")"; sleep 0.3; berth up >/dev/null
    ctl_done=$((ctl_done + 1))
    echo "          controller killed (-9) and restarted" | tee -a "$OUT"
  fi
done
touch "$WORK/long.stop"

# Drain the queue (bounded).
t0=$SECONDS
while berth jobs --json | jq -e 'map(select(.state == "queued" or .state == "running")) | length > 0' >/dev/null; do
  if [ $((SECONDS - t0)) -gt 600 ]; then echo "queue did not drain" >&2; exit 1; fi
  sleep 1
done

stats() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "n=%d median %.2f s, worst %.2f s", NR, m, a[NR]}'; }
ALL=$(berth jobs --all --json)
completed=$(echo "$ALL" | jq '[.[] | select(.name == "short.sh" and .state == "completed")] | length')
failed=$(echo "$ALL" | jq '[.[] | select(.name == "short.sh" and .state != "completed")] | length')
requeues=$(berth events --kind requeue --limit 100000 --json | jq length)
ran=$(wc -l <"$WORK/ran.log")
unique=$(sort -u "$WORK/ran.log" | wc -l)
long_state=$(echo "$ALL" | jq -r --arg id "$LONG" '.[] | select((.id|tostring) == $id) | .state')
long_starts=$(wc -l <"$WORK/long.pids")
marks=$(wc -l <"$WORK/long.marks")
last_mark=$(tail -1 "$WORK/long.marks")
{
  echo "detection, cut link:     $(stats "${CUT[@]}")"
  echo "detection, killed agent: $(stats "${KILL[@]}")"
  echo "detection, all:          $(stats "${CUT[@]}" "${KILL[@]}")"
  echo "short jobs: $JOBS submitted, $completed completed, $failed not completed; $requeues requeues; $ran runs of $unique distinct jobs (a run cut by a failure is rerun)"
  echo "long job on the never-faulted node: $long_state, started $long_starts time(s), counted $marks ticks, last $last_mark (no restart: ticks = last)"
  echo "controller kills: $ctl_done"
} | tee -a "$OUT"
[ "$completed" = "$JOBS" ] && [ "$long_state" = completed ] && [ "$long_starts" = 1 ] && [ "$marks" = "$last_mark" ]
