#!/usr/bin/env python3
"""Speculative decoding against Hugging Face transformers' assisted generation (no network).

A target (4-layer Llama, llama3 rope scaling, untied) and a smaller draft (2 layers, narrower,
the same vocabulary) are randomly initialized and trained on the period task of hf_parity.py
(decisive greedy predictions), saved as bf16 safetensors, then:
  HF greedy          target.generate(do_sample=False)                        (fp32, eager)
  HF assisted        target.generate(assistant_model=draft, do_sample=False) (fp32, eager)
  ours, draft model  examples/model_parity --draft DRAFT --k K, graphs on and off
  ours, lookup       examples/model_parity --lookup --k K (prompt lookup on the device)
PASS per prompt: HF assisted == HF greedy (transformers' own losslessness), and each of ours ==
HF greedy, every token. The table adds our acceptance (drafts accepted / proposed, tokens per
step). The trained checkpoints stay in --workdir for bench/ (bench_spec.py uses them).

  python3 scripts/hf_spec_parity.py --binary ./build-gpu/examples/model_parity
  python3 scripts/hf_spec_parity.py --device cpu --dry-run --train-steps 300   (HF only)
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import PROMPT_LENS, make_prompts, run_checked, train  # noqa: E402


def make_pair(init_range, hidden=512, layers=4, draft_hidden=256, draft_layers=2):
    common = dict(vocab_size=512, max_position_embeddings=2048, rms_norm_eps=1e-5,
                  rope_theta=10000.0, tie_word_embeddings=False, initializer_range=init_range,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    target = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=8,
                                      num_key_value_heads=2, **common)
    draft = transformers.LlamaConfig(hidden_size=draft_hidden, intermediate_size=2 * draft_hidden,
                                     num_hidden_layers=draft_layers, num_attention_heads=4,
                                     num_key_value_heads=2, **common)
    return target, draft


def greedy(model, prompts, new_tokens, device, assistant=None):
    out = []
    model.generation_config.eos_token_id = None
    if assistant is not None:
        assistant.generation_config.eos_token_id = None
    for p in prompts:
        ids = torch.tensor([p], device=device)
        with torch.no_grad():
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=new_tokens, pad_token_id=0,
                                 assistant_model=assistant)
        out.append(seq[0, len(p):].tolist())
    return out


def run_ours(binary, ckpt, draft, prompts_file, new_tokens, k, graphs, out):
    cmd = [binary, "--checkpoint", ckpt, "--prompts", prompts_file, "--new-tokens",
           str(new_tokens), "--graphs", graphs, "--out", out, "--k", str(k)]
    cmd += ["--draft", draft] if draft else ["--lookup"]
    run_checked(cmd)
    return json.load(open(out + ".json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="./build-gpu/examples/model_parity")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="training + HF only, no binary")
    ap.add_argument("--train-steps", type=int, default=1500)
    ap.add_argument("--train-batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--init-range", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"device {args.device}")
    work = args.workdir or tempfile.mkdtemp(prefix="gd_spec_parity_")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    seq_len = max(PROMPT_LENS) + args.new_tokens
    ckpts, models = {}, {}
    for name, config in zip(["target", "draft"], make_pair(args.init_range)):
        print(f"{name}: training ({config.num_hidden_layers} layers, hidden {config.hidden_size})")
        torch.manual_seed(args.seed + (name == "draft"))
        model = transformers.LlamaForCausalLM(config).to(args.device)
        train(model, args.train_steps, args.train_batch, seq_len, args.device, args.seed)
        ckpts[name] = os.path.join(work, name)
        model.to(torch.bfloat16).save_pretrained(ckpts[name], safe_serialization=True)
        del model
        models[name] = transformers.LlamaForCausalLM.from_pretrained(
            ckpts[name], dtype=torch.float32, attn_implementation="eager").to(args.device).eval()
    prompts, expected, _ = make_prompts(rng, args.new_tokens)
    pf = os.path.join(work, "prompts.txt")
    with open(pf, "w") as f:
        f.writelines(" ".join(map(str, p)) + "\n" for p in prompts)
    hf = greedy(models["target"], prompts, args.new_tokens, args.device)
    hf_assisted = greedy(models["target"], prompts, args.new_tokens, args.device,
                         assistant=models["draft"])
    runs = [("HF assisted", None, hf_assisted)]
    if not args.dry_run:
        for label, draft in [("draft model", ckpts["draft"]), ("prompt lookup", None)]:
            for graphs in ["on", "off"]:
                meta = run_ours(args.binary, ckpts["target"], draft, pf, args.new_tokens, args.k,
                                graphs, os.path.join(work, f"ours_{label[0]}_{graphs}"))
                runs.append((f"ours {label}, graphs {graphs}", meta, meta["tokens"]))
    all_ok = True
    print(f"\n{'run':<32} {'prompt':>6} {'= HF greedy':>11} {'= task':>7} {'accepted':>14} "
          f"{'tok/step':>8}")
    for label, meta, toks in runs:
        for i in range(len(prompts)):
            same = toks[i] == hf[i]
            all_ok &= same
            acc = "-" if meta is None else f"{meta['accepted']}/{meta['drafted']}"
            tps = "-" if meta is None else f"{meta['tokens_per_step']:.2f}"
            print(f"{label:<32} {i:>6} {'yes' if same else 'NO':>11} "
                  f"{'yes' if hf[i] == expected[i] else 'no':>7} {acc:>14} {tps:>8}")
    print(f"\nk {args.k}, new tokens {args.new_tokens} per prompt; OVERALL:",
          "PASS" if all_ok else "FAIL", f"(checkpoints in {work})")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
