#!/usr/bin/env python3
"""PNG plots beside the benchmark tables, from the JSON the benchmarks write.

    python3 bench/plot.py RESULTS_DIR [--out DIR]      # every known JSON in the folder
    python3 bench/plot.py a.json b.json ... [--out DIR]

Recognizes bench_attention (+ sdpa_peer for the peer), bench_decode, bench_gemm and bench_step
JSON (by their "bench" key, or the file name for bench_step) and writes:
  attention.png  decode attention time vs context, one panel per batch, ours (one call and per
                 layer of a step) against PyTorch SDPA flash / cuDNN; below, ours / flash
  decode.png     a 1B-class decode step as % of its bandwidth floor over batch, per context;
                 graph vs eager time
  gemm.png       the decode GEMMs as % of their weight-read floor, cuBLAS vs the skinny kernel
  step.png       host time per step (write + copy + launch) over batch
Without matplotlib it says so and exits 0, so scripts can call it unconditionally.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict


def load(paths: list[str]) -> dict[str, dict]:
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += [os.path.join(p, f) for f in sorted(os.listdir(p)) if f.endswith(".json")]
        else:
            files.append(p)
    found = {}
    for f in files:
        try:
            with open(f) as fh:
                d = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"plot: skipping {f}: {e}", file=sys.stderr)
            continue
        kind = d.get("bench") if isinstance(d, dict) else None
        if kind is None and isinstance(d, dict) and "host_us" in d:
            kind = "bench_step"
        if kind:
            found[kind] = d
    return found


def title_of(d: dict, what: str) -> str:
    return f"{what} — {d.get('device', 'unknown device')}"


def plot_attention(plt, gd: dict, peer: dict | None, out: str) -> str:
    ours = [r for r in gd["results"]
            if r.get("kind") == "decode" and not r.get("deterministic") and not r.get("skipped")]
    batches = sorted({r["B"] for r in ours})
    peers = defaultdict(dict)
    for r in (peer or {}).get("results", []):
        if not r.get("skipped"):
            peers[(r["B"], r["L"])][r["backend"]] = r
    fig, axes = plt.subplots(2, len(batches), figsize=(4.2 * len(batches), 7.5), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for col, b in enumerate(batches):
        rows = sorted((r for r in ours if r["B"] == b), key=lambda r: r["L"])
        ls = [r["L"] for r in rows]
        ax = axes[0][col]
        ax.plot(ls, [r["us"] for r in rows], "o-", label="graphdecode call")
        step = [(r["L"], r["step_us"]) for r in rows if r.get("step_layers")]
        if step:
            ax.plot(*zip(*step), "o--", label="graphdecode per layer of a step")
        for backend, style in (("flash", "s-"), ("cudnn", "^-")):
            pts = [(l, peers[(b, l)][backend]["graph_us"]) for l in ls
                   if backend in peers[(b, l)]]
            if pts:
                ax.plot(*zip(*pts), style, alpha=0.8, label=f"SDPA {backend} call")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"B = {b}")
        ax.set_xlabel("context L (tokens)")
        if col == 0:
            ax.set_ylabel("time (us)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[1][col]
        for key, field, style, label in (("graph_us", "us", "o-", "call / flash"),
                                         ("step_us", "step_us", "o--", "step / flash")):
            pts = [(r["L"], r[field] / peers[(b, r["L"])]["flash"][key]) for r in rows
                   if "flash" in peers[(b, r["L"])] and r.get(field)
                   and peers[(b, r["L"])]["flash"].get(key)
                   and (field != "step_us" or r.get("step_layers"))]
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        ax.axhline(1.0, color="gray", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context L (tokens)")
        if col == 0:
            ax.set_ylabel("graphdecode / SDPA flash (< 1 faster)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    shape = gd.get("shape", {})
    fig.suptitle(title_of(gd, f"decode attention, {shape.get('num_q_heads')}q/"
                              f"{shape.get('num_kv_heads')}kv heads, d{shape.get('head_dim')}, "
                              f"{shape.get('dtype')}"))
    fig.tight_layout()
    path = os.path.join(out, "attention.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_decode(plt, d: dict, out: str) -> str:
    rows = [r for r in d["results"] if not r.get("skipped")]
    by_l = defaultdict(list)
    for r in rows:
        by_l[r["L"]].append(r)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for l, rs in sorted(by_l.items()):
        rs.sort(key=lambda r: r["B"])
        a.plot([r["B"] for r in rs], [r["pct_of_floor"] for r in rs], "o-", label=f"L = {l}")
        b.plot([r["B"] for r in rs], [r["graph_us"] for r in rs], "o-", label=f"graph, L = {l}")
        b.plot([r["B"] for r in rs], [r["eager_us"] for r in rs], "x--", label=f"eager, L = {l}")
    a.axhline(100, color="gray", lw=1)
    a.set(xscale="log", xlabel="batch", ylabel="% of floor (weights + KV at copy bandwidth)",
          title="decode step vs its bandwidth floor", ylim=(0, 105))
    b.set(xscale="log", xlabel="batch", ylabel="time per step (us)", title="graph vs eager")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    c = d.get("config", {})
    fig.suptitle(title_of(d, f"one decode step, hidden {c.get('hidden')}, {c.get('layers')} "
                             f"layers, vocab {c.get('vocab')}"))
    fig.tight_layout()
    path = os.path.join(out, "decode.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gemm(plt, d: dict, out: str) -> str:
    rows = d["results"]
    labels = [f"{r['shape']}\nrows {r['rows']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(rows)), 4.2))
    w = 0.4
    ax.bar([i - w / 2 for i in x], [r["cublas_pct_floor"] for r in rows], w, label="cuBLAS")
    ax.bar([i + w / 2 for i in x], [r["skinny_pct_floor"] for r in rows], w, label="skinny")
    ax.axhline(100, color="gray", lw=1)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("% of weight-read floor")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(title_of(d, "decode GEMMs"))
    fig.tight_layout()
    path = os.path.join(out, "gemm.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_step(plt, d: dict, out: str) -> str:
    pts = sorted((int(b), us) for b, us in d["host_us"].items())
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(*zip(*pts), "o-")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch", ylabel="host us per step", ylim=(0, None),
           title="host time per step (write + copy + graph launch)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out, "step.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="+", help="JSON files or folders of them")
    p.add_argument("--out", help="folder for the PNGs (default: beside the first input)")
    args = p.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: matplotlib is not installed; no plots (pip install matplotlib)")
        return 0
    first = args.inputs[0]
    out = args.out or (first if os.path.isdir(first) else os.path.dirname(first) or ".")
    os.makedirs(out, exist_ok=True)
    found = load(args.inputs)
    written = []
    if "bench_attention" in found:
        written.append(plot_attention(plt, found["bench_attention"], found.get("sdpa_peer"), out))
    if "bench_decode" in found:
        written.append(plot_decode(plt, found["bench_decode"], out))
    if "bench_gemm" in found:
        written.append(plot_gemm(plt, found["bench_gemm"], out))
    if "bench_step" in found:
        written.append(plot_step(plt, found["bench_step"], out))
    if not written:
        print("plot: no benchmark JSON recognized in", " ".join(args.inputs))
    for w in written:
        print("plot: wrote", w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
