#!/bin/bash
# Submission rate of Slurm's CLI: N x `sbatch --wrap true`, sequential (P=1) or P-way parallel via xargs.
#   submit_rate.sh N [P]        P defaults to 1 (sequential)
# Env: HOLD=1 submit held (-H) so nothing runs while submitting; TIMEOUT (s, default 900) bounds the
#      submission phase; PER_CMD_TIMEOUT (s, default 0 = off: wrapping each sbatch in timeout(1)
#      costs an extra exec per job, which is measurable at ~200 jobs/s).
# A job counts once sbatch has printed its id, i.e. slurmctld has accepted it (job record + script
# written under StateSaveLocation). Rate = accepted jobs / wall time of the whole submission phase.
# Afterwards every submitted job is cancelled and the script waits (bounded) until squeue has none left.
# Output: one JSON line on stdout (machine) and a human line on stderr.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
N=${1:?usage: submit_rate.sh N [P]}
P=${2:-1}
TIMEOUT=${TIMEOUT:-900}
PER_CMD_TIMEOUT=${PER_CMD_TIMEOUT:-0}
NAME=subrate-$$
HOLDARG=(); [ "${HOLD:-0}" = 1 ] && HOLDARG=(-H)
WORK=$(mktemp -d /tmp/berth-slurm-subrate.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

scontrol ping >/dev/null 2>&1 || { echo "slurmctld not reachable (SLURM_CONF=$SLURM_CONF)" >&2; exit 1; }
recs=$(slurm_job_records); max=$(slurm_max_jobs)
if [ $((recs + N)) -gt "$max" ]; then
  echo "warning: $recs job records held + $N new > MaxJobCount=$max; late submissions may stall/fail" >&2
fi
mode=$(slurm_mode); nodes=$(slurm_nodes); cpus=$(slurm_cpus); la0=$(loadavg)

SB=(); [ "$PER_CMD_TIMEOUT" -gt 0 ] && SB=(timeout "$PER_CMD_TIMEOUT")
SB+=(sbatch --parsable -J "$NAME" -o /dev/null -e /dev/null "${HOLDARG[@]}" --wrap true)
t0=$(now)
if [ "$P" -le 1 ]; then
  timeout "$TIMEOUT" bash -c '
    for ((i = 0; i < '"$N"'; i++)); do
      if "$@"; then echo "T $EPOCHREALTIME"; else echo "FAIL" >&2; fi
    done' _ "${SB[@]}" >"$WORK/ids" 2>"$WORK/err" || true
else
  seq "$N" | timeout "$TIMEOUT" xargs -P "$P" -I{} "${SB[@]}" >"$WORK/ids" 2>"$WORK/err" || true
fi
t1=$(now)
ok=$(grep -cE '^[0-9]+' "$WORK/ids" || true)
fail=$((N - ok))
secs=$(fsub "$t1" "$t0")
rate=$(fdiv "$ok" "$secs")
la1=$(loadavg)
# sequential mode: per-job acceptance times -> rate over the first and last 10% (does it degrade as the queue grows?)
first10=null; last10=null
if [ "$P" -le 1 ] && [ "$ok" -ge 20 ]; then
  read -r first10 last10 < <(awk -v t0="$t0" '/^T / {t[++n] = $2}
    END { k = int(n / 10); printf "%.2f %.2f\n", k / (t[k] - t0), k / (t[n] - t[n-k]) }' "$WORK/ids")
fi
[ -s "$WORK/err" ] && { echo "sbatch stderr (first lines):" >&2; sort "$WORK/err" | uniq -c | sort -rn | head -5 >&2; }

# drain: cancel everything this run submitted, wait until squeue shows none of it
t2=$(now)
cancel_name "$NAME" 300
cancel_s=$(fsub "$(now)" "$t2")

hold=$([ "${HOLD:-0}" = 1 ] && echo true || echo false)
printf '{"peer":"slurm","test":"submit_rate","mode":"%s","nodes":%s,"cpus":%s,"n":%s,"parallel":%s,"held":%s,"submitted":%s,"failed":%s,"seconds":%s,"jobs_per_second":%s,"rate_first_10pct":%s,"rate_last_10pct":%s,"cancel_seconds":%s,"loadavg_before":%s,"loadavg_after":%s}\n' \
  "$mode" "$nodes" "${cpus:-null}" "$N" "$P" "$hold" "$ok" "$fail" "$secs" "$rate" "$first10" "$last10" "$cancel_s" "$la0" "$la1"
echo "slurm submit_rate ($mode, $nodes nodes, P=$P, held=$hold): $ok/$N jobs accepted in ${secs}s = $rate jobs/s; cancel+drain ${cancel_s}s" >&2
