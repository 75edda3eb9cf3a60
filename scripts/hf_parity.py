#!/usr/bin/env python3
"""Parity of graphdecode's Llama-family model with Hugging Face transformers (no network).

Builds small random models in transformers (LlamaForCausalLM with llama3 rope scaling; Qwen2 with
sliding-window layers whose window is 16 tokens), saves them as bf16 safetensors, runs HF greedy
generation (eager attention) per prompt, runs examples/model_parity with --graphs on and off on
the same prompts (different lengths, longer than the window), and compares greedy tokens (all
new tokens, every prompt) and logits (max abs diff relative to the logit scale, up to the first
divergence). Prints a PASS/FAIL table; exits 1 on any failure.

  python3 scripts/hf_parity.py --binary ./build-gpu/examples/model_parity [--new-tokens 64]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers


def make_models(init_range):
    llama = transformers.LlamaConfig(
        vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        initializer_range=init_range,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    qwen_kw = dict(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
        initializer_range=init_range, use_sliding_window=True, sliding_window=16,
        max_window_layers=2)
    qwen = transformers.Qwen2Config(**qwen_kw)
    if hasattr(qwen, "layer_types") and qwen.layer_types is not None:
        # Spell the per-layer kinds explicitly (newer transformers): layers >= 2 slide.
        qwen.layer_types = ["full_attention" if i < 2 else "sliding_attention" for i in range(4)]
    return [("llama", llama, transformers.LlamaForCausalLM),
            ("qwen2-swa16", qwen, transformers.Qwen2ForCausalLM)]


def hf_generate(model, prompts, new_tokens):
    toks, logits = [], []
    # No stop token: greedy over the raw logits for exactly new_tokens (min_new_tokens would
    # mask the eos logit and change HF's picks).
    model.generation_config.eos_token_id = None
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens,
                             output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0)
        toks.append(out.sequences[0, len(p):].tolist())
        logits.append(torch.stack([l[0].float() for l in out.logits]).cpu().numpy())
    return toks, logits  # [prompt][step], [prompt] -> [steps][vocab]


def run_ours(binary, ckpt, prompts_file, new_tokens, graphs, out):
    cmd = [binary, "--checkpoint", ckpt, "--prompts", prompts_file, "--new-tokens",
           str(new_tokens), "--graphs", graphs, "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    meta = json.load(open(out + ".json"))
    raw = np.fromfile(out + ".f32", dtype=np.float32)
    logits = raw.reshape(meta["steps"], meta["batch"], meta["vocab"])
    return meta, logits


def compare(name, graphs, prompts, hf_toks, hf_logits, meta, ours, tol_rel):
    ok = True
    rows = []
    for i, p in enumerate(prompts):
        ot = meta["tokens"][i]
        ht = hf_toks[i]
        div = next((s for s in range(len(ht)) if s >= len(ot) or ot[s] != ht[s]), None)
        upto = len(ht) if div is None else div + 1
        h = hf_logits[i][:upto]
        o = ours[:upto, i, :]
        scale = float(np.abs(h).max())
        diff = float(np.abs(h - o).max())
        rel = diff / max(scale, 1e-12)
        top1 = all(int(np.argmax(h[s])) == int(np.argmax(o[s])) for s in range(upto)
                   if div is None or s < div)
        good = div is None and rel < tol_rel and top1
        note = ""
        if div is not None:
            hs = np.sort(hf_logits[i][div])[::-1]
            note = (f"diverged at step {div}: hf {ht[div]} ours {ot[div]}; hf top1-top2 gap "
                    f"{hs[0] - hs[1]:.4g}, ours logit gap "
                    f"{ours[div, i, ot[div]] - ours[div, i, ht[div]]:.4g}")
        rows.append((name, graphs, i, len(p), "PASS" if good else "FAIL", diff, scale, rel, note))
        ok &= good
    return ok, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="./build-gpu/examples/model_parity")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--tol-rel", type=float, default=0.1)
    ap.add_argument("--init-range", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--hf-dtype", choices=["bf16", "fp32"], default="bf16",
                    help="dtype HF computes in, on the same bf16 checkpoint (fp32 = exact "
                         "reference of the bf16 weights, no bf16 ties in HF's logits)")
    args = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"HF computes in {args.hf_dtype}")
    work = args.workdir or tempfile.mkdtemp(prefix="gd_parity_")
    lengths = [5, 17, 33, 40]
    rng = np.random.default_rng(args.seed)
    all_ok = True
    table = []
    for name, config, cls in make_models(args.init_range):
        torch.manual_seed(args.seed)
        model = cls(config).to(torch.bfloat16)
        ckpt = os.path.join(work, name)
        model.save_pretrained(ckpt, safe_serialization=True)
        hf_dtype = torch.bfloat16 if args.hf_dtype == "bf16" else torch.float32
        model = cls.from_pretrained(ckpt, torch_dtype=hf_dtype,
                                    attn_implementation="eager").to("cuda").eval()
        prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in lengths]
        pf = os.path.join(work, name + "_prompts.txt")
        with open(pf, "w") as f:
            f.writelines(" ".join(map(str, p)) + "\n" for p in prompts)
        with torch.no_grad():
            hf_toks, hf_logits = hf_generate(model, prompts, args.new_tokens)
        del model
        torch.cuda.empty_cache()
        for graphs in ["on", "off"]:
            meta, ours = run_ours(args.binary, ckpt, pf, args.new_tokens, graphs,
                                  os.path.join(work, f"{name}_{graphs}"))
            ok, rows = compare(name, graphs, prompts, hf_toks, hf_logits, meta, ours,
                               args.tol_rel)
            print(f"{name} graphs={graphs}: graph steps {meta['graph_steps']}, "
                  f"eager steps {meta['eager_steps']}")
            all_ok &= ok
            table += rows
    print(f"\n{'model':<12} {'graphs':<6} {'prompt':>6} {'len':>4} {'result':<6} "
          f"{'max|dlogit|':>11} {'max|logit|':>10} {'rel':>8}  note")
    for (m, g, i, n, res, diff, scale, rel, note) in table:
        print(f"{m:<12} {g:<6} {i:>6} {n:>4} {res:<6} {diff:>11.4g} {scale:>10.4g} {rel:>8.4g}  "
              f"{note}")
    print("\nOVERALL:", "PASS" if all_ok else "FAIL", f"(work dir {work})")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
