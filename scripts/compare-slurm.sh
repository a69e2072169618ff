#!/bin/bash
# compare-slurm.sh: submit every Slurm-dialect script of the compat corpus (tests/data/compat/,
# the files with #SBATCH lines) held, to a real Slurm (the peer in ../shared/peers/slurm) and to
# a local berth cluster, read back what each made of it (Slurm: `scontrol show job`; berth:
# `berth show --json`) and print a table: nodes, tasks, CPUs, time limit and memory.
# Exit status: 0 when every script both accept agrees, and berth rejects only the scripts whose
# .expect says it must; 1 otherwise; 2 when it cannot run.
#
# Both sides get the same four emulated nodes: 2 sockets x 64 cores (128 CPUs) and 512 GiB each
# (Slurm: SlurmdParameters=config_overrides; berth: `berth up --topology` with a synthetic one).
# Held jobs never run, so nothing needs the hardware. Partitions and QOS names of the corpus
# (site names: normal, regular, cm2_tiny, ...) are replaced on both command lines by each
# side's own (`-p debug` / `--queue batch`, `--qos normal`); dependency ids by a held job's.
#
# Needs: root, the peer installed (`slurm-peer.sh install`), berth built (`cargo build -p berth`;
# BERTH=path/to/berth to choose another), python3. KEEP=1 keeps the work directory.
# Usage: scripts/compare-slurm.sh [SCRIPT-NAME-SUBSTRING]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CORPUS=$ROOT/tests/data/compat
PEER=${PEER:-$ROOT/../shared/peers/slurm/slurm-peer.sh}
BERTH=${BERTH:-$ROOT/target/debug/berth}
FILTER=${1:-}
for need in "$PEER" "$BERTH"; do
  [ -x "$need" ] || { echo "compare-slurm: $need is missing (see the header of $0)" >&2; exit 2; }
