#!/bin/bash
# Median [min-max] per (test, mode, nodes, n, parallel, held) from a results.jsonl written by the scripts here.
#   summarize.sh [results.jsonl]
HERE=$(cd "$(dirname "$0")" && pwd)
python3 - "${1:-$HERE/results.jsonl}" <<'PY'
import json, sys, statistics
groups = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith('{'): continue
    r = json.loads(line)
    key = (r['test'], r['mode'], r['nodes'], r['cpus'], r['n'], r.get('parallel', 1), r.get('held', False))
    groups.setdefault(key, []).append(r)
print(f"{'test':12} {'mode':5} {'nodes':>5} {'cpus':>4} {'n':>6} {'P':>2} {'held':5} {'runs':>4}  seconds median [min-max]      jobs/s median [min-max]")
for k in sorted(groups):
    rs = groups[k]
    s = [r['seconds'] for r in rs]; j = [r['jobs_per_second'] for r in rs]
    print(f"{k[0]:12} {k[1]:5} {k[2]:>5} {k[3]:>4} {k[4]:>6} {k[5]:>2} {str(k[6]).lower():5} {len(rs):>4}  "
          f"{statistics.median(s):8.1f} [{min(s):.1f}-{max(s):.1f}]".ljust(30) +
          f"  {statistics.median(j):7.1f} [{min(j):.1f}-{max(j):.1f}]")
PY
