#!/bin/bash
# End-to-end throughput of Slurm: N x `sbatch -n1 -c1 --wrap /bin/true`, time from the first submission
# until squeue shows none of them left (pending, running or completing).
#   e2e.sh N
# Env: TIMEOUT (s, default 2700) bounds the whole run (submission + wait); on timeout the remaining jobs
#      are cancelled and the JSON carries "timed_out":true. POLL (s, default 0.25) squeue poll interval.
# Accounting (slurmdbd) is not configured by slurm-peer.sh, so sacct is unavailable; completion is taken
# from squeue, and cross-checked against the jobcomp/filetxt log (JobState=COMPLETED lines of this run).
# Output: one JSON line on stdout (machine) and a human line on stderr.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
N=${1:?usage: e2e.sh N}
TIMEOUT=${TIMEOUT:-2700}
POLL=${POLL:-0.25}
NAME=e2e-$$
WORK=$(mktemp -d /tmp/berth-slurm-e2e.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

scontrol ping >/dev/null 2>&1 || { echo "slurmctld not reachable (SLURM_CONF=$SLURM_CONF)" >&2; exit 1; }
# start from an idle cluster: wait (bounded) for other jobs to leave
for ((i = 0; i < 600; i++)); do
  [ "$(squeue -h -o %i | wc -l)" -eq 0 ] && break; sleep 1
done
[ "$(squeue -h -o %i | wc -l)" -eq 0 ] || { echo "queue not empty after 600 s; aborting" >&2; exit 1; }
recs=$(slurm_job_records); max=$(slurm_max_jobs)
[ $((recs + N)) -le "$max" ] || echo "warning: $recs job records held + $N new > MaxJobCount=$max" >&2
JOBCOMP=$(scontrol show config | awk '/^JobCompLoc/ {print $3}')
mode=$(slurm_mode); nodes=$(slurm_nodes); cpus=$(slurm_cpus); la0=$(loadavg)

deadline=$(( $(date +%s) + TIMEOUT ))
t0=$(now)
for ((i = 0; i < N; i++)); do
  [ "$(date +%s)" -lt "$deadline" ] || break
  sbatch --parsable -J "$NAME" -n 1 -c 1 -o /dev/null -e /dev/null --wrap /bin/true >>"$WORK/ids" 2>>"$WORK/err" \
    || echo FAIL >>"$WORK/err"
done
t_sub=$(now)
submitted=$(grep -cE '^[0-9]+' "$WORK/ids" || true)

timed_out=false
while [ "$(squeue -h -n "$NAME" -o %i 2>/dev/null | wc -l)" -gt 0 ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then timed_out=true; break; fi
  sleep "$POLL"
done
t1=$(now)
left=0
if $timed_out; then
  left=$(squeue -h -n "$NAME" -o %i | wc -l)
  cancel_name "$NAME" 300
fi
la1=$(loadavg)

secs=$(fsub "$t1" "$t0"); sub_s=$(fsub "$t_sub" "$t0")
done_n=$((submitted - left))
rate=$(fdiv "$done_n" "$secs"); sub_rate=$(fdiv "$submitted" "$sub_s")
# cross-check with the jobcomp log (1 s resolution timestamps)
completed=null; failed=null; span=null
if [ -n "$JOBCOMP" ] && [ -r "$JOBCOMP" ]; then
  grep -F " Name=$NAME " "$JOBCOMP" >"$WORK/comp" || true
  completed=$(grep -c 'JobState=COMPLETED' "$WORK/comp" || true)
  failed=$(( $(wc -l <"$WORK/comp") - completed ))
  span=$(awk '{ for (i = 1; i <= NF; i++) {
                   if ($i ~ /^SubmitTime=/) { v = substr($i, 12); if (s == "" || v < s) s = v }
                   if ($i ~ /^EndTime=/)    { v = substr($i, 9);  if (v > e) e = v } } }
               END { if (s == "") { print "null"; exit }
                     c = "date -d " s " +%s"; c | getline a; close(c)
                     c = "date -d " e " +%s"; c | getline b; close(c); print b - a }' "$WORK/comp")
fi
[ -s "$WORK/err" ] && { echo "sbatch stderr (first lines):" >&2; sort "$WORK/err" | uniq -c | sort -rn | head -5 >&2; }

printf '{"peer":"slurm","test":"e2e","mode":"%s","nodes":%s,"cpus":%s,"n":%s,"submitted":%s,"completed":%s,"failed":%s,"timed_out":%s,"seconds":%s,"jobs_per_second":%s,"submit_seconds":%s,"submit_jobs_per_second":%s,"jobcomp_span_seconds":%s,"loadavg_before":%s,"loadavg_after":%s}\n' \
  "$mode" "$nodes" "${cpus:-null}" "$N" "$submitted" "$completed" "$failed" "$timed_out" "$secs" "$rate" "$sub_s" "$sub_rate" "$span" "$la0" "$la1"
echo "slurm e2e ($mode, $nodes nodes/${cpus} cpus): $N jobs submitted in ${sub_s}s, all finished after ${secs}s = $rate jobs/s (completed=$completed failed=$failed timed_out=$timed_out)" >&2
