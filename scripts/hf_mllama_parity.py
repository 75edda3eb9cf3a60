#!/usr/bin/env python3
"""Parity of graphdecode's Mllama text decoder (gated cross-attention layers) with transformers.

A small MllamaForCausalLM (6 layers, cross-attention layers 1 and 4, hidden 256, 4 q / 2 kv heads
of 64, vocab 512 + 8 input ids, llama3 rope scaling, untied) is randomly initialized in
transformers, its tanh gates set to 0.5 (HF starts them at 0: the cross layers off), then trained
(fp32 AdamW) on two tasks that make every prediction decisive:
  - text only (no encoder states, the cross layers skipped as HF skips them): hf_parity.py's
    period task, a pattern of P in 2..12 distinct ids from the block [16P, 16P + 16) repeated;
  - image: the sequence is <|image|> (id 512, an input id past the output vocabulary) and a chain
    in a block of 16 ids [256 + 16b, 256 + 16b + 16): y[t+1] = y[t] + s (mod 16 inside the block),
    the step s = 2c + 1 set by the image class c in 0..7. The class is only in the encoder states:
    every state is code[c] + N(0, 0.5^2) noise (code[c] a fixed random vector of RMS 1), so the
    model must read the cross-attention to continue the chain, whatever the number of states.
    Training draws one length per step, log-uniform in [1, 1200] (the test lengths' range).
It is saved as bf16 safetensors; transformers runs it (eager attention, no cache: every step
recomputes the sequence with the request's own cross_attention_states, or None for a text-only
request) in fp32 (the reference) and bf16 (HF's own bf16 error band); examples/model_parity runs
one batch of six requests whose encoder lengths are 17, 0, 1, 64 (a page multiple), 1100 and 0,
graphs on and off. PASS per request: HF fp32's continuation is the task's; our greedy tokens equal
HF fp32's for all --new-tokens steps; at every step max|ours - hf_fp32| <= tol * max|hf_fp32|,
tol = max(--tol-rel, 2 x HF bf16's own worst error on that request): bf16 tolerance, as
transformers' bf16 evaluation of the same weights sets it.

Controls that must FAIL the same check (the bug class it exists for: an engine that uses one
request's encoder length for the whole batch at graph replay): model_parity
--control-encoder-len-of K gives every request request K's length, for K = 0 (17 keys) and K = 1
(text only); the script exits 1 if a control passes. It also prints how far the image requests'
logits move when their states are dropped (the cross layers matter).

  python3 scripts/hf_mllama_parity.py --binary ./build-gpu/examples/model_parity
  python3 scripts/hf_mllama_parity.py --device cpu --dry-run --train-steps 300 --new-tokens 16
      (no binary, no GPU: training + HF only)

Flags: --train-steps (default 2000), --train-batch (32 per task), --new-tokens (64), --tol-rel
(0.03), --device (cuda), --dry-run, --seed, --workdir (keeps the checkpoint and outputs there).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import margin, run_checked, worst_rel  # noqa: E402

VOCAB = 512
IMAGE_TOKEN = VOCAB          # the first of the 8 input-only ids
HIDDEN = 256
MAX_PERIOD = 12              # text task: period P in [2, 12], ids [16P, 16P + 16)
BLOCK = 16
CHAIN_BASE = 256             # image task: blocks [256 + 16b, 256 + 16b + 16), b in 0..7
CHAIN_BLOCKS = 8
CLASSES = 8                  # image class c: chain step 2c + 1
NOISE = 0.5
TRAIN_MAX_LEN = 1200         # encoder lengths drawn in training: log-uniform in [1, 1200]
# The parity batch: (encoder length, prompt length, text tokens before <|image|>); 0 = text only.
# The last two start with text (a chat template's header): transformers' vision flow masks those
# rows (full_text_row_masked_out_mask: their cross MLP term is dropped).
REQUESTS = [(17, 6, 0), (0, 17, 0), (1, 9, 0), (64, 33, 0), (1100, 40, 0), (0, 5, 0), (17, 12, 3),
            (64, 20, 6)]
MAX_PREFIX = 6               # training: 0..6 text tokens before <|image|> on half of the rows


def make_model(seed):
    config = transformers.MllamaTextConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, cross_attention_layers=[1, 4],
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=3,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64})
    torch.manual_seed(seed)
    model = transformers.MllamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_gate"):
                p.fill_(0.5)  # HF's 0 switches the cross layers off and starves their gradients
    return model


def class_codes(seed):
    g = torch.Generator().manual_seed(seed + 12345)
    return torch.randn(CLASSES, HIDDEN, generator=g)


def encoder_states(codes, cls, length, gen):
    """[len(cls), length, HIDDEN] float32, rounded through bf16 (what both sides get)."""
    noise = torch.randn(len(cls), length, HIDDEN, generator=gen) * NOISE
    return (codes[cls][:, None, :] + noise).to(torch.bfloat16).float()


def text_batch(batch, length, gen):
    period = torch.randint(2, MAX_PERIOD + 1, (batch, 1), generator=gen)
    pattern = torch.rand(batch, BLOCK, generator=gen).argsort(dim=1)
    pos = torch.arange(length)
    x = pattern.gather(1, pos[None, :] % period) + BLOCK * period
    return x, pos[None, :-1] >= period - 1  # targets determined once t + 1 - P >= 0


def chain(start, step, length):
    """The chain of `length` ids from id `start` with step `step` inside start's block."""
    base = CHAIN_BASE + (start - CHAIN_BASE) // BLOCK * BLOCK
    return [base + (start - base + step * t) % BLOCK for t in range(length)]


