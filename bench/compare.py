#!/usr/bin/env python3
"""Combined decode table: graphdecode (paged K/V) vs PyTorch SDPA (contiguous K/V).

    python3 bench/compare.py GRAPHDECODE_JSON SDPA_JSON

Reads bench_attention's JSON (decode rows, default split) and sdpa_peer.py's JSON. Each ratio
compares graphdecode with the SDPA flash backend (the issue's peer; cuDNN is listed beside it),
timed by the same method in the same run (< 1 means graphdecode is faster):
  call: one CUDA-graph replay after an L2 flush (gd `us` = run(); SDPA `graph us`)
  step: per layer of a graph of K layers with their own K/V (gd `step us`; SDPA `step us`)
The SDPA eager times (kernels queued behind the flush, no launch in the time) are listed too.
"""
import json
import sys


def fmt(x, width, digits=1):
    return f"{x:>{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        gd = json.load(f)
    with open(sys.argv[2]) as f:
        sd = json.load(f)
    ours = {(r["B"], r["L"]): r for r in gd["results"]
            if r["kind"] == "decode" and not r["deterministic"] and not r.get("skipped")}
    peers = {}
    names = []
    for r in sd["results"]:
        if r.get("skipped"):
            continue
        if r["backend"] not in names:
            names.append(r["backend"])
        peers.setdefault((r["B"], r["L"]), {})[r["backend"]] = r

    def peer(p, field):
        return p.get("flash", {}).get(field)

    def ratio(a, b):
        return a / b if a is not None and b else None

    print(f"decode, 32q/8kv heads, d128, bf16 — graphdecode (paged, page 16 shuffled) on "
          f"{gd.get('device')} vs SDPA (contiguous K/V, torch {sd.get('torch')})")
    head = f"{'B':>5} {'L':>6} | {'gd call':>8}"
    head += "".join(f" {n + ' call':>11}" for n in names) + f" {'/flash':>6} | {'gd step':>8}"
    head += "".join(f" {n + ' step':>11}" for n in names) + f" {'/flash':>6} |"
    head += "".join(f" {n + ' eager':>12}" for n in names)
    print(head)
    slower = {"call": [], "step": []}
    for key in sorted(set(ours) | set(peers)):
        b, l = key
        g = ours.get(key, {})
        p = peers.get(key, {})
        gcall, gstep = g.get("us"), (g.get("step_us") if g.get("step_layers") else None)
        rc, rs = ratio(gcall, peer(p, "graph_us")), ratio(gstep, peer(p, "step_us"))
        for kind, r in (("call", rc), ("step", rs)):
            if r is not None and r > 1.0:
                slower[kind].append(f"B={b} L={l} ({r:.3f})")
        line = f"{b:>5} {l:>6} | {fmt(gcall, 8)}"
        line += "".join(f" {fmt(p.get(n, {}).get('graph_us'), 11)}" for n in names)
        line += f" {fmt(rc, 6, 2)} | {fmt(gstep, 8)}"
        line += "".join(f" {fmt(p.get(n, {}).get('step_us'), 11)}" for n in names)
        line += f" {fmt(rs, 6, 2)} |"
        line += "".join(f" {fmt(p.get(n, {}).get('us'), 12)}" for n in names)
        print(line)
    for kind in ("call", "step"):
        print(f"slower than SDPA flash ({kind}): "
              + (", ".join(slower[kind]) if slower[kind] else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
