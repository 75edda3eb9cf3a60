#!/usr/bin/env python3
"""transformers peer of bench_decode and bench_prefill (issue 38): the same shapes, random weights.

    python3 bench/hf_decode_peer.py [--shapes 1b,8b] [--batches 1,8,32,64,128] [--contexts 1024,4096]
                                    [--prompts 512,2048,8192] [--requests 1,16] [--reps N]
                                    [--budget-s S] [--no-compile] [--json PATH] [--quick]
    python3 bench/hf_decode_peer.py --dry-run      # tiny config on the CPU: checks the plumbing

Model: LlamaForCausalLM built from a LlamaConfig with bench_decode's dimensions (1b: Llama-3.2-1B,
tied; 8b: Llama-3.1-8B, untied), transformers' random init, bf16, cuda, attn_implementation
"sdpa". RoPE scaling is left at the config default: it changes the inverse frequencies once, not
the work of a step.

Decode step at (B, L), the same step as bench_decode's: B rows of one new token each at position
L over L cached keys per row (KV extent L + 1), then the greedy next token (argmax of the last
logits). The cache holds random bf16 K/V (never zeros, as ours) and is cut back to L after every
step, so every rep does the same work.
  eager     DynamicCache (what generate() uses by default): each step concatenates the new K/V to
            the cache, as it does in generate().
  compiled  StaticCache(max_cache_len = L + 1) and torch.compile(mode="reduce-overhead") of the
            step (CUDA graphs through cudagraph trees): transformers' fastest stock decode path.
            One compiled function per shape; dynamo marks B and L dynamic after the first
            recompile, so later cells re-record a CUDA graph instead of recompiling (the first two
            cells of a shape pay the compiles, ~30-90 s each on an H100).
Time = median over --reps of CUDA-event timed steps, each after an L2 flush (a read of 4x the L2,
as bench_decode and sdpa_peer.py), after warm-up (compiled: 3 calls, which compile and record).
The host is not drained: as in bench_decode, the flush gives the host a head start of one flush.

Prefill of P tokens for n requests at once (a [n, P] batch, no padding): one forward with a
DynamicCache and logits_to_keep=1 (what generate() does for the prompt), then the argmax copied to
the host. prefill_ms = CUDA events around forward + argmax; ttft_ms = host wall time from the call
to the tokens on the host (bench_prefill's time to first token); medians of up to 3 runs after one
warm-up. Eager only: transformers does not compile the prefill (its docs advise against it).

Cells that do not fit (estimated before allocation) or that raise out-of-memory are skipped with
the reason; cells started after --budget-s seconds are skipped with "time budget". Work runs in
priority order across shapes (the PRIORITY decode cells, then prefill, then the rest of the decode
grid), so a budget cut drops B = 32 and 128 first; the JSON is rewritten after every cell, so a
run killed by an outer timeout keeps what it measured.
"""
import argparse
import gc
import inspect
import json
import statistics
import sys
import time

import torch

SHAPES = {
    # bench_decode --shape 1b / 8b (engine/model_config.cpp: llama_1b_config, llama_8b_config)
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
               tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
               tie_word_embeddings=False),
    # --dry-run: small enough for a CPU in seconds
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=256, tie_word_embeddings=True),
}
# Decode cells in the order they run (the rest of the grid follows in grid order): the issue's
# B = 1, 8, 64 targets at both contexts first, so a --budget-s cut drops B = 32 and 128 first.
PRIORITY = [(1, 1024), (64, 4096), (8, 1024), (1, 4096), (64, 1024), (8, 4096)]


def log(*a):
    print(*a, flush=True)


# ---- transformers version differences --------------------------------------------------------
# transformers 4.x: forward(past_key_values=, cache_position=), StaticCache(config, max_batch_size,
# max_cache_len, device, dtype), caches as key_cache / value_cache lists. transformers 5.x:
# forward(cache=) (newer 5.x) or past_key_values=, caches as .layers with keys / values, and a
# StaticLayer that writes at its own cumulative_length (not at cache_position).

def forward_kwargs(model):
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
    return cache_kw, keep_kw, "cache_position" in params


