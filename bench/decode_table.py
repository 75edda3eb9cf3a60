#!/usr/bin/env python3
"""Issue 38's tables from one run: bench_decode, bench_prefill and hf_decode_peer.py JSON.

    python3 bench/decode_table.py --decode DECODE_1B.json [DECODE_8B.json ...]
                                  [--prefill PREFILL_1B.json ...] [--peer PEER.json ...]

Prints markdown (device and versions first):
  1. Decode step per shape, B and L: `graph us` (bench_decode's forward to the logits, the column of
     earlier runs), `greedy us` and `sampled us` (the engine's step: the same forward + device
     sampling, every row greedy / every row at T 0.8, top-k 50, top-p 0.95; one captured graph),
     sampled / greedy, `floor us` ((weights + KV bytes) / measured D2D copy bandwidth),
     % of floor = floor / greedy step, ours / floor = greedy / floor, the peer's eager
     (DynamicCache) and compiled (StaticCache + torch.compile reduce-overhead) step, and
     ours / peer = greedy step / peer compiled step (< 1: ours is faster; eager when the peer has no
     compiled time for the cell).
  2. Prefill per shape, chunk budget (EngineConfig::max_step_tokens), requests n and prompt P:
     time to first token (first and last request of the batch), prompt tokens/s, TFLOP/s and % of
     the dense bf16 peak (bench_prefill's FLOP count, the device's peak by name), and the peer's
     TTFT, tokens/s and % of peak over the same FLOP count, ours / peer = our last TTFT / the
     peer's TTFT.
A cell missing from a file, or skipped there, shows "-" (the skip reasons are listed below the
tables). Timing methods: bench/bench_decode.cu, bench/bench_prefill.cu, bench/hf_decode_peer.py.
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def num(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def ratio(a, b, digits=2):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.{digits}f}"


def pct(a, b):
    return "-" if a is None or b is None or b == 0 else f"{100.0 * a / b:.1f}%"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def decode_tables(decode_files, peer, notes):
    peer_rows = {}
    for r in (peer or {}).get("decode", []):
        peer_rows[(r["shape"], r["B"], r["L"])] = r
    out = []
    for d in decode_files:
        shape = d.get("shape", "1b")
        c = d["config"]
        out.append(f"\n### Decode step, {shape} shape (hidden {c['hidden']}, {c['layers']} layers, "
                   f"{c['heads']} q / {c['kv_heads']} kv heads of {c['head_dim']}, vocab "
                   f"{c['vocab']}, {'tied' if c['tied'] else 'untied'}), us\n")
        header = ["B", "L", "graph", "greedy", "sampled", "sampled/greedy", "floor",
                  "% of floor", "ours/floor", "peer eager", "peer compiled", "ours/peer"]
        rows = []
        for r in d["results"]:
            b, l = r["B"], r["L"]
            p = peer_rows.get((shape, b, l), {})
            for k in ("eager_note", "compiled_note"):
                if k in p:
                    notes.append(f"peer {shape} B={b} L={l} {k.split('_')[0]}: {p[k]}")
            if r.get("skipped"):
                notes.append(f"ours {shape} B={b} L={l}: {r.get('note', 'skipped')}")
                rows.append([b, l] + ["-"] * 7 + [num(p.get("eager_us")),
                                                  num(p.get("compiled_us")), "-"])
                continue
            if not r.get("sane", True):
                notes.append(f"ours {shape} B={b} L={l}: NOT SANE (logits or token checks)")
            greedy = r.get("greedy_step_us")
            peer_us = p.get("compiled_us", p.get("eager_us"))
            vs = ratio(greedy, peer_us)
            if "compiled_us" not in p and "eager_us" in p:
                vs += " (eager)"
            rows.append([b, l, num(r["graph_us"]), num(greedy), num(r.get("sampled_step_us")),
                         ratio(r.get("sampled_step_us"), greedy, 3), num(r["floor_us"]),
                         pct(r["floor_us"], greedy), ratio(greedy, r["floor_us"]),
                         num(p.get("eager_us")), num(p.get("compiled_us")), vs])
        out.append(table(header, rows))
        out.append(f"\nFloor from {d['copy_gbps']:.0f} GB/s D2D copy (read + write), "
                   f"{d['reps']} reps, L2 flush {'on' if d.get('l2_flush') else 'off'}; "
                   f"`graph` = forward to the logits only (earlier runs' column), % of floor of "
                   f"it: " + ", ".join(f"B={r['B']} L={r['L']} {r['pct_of_floor']:.1f}%"
                                       for r in d["results"] if not r.get("skipped")) + ".")
    return out


def prefill_tables(prefill_files, peer, notes):
    peer_rows = {}
    for r in (peer or {}).get("prefill", []):
        peer_rows[(r["shape"], r["n"], r["P"])] = r
    out = []
    for d in prefill_files:
        shape = d.get("shape", "1b")
        peak = d.get("peak_bf16_dense_tflops") or 0
        out.append(f"\n### Prefill, {shape} shape: time to first token (ms), prompt tokens/s, "
                   f"% of {peak:.0f} TFLOP/s dense bf16 ({d.get('peak_source', '?')}, detected "
                   f"from the device name)\n" if peak else
                   f"\n### Prefill, {shape} shape (peak unknown for this device)\n")
        header = ["chunk", "n", "P", "TTFT first", "TTFT last", "tok/s", "TFLOP/s", "% of peak",
                  "steps", "peer TTFT", "peer tok/s", "peer % of peak", "ours/peer"]
        rows = []
        for r in d["results"]:
            n, p_len = r["requests"], r["prompt"]
            p = peer_rows.get((shape, n, p_len), {})
            if "note" in p:
                notes.append(f"peer prefill {shape} n={n} P={p_len}: {p['note']}")
            if r.get("skipped"):
                notes.append(f"ours prefill {shape} chunk={r['step_tokens']} n={n} P={p_len}: "
                             f"{r.get('note', 'skipped')}")
                rows.append([r["step_tokens"], n, p_len] + ["-"] * 6
                            + [num(p.get("ttft_ms"), 2), num(p.get("tokens_per_s"), 0), "-", "-"])
                continue
            peer_tflops = (r["flops"] / (p["ttft_ms"] * 1e-3) / 1e12) if "ttft_ms" in p else None
            rows.append([r["step_tokens"], n, p_len, num(r["ttft_first_ms"], 2),
                         num(r["ttft_last_ms"], 2), num(r["tokens_per_s"], 0), num(r["tflops"]),
                         pct(r["tflops"], peak) if peak else "-", r["prefill_steps"],
                         num(p.get("ttft_ms"), 2), num(p.get("tokens_per_s"), 0),
                         pct(peer_tflops, peak) if peak else "-",
                         ratio(r["ttft_last_ms"], p.get("ttft_ms"))])
        out.append(table(header, rows))
    if prefill_files:
        out.append("\nFLOPs: 2 x tokens x (matmul weights a token passes) + lm_head on one row per "
                   "request + causal attention 4 x layers x q_heads x head_dim x P(P+1)/2 per "
                   "request (bench/bench_prefill.cu); the peer's % of peak uses the same count. "
                   "TTFT last = the batch's prefill wall time; tok/s = n x P / TTFT last.")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", nargs="*", default=[], help="bench_decode JSON, one per shape")
    ap.add_argument("--prefill", nargs="*", default=[], help="bench_prefill JSON, one per shape")
    ap.add_argument("--peer", nargs="*", default=[],
                    help="hf_decode_peer.py JSON; several (shards of one run on one host) merge")
    args = ap.parse_args()
    if not args.decode and not args.prefill:
        print(__doc__, file=sys.stderr)
        return 2
    decode = [load(p) for p in args.decode]
    prefill = [load(p) for p in args.prefill]
    peer = None
    for path in args.peer:  # shards: the first one's metadata, every shard's cells
        shard = load(path)
        if peer is None:
            peer = dict(shard, decode=list(shard.get("decode", [])),
                        prefill=list(shard.get("prefill", [])))
        else:
            peer["decode"] += shard.get("decode", [])
            peer["prefill"] += shard.get("prefill", [])
    devices = sorted({d["device"] for d in decode + prefill})
    print(f"## Issue 38 tables: {', '.join(devices)}")
    if peer:
        print(f"\npeer: transformers {peer['transformers']}, torch {peer['torch']}, "
              f"{peer['attn_implementation']}, {peer['dtype']}, on {peer['device']}"
              + ("" if peer["device"] in devices else "  (NOT the device of our figures)"))
    notes = []
    for line in decode_tables(decode, peer, notes) + prefill_tables(prefill, peer, notes):
        print(line)
    if notes:
        print("\nSkipped or flagged cells:")
        for n in notes:
            print(f"- {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