def text_prefix(n, gen):
    """n ids of the text task's blocks (what a template header would be: not the chain's)."""
    return [int(t) for t in torch.randint(2 * BLOCK, CHAIN_BASE, (n,), generator=gen)]


def row_mask(prefixes, length):
    """transformers' full_text_row_masked_out_mask [B, 1, length, 1]: 0 on rows before the image."""
    m = torch.ones(len(prefixes), 1, length, 1)
    for b, n in enumerate(prefixes):
        m[b, 0, :n, 0] = 0
    return m


def image_batch(batch, length, gen):
    cls = torch.randint(0, CLASSES, (batch,), generator=gen)
    start = CHAIN_BASE + torch.randint(0, CHAIN_BLOCKS * BLOCK, (batch,), generator=gen)
    # Half of the rows start with 1..MAX_PREFIX text tokens, masked as transformers masks them.
    prefixes = [int(torch.randint(1, MAX_PREFIX + 1, (1,), generator=gen)) if b % 2 else 0
                for b in range(batch)]
    rows = [(text_prefix(n, gen) + [IMAGE_TOKEN] + chain(int(s), 2 * int(c) + 1, length))[:length]
            for s, c, n in zip(start, cls, prefixes)]
    x = torch.tensor(rows)
    mask = torch.ones(batch, length - 1, dtype=torch.bool)
    for b, n in enumerate(prefixes):
        mask[b, :n + 1] = False  # the prefix, the image token and the first chain id are free
    return x, mask, cls, row_mask(prefixes, length)


