#!/usr/bin/env python3
"""Makes a small Hugging Face checkpoint that speaks: a byte-level BPE tokenizer and a 4-layer
Llama trained to recite a short text, saved as bf16 safetensors with its tokenizer files.

    python3 python/examples/make_tiny_checkpoint.py /tmp/tiny-llama      # ~20 s on an H100
    python3 python/examples/generate.py --checkpoint /tmp/tiny-llama --prompt "Each step"

For machines that cannot download a model: generate.py's text path (tokenize, run, detokenize)
then runs on a real checkpoint directory whose completions can be read. Needs torch (CUDA),
transformers and tokenizers.
"""

from __future__ import annotations

import argparse
import time

TEXT = """\
Each step of the engine plans a batch, writes one image of its inputs, copies it to the device \
once and replays one captured graph. The graph derives every page table and sequence length \
from that image, runs the model, samples the next token of every request and writes it where \
the next step reads it. The host waits once per step, for the tokens, and hands them to the \
callbacks. A request that asks for too much is refused by name, and the others keep running. \
Speculative decoding drafts a few tokens, verifies them in one pass and keeps the accepted \
prefix, so a greedy request gets exactly the tokens it would have had without drafts.
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="directory to write")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--vocab", type=int, default=384)
    args = p.parse_args()

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    t0 = time.perf_counter()
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([TEXT], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    # Every sentence is also its own sequence, so a prompt that starts a sentence (no leading
    # space, as a user types it) is a context the model has seen; the whole text comes first.
    sentences = [s.strip() + "." for s in TEXT.replace("\n", " ").split(". ") if s.strip()]
    sentences[-1] = sentences[-1].rstrip(".") + "."
    seqs = [tok(t)["input_ids"] + [tok.eos_token_id] for t in [TEXT.strip()] + sentences]
    n = max(len(q) for q in seqs)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=768,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    pad = tok.eos_token_id
    x = torch.tensor([q + [pad] * (n - len(q)) for q in seqs], device="cuda")
    labels = torch.tensor([q + [-100] * (n - len(q)) for q in seqs], device="cuda")
    for step in range(args.steps):
        loss = model(x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {loss.item():.4f}", flush=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    print(f"wrote {args.out}: {len(tok)} tokens of vocabulary, {len(seqs)} sequences of <= {n} tokens, "
          f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
