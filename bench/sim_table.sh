#!/bin/bash
# Simulator speed table (issue 5). Run from a checkout with target/release/berth-bench built.
B=${B:-target/release/berth-bench}
T="package:2 numa:2 core:4 pu:1"
row() { local label="$1"; shift; local lim=$1; shift
  local out; out=$(timeout $lim $B sim --json "$@" 2>/dev/null | grep "^{")
  echo "$label | ${out:-TIMEOUT after ${lim}s} | load $(cut -d' ' -f1 /proc/loadavg)"; }
date; uptime; git log --oneline -1
for p in fcfs easy conservative; do row "lublin pool $p" 300 --policy $p --repeats 3; done
for p in fcfs easy conservative; do row "100k s1.25 $p" 300 --policy $p --jobs 100000 --stretch 1.25 --repeats 1; done
for p in fcfs easy conservative; do row "100k s1 $p" 300 --policy $p --jobs 100000 --stretch 1 --repeats 1; done
for p in fcfs easy conservative; do row "lublin 16xtopo $p" 400 --policy $p --nodes 16 --topology "$T" --repeats 1; done
for p in fcfs easy; do row "lublin preempt $p" 400 --policy $p --preempt --repeats 1; done
date
