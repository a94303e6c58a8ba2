"""Function-preserving rewrites before quantizing (issue 33), measured in
torch: column balancing absorbed into the producers, offline Hadamard
rotations (R1 on the residual stream, R2 per head), and both.

  chroot.sh transforms.py run MODEL OUT.json [--blocks N]
  chroot.sh transforms.py table RUN.json... [--out RESULTS.json]   (markdown tables)

`run` loads /mnt/models/MODEL, rewrites it with every transform of
TRANSFORMS (in float64, cast once to BF16), checks that each rewritten BF16
model computes the function of the original (logits on the held-out
blocks, against the BF16 rounding floor of `noise_floor`; also in float64
without the cast, on 4 blocks: transformers' RMSNorm computes in float32
even in a float64 model, so a rotation, which changes the residual stream,
differs there by float32 rounding), then fake-quantizes each
(fakequant.py) with every preset of PRESETS and measures it against the
ORIGINAL BF16 model on the held-out blocks (kld.py's per-block sums and
paired bootstrap). --transforms and --presets choose a subset (variants:
balance-nncf05, rotate-r1, rotate-b32); --outliers K,F runs the stress
test of `inject_outliers_` (then the source is the injected model);
`table` merges runs and prints the tables of docs/accuracy.md.

These are torch prototypes: the weights are replaced by what
compressed-tensors would dequantize (fakequant.py), not ctquant's output.

Transforms, for the two families of tools/accuracy/models (Llama and
Qwen3: RMSNorm x * g, no biases; the rules are in `check_family`):

balance (W <- W diag(1/t), the producer absorbs t), for each group of
  Linears that read the same input:
    q/k/v      t into input_layernorm's g
    gate/up    t into post_attention_layernorm's g
    down       t into up_proj's rows (silu(gate) * up is linear in up)
    o          t into v_proj's rows, one t per KV head shared by the query
               heads of its GQA group (query head i reads KV head i // rep)
  The final norm feeds lm_head, which is not quantized: it is never
  rescaled (a tied head would need the embedding rescaled too).
  Two scales t per input column j, over the rows of every consumer:
    nncf   t_j = mean_i |W_ij| (NNCF's data-free AWQ, 2.17: the weight is
           multiplied by 1 / mean|W| per input channel and the previous
           node by its inverse), divided by its median
    sinq   Pre-SINQ (huawei-csl/SINQ, arXiv 2509.22944): per block of
           `group` input columns, a Sinkhorn-style iteration that divides
           rows and columns by their standard deviations (log domain, steps
           clamped) and keeps the column scales of the least imbalanced
           iterate (max std / min std over rows and columns); the row
           scales are dropped (they would change the function); t divided
           by its median; n_repeat passes over the model (8 iterations,
           one pass by default).
rotate: untie the head; fold every norm's g into its consumers (q/k/v,
  gate/up, lm_head) and set g to 1; x -> x Q on the residual stream with
  Q = D H / sqrt(n) (Sylvester Hadamard, D random signs of a fixed seed):
  embedding E Q, o_proj and down_proj Q^T W, consumers W Q. R2 per head:
  v_proj rows R^T per KV head, o_proj columns R per query head, R a
  head_dim Hadamard. Sizes that are not a power of two: H = H_k (x) H_2^m
  with H_k a known Hadamard of order k (12, 20, 28, 36, 40, 52, 60, ...; as
  compressed-tensors' random-hadamard and QuaRot do), else refuse.
rotate+balance: rotate, then balance the rotated model (balance first
  would be undone by the folding of g).
"""
import argparse
import copy
import json
import math
import sys
import time

import numpy as np
import torch

import common
import fakequant as fq
import kld


# --- presets: fake quantization of every Linear but lm_head ---------------

PRESETS = {
    "W4A16 min-max": (128, lambda w: fq.int_minmax(w, 4, 128, True)),
    "W4A16 mse": (128, lambda w: fq.int_mse(w, 4, 128, True)),
    "W4A16 refit": (128, lambda w: fq.int_refit(w, 4, 128, True)),
    "W4A16_ASYM min-max": (128, lambda w: fq.int_minmax(w, 4, 128, False)),
    "W3 g128 min-max": (128, lambda w: fq.int_minmax(w, 3, 128, True)),
    "MXFP4A16 min-max": (32, lambda w: fq.mxfp4(w, 32)),
}


# --- the family rules -------------------------------------------------------

