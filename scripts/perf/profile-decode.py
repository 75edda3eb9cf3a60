#!/usr/bin/env python3
"""Per-kernel device time of one decode step of bench_decode, from an ncu CSV.

  ncu --graph-profiling node --metrics gpu__time_duration.sum --csv --launch-count N \
      build-gpu/bench/bench_decode --batches B --context L --reps 5 --no-flush > prof.csv
  python3 scripts/perf/profile-decode.py prof.csv

A step starts at the first table-apply kernel of the prep; the last complete step is summed by
kernel name (time in us, count), largest first.
"""
import csv
import sys
from collections import defaultdict


def main(path):
    rows = []
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1000.0 if unit in ("ns", "nsecond") else v * 1e6 if unit == "s" else v
        rows.append((r["Kernel Name"], us))
    starts = [i for i, (n, _) in enumerate(rows) if "apply_table" in n]
    if len(starts) < 2:
        sys.exit("fewer than two steps found")
    # Last complete step: between the last two starts (an eager step may follow a graph one).
    a, b = starts[-2], starts[-1]
    agg = defaultdict(lambda: [0.0, 0])
    for n, us in rows[a:b]:
        key = n.split("(")[0][:90]
        agg[key][0] += us
        agg[key][1] += 1
    total = sum(v[0] for v in agg.values())
    print(f"one step: {b - a} kernels, {total:.1f} us of kernel time")
    for k, (us, c) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
        print(f"{us:9.1f} us {100 * us / total:5.1f}% x{c:4d}  {k}")


if __name__ == "__main__":
    main(sys.argv[1])
