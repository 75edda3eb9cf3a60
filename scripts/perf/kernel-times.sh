#!/usr/bin/env bash
# Device time of every kernel launch of one bench_attention shape (ncu, graph nodes profiled one by
# one), summarized by kernel name in launch order: tells the planner's time from the attention
# kernel's in the `us` (plan + attention) and `layer us` (attention only) graphs.
#   scripts/perf/kernel-times.sh BUILD_DIR B,L[,N]
set -uo pipefail
cd "$(dirname "$0")/../.."
build=$1 shape=$2
ncu --graph-profiling node --metrics gpu__time_duration.sum --csv --clock-control none \
  "$build/bench/bench_attention" --shape "$shape" --reps 50 2>/dev/null |
  python3 -c '
import csv, statistics, sys
rows = [r for r in csv.DictReader(l for l in sys.stdin if l.startswith("\""))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
seq = []
for r in rows:
    name = r["Kernel Name"].split("(")[0].split("<")[0].split("::")[-1].strip()
    v = float(r["Metric Value"].replace(",", ""))
    seq.append((name, v / 1000 if r.get("Metric Unit", "ns") in ("ns", "nsecond") else v))
groups = {"plan_kernel": [], "attention after plan": [], "attention alone": []}
for i, (name, us) in enumerate(seq):
    if name == "plan_kernel":
        groups[name].append(us)
    elif name == "attention_kernel":
        after = i > 0 and seq[i - 1][0] == "plan_kernel"
        groups["attention after plan" if after else "attention alone"].append(us)
for k, v in groups.items():
    if v:
        print(f"{k:22s} x{len(v):4d} median {statistics.median(v):9.2f} us  min {min(v):9.2f}")
'
