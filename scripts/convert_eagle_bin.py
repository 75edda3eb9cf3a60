#!/usr/bin/env python3
"""Converts an EAGLE-1/2 head released as PyTorch pickles (SafeAILab/EAGLE: config.json +
pytorch_model.bin, e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B) into the directory graphdecode loads
(load_eagle_head / --eagle DIR): config.json + model.safetensors with the same tensor names
(fc.weight, fc.bias, layers.0.*, embed_tokens.weight). No network: download the files first.

  python3 scripts/convert_eagle_bin.py SRC_DIR DST_DIR [--drop-embedding] [--dtype bf16|keep]

--drop-embedding leaves embed_tokens.weight out (the head then uses the target's embedding, as
EAGLE's own code does when it loads the base model's; saves vocab x hidden of memory).
Tensors are written as bf16 by default (what the engine runs; the loader would round F32/F16 on
every load otherwise). The weights are loaded with torch.load(weights_only=True): no code runs.
"""
import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

EAGLE3 = ("d2t", "t2d")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--drop-embedding", action="store_true")
    ap.add_argument("--dtype", choices=["bf16", "keep"], default="bf16")
    args = ap.parse_args()
    bin_path = os.path.join(args.src, "pytorch_model.bin")
    config_path = os.path.join(args.src, "config.json")
    for p in (bin_path, config_path):
        if not os.path.isfile(p):
            print(f"convert_eagle_bin: missing {p}", file=sys.stderr)
            return 1
    state = torch.load(bin_path, map_location="cpu", weights_only=True)
    if any(k in state for k in EAGLE3) or any(k.startswith("midlayer.") for k in state):
        print("convert_eagle_bin: an EAGLE-3 head (d2t / midlayer.*): not supported yet",
              file=sys.stderr)
        return 1
    out = {}
    for name, t in state.items():
        if name == "embed_tokens.weight" and args.drop_embedding:
            continue
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if args.dtype == "bf16" and t.is_floating_point():
            t = t.to(torch.bfloat16)
        out[name] = t.contiguous()
    os.makedirs(args.dst, exist_ok=True)
    save_file(out, os.path.join(args.dst, "model.safetensors"))
    shutil.copyfile(config_path, os.path.join(args.dst, "config.json"))
    with open(config_path) as f:
        config = json.load(f)
    print(f"convert_eagle_bin: {len(out)} tensors -> {args.dst} "
          f"(hidden {config.get('hidden_size')}, layers {config.get('num_hidden_layers')}, "
          f"fc bias {'fc.bias' in out}, own embedding {'embed_tokens.weight' in out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
