# Shared helpers for the Slurm peer benchmarks (sourced, not run).
PEER=${PEER:-/work/shared/peers/slurm/slurm-peer.sh}
if [ -z "${SLURM_CONF:-}" ]; then eval "$(bash "$PEER" env)"; fi
export SLURM_CONF

now() { date +%s.%N; }
fsub() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a-b}'; }
fdiv() { awk -v a="$1" -v b="$2" 'BEGIN{if (b>0) printf "%.2f", a/b; else print "null"}'; }

# stock or htc, from the running controller's SchedulerParameters
slurm_mode() {
  if scontrol show config 2>/dev/null | grep -E '^SchedulerParameters' | grep -q 'batch_sched_delay=0'; then
    echo htc; else echo stock; fi
}
slurm_nodes() { sinfo -h -N -o '%N' 2>/dev/null | sort -u | wc -l; }
slurm_cpus()  { sinfo -h -o '%C' 2>/dev/null | awk -F/ '{print $4; exit}'; }   # A/I/O/T -> T
slurm_version() { sinfo --version 2>/dev/null | awk '{print $2}'; }
loadavg() { cut -d' ' -f1 /proc/loadavg; }
# number of job records the controller holds (pending, running, and finished ones not yet purged: MinJobAge)
slurm_job_records() { scontrol -o show jobs 2>/dev/null | grep -c '^JobId=' || true; }
slurm_max_jobs() { scontrol show config 2>/dev/null | awk '/^MaxJobCount/ {print $3}'; }

# Wait (bounded) until squeue shows no job with name $1 (any state incl. completing). 0 = empty, 1 = timeout.
wait_name_gone() {
  local name=$1 limit=$2 interval=${3:-0.25} t0 c
  t0=$(date +%s)
  while :; do
    c=$(squeue -h -n "$name" -o %i 2>/dev/null | wc -l)
    [ "$c" -eq 0 ] && return 0
    [ $(( $(date +%s) - t0 )) -ge "$limit" ] && return 1
    sleep "$interval"
  done
}

# Cancel all jobs named $1 and wait (bounded) until they are gone from squeue.
cancel_name() {
  local name=$1
  scancel -n "$name" 2>/dev/null || true
  wait_name_gone "$name" "${2:-120}" 0.5 || echo "warning: jobs named $name still in squeue after cancel" >&2
}
