#!/usr/bin/env python3
"""Summary of bench_attention's per-CTA traces (a GD_ATTN_TRACE=1 build, GD_TRACE_DIR set).
Times in us from the first CTA's entry (globaltimer); durations inside a CTA from clock64."""
import glob, sys
import numpy as np

F = 12
for path in sorted(glob.glob(sys.argv[1] + "/trace_*.bin")):
    t = np.fromfile(path, dtype=np.uint64).reshape(-1, F).astype(np.int64)
    ran = t[:, 0] != 0
    work = ran & (t[:, 2] != 0)
    if not work.any():
        continue
    g = lambda i: t[:, 2 * i]
    c = lambda i: t[:, 2 * i + 1]
    t0 = g(0)[ran].min()
    ghz = np.median((c(4) - c(0))[work] / np.maximum(1, (g(4) - g(0))[work]))
    us = lambda cyc: cyc / ghz / 1e3
    q = lambda x: " ".join(f"{v:7.1f}" for v in np.percentile(x, [0, 10, 50, 90, 100]))
    info = t[:, 10]
    sm = info & 0xFFFF
    keys = info >> 40
    last = t[:, 11] == 1
    first_tile = work & (t[:, 4] != 0)
    print(f"== {path.split('/')[-1]}: {ran.sum()} CTAs ran, {work.sum()} with work, "
          f"{len(np.unique(sm[work]))} SMs, {ghz:.2f} GHz, keys/CTA {np.median(keys[work]):.0f}")
    print(f"   span (first entry -> last exit)   {(g(4)[work].max() - t0) / 1e3:7.1f} us")
    print("   quantiles (min 10% 50% 90% max), us:")
    print(f"   entry (globaltimer)             {q((g(0)[work] - t0) / 1e3)}")
    print(f"   plan: entry -> item             {q(us((c(1) - c(0))[work]))}")
    print(f"   item -> first tile in smem      {q(us((c(2) - c(1))[first_tile]))}")
    print(f"   first tile -> attend done       {q(us((c(3) - c(2))[first_tile]))}")
    print(f"   attend done (globaltimer)       {q((g(3)[work] - t0) / 1e3)}")
    if last.any():
        print(f"   merge (last CTAs, {last.sum():4d})        {q(us((c(4) - c(3))[last]))}")
        print(f"   merge done (globaltimer)        {q((g(4)[last] - t0) / 1e3)}")
    bytes_ = keys[first_tile] * 128 * 2 * 2
    rate = bytes_ / np.maximum(1, us((c(3) - c(2))[first_tile])) / 1e3  # GB/s per CTA
    print(f"   stream GB/s per CTA             {q(rate)}")
    per_sm = np.bincount(sm[work], minlength=132)
    print(f"   CTAs per SM: min {per_sm.min()} max {per_sm.max()}")