def train(model, codes, steps, batch, seq_len, device, seed, lr=2e-3):
    gen = torch.Generator().manual_seed(seed)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / max(steps, 1)))
    t0 = time.time()

    def losses(n):
        xt, mt = text_batch(n, seq_len, gen)
        xi, mi, cls, rows_i = image_batch(n, seq_len, gen)
        u = float(torch.rand(1, generator=gen))
        length = max(1, min(TRAIN_MAX_LEN, int(round(TRAIN_MAX_LEN ** u))))
        st = encoder_states(codes, cls, length, gen).to(device)
        out = []
        for x, m, states, rows in ((xt, mt, None, None), (xi, mi, st, rows_i)):
            x, m = x.to(device), m.to(device)
            rows = None if rows is None else rows.to(device)
            logits = model(input_ids=x, cross_attention_states=states,
                           full_text_row_masked_out_mask=rows, use_cache=False).logits[:, :-1].float()
            tgt = x[:, 1:]
            out.append((torch.nn.functional.cross_entropy(logits[m], tgt[m]),
                        (logits.argmax(-1) == tgt)[m].float().mean().item()))
        return out

    for step in range(steps):
        (lt, at), (li, ai) = losses(batch)
        loss = lt + li
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  step {step:4d}  text loss {lt.item():.4f} acc {at:.4f}  image loss "
                  f"{li.item():.4f} acc {ai:.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        (lt, at), (li, ai) = losses(128)
    print(f"  trained {steps} steps in {time.time() - t0:.1f} s: held-out text acc {at:.4f}, "
          f"image acc {ai:.4f}")


def make_requests(codes, new_tokens, rng):
    """The parity batch: prompts, expected continuations, encoder states [len, HIDDEN] or None."""
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    prompts, expected, states, what = [], [], [], []
    for enc_len, n, prefix in REQUESTS:
        if enc_len == 0:
            p = int(rng.integers(2, min(MAX_PERIOD, n) + 1))
            pattern = rng.permutation(BLOCK)[:p] + BLOCK * p
            seq = [int(pattern[t % p]) for t in range(n + new_tokens)]
            states.append(None)
            what.append(f"text P={p}")
        else:
            c = int(rng.integers(CLASSES))
            start = CHAIN_BASE + int(rng.integers(CHAIN_BLOCKS * BLOCK))
            seq = (text_prefix(prefix, gen) + [IMAGE_TOKEN] +
                   chain(start, 2 * c + 1, n - 1 - prefix + new_tokens))
            states.append(encoder_states(codes, torch.tensor([c]), enc_len, gen)[0])
            what.append(f"image c={c}" + (f" +{prefix}" if prefix else ""))
        prompts.append(seq[:n])
        expected.append(seq[n:])
    return prompts, expected, states, what


def hf_generate(model, prompts, states, new_tokens, dtype, device, prefixes):
    """Greedy, no cache: each step recomputes the sequence with the request's own states (and
    transformers' row mask where text precedes the image)."""
    toks, logits = [], []
    with torch.no_grad():
        for p, st, prefix in zip(prompts, states, prefixes):
            seq = list(p)
            cross = None if st is None else st[None].to(device=device, dtype=dtype)
            out_t, out_l = [], []
            for _ in range(new_tokens):
                ids = torch.tensor([seq], device=device)
                rows = (row_mask([prefix], len(seq)).to(device=device, dtype=dtype)
                        if cross is not None and prefix else None)
                last = model(input_ids=ids, cross_attention_states=cross,
                             full_text_row_masked_out_mask=rows,
                             use_cache=False).logits[0, -1].float()
                t = int(last.argmax())
                out_t.append(t)
                out_l.append(last.cpu().numpy())
                seq.append(t)
            toks.append(out_t)
            logits.append(np.stack(out_l))
    return toks, logits


def hf_eval(ckpt, dtype, prompts, states, new_tokens, device, prefixes):
    model = transformers.MllamaForCausalLM.from_pretrained(
        ckpt, dtype=dtype, attn_implementation="eager").to(device).eval()
    return hf_generate(model, prompts, states, new_tokens, dtype, device, prefixes)


