#!/usr/bin/env python3
"""EAGLE-1/2 and EAGLE-3 drafts against a PyTorch EAGLE head from the same target state (no network).

A target (hf_spec_parity.py's: 4-layer Llama, llama3 rope scaling, untied) is trained on the period
task of hf_parity.py (decisive greedy predictions). An EAGLE-1 head is written here in plain torch
as SafeAILab/EAGLE's cnets1.py computes it:
    x = fc(cat(embed(token_{t+1}), h_t))          h_t: the target's state AFTER its final norm
    y = LlamaDecoderLayer(x)                       (layer 0: no input_layernorm)
    logits = target.lm_head(y)                     (no final norm; y feeds the next draft)
randomly initialized and, with --head-train-steps > 0, trained briefly on the target's states
(cross-entropy of the token after next, as EAGLE's classification loss), then saved as a head
directory (config.json + model.safetensors, EAGLE's tensor names, bf16). Then:
  ours   examples/model_parity --checkpoint TARGET --eagle HEAD --k K, graphs on and off: greedy
         speculative decoding, every step's drafts and committed tokens in its JSON;
  HF     target.generate(do_sample=False) (fp32 on the bf16 weights, eager attention);
  torch  for every step of ours and every request: the PyTorch head's K drafts from the state
         before that step (prompt + tokens committed so far; the target's states recomputed),
         d_1 from the pair (last committed token, h_{P-1}), d_j+1 from (d_j, the head's own y).
--eagle-version 3: an EAGLE-3 head instead (SGLang's / vLLM's llama_eagle3.py, written here):
    x = fc(cat(s_{p0}, s_{p1}, s_{p2}))            s_p: the target's residual stream entering
                                                   layer p (HF output_hidden_states[p]); config
                                                   eagle_aux_hidden_state_layer_ids [0, 1, 2] =
                                                   layer outputs, so p = 1, 2, 3
    c = cat(input_layernorm(embed(token_{t+1})), hidden_norm(x))
    x = x + o_proj(attention(c)); y = x + mlp(post_attention_layernorm(x))
    draft id = argmax lm_head(norm(y)) over a draft vocabulary of half the target's (the task's
    ids and random others), target id = draft id + d2t[draft id]; later drafts feed y back as x
saved as LlamaForCausalLMEagle3 (config.json, fc / midlayer.* / norm / lm_head bf16, d2t I64,
t2d BOOL) and trained briefly on the target's states like the EAGLE-1 head.
PASS: our tokens == HF greedy (every prompt, every token), and our drafts == the PyTorch head's,
compared up to the first mismatch of each request-step; a mismatch counts as a near-tie (reported,
at most max(--max-near-ties, --near-tie-share of the compared drafts) allowed) only where the
PyTorch head's top-2 gap is within --tol-rel of its largest logit. Later drafts feed the head's own
output back (bf16 here, fp32 in torch), so their near-ties grow with k: on the H200, k 4, 64
tokens, 5 of 329 drafts differed, all at gaps of 0.10-0.49% of the largest logit. --dry-run: no binary; "ours" is simulated by the PyTorch head (checks the script).

  python3 scripts/hf_eagle_parity.py --binary ./build/examples/model_parity
  python3 scripts/hf_eagle_parity.py --device cpu --dry-run --train-steps 150 --train-batch 16 \\
      --head-train-steps 60 --new-tokens 24
  python3 scripts/hf_eagle_parity.py --eagle-version 3 ...   (either command, an EAGLE-3 head)
"""
import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import make_prompts, run_checked, task_batch, train  # noqa: E402
from hf_spec_parity import greedy, make_pair  # noqa: E402


# ---- the EAGLE-1 head in plain torch (parameter names = EAGLE's checkpoint names) ---------------

class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