def check_family(model):
    """Refuses what the rewrites do not keep: only Llama and Qwen3 (RMSNorm
    x * g with no bias, pre-norm blocks, no attention/MLP biases)."""
    cfg = model.config
    problems = []
    if cfg.model_type not in ("llama", "qwen3"):
        problems.append(f"model_type {cfg.model_type}: no rule (Gemma's 1 + g norms, post-norms, "
                        "MLA, biased LayerNorm are refused)")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        problems.append("biases on Linears: not handled")
    for name, mod in model.named_modules():
        if name.endswith("norm") and "RMSNorm" not in type(mod).__name__:
            problems.append(f"{name}: {type(mod).__name__} is not an RMSNorm")
        if name.endswith("norm") and getattr(mod, "bias", None) is not None:
            problems.append(f"{name}: a norm with a bias")
    if problems:
        raise SystemExit("transforms.py: " + "; ".join(problems))


def layers(model):
    return model.model.layers


# --- balance ----------------------------------------------------------------

def scale_nncf(ws, group=None, alpha=1.0):
    """t_j = (mean over every consumer row of |W_ij|)^alpha, over its median
    (alpha 1: NNCF's data-free scale; 0.5: half-way, as SmoothQuant's)."""
    t = torch.cat(ws, 0).abs().mean(0).clamp_min(1e-12) ** alpha
    return t / t.median()


def _imbalance(x):
    sr, sc = x.std(1), x.std(0)
    return torch.maximum(sr.max(), sc.max()) / torch.minimum(sr.min(), sc.min()).clamp_min(1e-12)


def _sinkhorn_cols(m, iters, lo=1e-3, hi=1e3):
    """Column scales c of m [rows, cols] such that m / c / r (r: row scales)
    has balanced row and column standard deviations: each step divides by
    the stds relative to the smallest one, the step factor clamped to
    [0.7, 2] and the log scales to [-0.3, 10]; returns the c of the least
    imbalanced iterate (c = 1 when none beats m itself)."""
    lc = torch.zeros(m.shape[1], dtype=m.dtype)
    lr = torch.zeros(m.shape[0], 1, dtype=m.dtype)
    target = torch.minimum(m.std(1).clamp(lo, hi).min(), m.std(0).clamp(lo, hi).min())
    best, best_c = _imbalance(m), torch.ones_like(lc)
    for _ in range(iters):
        x = m / lc.exp() / lr.exp()
        sc = x.std(0).clamp(lo, hi)
        sr = x.std(1).clamp(lo, hi)
        lc = (lc + (sc / target).clamp(0.7, 2.0).log()).clamp(-0.3, 10.0)
        lr = (lr + (sr[:, None] / target).clamp(0.7, 2.0).log()).clamp(-0.3, 10.0)
        ib = _imbalance(m / lc.exp() / lr.exp())
        if ib < best:
            best, best_c = ib, lc.exp()
        else:
            break  # imbalance rose: keep the best so far
    return best_c


def scale_sinq(ws, group, iters=8):
    """Pre-SINQ's column scale: Sinkhorn per block of `group` columns of the
    consumers stacked by rows, over its median."""
    w = torch.cat(ws, 0)
    n = w.shape[1]
    g = group if n % group == 0 else n
    t = torch.cat([_sinkhorn_cols(w[:, b:b + g], iters) for b in range(0, n, g)])
    return t / t.median()


def balance_(model, method, group=128, iters=8, repeat=1, scope=("down", "vo", "qkv", "gateup")):
    """Column balancing absorbed into the producers (float64 model)."""
    cfg = model.config
    hd = cfg.head_dim
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    nkv = cfg.num_key_value_heads
    fn = {"nncf": scale_nncf,
          "nncf05": lambda ws, g: scale_nncf(ws, g, 0.5),
          "sinq": lambda ws, g: scale_sinq(ws, g, iters)}[method]
    with torch.no_grad():
        for _ in range(repeat):
            for L in layers(model):
                a, m = L.self_attn, L.mlp
                if "down" in scope:
                    t = fn([m.down_proj.weight], group)
                    m.down_proj.weight.div_(t)
                    m.up_proj.weight.mul_(t[:, None])
                if "vo" in scope:
                    wo = a.o_proj.weight  # [hidden, heads * hd]; head i reads kv head i // rep
                    # rows of every query head of a KV head's group stacked:
                    # [rep * hidden, nkv * hd], one column per v_proj row
                    stk = wo.reshape(wo.shape[0], nkv, rep, hd).permute(2, 0, 1, 3)
                    stk = stk.reshape(rep * wo.shape[0], nkv * hd)
                    # the block is head_dim at most: a scale never mixes heads
                    t = fn([stk], min(group, hd))
                    a.v_proj.weight.mul_(t[:, None])
                    a.o_proj.weight.div_(t.reshape(nkv, 1, hd).expand(nkv, rep, hd).reshape(-1))
                if "qkv" in scope:
                    t = fn([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], group)
                    for lin in (a.q_proj, a.k_proj, a.v_proj):
                        lin.weight.div_(t)
                    L.input_layernorm.weight.mul_(t)
                if "gateup" in scope:
                    t = fn([m.gate_proj.weight, m.up_proj.weight], group)
                    for lin in (m.gate_proj, m.up_proj):
                        lin.weight.div_(t)
                    L.post_attention_layernorm.weight.mul_(t)
    return model


