#!/usr/bin/env python3
"""PyTorch SDPA peer for bench_attention's decode shapes (contiguous K/V, not paged).

    python3 bench/sdpa_peer.py [--json PATH] [--reps N] [--quick]

q [B, 32, 1, 128], k/v [B, 8, L, 128] bf16 with enable_gqa=True (falls back to K/V expanded to
32 heads when a backend refuses GQA; the row then says layout "expanded" and its bytes still count
the 8-head K/V that a GQA kernel must read). Backends: FLASH_ATTENTION and CUDNN_ATTENTION (when
available). Time = median of CUDA-event timed calls, each after an L2 flush that reads a buffer of
4x the L2 size, like bench_attention. bytes = K + V + Q + out.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128


def backends():
    out = [("flash", SDPBackend.FLASH_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        out.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    return out


def l2_bytes():
    props = torch.cuda.get_device_properties(0)
    return int(getattr(props, "L2_cache_size", 50 << 20))


def time_call(fn, flush, reps):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.sum()  # read-only L2 flush (clean lines)
        starts[i].record()
        fn()
        stops[i].record()
    torch.cuda.synchronize()
    return statistics.median(1e3 * s.elapsed_time(e) for s, e in zip(starts, stops))


def bench_shape(b, l, name, backend, flush, reps):
    row = {"B": b, "L": l, "backend": name}
    kv_bytes = 2 * b * HKV * l * D * 2
    free, _ = torch.cuda.mem_get_info()
    if kv_bytes * 1.2 > free:
        row.update(skipped=True, note="does not fit in device memory")
        return row
    try:
        q = torch.empty(b, HQ, 1, D, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
        k = torch.empty(b, HKV, l, D, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
        v = torch.empty(b, HKV, l, D, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
        layout = "gqa"
        with sdpa_kernel(backend):
            try:
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
            except (RuntimeError, TypeError):
                layout = "expanded"
                if kv_bytes * (HQ // HKV) * 1.2 > free:
                    row.update(skipped=True, note="expanded K/V does not fit")
                    return row
                k = k.repeat_interleave(HQ // HKV, dim=1)
                v = v.repeat_interleave(HQ // HKV, dim=1)
                F.scaled_dot_product_attention(q, k, v)
                fn = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
            us = time_call(fn, flush, reps)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
        row.update(skipped=True, note=str(e).splitlines()[0][:120])
        torch.cuda.empty_cache()
        return row
    nbytes = kv_bytes + 2 * b * HQ * D * 2
    row.update(skipped=False, layout=layout, us=us, bytes=nbytes, gbps=nbytes / (us * 1e-6) / 1e9)
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("sdpa_peer: no CUDA device", file=sys.stderr)
        return 1
    batches = [1, 64] if args.quick else [1, 8, 64, 256]
    lens = [2048, 8192] if args.quick else [512, 2048, 8192, 32768]
    flush = torch.empty(max(4 * l2_bytes(), 64 << 20) // 4, device="cuda", dtype=torch.float32)
    flush.zero_()
    rows = []
    for name, backend in backends():
        for b in batches:
            for l in lens:
                rows.append(bench_shape(b, l, name, backend, flush, max(50, args.reps)))
    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}, torch {torch.__version__}")
    print(f"{'backend':8} {'B':>5} {'L':>6} {'layout':9} {'us':>10} {'GB/s':>8}")
    for r in rows:
        if r.get("skipped"):
            print(f"{r['backend']:8} {r['B']:>5} {r['L']:>6} skipped: {r['note']}")
        else:
            print(f"{r['backend']:8} {r['B']:>5} {r['L']:>6} {r['layout']:9} {r['us']:>10.1f} "
                  f"{r['gbps']:>8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "sdpa_peer", "device": dev, "torch": torch.__version__,
                       "shape": {"num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": D,
                                 "dtype": "bf16"},
                       "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
