#!/usr/bin/env python3
"""Summary of bench_attention's per-CTA traces (a GD_ATTN_TRACE=1 build, GD_TRACE_DIR set).
Times in us from the first CTA's entry (globaltimer); durations inside a CTA from clock64."""
import glob, sys
import numpy as np

F = 36  # attention/attention_trace.cuh's kTraceFields
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
    planned_in_cta = work & (t[:, 20] != 0)
    if planned_in_cta.any():  # sub-steps of the self-planned CTA's plan (attention_trace.cuh)
        steps = [(0, "entry -> num_requests"), (20, "-> request row"), (21, "-> block sum"),
                 (22, "-> plan scans"), (23, "-> item")]
        for (a, name), b in zip(steps, [20, 21, 22, 23, 3]):
            ca = c(0) if a == 0 else t[:, a]
            print(f"     {name:29s} {q(us((t[:, b] - ca)[planned_in_cta]))}")
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
    # Per SM: when its last CTA's attention is done, and its CTAs' median stream rate (the one-wave
    # tail of bench/NOTES.md 32: are the late SMs the same ones, and by how much are they late?).
    done = (g(3) - t0) / 1e3
    sms = np.unique(sm[work])
    sm_done = np.array([done[work & (sm == s)].max() for s in sms])
    sm_rate = np.array([np.median(rate[(sm[first_tile] == s)]) if (sm[first_tile] == s).any()
                        else np.nan for s in sms])
    order = np.argsort(sm_done)
    print(f"   SM last attend done, quantiles    {q(sm_done)}")
    print(f"   SMs done after median + 2%: {int((sm_done > np.median(sm_done) * 1.02).sum())}; "
          f"slowest 12 SMs: {' '.join(str(int(s)) for s in sms[order[-12:]])}")
    print(f"   SM median stream GB/s, quantiles  {q(sm_rate[~np.isnan(sm_rate)])}")
    # The stream's progress (fields 12..19: tile n * j / 8 in shared memory), for CTAs that ran one
    # item: each CTA's rate per eighth of its tiles, and the sum over CTAs in 5 us bins (bench/NOTES
    # 64: is the call DRAM-bound to the end, or do few slow CTAs finish it alone?).
    prog = work & np.all(t[:, 12:20] != 0, axis=1)
    if prog.sum() > 0:
        ntiles = (keys[prog] + 63) // 64
        pts = (np.concatenate([t[prog, 12:20], t[prog, 6:7]], axis=1) - t0) / 1e3
        done_bytes = np.stack([ntiles * j // 8 for j in range(8)] + [ntiles], axis=1) * 64 * 512.0
        seg = np.diff(done_bytes, axis=1) / np.maximum(1e-3, np.diff(pts, axis=1)) / 1e3  # GB/s
        end = pts[:, 8]
        late, early = end > np.percentile(end, 90), end < np.percentile(end, 10)
        eighths = lambda x: " ".join(f"{v:5.1f}" for v in np.median(x, axis=0))
        print(f"   CTA GB/s by eighth of its tiles: all {eighths(seg)}")
        print(f"                   last-done 10%       {eighths(seg[late])}")
        print(f"                   first-done 10%      {eighths(seg[early])}")
        bins = np.zeros(int(end.max() // 5) + 1)
        for c in range(len(pts)):
            for k in range(8):
                s, e = pts[c, k], pts[c, k + 1]
                if e <= s:
                    continue
                r = (done_bytes[c, k + 1] - done_bytes[c, k]) / (e - s)  # bytes per us
                for i in range(int(s // 5), min(int(e // 5), len(bins) - 1) + 1):
                    bins[i] += r * max(0.0, min(5 * i + 5, e) - max(5 * i, s)) / 5
        every = max(1, len(bins) // 12)
        print(f"   all CTAs, TB/s per 5 us (every {every * 5} us): "
              + " ".join(f"{b / 1e6:.2f}" for b in bins[::every]))
        # Main-phase rate (eighths 2..6) of the two CTAs that share an SM: one speed per SM?
        main = (done_bytes[:, 6] - done_bytes[:, 1]) / np.maximum(1e-3, pts[:, 6] - pts[:, 1]) / 1e3
        smp = sm[prog]
        pairs = [main[smp == s] for s in np.unique(smp) if (smp == s).sum() == 2]
        if len(pairs) > 2:
            a, b = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
            pair_rate = (a + b) / 2  # per SM, GB/s per CTA (per_sm above counts CTAs)
            print(f"   SMs with 2 CTAs: {len(pairs)}, correlation of their rates {np.corrcoef(a, b)[0, 1]:.2f},"
                  f" per-SM GB/s per CTA quantiles {q(pair_rate)}")