done
command -v sbatch >/dev/null || { echo "compare-slurm: Slurm is not installed: $PEER install" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare-slurm: python3 is needed" >&2; exit 2; }

WORK=$(mktemp -d /tmp/compare-slurm.XXXXXX)
chmod 755 "$WORK" # munged runs as munge and must reach its files below
export BASE=$WORK/slurm
export SLURM_CONF=$BASE/etc/slurm.conf
export BERTH_DIR=$WORK/berth
SUBMIT_DIR=$WORK/submit
mkdir -p "$SUBMIT_DIR"
started_berth=0
cleanup() {
  [ "$started_berth" = 1 ] && "$BERTH" --dir "$BERTH_DIR" down >/dev/null 2>&1
  "$PEER" down >/dev/null 2>&1
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# --- Slurm: four nodes, then their size as the configuration says (not this host's) --------
"$PEER" up n1 n2 n3 n4 >"$WORK/peer-up.log" 2>&1 || { cat "$WORK/peer-up.log"; exit 2; }
sed -i -E 's/CPUs=[0-9]+ RealMemory=[0-9]+/CPUs=128 Boards=1 SocketsPerBoard=2 CoresPerSocket=64 ThreadsPerCore=1 RealMemory=524288 Features=cpu/' "$SLURM_CONF"
echo "SlurmdParameters=config_overrides" >>"$SLURM_CONF"
scontrol shutdown >/dev/null 2>&1
for _ in $(seq 100); do pgrep -f "slurmctld -f $SLURM_CONF" >/dev/null || break; sleep 0.1; done
for _ in $(seq 100); do pgrep -f "slurmd -f $SLURM_CONF" >/dev/null || break; sleep 0.1; done
/usr/sbin/slurmctld -f "$SLURM_CONF" </dev/null
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
for n in n1 n2 n3 n4; do /usr/sbin/slurmd -f "$SLURM_CONF" -N "$n" </dev/null; done
for _ in $(seq 150); do
  [ "$(sinfo -h -N -o '%T %c' | grep -cE '^(idle|mixed|allocated) 128$')" -ge 4 ] && break
  sleep 0.2
done
sinfo -h -N -o '%N %c %m %T' >"$WORK/sinfo.txt"
grep -q "128 524288 idle" "$WORK/sinfo.txt" || { echo "compare-slurm: the Slurm nodes did not come up:" >&2; cat "$WORK/sinfo.txt" >&2; exit 2; }

# --- berth: a local cluster of the same four nodes -------------------------------------------
# 256 GiB per socket, in bytes (hwloc's "GB" is 10^9). Each node is one subnode (both its NUMA
# nodes) with the property `cpu`, as the Slurm nodes have the feature (NERSC's `-C cpu`).
mkdir -p "$BERTH_DIR"
echo "subnode_numa = 2" >"$BERTH_DIR/berth.toml"
"$BERTH" --dir "$BERTH_DIR" up --agents 4 --topology "package:2 numa:1(memory=274877906944) core:64 pu:1" \
  >"$WORK/berth-up.log" 2>&1 || { cat "$WORK/berth-up.log"; exit 2; }
started_berth=1
for n in node1 node2 node3 node4; do
  "$BERTH" --dir "$BERTH_DIR" subnode properties "$n:0" cpu >>"$WORK/berth-up.log" 2>&1 || { cat "$WORK/berth-up.log"; exit 2; }
done

cd "$SUBMIT_DIR" || exit 2
printf '#!/bin/sh\ntrue\n' >"$WORK/dummy.sh"
SLURM_DEP=$(sbatch --parsable --hold -p debug -n 1 -t 1 "$WORK/dummy.sh" 2>&1) || { echo "sbatch: $SLURM_DEP" >&2; exit 2; }
BERTH_DEP=$("$BERTH" submit --hold --cores 1 "$WORK/dummy.sh" 2>&1)
[[ "$BERTH_DEP" =~ ^[0-9]+$ ]] || { echo "berth submit: $BERTH_DEP" >&2; exit 2; }

# A copy of a script with each dependency's job ids replaced by $2.
with_dep() {
  sed -E "/^#(SBATCH|PBS)/ s/((-d|--dependency)[= ]*after[a-z]*):[0-9:]+/\1:$2/" "$1"
}

# Slurm's `scontrol show job` -> "nodes,tasks,cpus,seconds,mem" (mem: N/node or N/cpu in MiB, or -).
slurm_fields() {
  python3 -c '
import re, sys
t = sys.stdin.read()
f = dict(re.findall(r"(\S+?)=(\S*)", t))
def secs(v):
    if v in ("UNLIMITED", "INFINITE"): return "-"
    d, _, hms = v.rpartition("-")
    p = [int(x) for x in hms.split(":")]
    while len(p) < 3: p.insert(0, 0)
    return (int(d) if d else 0) * 86400 + p[0] * 3600 + p[1] * 60 + p[2]
def mib(v):
    m = re.fullmatch(r"([0-9.]+)([KMGT]?)", v)
    if not m: return v
    return int(float(m.group(1)) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1 << 20}[m.group(2)])
mem = "-"
if f.get("MinMemoryCPU"): mem = "%d/cpu" % mib(f["MinMemoryCPU"])
elif f.get("MinMemoryNode", "0") != "0": mem = "%d/node" % mib(f["MinMemoryNode"])
print(",".join(map(str, [f["NumNodes"].split("-")[0], f["NumTasks"], f["NumCPUs"], secs(f["TimeLimit"]), mem])))
'
}

# berth's `show --json` -> the same fields. Tasks: the job's recorded ones (`tasks`: --exclusive,
# or an uneven `-N 2 -n 5`), else nodes x tasks-per-node, else cores / cpus per task, else one
# per node (or one); CPUs: cores, else nodes x tasks-per-node x cpus per task, else tasks x cpus
# per task. Nodes "*":
# berth asked for cores anywhere (Slurm shows its minimum). Memory only when the script set it
# (berth applies a per-CPU default otherwise; Slurm none here).
berth_fields() {
  python3 -c '
import json, sys
j = json.load(sys.stdin); r = j["request"]
cpt = r.get("cpus_per_task") or 1
if j.get("tasks"): tasks = j["tasks"]["total"]
elif r.get("nodes") and r.get("tasks_per_node"): tasks = r["nodes"] * r["tasks_per_node"]
elif r.get("cores"): tasks = r["cores"] // cpt
else: tasks = r.get("nodes") or 1
if r.get("cores"): cpus = r["cores"]
elif r.get("nodes") and r.get("tasks_per_node"): cpus = r["nodes"] * r["tasks_per_node"] * cpt
else: cpus = tasks * cpt
mem = "-"
if sys.argv[1] == "1":
    if r.get("mem_per_node"): mem = "%d/node" % (r["mem_per_node"] >> 20)
    elif r.get("mem_per_cpu"): mem = "%d/cpu" % (r["mem_per_cpu"] >> 20)
print(",".join(map(str, [r.get("nodes") or "*", tasks, cpus, j.get("walltime_seconds") or "-", mem])))
' "$1"
}

printf '%-30s %-17s %-26s %-26s %s\n' SCRIPT RESULT "SLURM n,t,cpu,s,mem" "BERTH n,t,cpu,s,mem" NOTE
agree=0 compared=0 differ=0 rejected_ok=0 slurm_only_reject=0
for script in "$CORPUS"/*.sh; do
  grep -q '^#SBATCH' "$script" || continue
  name=$(basename "$script" .sh)
  [ -n "$FILTER" ] && [[ "$name" != *"$FILTER"* ]] && continue
  expect="${script%.sh}.expect"
  must_reject=0; grep -q '^reject = ' "$expect" && must_reject=1
  ignore=(); grep -q '^with = --ignore-unsupported' "$expect" && ignore=(--ignore-unsupported)
  qos_s=(); qos_b=(); grep -qE '^#SBATCH.*(-q |--qos)' "$script" && { qos_s=(--qos=normal); qos_b=(--qos normal); }
  if grep -q '^#BERTH' "$script"; then
    printf '%-30s %-17s %-26s %-26s %s\n' "$name" "berth-only" "" "" "has #BERTH lines, which only berth reads"
    continue
  fi
  with_dep "$script" "$SLURM_DEP" >"$WORK/$name.slurm.sh"
  with_dep "$script" "$BERTH_DEP" >"$WORK/$name.berth.sh"
  s_out=$(sbatch --parsable --hold -p debug "${qos_s[@]}" "$WORK/$name.slurm.sh" 2>&1); s_ok=$?
  b_out=$("$BERTH" submit --hold --queue batch "${qos_b[@]}" "${ignore[@]}" "$WORK/$name.berth.sh" 2>&1); b_ok=$?
  s_id=${s_out##*$'\n'}; b_id=${b_out##*$'\n'}
  s_f="rejected"; b_f="rejected"
  [ $s_ok = 0 ] && s_f=$(scontrol show job "$s_id" | slurm_fields)
  mem_asked=0; grep -qE '^#SBATCH.*--mem' "$script" && mem_asked=1
  [ $b_ok = 0 ] && b_f=$("$BERTH" show --json "$b_id" | berth_fields $mem_asked)
  note=""
  if [ $must_reject = 1 ]; then
    want=$(sed -n 's/^reject = //p' "$expect")
    if [ $b_ok != 0 ] && [[ "$b_out" != *"$want"* ]]; then
      differ=$((differ + 1)); result="DIFFER"; note="berth's error is not the .expect's: $(echo "$b_out" | head -1 | cut -c1-90)"
    elif [ $b_ok != 0 ]; then
      rejected_ok=$((rejected_ok + 1)); result="berth-rejects(ok)"
      note=$(echo "$b_out" | head -1 | cut -c1-90)
    else
      differ=$((differ + 1)); result="DIFFER"; note="berth accepted a script its .expect rejects"
    fi
  elif [ $s_ok != 0 ] && [ $b_ok != 0 ]; then
    differ=$((differ + 1)); result="both-reject"; note="slurm: $(echo "$s_out" | head -1 | cut -c1-60) | berth: $(echo "$b_out" | head -1 | cut -c1-60)"
  elif [ $s_ok != 0 ]; then
    slurm_only_reject=$((slurm_only_reject + 1)); result="slurm-rejects"; note=$(echo "$s_out" | head -1 | cut -c1-90)
  elif [ $b_ok != 0 ]; then
    differ=$((differ + 1)); result="DIFFER"; note="berth: $(echo "$b_out" | tail -1 | cut -c1-110)"
  else
    compared=$((compared + 1))
    IFS=, read -r sn st sc ss sm <<<"$s_f"
    IFS=, read -r bn bt bc bs bm <<<"$b_f"
    diffs=()
    [ "$bn" != "*" ] && [ "$sn" != "$bn" ] && diffs+=(nodes)
    [ "$st" != "$bt" ] && diffs+=(tasks)
    [ "$sc" != "$bc" ] && diffs+=(cpus)
    [ "$ss" != "$bs" ] && diffs+=(time)
    [ "$sm" != "$bm" ] && diffs+=(mem)
    if [ ${#diffs[@]} = 0 ]; then
      agree=$((agree + 1)); result="agree"
    else
      differ=$((differ + 1)); result="DIFFER"; note="${diffs[*]}"
    fi
  fi
  printf '%-30s %-17s %-26s %-26s %s\n' "$name" "$result" "$s_f" "$b_f" "$note"
done
echo
echo "accepted by both: $agree of $compared agree on nodes, tasks, CPUs, time limit and memory"
echo "rejected by berth as its .expect says (GPUs, unsupported directives): $rejected_ok"
echo "accepted by berth, rejected by this Slurm (its configuration): $slurm_only_reject"
echo "disagreements: $differ"
[ "$differ" = 0 ]