def run_ours(binary, ckpt, prompts_file, enc_file, lens, new_tokens, graphs, out, control=-1,
             firsts=None):
    cmd = [binary, "--checkpoint", ckpt, "--prompts", prompts_file, "--new-tokens",
           str(new_tokens), "--graphs", graphs, "--out", out, "--encoders", enc_file,
           "--encoder-lens", ",".join(map(str, lens))]
    if firsts is not None:
        cmd += ["--encoder-first-positions", ",".join(map(str, firsts))]
    if control >= 0:
        cmd += ["--control-encoder-len-of", str(control)]
    run_checked(cmd)
    meta = json.load(open(out + ".json"))
    raw = np.fromfile(out + ".f32", dtype=np.float32)
    return meta, raw.reshape(meta["steps"], meta["batch"], meta["vocab"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="./build-gpu/examples/model_parity")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="training + HF only, no binary")
    ap.add_argument("--train-steps", type=int, default=2000)
    ap.add_argument("--train-batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--tol-rel", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"device {args.device}")
    work = args.workdir or tempfile.mkdtemp(prefix="gd_mllama_parity_")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(args.seed)

    codes = class_codes(args.seed)
    model = make_model(args.seed)
    print("mllama: training")
    longest_prompt = max(n for _, n, _ in REQUESTS)
    train(model, codes, args.train_steps, args.train_batch, longest_prompt + args.new_tokens,
          args.device, args.seed)
    ckpt = os.path.join(work, "mllama")
    model.to(torch.bfloat16).save_pretrained(ckpt, safe_serialization=True)
    del model

    prompts, expected, states, what = make_requests(codes, args.new_tokens, rng)
    lens = [enc_len for enc_len, _, _ in REQUESTS]
    firsts = [prefix if enc_len else 0 for enc_len, _, prefix in REQUESTS]
    pf = os.path.join(work, "prompts.txt")
    with open(pf, "w") as f:
        f.writelines(" ".join(map(str, p)) + "\n" for p in prompts)
    enc_file = os.path.join(work, "encoders.bf16")
    blob = [s.to(torch.bfloat16).view(torch.int16).numpy() for s in states if s is not None]
    np.concatenate([b.reshape(-1) for b in blob]).tofile(enc_file)

    ref_toks, ref = hf_eval(ckpt, torch.float32, prompts, states, args.new_tokens, args.device,
                            firsts)
    bf_toks, bf = hf_eval(ckpt, torch.bfloat16, prompts, states, args.new_tokens, args.device,
                          firsts)
    # How much the cross layers matter: the image requests without their states.
    no_toks, no = hf_eval(ckpt, torch.float32, prompts, [None] * len(prompts), args.new_tokens,
                          args.device, firsts)
    all_ok, rows, warnings = True, [], []
    hf_info = []
    for i in range(len(prompts)):
        task_ok = ref_toks[i] == expected[i]
        bf_rel, bf_div = worst_rel(ref[i], bf[i], ref_toks[i], bf_toks[i])
        hf_info.append((task_ok, bf_rel, bf_div, margin(ref[i])))
        all_ok &= task_ok
        if lens[i] > 0:
            rel, div = worst_rel(ref[i], no[i], ref_toks[i], no_toks[i])
            print(f"  request {i} ({what[i]}, encoder_len {lens[i]}) without its states: worst "
                  f"rel {rel:.3f}, first token divergence {'-' if div is None else div}")
            if div is None:
                warnings.append(f"request {i}: dropping its encoder states changes no token")

    def check(meta, ours, label):
        """Per request: (ok, why, rel, div) against HF fp32."""
        res = []
        for i, (task_ok, bf_rel, _, _) in enumerate(hf_info):
            rel, div = worst_rel(ref[i], ours[:, i, :], ref_toks[i], meta["tokens"][i])
            tol = max(args.tol_rel, 2 * bf_rel)
            why = [w for w, bad in [("task", not task_ok), ("tokens", div is not None),
                                    ("logits", rel > tol)] if bad]
            res.append((not why, why, rel, div))
        return res

    runs = [] if args.dry_run else ["on", "off"]
    if not runs:
        for i, (task_ok, bf_rel, bf_div, gap) in enumerate(hf_info):
            rows.append(("-", i, what[i], lens[i], len(prompts[i]), task_ok, gap, bf_rel, bf_div,
                         None, None, "OK" if task_ok else "FAIL"))
    for graphs in runs:
        meta, ours = run_ours(args.binary, ckpt, pf, enc_file, lens, args.new_tokens, graphs,
                              os.path.join(work, f"ours_{graphs}"), firsts=firsts)
        print(f"graphs={graphs}: graph steps {meta['graph_steps']}, eager steps "
              f"{meta['eager_steps']}")
        for i, (ok, why, rel, div) in enumerate(check(meta, ours, graphs)):
            task_ok, bf_rel, bf_div, gap = hf_info[i]
            all_ok &= ok
            rows.append((graphs, i, what[i], lens[i], len(prompts[i]), task_ok, gap, bf_rel,
                         bf_div, rel, div, "PASS" if ok else "FAIL " + ",".join(why)))
    controls = []
    for k in ([] if args.dry_run else [0, 1]):
        meta, ours = run_ours(args.binary, ckpt, pf, enc_file, lens, args.new_tokens, "on",
                              os.path.join(work, f"control_{k}"), control=k, firsts=firsts)
        res = check(meta, ours, f"control {k}")
        caught = [i for i, (ok, _, _, _) in enumerate(res) if not ok]
        controls.append((k, caught, res))
        all_ok &= bool(caught)

    # The row-mask control: ours without the first image positions must fail the requests whose
    # text precedes the image (and only those can).
    masked = [i for i, f in enumerate(firsts) if f]
    unmasked_caught = None
    if not args.dry_run and masked:
        meta, ours = run_ours(args.binary, ckpt, pf, enc_file, lens, args.new_tokens, "on",
                              os.path.join(work, "control_rows"))
        res = check(meta, ours, "control rows")
        unmasked_caught = [i for i in masked if not res[i][0]]
        all_ok &= bool(unmasked_caught)

    print(f"\nlogit metric: per step max|x - hf_fp32| / max|hf_fp32|, worst step shown; "
          f"tol max({args.tol_rel}, 2 x hf_bf16). margin: smallest hf_fp32 top-2 gap on the path. div: first step "
          f"whose greedy token differs from hf_fp32 (- = none).")
    print(f"{'graphs':<6} {'req':>3} {'what':<11} {'enc':>5} {'len':>4} {'hf=task':<7} "
          f"{'margin':>7} {'hf_bf16':>8} {'div':>4} {'ours':>8} {'div':>4}  result")
    for (g, i, w, e, n, task_ok, gap, bf_rel, bf_div, rel, div, res) in rows:
        ours_s = "-" if rel is None else f"{rel:.4f}"
        print(f"{g:<6} {i:>3} {w:<11} {e:>5} {n:>4} {'yes' if task_ok else 'NO':<7} {gap:>7.3f} "
              f"{bf_rel:>8.4f} {'-' if bf_div is None else bf_div:>4} {ours_s:>8} "
              f"{'-' if div is None else div:>4}  {res}")
    for k, caught, res in controls:
        print(f"control: every request at request {k}'s encoder length ({lens[k]}): "
              f"{'CAUGHT' if caught else 'NOT CAUGHT (FAIL)'} on requests {caught}")
        for i, (ok, why, rel, div) in enumerate(res):
            print(f"    request {i} (enc {lens[i]}): worst rel {rel:.4f}, div "
                  f"{'-' if div is None else div}: {'passes' if ok else 'fails ' + ','.join(why)}")
    if unmasked_caught is not None:
        print(f"control: rows before the image not masked (requests {masked}): "
              f"{'CAUGHT' if unmasked_caught else 'NOT CAUGHT (FAIL)'} on requests "
              f"{unmasked_caught}")
    for w in warnings:
        print("WARNING:", w)
    print(f"\nnew tokens {args.new_tokens} per request; OVERALL:", "PASS" if all_ok else "FAIL",
          f"(work dir {work})")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