# --- rotate -----------------------------------------------------------------

def hadamard(n, seed=None, dtype=torch.float64):
    """Orthogonal H D / sqrt(n): Sylvester's construction (n a power of two)
    times random signs D of a fixed seed (none: D = 1). Other sizes would
    take a known Hadamard of order k times H_2^m (k * 2^m = n); not needed
    by these models, so refused here."""
    if n & (n - 1):
        raise SystemExit(f"hadamard: {n} is not a power of two (needs a known H_k, k * 2^m = n)")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = h / math.sqrt(n)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        d = torch.randint(0, 2, (n,), generator=g).to(dtype) * 2 - 1
        h = d[:, None] * h  # D H: still orthogonal
    return h


def untie_(model):
    if model.config.tie_word_embeddings or \
            model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
        model.config.tie_word_embeddings = False
        if hasattr(model, "_tied_weights_keys"):
            model._tied_weights_keys = None


def rotate_(model, seed=0, r2=True, block=None):
    """R1 on the residual stream (and R2 per head when r2), float64 model.
    block: R1 block-diagonal, one Hadamard of that order per block of the
    hidden size (I (x) H_block: orthogonal too), else one of the hidden size."""
    cfg = model.config
    hd, nkv = cfg.head_dim, cfg.num_key_value_heads
    nh = cfg.num_attention_heads
    untie_(model)
    n = cfg.hidden_size
    if block:
        q = torch.block_diag(*[hadamard(block, None if seed is None else seed + 7 + k)
                               for k in range(n // block)])
    else:
        q = hadamard(n, seed)
    r = hadamard(hd, None if seed is None else seed + 1)
    with torch.no_grad():
        # fold every norm's g into its consumers, g <- 1
        for L in layers(model):
            a, m = L.self_attn, L.mlp
            for norm, cons in ((L.input_layernorm, (a.q_proj, a.k_proj, a.v_proj)),
                               (L.post_attention_layernorm, (m.gate_proj, m.up_proj))):
                for lin in cons:
                    lin.weight.mul_(norm.weight)
                norm.weight.fill_(1.0)
        model.lm_head.weight.mul_(model.model.norm.weight)
        model.model.norm.weight.fill_(1.0)
        # x -> x Q
        e = model.model.embed_tokens.weight
        e.copy_(e @ q)
        for L in layers(model):
            a, m = L.self_attn, L.mlp
            for lin in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj):
                lin.weight.copy_(lin.weight @ q)
            for lin in (a.o_proj, m.down_proj):
                lin.weight.copy_(q.T @ lin.weight)
            if r2:
                wv = a.v_proj.weight.reshape(nkv, hd, -1)
                a.v_proj.weight.copy_(torch.einsum("dk,hdi->hki", r, wv).reshape(nkv * hd, -1))
                wo = a.o_proj.weight.reshape(-1, nh, hd)
                a.o_proj.weight.copy_((wo @ r).reshape(-1, nh * hd))
        model.lm_head.weight.copy_(model.lm_head.weight @ q)
    return model


def inject_outliers_(model, k, f, seed=1):
    """A stress test, not a real model: per layer, k hidden channels of
    each norm (seeded) get g / f and the columns of its consumers W * f,
    which keeps the function and makes the outlier weight columns that
    large LLMs have and these small models lack."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for L in layers(model):
            a, m = L.self_attn, L.mlp
            for norm, cons in ((L.input_layernorm, (a.q_proj, a.k_proj, a.v_proj)),
                               (L.post_attention_layernorm, (m.gate_proj, m.up_proj))):
                idx = torch.randperm(norm.weight.shape[0], generator=g)[:k]
                norm.weight[idx] /= f
                for lin in cons:
                    lin.weight[:, idx] *= f
    return model


# --- building the variants --------------------------------------------------

def to_bf16_(model):
    """Casts every parameter once to BF16 (what a checkpoint holds), then to
    float32 for the evaluation (as measure.py runs)."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16).to(torch.float32)
    return model.float()


def rewrite(base64, name, group, sinq=(8, 1), seed=0):
    """The float64 model rewritten by transform `name` (a deep copy)."""
    m = copy.deepcopy(base64)
    steps = name.split("+")
    for s in steps:
        if s == "rotate":
            rotate_(m, seed)
        elif s.startswith("rotate-b"):  # block-diagonal R1, e.g. rotate-b32
            rotate_(m, seed, block=int(s[len("rotate-b"):]))
        elif s == "rotate-r1":  # R1 only
            rotate_(m, seed, r2=False)
    for s in steps:
        if s.startswith("balance-"):
            method = s[len("balance-"):]
            it, rep = sinq if method == "sinq" else (0, 1)
            balance_(m, method, group, it, rep)
    return m


TRANSFORMS = ["none", "balance-nncf", "balance-sinq", "rotate", "rotate+balance-nncf",
              "rotate+balance-sinq"]


def load_base(model_name):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(f"{common.MODELS}/{model_name}", dtype=torch.bfloat16,
                                             device_map="cpu")
    m.eval()
    check_family(m)
    return m


def noise_floor(base64, seed=0):
    """The BF16 rounding floor: every parameter plus a uniform error of at
    most half a BF16 unit in the last place (ulp = 2^(floor(log2 |w|) - 7)),
    not rounded again: the error one rounding to BF16 of a recomputed
    weight makes, with no rewrite at all."""
    m = copy.deepcopy(base64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            ulp = torch.pow(2.0, torch.floor(torch.log2(p.abs().clamp_min(1e-30))) - 7)
            u = torch.rand(p.shape, generator=g, dtype=torch.float64) - 0.5
            p.add_(u * ulp)
    return m.float()


def weight_stats(model, fn=None):
    """Mean excess kurtosis of the rows of the quantized Linears and, with
    fn, their relative weight error sum |Q(W) - W|^2 / sum |W|^2."""
    kurt, num, den = [], 0.0, 0.0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            w = mod.weight.detach().double()
            z = (w - w.mean(1, keepdim=True)) / w.std(1, keepdim=True)
            kurt.append(float((z ** 4).mean(1).mean() - 3))
            if fn is not None:
                num += float(((fn(w.float()).double() - w) ** 2).sum())
                den += float((w ** 2).sum())
    out = {"row_kurtosis": float(np.mean(kurt))}
    if fn is not None:
        out["rel_weight_err"] = num / den
    return out


# --- evaluation -------------------------------------------------------------

@torch.no_grad()
def stats(source, models, blocks, batch=8, dtype=torch.float32):
    """kld.FIELDS per block for each model against source, and the largest
    |logit difference| over scored tokens."""
    half = blocks.shape[1] // 2
    out = {k: np.zeros((blocks.shape[0], len(kld.FIELDS))) for k in models}
    maxdiff = {k: 0.0 for k in models}
    for b0 in range(0, blocks.shape[0], batch):
        ids = torch.from_numpy(blocks[b0:b0 + batch])
        tgt = ids[:, half + 1:]
        zs = source(ids).logits[:, half:-1].double()
        ls = torch.log_softmax(zs, -1)
        ps = ls.exp()
        nll_s = -ls.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        top_s = ls.argmax(-1)
        for k, m in models.items():
            zq = m(ids).logits[:, half:-1].double()
            maxdiff[k] = max(maxdiff[k], float((zq - zs).abs().max()))
            lq = torch.log_softmax(zq, -1)
            kl = (ps * (ls - lq)).sum(-1)
            tv = 0.5 * (ps - lq.exp()).abs().sum(-1)
            nll_q = -lq.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            top = (lq.argmax(-1) == top_s).double()
            st = torch.stack([kl.sum(-1), tv.sum(-1), top.sum(-1), nll_s.sum(-1), nll_q.sum(-1),
                              torch.full_like(kl[:, 0], kl.shape[1])], -1)
            out[k][b0:b0 + ids.shape[0]] = st.numpy()
    return out, maxdiff


def quantized(model, fn):
    return fq.quantize_model_(copy.deepcopy(model), fn)


def variant_key(name, group):
    """Only Pre-SINQ's scale depends on the group (its Sinkhorn blocks)."""
    return name if group == 128 or "sinq" not in name else f"{name} (block {group})"


def cmd_run(args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    t0 = time.time()
    blocks = common.heldout_blocks()[:args.blocks]
    base = load_base(args.model)
    if args.outliers:
        k, f = args.outliers.split(",")
        base = to_bf16_(inject_outliers_(copy.deepcopy(base).double(), int(k), float(f)))
    source = copy.deepcopy(base).float()
    base64 = copy.deepcopy(base).double()
    names = ["none"] + [n for n in args.transforms.split(",") if n != "none"]
    presets = {k: PRESETS[k] for k in (args.presets.split(",") if args.presets else PRESETS)}
    res = {"model": args.model, "blocks": int(blocks.shape[0]), "fields": list(kld.FIELDS),
           "sinq": {"iters": args.sinq_iters, "repeat": args.sinq_repeat}, "seed": 0,
           "function": {}, "quant": {}}

    res["outliers"] = args.outliers or None
    # 1. function kept: float64 without a cast (4 blocks), and BF16
    few = blocks[:0 if args.no_function else 4]
    fwd64 = {}
    bf16 = {"bf16 rounding floor": noise_floor(base64)}
    groups = sorted({g for g, _ in presets.values()}, key=lambda g: (g != 128, g))
    for name in names[1:]:
        for grp in groups:
            key = variant_key(name, grp)
            if key in bf16:
                continue  # nncf and rotate do not depend on the group
            m = rewrite(base64, name, grp, (args.sinq_iters, args.sinq_repeat))
            if grp == groups[0]:
                fwd64[key] = m
            bf16[key] = to_bf16_(copy.deepcopy(m))
    s64, d64 = stats(base64, fwd64, few, dtype=torch.float64)
    sbf, dbf = stats(source, bf16, blocks[:0 if args.no_function else len(blocks)])
    for k in bf16:
        if args.no_function:
            continue
        sm = kld.summary(sbf[k])
        res["function"][k] = {"bf16": {"max_abs_logit_diff": dbf[k], "kld": sm["kld"],
                                       "kld_ci": kld.bootstrap(sbf[k]), "top1": sm["top1"]}}
        if k in fwd64:
            res["function"][k]["float64"] = {"max_abs_logit_diff": d64[k],
                                             "kld": kld.summary(s64[k])["kld"]}
        print("function", k, json.dumps(res["function"][k]), flush=True)
    print(f"[{time.time() - t0:.0f}s] function kept done", flush=True)

    # 2. KLD of each transform x preset against the original BF16 model
    rewritten = {}
    for name in names:
        for grp in sorted({g for g, _ in presets.values()}):
            if name == "none":
                rewritten[(name, grp)] = source
            else:
                rewritten[(name, grp)] = bf16[variant_key(name, grp)]
    models = {}
    res["weights"] = {}
    for preset, (grp, fn) in presets.items():
        for name in names:
            models[(preset, name)] = quantized(rewritten[(name, grp)], fn)
            if not preset.endswith("refit"):
                res["weights"].setdefault(preset, {})[name] = weight_stats(
                    rewritten[(name, grp)], fn)
    print(f"[{time.time() - t0:.0f}s] {len(models)} quantized", flush=True)
    st, _ = stats(source, {f"{p}|{n}": m for (p, n), m in models.items()}, blocks)
    for (p, n) in models:
        s = st[f"{p}|{n}"]
        e = res["quant"].setdefault(p, {})
        sm = kld.summary(s)
        e[n] = {"kld": sm["kld"], "kld_ci": kld.bootstrap(s), "top1": sm["top1"],
                "ppl_q": sm["ppl_q"], "ppl_s": sm["ppl_s"], "block_kl": s[:, 0].tolist(),
                "block_n": s[:, 5].tolist()}
    for p in res["quant"]:
        ref = st[f"{p}|none"]
        for n in res["quant"][p]:
            if n != "none":
                s = st[f"{p}|{n}"]
                res["quant"][p][n]["vs_none"] = [kld.summary(s)["kld"] - kld.summary(ref)["kld"],
                                                 kld.bootstrap(s, ref)]
                res["quant"][p][n]["ratio"] = kld.summary(s)["kld"] / kld.summary(ref)["kld"]
            print(p, n, f"{res['quant'][p][n]['kld']:.5f}", res["quant"][p][n]["kld_ci"],
                  res["quant"][p][n].get("vs_none"), flush=True)
    res["seconds"] = round(time.time() - t0, 1)
    common.write_json(args.out, res)


def _fmt_ci(ci):
    return f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def cmd_table(args):
    """Merges the run outputs into one results file and prints the
    markdown tables of docs/accuracy.md."""
    runs = {}
    for p in args.runs:
        with open(p) as f:
            r = json.load(f)
        if r.get("outliers"):  # the stress test: its own columns
            r["model"] += f" + outliers {r['outliers']}"
        if r["model"] in runs:  # a further run of the same model: merge its rows
            old = runs[r["model"]]
            old["function"].update(r["function"])
            for p_, rows in r["quant"].items():
                old["quant"].setdefault(p_, {}).update(rows)
            for p_, rows in r.get("weights", {}).items():
                old["weights"].setdefault(p_, {}).update(rows)
        else:
            runs[r["model"]] = r
    if args.out:
        common.write_json(args.out, runs)
    models = [m for m in runs if not args.models or m in args.models.split(",")]

    def ordered(keys, first):
        return [k for k in first if k in keys] + sorted(k for k in keys if k not in first)
    print("| preset | transform | " + " | ".join(
        f"{m}: KLD [95% CI] | {m}: × none | {m}: ΔKLD vs none [95% CI]" for m in models) + " |")
    print("|---|---|" + "---|---|---|" * len(models))
    for preset in ordered(runs[models[0]]["quant"], list(PRESETS)):
        for name in ordered(runs[models[0]]["quant"][preset], TRANSFORMS):
            cells = []
            for m in models:
                e = runs[m]["quant"].get(preset, {}).get(name)
                if e is None:
                    cells += ["-", "-", "-"]
                elif name == "none":
                    cells += [f"{e['kld']:.4f} {_fmt_ci(e['kld_ci'])}", "1", "baseline"]
                else:
                    d, ci = e["vs_none"]
                    verdict = "lower" if ci[1] < 0 else "higher" if ci[0] > 0 else "tied"
                    cells += [f"{e['kld']:.4f} {_fmt_ci(e['kld_ci'])}", f"{e['ratio']:.2f}",
                              f"{d:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}] {verdict}"]
            print(f"| {preset} | {name} | " + " | ".join(cells) + " |")
    print()
    print("| transform | " + " | ".join(
        f"{m}: max abs logit diff (BF16) | {m}: mean KLD (BF16) | {m}: max abs logit diff (float64)"
        for m in models) + " |")
    print("|---|" + "---|---|---|" * len(models))
    for k in ordered(runs[models[0]]["function"], ["bf16 rounding floor"] + TRANSFORMS):
        cells = []
        for m in models:
            f = runs[m]["function"].get(k)
            if f is None:
                cells += ["-", "-", "-"]
                continue
            f64 = f.get("float64", {}).get("max_abs_logit_diff")
            cells += [f"{f['bf16']['max_abs_logit_diff']:.3f}", f"{f['bf16']['kld']:.2e}",
                      "-" if f64 is None else f"{f64:.1e}"]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print()
    print("| preset | transform | " + " | ".join(
        f"{m}: row kurtosis | {m}: rel. weight error" for m in models) + " |")
    print("|---|---|" + "---|---|" * len(models))
    for preset in ordered(runs[models[0]].get("weights", {}), list(PRESETS)):
        for name in ordered(runs[models[0]]["weights"][preset], TRANSFORMS):
            cells = []
            for m in models:
                w = runs[m]["weights"].get(preset, {}).get(name)
                if w is None:
                    cells += ["-", "-"]
                    continue
                cells += [f"{w['row_kurtosis']:.2f}", f"{w['rel_weight_err']:.5f}"]
            print(f"| {preset} | {name} | " + " | ".join(cells) + " |")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("model")
    r.add_argument("out")
    r.add_argument("--blocks", type=int, default=common.EVAL_BLOCKS)
    r.add_argument("--sinq-iters", type=int, default=8)
    r.add_argument("--sinq-repeat", type=int, default=1)
    r.add_argument("--transforms", default=",".join(TRANSFORMS))
    r.add_argument("--outliers", default="", help="K,F: the stress test of inject_outliers_")
    r.add_argument("--no-function", action="store_true", help="skip the function-kept check")
    r.add_argument("--presets", default="", help="comma-separated keys of PRESETS (default all)")
    t = sub.add_parser("table")
    t.add_argument("runs", nargs="+")
    t.add_argument("--out")
    t.add_argument("--models", default="", help="comma-separated columns (default every run)")
    args = ap.parse_args(argv)
    {"run": cmd_run, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main(sys.argv[1:])
