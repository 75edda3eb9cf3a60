#!/usr/bin/env python3
"""PyTorch SDPA peer for bench_attention's decode shapes (contiguous K/V, not paged).

    python3 bench/sdpa_peer.py [--json PATH] [--reps N] [--quick] [--batches 1,8] [--lens 512,2048]
                               [--backend flash|cudnn]

q [B, 32, 1, 128], k/v [B, 8, L, 128] bf16 with enable_gqa=True (falls back to K/V expanded to
32 heads when a backend refuses GQA; the row then says layout "expanded" and its bytes still count
the 8-head K/V that a GQA kernel must read). Backends: FLASH_ATTENTION and CUDNN_ATTENTION (when
available). Time = median of CUDA-event timed runs, each after an L2 flush that reads a buffer of
4x the L2 size, like bench_attention. Three timings per shape, their runs alternating:
  us       one eager call (the kernels queue behind the flush: no launch cost in the time)
  graph us one CUDA-graph replay of the call (bench_attention's method for its `us` column)
  step us  per call of a graph of K calls on K layers' own K/V (K <= 16, cold after the flush):
           bench_attention's `step us` column.
bytes = K + V + Q + out.
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


STEP_LAYERS = 16
STEP_POOL_BYTES = 16 << 30


def time_calls(fns, flush, reps):
    """Median us of each callable; runs alternate so clock drift shifts all of them alike."""
    for _ in range(5):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    starts = [[torch.cuda.Event(enable_timing=True) for _ in range(reps)] for _ in fns]
    stops = [[torch.cuda.Event(enable_timing=True) for _ in range(reps)] for _ in fns]
    for i in range(reps):
        for j, fn in enumerate(fns):
            flush.sum()  # read-only L2 flush (clean lines)
            starts[j][i].record()
            fn()
            stops[j][i].record()
    torch.cuda.synchronize()
    return [statistics.median(1e3 * s.elapsed_time(e) for s, e in zip(starts[j], stops[j]))
            for j in range(len(fns))]


def capture(fn):
    """A CUDA graph of fn (warmed up on a side stream, as torch.cuda.graph requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


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

        def call(kk, vv):
            if layout == "gqa":
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)
            return F.scaled_dot_product_attention(q, kk, vv)

        with sdpa_kernel(backend):
            try:
                call(k, v)
            except (RuntimeError, TypeError):
                layout = "expanded"
                if kv_bytes * (HQ // HKV) * 1.2 > free:
                    row.update(skipped=True, note="expanded K/V does not fit")
                    return row
                k = k.repeat_interleave(HQ // HKV, dim=1)
                v = v.repeat_interleave(HQ // HKV, dim=1)
                call(k, v)
            fn = lambda: call(k, v)  # noqa: E731
            fns, graphs, kvs, layers = [fn], [], [], 0
            try:
                graphs.append(capture(fn))
                fns.append(graphs[-1].replay)
                # The in-step graph: K layers, each with its own K/V (the first is k, v).
                layer_bytes = 2 * k.numel() * k.element_size()
                free, _ = torch.cuda.mem_get_info()
                layers = STEP_LAYERS
                while layers >= 2 and (layers * layer_bytes > STEP_POOL_BYTES
                                       or (layers - 1) * layer_bytes * 1.2 > free):
                    layers -= 1
                if layers >= 2:
                    kvs = [(k, v)] + [(torch.empty_like(k).uniform_(-1, 1),
                                       torch.empty_like(v).uniform_(-1, 1))
                                      for _ in range(layers - 1)]
                    graphs.append(capture(lambda: [call(kk, vv) for kk, vv in kvs]))
                    fns.append(graphs[-1].replay)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                row["graph_note"] = str(e).splitlines()[0][:120]  # eager time still reported
            times = time_calls(fns, flush, reps)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
        row.update(skipped=True, note=str(e).splitlines()[0][:120])
        torch.cuda.empty_cache()
        return row
    nbytes = kv_bytes + 2 * b * HQ * D * 2
    row.update(skipped=False, layout=layout, us=times[0],
               graph_us=times[1] if len(times) > 1 else None,
               step_layers=layers if len(times) > 2 else 0,
               step_us=times[2] / layers if len(times) > 2 else None, bytes=nbytes,
               gbps=nbytes / (times[0] * 1e-6) / 1e9)
    del q, k, v, fns, graphs, kvs
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batches", default=None, help="comma-separated B values (default: the table's)")
    ap.add_argument("--lens", default=None, help="comma-separated L values (default: the table's)")
    ap.add_argument("--backend", default=None, choices=["flash", "cudnn"], help="only this backend")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("sdpa_peer: no CUDA device", file=sys.stderr)
        return 1
    batches = [1, 64] if args.quick else [1, 8, 64, 256]
    lens = [2048, 8192] if args.quick else [512, 2048, 8192, 32768]
    if args.batches:
        batches = [int(x) for x in args.batches.split(",")]
    if args.lens:
        lens = [int(x) for x in args.lens.split(",")]
    flush = torch.empty(max(4 * l2_bytes(), 64 << 20) // 4, device="cuda", dtype=torch.float32)
    flush.zero_()
    rows = []
    for name, backend in backends():
        if args.backend and name != args.backend:
            continue
        for b in batches:
            for l in lens:
                rows.append(bench_shape(b, l, name, backend, flush, max(50, args.reps)))
    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}, torch {torch.__version__}")
    print(f"{'backend':8} {'B':>5} {'L':>6} {'layout':9} {'us':>10} {'graph us':>9} "
          f"{'step us':>9} {'GB/s':>8}")
    for r in rows:
        if r.get("skipped"):
            print(f"{r['backend']:8} {r['B']:>5} {r['L']:>6} skipped: {r['note']}")
        else:
            graph = f"{r['graph_us']:.1f}" if r["graph_us"] is not None else "-"
            step = f"{r['step_us']:.1f}" if r["step_us"] is not None else "-"
            print(f"{r['backend']:8} {r['B']:>5} {r['L']:>6} {r['layout']:9} {r['us']:>10.1f} "
                  f"{graph:>9} {step:>9} {r['gbps']:>8.0f}"
                  + (f"  (graph: {r['graph_note']})" if "graph_note" in r else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "sdpa_peer", "device": dev, "torch": torch.__version__,
                       "shape": {"num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": D,
                                 "dtype": "bf16"},
                       "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