class Attention(torch.nn.Module):
    def __init__(self, c, in_dim=None):
        super().__init__()
        in_dim = in_dim or c.hidden_size  # EAGLE-3: 2 hidden, cat(embedding, state)
        self.hq, self.hkv = c.num_attention_heads, c.num_key_value_heads
        self.d = c.hidden_size // c.num_attention_heads
        self.q_proj = torch.nn.Linear(in_dim, self.hq * self.d, bias=False)
        self.k_proj = torch.nn.Linear(in_dim, self.hkv * self.d, bias=False)
        self.v_proj = torch.nn.Linear(in_dim, self.hkv * self.d, bias=False)
        self.o_proj = torch.nn.Linear(self.hq * self.d, c.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.hq, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.hkv, self.d).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        rot = lambda t: torch.cat((-t[..., self.d // 2:], t[..., :self.d // 2]), dim=-1)  # noqa
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k = k.repeat_interleave(self.hq // self.hkv, dim=1)
        v = v.repeat_interleave(self.hq // self.hkv, dim=1)
        s = (q @ k.transpose(2, 3)) / math.sqrt(self.d)
        mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        s = s.masked_fill(~mask, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj((s @ v).transpose(1, 2).reshape(b, n, -1))


class MLP(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = torch.nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):  # cnets1.LlamaDecoderLayer with index 0: no input_layernorm
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(x, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = torch.nn.Linear(2 * c.hidden_size, c.hidden_size, bias=True)
        self.layers = torch.nn.ModuleList([Layer(c)])
        self.rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config=c)

    def forward(self, embeds, hidden):
        """embeds, hidden: [b, n, H] for head positions 0 .. n - 1 -> y [b, n, H]."""
        x = self.fc(torch.cat((embeds, hidden), dim=-1))
        pos = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = self.rotary(x, pos)
        return self.layers[0](x, cos.to(x.dtype), sin.to(x.dtype))


# ---- the EAGLE-3 head in plain torch (parameter names = SGLang's / SpecForge's checkpoint names) --

AUX_LAYER_IDS = [0, 1, 2]  # config ids (layer outputs); capture points id + 1 = 1, 2, 3


class Layer3(torch.nn.Module):  # llama_eagle3.LlamaDecoderLayer: q/k/v over cat(embedding, state)
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, 2 * c.hidden_size)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, embeds, x, cos, sin):
        c = torch.cat((self.input_layernorm(embeds), self.hidden_norm(x)), dim=-1)
        x = x + self.self_attn(c, cos, sin)  # the residual is the un-normed state
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(torch.nn.Module):
    def __init__(self, c, draft_ids):
        super().__init__()
        self.fc = torch.nn.Linear(3 * c.hidden_size, c.hidden_size, bias=False)
        self.midlayer = Layer3(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = torch.nn.Linear(c.hidden_size, len(draft_ids), bias=False)
        self.rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config=c)
        self.register_buffer("draft_ids", torch.tensor(draft_ids, dtype=torch.long),
                             persistent=False)

    def forward(self, embeds, x):
        """embeds, x: [b, n, H] (x: fc of the target's states, or the head's own y) -> y."""
        pos = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = self.rotary(x, pos)
        return self.midlayer(embeds, x, cos.to(x.dtype), sin.to(x.dtype))

    def draft_logits(self, y):
        return self.lm_head(self.norm(y))


def target_aux(target, ids):
    """cat(s_1, s_2, s_3) of ids [b, n]: the residual stream entering layers id + 1 (HF's
    hidden_states[i] is the input of layer i)."""
    hs = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1] for i in AUX_LAYER_IDS], dim=-1)


def make_draft_ids(vocab, seed):
    """Half the vocabulary: every id of the period task ([32, 208)) and random others, sorted."""
    rng = np.random.default_rng(seed + 21)
    task = set(range(32, 208))
    others = [i for i in rng.permutation(vocab).tolist() if i not in task]
    return sorted(task | set(others[:vocab // 2 - len(task)]))


def train_head3(head, target, steps, batch, seq_len, device, seed):
    """Head row j (token_{j+1}, a_j) predicts token_{j+2} over the draft vocabulary."""
    gen = torch.Generator(device=device).manual_seed(seed + 11)
    opt = torch.optim.AdamW([p for n, p in head.named_parameters()], lr=2e-3)
    t2d = torch.full((target.config.vocab_size,), -1, dtype=torch.long, device=device)
    t2d[head.draft_ids] = torch.arange(len(head.draft_ids), device=device)
    head.train()
    for step in range(steps):
        x, mask = task_batch(batch, seq_len, gen, device)
        with torch.no_grad():
            a = target_aux(target, x)
            emb = target.model.embed_tokens(x)
        y = head(emb[:, 1:], head.fc(a[:, :-1]))
        logits = head.draft_logits(y[:, :-1]).float()
        want = t2d[x[:, 2:]]
        m = mask[:, 1:] & (want >= 0)
        loss = torch.nn.functional.cross_entropy(logits[m], want[m])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            acc = (logits.argmax(-1) == want)[m].float().mean().item()
            print(f"  head step {step:4d}  loss {loss.item():.4f}  acc {acc:.4f}", flush=True)
    head.eval()


def save_head3(head, config, path):
    os.makedirs(path, exist_ok=True)
    d = config.to_dict()
    d.update(num_hidden_layers=1, architectures=["LlamaForCausalLMEagle3"], model_type="llama",
             bias=False, torch_dtype="bfloat16", draft_vocab_size=len(head.draft_ids),
             eagle_config={"use_aux_hidden_state": True,
                           "eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS})
    d.pop("dtype", None)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=1)
    tensors = {n: p.detach().to(torch.bfloat16).contiguous().cpu()
               for n, p in head.state_dict().items() if not n.startswith("rotary")}
    ids = head.draft_ids.cpu()
    tensors["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64).contiguous()
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    save_file(tensors, os.path.join(path, "model.safetensors"))


@torch.no_grad()
def torch_drafts3(head, target, seq, k):
    ids = torch.tensor([seq], device=target.lm_head.weight.device)
    x = head.fc(target_aux(target, ids)[:, :-1])           # from a_0 .. a_{P-1}
    emb = target.model.embed_tokens(ids[:, 1:])            # token_1 .. token_P
    drafts, gaps = [], []
    for _ in range(k):
        y = head(emb, x)
        logits = head.draft_logits(y[:, -1]).float()[0]
        top = logits.topk(2).values
        gaps.append(float((top[0] - top[1]) / logits.abs().max()))
        d = int(head.draft_ids[int(logits.argmax())])
        drafts.append(d)
        emb = torch.cat((emb, target.model.embed_tokens(torch.tensor([[d]], device=ids.device))), 1)
        x = torch.cat((x, y[:, -1:]), 1)                   # the head's own y, no fc
    return drafts, gaps


def target_states(target, ids):
    """The target's final-normed states h_0 .. h_{n-1} of ids [b, n]."""
    return target.model(input_ids=ids).last_hidden_state


def train_head(head, target, steps, batch, seq_len, device, seed):
    """EAGLE's classification loss: head row j (token_{j+1}, h_j) predicts token_{j+2}."""
    gen = torch.Generator(device=device).manual_seed(seed + 11)
    opt = torch.optim.AdamW([p for n, p in head.named_parameters()], lr=2e-3)
    head.train()
    for step in range(steps):
        x, mask = task_batch(batch, seq_len, gen, device)
        with torch.no_grad():
            h = target_states(target, x)
            emb = target.model.embed_tokens(x)
        y = head(emb[:, 1:], h[:, :-1])                  # rows j = 0 .. n - 2
        logits = target.lm_head(y[:, :-1]).float()       # predicts x[:, 2:]
        m = mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[m], x[:, 2:][m])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            acc = (logits.argmax(-1) == x[:, 2:])[m].float().mean().item()
            print(f"  head step {step:4d}  loss {loss.item():.4f}  acc {acc:.4f}", flush=True)
    head.eval()


def save_head(head, config, path):
    os.makedirs(path, exist_ok=True)
    d = config.to_dict()
    d.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], model_type="llama",
             bias=True, torch_dtype="bfloat16")
    d.pop("dtype", None)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=1)
    tensors = {n: p.detach().to(torch.bfloat16).contiguous().cpu()
               for n, p in head.state_dict().items() if not n.startswith("rotary")}
    save_file(tensors, os.path.join(path, "model.safetensors"))


# ---- the PyTorch head's drafts from a state -----------------------------------------------------

@torch.no_grad()
def torch_drafts(head, target, seq, k):
    """K greedy drafts after seq (prompt + committed, its last token at P = len - 1), with each
    draft's top-2 gap relative to its largest logit."""
    if isinstance(head, Eagle3Head):
        return torch_drafts3(head, target, seq, k)
    ids = torch.tensor([seq], device=target.lm_head.weight.device)
    h = target_states(target, ids)[:, :-1]                 # h_0 .. h_{P-1}
    emb = target.model.embed_tokens(ids[:, 1:])            # token_1 .. token_P
    drafts, gaps = [], []
    for _ in range(k):
        y = head(emb, h)
        logits = target.lm_head(y[:, -1]).float()[0]
        top = logits.topk(2).values
        gaps.append(float((top[0] - top[1]) / logits.abs().max()))
        d = int(logits.argmax())
        drafts.append(d)
        emb = torch.cat((emb, target.model.embed_tokens(torch.tensor([[d]], device=ids.device))), 1)
        h = torch.cat((h, y[:, -1:]), 1)
    return drafts, gaps


def simulate_ours(head, target, prompts, new_tokens, k):
    """The script's own greedy speculative run (--dry-run): drafts by the PyTorch head, verified
    by the target's greedy tokens; the JSON layout of model_parity --eagle."""
    steps, tokens = [], []
    seqs = []
    for p in prompts:
        ids = torch.tensor([p], device=target.lm_head.weight.device)
        seqs.append(list(p) + [int(target(input_ids=ids).logits[0, -1].argmax())])
    while min(len(s) - len(p) for s, p in zip(seqs, prompts)) < new_tokens:
        step = {"drafts": [], "committed": []}
        for r, s in enumerate(seqs):
            if len(s) - len(prompts[r]) >= new_tokens:  # done: sits the step out, as ours does
                step["drafts"].append([])
                step["committed"].append([])
                continue
            drafts, _ = torch_drafts(head, target, s, k)
            ids = torch.tensor([s + drafts], device=target.lm_head.weight.device)
            picks = target(input_ids=ids).logits[0, len(s) - 1:].argmax(-1).tolist()
            a = 0
            while a < k and drafts[a] == picks[a]:
                a += 1
            committed = drafts[:a] + [picks[a]]
            step["drafts"].append(drafts)
            step["committed"].append(committed)
            seqs[r] = s + committed
        steps.append(step)
    for s, p in zip(seqs, prompts):
        tokens.append(s[len(p):len(p) + new_tokens])
    drafted = k * sum(1 for st in steps for c in st["committed"] if c)
    accepted = sum(len(c) - 1 for st in steps for c in st["committed"] if c)
    return {"tokens": tokens, "steps": steps, "drafted": drafted, "accepted": accepted}


def compare_drafts(head, target, prompts, meta, k, tol_rel):
    """Per request-step: our drafts vs the PyTorch head's from the state before the step."""
    # The state before step 0: prompt + the prefill's token (our first generated token).
    seqs = [list(p) + [meta["tokens"][r][0]] for r, p in enumerate(prompts)]
    equal = compared = 0
    near, bad = [], []
    for s, step in enumerate(meta["steps"]):
        for r in range(len(prompts)):
            got = step["drafts"][r]
            if not got:  # the request already had its new tokens: it sat this step out
                continue
            want, gaps = torch_drafts(head, target, seqs[r], k)
            for j in range(k):
                compared += 1
                if got[j] == want[j]:
                    equal += 1
                    continue
                (near if gaps[j] <= tol_rel else bad).append((s, r, j, got[j], want[j], gaps[j]))
                break  # later drafts follow different tokens
            seqs[r] = seqs[r] + step["committed"][r]
    return equal, compared, near, bad


def run_ours(binary, target_dir, head_dir, prompts_file, new_tokens, k, graphs, out):
    cmd = [binary, "--checkpoint", target_dir, "--eagle", head_dir, "--prompts", prompts_file,
           "--new-tokens", str(new_tokens), "--graphs", graphs, "--out", out, "--k", str(k)]
    run_checked(cmd)
    return json.load(open(out + ".json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="./build/examples/model_parity")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="no binary: ours simulated in torch")
    ap.add_argument("--train-steps", type=int, default=1500)
    ap.add_argument("--train-batch", type=int, default=64)
    ap.add_argument("--head-train-steps", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tol-rel", type=float, default=0.03)
    ap.add_argument("--max-near-ties", type=int, default=2)
    ap.add_argument("--near-tie-share", type=float, default=0.02)
    ap.add_argument("--init-range", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--eagle-version", type=int, choices=[1, 3], default=1)
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"device {args.device}")
    work = args.workdir or tempfile.mkdtemp(prefix="gd_eagle_parity_")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    seq_len = 40 + args.new_tokens
    config, _ = make_pair(args.init_range)
    print(f"target: training ({config.num_hidden_layers} layers, hidden {config.hidden_size})")
    torch.manual_seed(args.seed)
    model = transformers.LlamaForCausalLM(config).to(args.device)
    train(model, args.train_steps, args.train_batch, seq_len, args.device, args.seed)
    target_dir = os.path.join(work, "target")
    model.to(torch.bfloat16).save_pretrained(target_dir, safe_serialization=True)
    del model
    # Everything below in fp32 on the bf16 weights (what both sides read).
    target = transformers.LlamaForCausalLM.from_pretrained(
        target_dir, dtype=torch.float32, attn_implementation="eager").to(args.device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    hc = make_pair(args.init_range, layers=1)[0]  # the target's config with one layer
    torch.manual_seed(args.seed + 1)
    v3 = args.eagle_version == 3
    head = (Eagle3Head(hc, make_draft_ids(config.vocab_size, args.seed)) if v3
            else EagleHead(hc)).to(args.device)
    for n, p in head.named_parameters():  # HF's init: N(0, init_range), norms 1, biases 0
        if n.endswith("norm.weight"):
            torch.nn.init.ones_(p)
        elif n.endswith("bias"):
            torch.nn.init.zeros_(p)
        else:
            torch.nn.init.normal_(p, std=args.init_range)
    if args.head_train_steps > 0:
        print(f"EAGLE head: training {args.head_train_steps} steps on the target's states")
        (train_head3 if v3 else train_head)(head, target, args.head_train_steps,
                                            args.train_batch, seq_len, args.device, args.seed)
    head_dir = os.path.join(work, "eagle3" if v3 else "eagle")
    (save_head3 if v3 else save_head)(head, hc, head_dir)
    with torch.no_grad():  # the saved bf16 values, in fp32 (rotary's inv_freq stays fp32)
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    head.eval()
    prompts, _, _ = make_prompts(rng, args.new_tokens)
    pf = os.path.join(work, "prompts.txt")
    with open(pf, "w") as f:
        f.writelines(" ".join(map(str, p)) + "\n" for p in prompts)
    hf = greedy(target, prompts, args.new_tokens, args.device)
    runs = []
    if args.dry_run:
        with torch.no_grad():
            runs.append(("torch simulated (dry run)",
                         simulate_ours(head, target, prompts, args.new_tokens, args.k)))
    else:
        for graphs in ["on", "off"]:
            runs.append((f"ours, graphs {graphs}",
                         run_ours(args.binary, target_dir, head_dir, pf, args.new_tokens, args.k,
                                  graphs, os.path.join(work, f"ours_{graphs}"))))
    all_ok = True
    print(f"\n{'run':<28} {'= HF greedy':>11} {'drafts = torch':>16} {'near-ties':>9} "
          f"{'accepted':>12}")
    for label, meta in runs:
        same = all(meta["tokens"][i] == hf[i] for i in range(len(prompts)))
        equal, compared, near, bad = compare_drafts(head, target, prompts, meta, args.k,
                                                    args.tol_rel)
        allowed = max(args.max_near_ties, int(args.near_tie_share * compared))
        ok = same and not bad and len(near) <= allowed
        all_ok &= ok
        print(f"{label:<28} {'yes' if same else 'NO':>11} {f'{equal}/{compared}':>16} "
              f"{len(near):>9} {str(meta['accepted']) + '/' + str(meta['drafted']):>12}")
        for s, r, j, g, w, gap in near:
            print(f"  near-tie: step {s} request {r} draft {j + 1}: ours {g}, torch {w}, "
                  f"top-2 gap {gap:.4f} of the largest logit")
        for s, r, j, g, w, gap in bad:
            print(f"  MISMATCH: step {s} request {r} draft {j + 1}: ours {g}, torch {w}, "
                  f"top-2 gap {gap:.4f} of the largest logit (tol {args.tol_rel})")
        for i in range(len(prompts)):
            if meta["tokens"][i] != hf[i]:
                print(f"  prompt {i}: tokens differ from HF greedy")
    version = "3" if v3 else "1/2"
    print(f"\nEAGLE-{version} head, k {args.k}, new tokens {args.new_tokens}; OVERALL:",
          "PASS" if all_ok else "FAIL",
          f"(checkpoints in {work})")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
