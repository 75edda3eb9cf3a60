#!/usr/bin/env python3
"""Per-step breakdown of an Nsight Systems capture of the engine, from its NVTX ranges.

    nsys profile -t cuda,nvtx -o dl build/examples/decode_loop --requests 32
    nsys export --type sqlite -o dl.sqlite dl.nsys-rep      # or: nsys stats dl.nsys-rep
    python3 scripts/nvtx-steps.py dl.sqlite [--first 12]

Where the only nsys is the one bundled with Nsight Compute (.../host/target-linux-x64/nsys), it
profiles (add -s none --cpuctxsw=none to keep the capture small) but its QdstrmImporter may lack
libdw.so.1: with Debian's libdw1 and libelf1 unpacked (dpkg -x) and LD_LIBRARY_PATH pointing at
them, it makes the .nsys-rep, and `nsys export --type sqlite` works.

Reads the graphdecode.* push/pop ranges (common/nvtx.h): each graphdecode.step holds
.schedule, one of .prefill / .decode / .speculative (holding .launch and .wait), and .deliver.
Prints every range's count and median, the median breakdown of a step by kind, the first steps
one by one, and where the GPU kernel records of the capture allow it, device time per step.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
from collections import defaultdict

PUSH_POP = 59  # NVTX_EVENTS.eventType of a push/pop range
PHASES = ["schedule", "launch", "wait", "deliver"]


def ranges(db: sqlite3.Connection) -> list[dict]:
    cols = {r[1] for r in db.execute("PRAGMA table_info(NVTX_EVENTS)")}
    text = "COALESCE(e.text, s.value)" if "textId" in cols else "e.text"
    join = "LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in cols else ""
    payload = "e.int64Value" if "int64Value" in cols else "NULL"
    rows = db.execute(
        f"SELECT e.start, e.end, {text}, {payload}, e.globalTid FROM NVTX_EVENTS e {join} "
        f"WHERE e.eventType = ? AND e.end IS NOT NULL ORDER BY e.start", (PUSH_POP,))
    out = []
    for start, end, name, value, tid in rows:
        if name and name.startswith("graphdecode."):
            out.append(dict(start=start, end=end, name=name[len("graphdecode."):],
                            payload=value, tid=tid, us=(end - start) / 1e3))
    return out


def kernel_spans(db: sqlite3.Connection) -> list[tuple[int, int]]:
    """Device activity: kernels launched on their own, and whole graph replays (nsys records a
    replayed graph as one span in its default --cuda-graph-trace=graph mode, not its kernels)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    spans = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"):
        if table in tables:
            spans += list(db.execute(f"SELECT start, end FROM {table}"))
    return sorted(spans)


def steps_of(rs: list[dict]) -> list[dict]:
    steps = []
    current = None
    for r in rs:  # by start time; children start inside their step
        if r["name"] == "step":
            current = dict(r, parts={}, kind="idle", batch=None)
            steps.append(current)
        elif current is not None and r["tid"] == current["tid"] and r["end"] <= current["end"]:
            if r["name"] in ("prefill", "decode", "speculative"):
                current["kind"], current["batch"] = r["name"], r["payload"]
                current["parts"]["run"] = r["us"]
            else:
                current["parts"][r["name"]] = current["parts"].get(r["name"], 0.0) + r["us"]
    return [s for s in steps if s["kind"] != "idle"]


def gpu_us(step: dict, kernels: list[tuple[int, int]]) -> float:
    """Kernel time inside the step's window, overlaps merged (device busy time)."""
    busy, last = 0, step["start"]
    for s, e in kernels:
        if e <= step["start"] or s >= step["end"]:
            continue
        s, e = max(s, step["start"], last), min(e, step["end"])
        if e > s:
            busy += e - s
            last = e
    return busy / 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sqlite", help="nsys export --type sqlite output")
    p.add_argument("--first", type=int, default=12, help="steps listed one by one")
    args = p.parse_args()
    db = sqlite3.connect(args.sqlite)
    rs = ranges(db)
    if not rs:
        print("no graphdecode.* NVTX ranges in", args.sqlite)
        return 1
    by_name = defaultdict(list)
    for r in rs:
        by_name[r["name"]].append(r["us"])
    print("range                    count    median us     total ms")
    for name, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"graphdecode.{name:<12} {len(v):>8} {statistics.median(v):>12.1f} "
              f"{sum(v) / 1e3:>12.2f}")

    steps = steps_of(rs)
    kernels = kernel_spans(db)
    cols = ["step", "run"] + PHASES + (["gpu busy"] if kernels else [])
    print(f"\nmedian us per step, by kind ({len(steps)} steps; run = the .prefill/.decode/"
          f".speculative range, holding launch and wait)")
    print(f"{'kind':<12} {'steps':>6} {'batch':>6} " + " ".join(f"{c:>9}" for c in cols))
    for kind in ("prefill", "decode", "speculative"):
        ss = [s for s in steps if s["kind"] == kind]
        if not ss:
            continue
        med = {"step": statistics.median(s["us"] for s in ss)}
        for c in ["run"] + PHASES:
            med[c] = statistics.median(s["parts"].get(c, 0.0) for s in ss)
        if kernels:
            med["gpu busy"] = statistics.median(gpu_us(s, kernels) for s in ss)
        batch = statistics.median(s["batch"] or 0 for s in ss)
        print(f"{kind:<12} {len(ss):>6} {batch:>6.0f} " + " ".join(f"{med[c]:>9.1f}" for c in cols))

    print(f"\nfirst {args.first} steps (us)")
    print(f"{'#':>4} {'kind':<12} {'batch':>5} " + " ".join(f"{c:>9}" for c in cols))
    for i, s in enumerate(steps[: args.first]):
        vals = [s["us"]] + [s["parts"].get(c, 0.0) for c in ["run"] + PHASES]
        if kernels:
            vals.append(gpu_us(s, kernels))
        print(f"{i:>4} {s['kind']:<12} {s['batch'] or 0:>5} " + " ".join(f"{v:>9.1f}" for v in vals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
