#!/usr/bin/env python3
"""Top SASS instructions by warp-stall samples from `ncu --page source --csv` output.

  python3 scripts/perf/ncu-stalls.py prof.sass.csv [TOP]

Prints the sample total, then the TOP instructions (default 40) with their share of all samples
and the stall-reason columns that are non-zero for them, in program order of the hot spots.
"""
import csv
import sys


def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    # ncu puts a "Kernel Name" line before the header row.
    head = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), 0)
    lines = lines[head:]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit("no CSV rows in " + path)
    cols = list(rows[0].keys())
    sample_col = next((c for c in cols if "Warp Stall Sampling (All" in c), None)
    if sample_col is None:
        sample_col = next((c for c in cols if "Sampling" in c), None)
    if sample_col is None:
        print("columns:", cols)
        sys.exit("no sampling column")
    src_col = next((c for c in cols if c.strip() in ("Source", "# Source")), cols[1])
    addr_col = next((c for c in cols if "Address" in c), cols[0])
    reason_cols = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(num(r[sample_col]) for r in rows)
    print(f"{len(rows)} instructions, {total:.0f} samples ({sample_col})")
    hot = sorted(rows, key=lambda r: -num(r[sample_col]))[:top]
    order = {id(r): i for i, r in enumerate(rows)}
    for r in sorted(hot, key=lambda r: order[id(r)]):
        s = num(r[sample_col])
        if s <= 0:
            continue
        reasons = ", ".join(
            f"{c[6:]}={r[c]}" for c in sorted(reason_cols, key=lambda c: -num(r[c])) if num(r[c]) > 0
        )[:120]
        print(f"{100 * s / max(total, 1):5.1f}% {r[addr_col][-5:]:>5} {r[src_col].strip()[:60]:<60} {reasons}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
