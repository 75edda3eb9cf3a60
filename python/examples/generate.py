#!/usr/bin/env python3
"""Text in, text out through graphdecode: tokenize with Hugging Face, decode with the engine.

    # a Hugging Face checkpoint directory (config.json, safetensors, tokenizer files)
    python3 python/examples/generate.py --checkpoint /models/Llama-3.2-1B \
        --prompt "The capital of France is" --prompt "def fibonacci(n):" --max-new-tokens 48

    # synthetic weights, token ids in and out (no tokenizer, no checkpoint)
    python3 python/examples/generate.py --synthetic small --prompt-ids 1,2,3,4 --max-new-tokens 16

The first request's text is streamed as its tokens arrive (the request iterator steps the engine,
so the other requests advance in the same steps); then every prompt is printed with its
completion, and the engine's stats last. Greedy unless --temperature > 0.
"""

from __future__ import annotations

import argparse
import sys
import time

import graphdecode as gd


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="Hugging Face model directory (weights + tokenizer)")
    src.add_argument("--synthetic", choices=["small", "1b"], help="seeded random weights")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the checkpoint)")
    p.add_argument("--prompt", action="append", default=[], help="text; repeat for a batch")
    p.add_argument("--prompt-ids", action="append", default=[],
                   help="comma-separated token ids; repeat for a batch")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--speculate-ngram", type=int, default=0, metavar="K",
                   help="speculative decoding by prompt lookup, up to K draft tokens")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (same kernels, eagerly)")
    p.add_argument("--check-hf", action="store_true",
                   help="also run transformers' greedy generate and compare the tokens")
    return p.parse_args()


def load_tokenizer(path: str | None):
    if path is None:
        return None
    from transformers import AutoTokenizer  # only needed for text

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    if chat:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                  add_generation_prompt=True, tokenize=True))
    return list(tokenizer(text)["input_ids"])


def stop_tokens(tokenizer) -> list[int]:
    if tokenizer is None or tokenizer.eos_token_id is None:
        return []
    eos = tokenizer.eos_token_id
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


def hf_greedy(checkpoint: str, prompts: list[list[int]], n: int, stops: list[int]) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True,
                                                 dtype=torch.bfloat16).cuda().eval()
    out = []
    for ids in prompts:
        x = torch.tensor([ids], device="cuda")
        with torch.no_grad():
            y = model.generate(x, max_new_tokens=n, do_sample=False,
                               eos_token_id=stops or None, pad_token_id=0)
        out.append(y[0, len(ids):].tolist())
    return out


def main() -> int:
    args = parse_args()
    tokenizer = load_tokenizer(args.tokenizer or args.checkpoint)
    if args.prompt and tokenizer is None:
        print("--prompt needs a tokenizer (--checkpoint or --tokenizer); use --prompt-ids",
              file=sys.stderr)
        return 2
    prompts = [encode(tokenizer, t, args.chat) for t in args.prompt]
    prompts += [[int(t) for t in s.split(",")] for s in args.prompt_ids]
    if not prompts:
        prompts = [[1, 2, 3, 4]] if tokenizer is None else [encode(tokenizer, "Hello", args.chat)]
    if not gd.cuda_device_available():
        print("graphdecode: no CUDA device; the engine needs one", file=sys.stderr)
        return 1

    options = dict(max_batch=args.max_batch, max_context=args.max_context, use_graphs=not args.eager)
    if args.speculate_ngram:
        options["speculative"] = gd.Speculative(max_draft_tokens=args.speculate_ngram,
                                                proposer="ngram")
    t0 = time.perf_counter()
    if args.checkpoint:
        engine = gd.Engine.from_checkpoint(args.checkpoint, **options)
    else:
        engine = gd.Engine.synthetic(args.synthetic, seed=args.seed or 1, **options)
    print(f"engine: {engine.model_config} on cuda:{engine.device}, "
          f"built in {time.perf_counter() - t0:.1f} s", flush=True)

    stops = stop_tokens(tokenizer)
    sampling = gd.Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                           seed=args.seed)
    try:
        requests = [engine.submit(ids, max_new_tokens=args.max_new_tokens, stop_tokens=stops,
                                  sampling=sampling) for ids in prompts]
    except gd.Error as e:  # e.g. a prompt longer than --max-context
        print(f"refused: {e.field} = {e.value}: {e.message}", file=sys.stderr)
        return 2

    # Stream request 0: decode the whole completion each time and print what is new, so
    # multi-token characters and leading spaces come out right.
    print("\n--- streaming request 0 ---")
    shown = ""
    for _ in requests[0]:
        if tokenizer is None:
            print(requests[0].tokens[-1], end=" ", flush=True)
            continue
        text = tokenizer.decode(requests[0].tokens, skip_special_tokens=True)
        print(text[len(shown):], end="", flush=True)
        shown = text
    print()
    engine.run_until_idle()

    print("\n--- all requests ---")
    for i, (ids, r) in enumerate(zip(prompts, requests)):
        if tokenizer is None:
            print(f"[{i}] prompt {ids} -> {r.tokens}")
        else:
            prompt = tokenizer.decode(ids, skip_special_tokens=True)
            completion = tokenizer.decode(r.tokens, skip_special_tokens=True)
            print(f"[{i}] {prompt!r} -> {completion!r}  ({len(r.tokens)} tokens)")

    s = engine.stats()
    print(f"\nstats: {s.steps} steps ({s.prefill_steps} prefill, {s.decode_steps} decode, "
          f"{s.graph_steps} by graph replay), {s.prompt_tokens} prompt + {s.generated_tokens} "
          f"generated tokens, {s.tokens_per_s:.0f} tok/s, decode step p50 {s.decode_p50_us:.0f} us")
    if s.spec_rows:
        print(f"speculative: {s.tokens_per_spec_row:.2f} tokens per request-step, "
              f"{s.accepted_tokens}/{s.drafted_tokens} drafts accepted")

    if args.check_hf:
        if not args.checkpoint or args.temperature > 0:
            print("--check-hf compares greedy runs of a checkpoint", file=sys.stderr)
            return 2
        engine.close()
        ref = hf_greedy(args.checkpoint, prompts, args.max_new_tokens, stops)
        same = sum(r.tokens == t for r, t in zip(requests, ref))
        print(f"transformers greedy: {same}/{len(ref)} requests token-identical")
        for i, (r, t) in enumerate(zip(requests, ref)):
            if r.tokens != t:
                k = next((j for j, (a, b) in enumerate(zip(r.tokens, t)) if a != b),
                         min(len(r.tokens), len(t)))
                print(f"  [{i}] first difference at token {k}: ours {r.tokens[k:k + 5]}, "
                      f"transformers {t[k:k + 5]}")
        return 0 if same == len(ref) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