def make_static_cache(config, b, max_len, device):
    from transformers import StaticCache
    params = inspect.signature(StaticCache.__init__).parameters
    if "max_batch_size" in params or "batch_size" in params:  # 4.x
        kw = "max_batch_size" if "max_batch_size" in params else "batch_size"
        cache = StaticCache(config=config, max_cache_len=max_len, device=device,
                            dtype=torch.bfloat16, **{kw: b})
    else:
        cache = StaticCache(config=config, max_cache_len=max_len)
        cache.early_initialization(b, config.num_key_value_heads, config.head_dim,
                                   torch.bfloat16, torch.device(device))
    for t in cache_tensors(cache):
        t.uniform_(-1, 1)  # random, never zeros (the attention reads all max_len keys)
    return cache


def make_dynamic_cache(config, b, length, device):
    from transformers import DynamicCache
    cache = DynamicCache()
    shape = (b, config.num_key_value_heads, length, config.head_dim)
    for i in range(config.num_hidden_layers):
        k = torch.empty(shape, device=device, dtype=torch.bfloat16).uniform_(-1, 1)
        v = torch.empty(shape, device=device, dtype=torch.bfloat16).uniform_(-1, 1)
        cache.update(k, v, i)
    return cache


def cache_tensors(cache):
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            yield layer.keys
            yield layer.values
    else:
        yield from cache.key_cache
        yield from cache.value_cache


def reset_length(cache, length):
    """Back to `length` cached tokens, in place (a compiled graph holds the static addresses)."""
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            if hasattr(layer, "cumulative_length"):  # 5.x StaticLayer: writes at this offset
                layer.cumulative_length.fill_(length)
            elif getattr(layer, "keys", None) is not None and layer.keys.dim() == 4:
                if layer.keys.shape[-2] > length:  # DynamicLayer: drop the appended token
                    layer.keys = layer.keys[..., :length, :]
                    layer.values = layer.values[..., :length, :]
    elif hasattr(cache, "key_cache"):  # 4.x: a static cache is indexed by cache_position
        for i, k in enumerate(cache.key_cache):
            if k.dim() == 4 and k.shape[-2] > length and not getattr(cache, "is_compileable", False):
                cache.key_cache[i] = k[..., :length, :]
                cache.value_cache[i] = cache.value_cache[i][..., :length, :]


# ---- timing ----------------------------------------------------------------------------------

class Timer:
    """Median us of fn over reps, each after an L2 flush; CUDA events on a GPU, wall on a CPU."""

    def __init__(self, device):
        self.cuda = device == "cuda"
        l2 = (getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
              if self.cuda else 1 << 20)
        self.flush = torch.ones(max(4 * l2, 64 << 20) // 4 if self.cuda else 1024,
                                device=device, dtype=torch.float32)

    def median_us(self, fn, reps, before=None):
        times = []
        for _ in range(reps):
            if before:
                before()
            self.flush.sum()  # read-only L2 flush (clean lines)
            if self.cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                times.append((s, e))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e6 * (time.perf_counter() - t0))
        if self.cuda:
            torch.cuda.synchronize()
            times = [1e3 * s.elapsed_time(e) for s, e in times]
        return statistics.median(times)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def free_bytes(device):
    if device != "cuda":
        return 1 << 62
    return torch.cuda.mem_get_info()[0]


