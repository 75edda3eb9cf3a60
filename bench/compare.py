#!/usr/bin/env python3
"""Combined decode table: graphdecode (paged K/V) vs PyTorch SDPA (contiguous K/V).

    python3 bench/compare.py GRAPHDECODE_JSON SDPA_JSON

Reads bench_attention's JSON (decode rows, default split) and sdpa_peer.py's JSON, and prints per
(B, L): graphdecode us, each SDPA backend's us, and graphdecode / best SDPA (< 1 means faster).
"""
import json
import sys


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
    ours_det = {(r["B"], r["L"]): r for r in gd["results"]
                if r["kind"] == "decode" and r["deterministic"] and not r.get("skipped")}
    peers = {}
    names = []
    for r in sd["results"]:
        if r.get("skipped"):
            continue
        if r["backend"] not in names:
            names.append(r["backend"])
        peers.setdefault((r["B"], r["L"]), {})[r["backend"]] = r["us"]
    print(f"decode, 32q/8kv heads, d128, bf16 — graphdecode on {gd.get('device')} "
          f"vs SDPA (torch {sd.get('torch')})")
    head = f"{'B':>5} {'L':>6} {'gd us':>9} {'layer us':>9} {'gd det us':>10}"
    for n in names:
        head += f" {n + ' us':>10}"
    head += f" {'gd/best':>8}"
    print(head)
    for key in sorted(set(ours) | set(peers)):
        b, l = key
        line = f"{b:>5} {l:>6}"
        g = ours.get(key)
        gdet = ours_det.get(key)
        line += f" {g['us']:>9.1f}" if g else f" {'-':>9}"
        line += f" {g.get('layer_us', 0):>9.1f}" if g else f" {'-':>9}"
        line += f" {gdet['us']:>10.1f}" if gdet else f" {'-':>10}"
        p = peers.get(key, {})
        for n in names:
            line += f" {p[n]:>10.1f}" if n in p else f" {'-':>10}"
        best = min(p.values()) if p else None
        line += f" {g['us'] / best:>8.2f}" if g and best else f" {'-':>8}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