def cleanup(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def oom_note(e):
    return "out of memory: " + str(e).splitlines()[0][:100]


# ---- model -----------------------------------------------------------------------------------

def build_model(shape, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=131072,
                         attn_implementation="sdpa", use_cache=True)
    config._attn_implementation = "sdpa"
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # init in bf16 on the device: no fp32 copy on the host
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    return model.to(device=device, dtype=torch.bfloat16).eval(), config


def weight_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes(config, b, length):
    return 2 * config.num_hidden_layers * b * config.num_key_value_heads * length * config.head_dim * 2


# ---- decode ----------------------------------------------------------------------------------

def decode_cell(model, config, b, l, args, timer, compiled_step, device):
    row = {"B": b, "L": l}
    cache_kw, _, takes_cache_position = forward_kwargs(model)
    ids = torch.randint(0, config.vocab_size, (b, 1), device=device)
    pos = torch.full((b, 1), l, device=device, dtype=torch.long)
    extra = {"cache_position": torch.tensor([l], device=device)} if takes_cache_position else {}

    def step(cache):
        out = model(input_ids=ids, position_ids=pos, use_cache=True, **{cache_kw: cache}, **extra)
        return out.logits[:, -1].argmax(-1)

    # The eager step holds the cache and its concatenated copy of one layer (L + 1 keys).
    need = kv_bytes(config, b, l + 1) * 1.1 + (1 << 30)
    with torch.no_grad():
        if time.monotonic() > args.deadline:
            row["eager_note"] = row["compiled_note"] = "time budget (--budget-s)"
            return row
        if need > free_bytes(device):
            row["eager_note"] = f"does not fit: ~{need / 1e9:.1f} GB of KV + headroom"
        else:
            try:
                cache = make_dynamic_cache(config, b, l, device)
                for _ in range(3):
                    step(cache)
                    reset_length(cache, l)
                row["eager_us"] = timer.median_us(lambda: step(cache), args.reps,
                                                  before=lambda: reset_length(cache, l))
                del cache
            except torch.cuda.OutOfMemoryError as e:
                row["eager_note"] = oom_note(e)
            cleanup(device)
        if compiled_step is None:
            row["compiled_note"] = "not run (--no-compile)"
            return row
        if time.monotonic() > args.deadline:
            row["compiled_note"] = "time budget (--budget-s)"
            return row
        if need > free_bytes(device):
            row["compiled_note"] = f"does not fit: ~{need / 1e9:.1f} GB of KV + headroom"
            return row
        try:
            cache = make_static_cache(config, b, l + 1, device)
            t0 = time.monotonic()
            for _ in range(3):  # compile (first cells of a shape), cudagraph warm-up and record
                reset_length(cache, l)
                compiled_step(ids, pos, cache, extra)
            sync(device)
            row["compile_s"] = time.monotonic() - t0
            row["compiled_us"] = timer.median_us(lambda: compiled_step(ids, pos, cache, extra),
                                                 args.reps, before=lambda: reset_length(cache, l))
            del cache
        except torch.cuda.OutOfMemoryError as e:
            row["compiled_note"] = oom_note(e)
        cleanup(device)
    return row


def make_compiled_step(model, device):
    cache_kw, _, _ = forward_kwargs(model)

    def step(ids, pos, cache, extra):
        out = model(input_ids=ids, position_ids=pos, use_cache=True, **{cache_kw: cache}, **extra)
        return out.logits[:, -1].argmax(-1)

    if device == "cuda":
        return torch.compile(step, mode="reduce-overhead")
    # --dry-run on a CPU: dynamo traces the same step (graph breaks, cache plumbing) without
    # inductor's C++ build or CUDA graphs.
    return torch.compile(step, backend="eager")


# ---- prefill ---------------------------------------------------------------------------------

def prefill_cell(model, config, n, p, device):
    row = {"n": n, "P": p}
    cache_kw, keep_kw, _ = forward_kwargs(model)
    # KV of the prompt + the widest MLP activations of n * p rows (gate, up, act, bf16) + logits
    need = (kv_bytes(config, n, p) + 4 * n * p * config.intermediate_size * 2 + (2 << 30))
    if need > free_bytes(device):
        row["note"] = f"does not fit: ~{need / 1e9:.1f} GB"
        return row
    from transformers import DynamicCache

    def run():
        ids = torch.randint(0, config.vocab_size, (n, p), device=device)
        sync(device)
        t0 = time.perf_counter()
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
        kw = {cache_kw: DynamicCache(), "use_cache": True}
        if keep_kw:
            kw[keep_kw] = 1
        out = model(input_ids=ids, **kw)
        tokens = out.logits[:, -1].argmax(-1)
        if device == "cuda":
            e.record()
        tokens = tokens.cpu()  # the first tokens on the host: a user's time to first token
        wall = 1e3 * (time.perf_counter() - t0)
        dev_ms = s.elapsed_time(e) if device == "cuda" else wall
        del out
        return dev_ms, wall

    try:
        with torch.no_grad():
            run()  # warm-up
            ms, ttft = [], []
            t0 = time.monotonic()
            while len(ms) < 3 and (not ms or time.monotonic() - t0 < 3.0):
                a, b = run()
                ms.append(a)
                ttft.append(b)
        row.update(prefill_ms=statistics.median(ms), ttft_ms=statistics.median(ttft),
                   tokens_per_s=n * p / (statistics.median(ttft) * 1e-3), runs=len(ms))
    except torch.cuda.OutOfMemoryError as e:
        row["note"] = oom_note(e)
    cleanup(device)
    return row


# ---- main ------------------------------------------------------------------------------------

def ordered_cells(batches, contexts):
    grid = [(b, l) for l in contexts for b in batches]
    first = [c for c in PRIORITY if c in grid]
    return first + [c for c in grid if c not in first]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1b,8b")
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--prompts", default="512,2048,8192")
    ap.add_argument("--requests", default="1,16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip compiled decode cells and prefill cells started after this many s")
    ap.add_argument("--no-compile", action="store_true", help="eager decode only")
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="1b, B 1,8, L 1024, prompts 512")
    ap.add_argument("--dry-run", action="store_true", help="tiny config on the CPU")
    args = ap.parse_args()
    if args.dry_run:
        device, shapes = "cpu", ["tiny"]
        batches, contexts, prompts, requests = [1, 2], [16, 32], [8, 16], [1, 2]
        args.reps = 3
    else:
        if not torch.cuda.is_available():
            print("hf_decode_peer: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
            return 2
        device = "cuda"
        parse = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
        shapes = args.shapes.split(",")
        batches, contexts = parse(args.batches), parse(args.contexts)
        prompts, requests = parse(args.prompts), parse(args.requests)
        if args.quick:
            shapes, batches, contexts, prompts, requests = ["1b"], [1, 8], [1024], [512], [1]
    import transformers
    start = time.monotonic()
    args.deadline = start + args.budget_s if args.budget_s else float("inf")
    # B and L vary by cell: allow the recompiles (automatic dynamic shapes after the first).
    torch._dynamo.config.cache_size_limit = 64
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 64
    dev_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    log(f"device: {dev_name}, torch {torch.__version__}, transformers {transformers.__version__}")
    timer = Timer(device)
    decode_rows, prefill_rows = [], []
    models = {}  # shape -> (model, config, compiled step): all resident (1b + 8b: 18.5 GB)
    for shape in shapes:
        torch.manual_seed(0)
        model, config = build_model(shape, device)
        compiled = None if args.no_compile else make_compiled_step(model, device)
        models[shape] = (model, config, compiled)
        log(f"shape {shape}: {weight_bytes(model) / 1e9:.2f} GB bf16 weights, sdpa, "
            f"{time.monotonic() - start:.0f} s elapsed")

    def write_json():  # after every cell: a run cut short by a timeout keeps what it measured
        if not args.json:
            return
        with open(args.json, "w") as f:
            json.dump({"bench": "hf_decode_peer", "device": dev_name, "torch": torch.__version__,
                       "transformers": transformers.__version__, "reps": args.reps,
                       "l2_flush": True, "attn_implementation": "sdpa", "dtype": "bf16",
                       "elapsed_s": time.monotonic() - start,
                       "decode": decode_rows, "prefill": prefill_rows}, f, indent=2)

    # Work in priority order across shapes, so a budget cut costs the least important cells: the
    # PRIORITY decode cells, then prefill (small first), then the rest of the decode grid.
    cells = ordered_cells(batches, contexts)
    n_first = len([c for c in PRIORITY if c in cells])
    work = [("decode", shape, c) for c in cells[:n_first] for shape in shapes]
    if not args.no_prefill:
        work += [("prefill", shape, (n, p)) for n in requests for p in prompts for shape in shapes]
    work += [("decode", shape, c) for c in cells[n_first:] for shape in shapes]
    for kind, shape, (x, y) in work:
        model, config, compiled = models[shape]
        if kind == "decode":
            row = decode_cell(model, config, x, y, args, timer, compiled, device)
            row["shape"] = shape
            decode_rows.append(row)
            fmt = lambda k: f"{row[k]:10.1f}" if k in row else f"{'-':>10}"  # noqa: E731
            log(f"decode {shape} B={x:4d} L={y:6d} eager us {fmt('eager_us')} compiled us "
                f"{fmt('compiled_us')}  {row.get('eager_note', '')} {row.get('compiled_note', '')}"
                f"  ({time.monotonic() - start:.0f} s)")
        else:
            if time.monotonic() > args.deadline:
                row = {"n": x, "P": y, "note": "time budget (--budget-s)"}
            else:
                row = prefill_cell(model, config, x, y, device)
            row["shape"] = shape
            prefill_rows.append(row)
            log(f"prefill {shape} n={x:3d} P={y:6d} "
                + (f"{row['prefill_ms']:10.2f} ms, ttft {row['ttft_ms']:10.2f} ms, "
                   f"{row['tokens_per_s']:10.0f} tok/s" if "ttft_ms" in row
                   else f"skipped: {row['note']}") + f"  ({time.monotonic() - start:.0f} s)")
        write_json()
    write_json()
    return 0


if __name__ == "__main__":
    sys.exit(main())
