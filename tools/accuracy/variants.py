"""Variants of the refit observer, tried by fake quantization in torch before
any is built into ctquant (docs/accuracy.md, "Variants of refit tried").

  chroot.sh variants.py MODEL PRESET OUT.json [VARIANT...]

and on the host (tools/accuracy/variants_table.py) the table of
docs/accuracy.md from the OUT.json files.

MODEL is a directory of /mnt/models, PRESET w4a16 or w4a16asym (group 128).
Each VARIANT (default: the list DEFAULT) replaces every Linear's weight (not
lm_head, not the embeddings) by what compressed-tensors would dequantize
under that variant's scales and zero points; all are measured on the
held-out blocks as measure.py measures ctquant's outputs, and each is
compared pairwise with the rows ctquant's real outputs gave for the same
preset (results.json: min-max, memoryless_mse, refit) and with this script's
own unweighted refit.

The refit here follows src/scheme/refit.cpp step by step (candidates
s0 (1 + span (2k / steps - 1)), k = 0 .. steps, each with its closed-form
least-squares refit; the best predicted refit evaluated and refitted again
`refits` times; asymmetric: the same over the range, HQQ's integer zero-point
search at the best scale, then the scale with the zero point fixed) with one
addition: a weight per input column, the importance of that column's error
to the module's output. The importances tried are data-free but for "act":
  gamma2   the square of the RMSNorm weight that feeds the module (q/k/v:
           input_layernorm, gate/up: post_attention_layernorm); o_proj and
           down_proj unweighted. Its input is gamma * x_hat, x_hat of unit
           RMS, so the output error of a weight error d is about
           sum_j d_j^2 gamma_j^2 when x_hat's coordinates are alike.
  gammaN   |gamma|^N for another exponent N (gamma1 = |gamma|).
  prod     gamma2, and for o_proj and down_proj the expected square of
           their input coordinates when x_hat is N(0, I), by Monte Carlo
           with a fixed seed (o_proj: the variance of v's output channel of
           that head, which attention only averages; down_proj:
           E[(silu(gate . (gamma x_hat)) up . (gamma x_hat))^2]).
  act      the mean square of each input column over 64 blocks of training
           text (not data-free: the bound of what importances can give).
  rand     the same over blocks of tokens drawn uniformly from the
           vocabulary (no text, but the model must be run).
A suffix ":n2.4" ranks candidates by sum w |x - Q|^2.4 (memoryless_mse's
norm) instead of the squared error; ":hqqw" weights HQQ's zero-point mean;
":xE" multiplies each element's weight by |x|^E (":x2" is refit's
weight=x2); ":steps=N", ":span=F" change the candidate grid; ":only=SUFFIX"
quantizes only the modules whose name ends so (the others stay 16-bit);
":shrink" takes memoryless_mse's candidates (the range times 1 - k / 100,
k = 0 .. 19) instead; ":refits=0" drops the least-squares refits and
":hqq=0" HQQ (":shrink:refits=0:hqq=0:n2.4" is memoryless_mse, nearly).
"""
import copy
import json
import sys

import numpy as np
import torch

import common
import fakequant
import kld

RBF = fakequant._round_bf16
EPS = 2 ** -7

PRESETS = {"w4a16": (4, True), "w4a16asym": (4, False)}


def codes(g, s, z, qmin, qmax):
    v = RBF(g / s)
    v = RBF(v + z)
    return torch.clamp(torch.round(v), qmin, qmax)


def dequant(q, s, z):
    return RBF(RBF(q - z) * s)


class Search:
    """The per-group search of one Linear: g [o, ng, G], imp broadcastable
    to it; keeps the best (s, z) by the weighted error."""

    def __init__(self, g, imp, bits, symmetric, norm=2.0):
        self.g, self.imp, self.norm = g, imp, norm
        self.qmin, self.qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        self.sym = symmetric
        self.best_s = self.best_z = self.best_e = None

    def err(self, s, z):
        q = codes(self.g, s, z, self.qmin, self.qmax)
        d = (self.g - dequant(q, s, z)).abs()
        e = (self.imp * (d * d if self.norm == 2.0 else d ** self.norm)).sum(-1, keepdim=True)
        return e, q

    def consider(self, s, z):
        """Evaluates (s, z) (invalid where s is NaN or not positive);
        returns its codes."""
        ok = torch.isfinite(s) & (s > 0)
        s1 = torch.where(ok, s, torch.ones_like(s))
        e, q = self.err(s1, z)
        e = torch.where(ok, e, torch.full_like(e, float("inf")))
        if self.best_e is None:
            self.best_s, self.best_z, self.best_e = s1, z, e
        else:
            b = e < self.best_e
            self.best_e = torch.where(b, e, self.best_e)
            self.best_s = torch.where(b, s1, self.best_s)
            self.best_z = torch.where(b, z, self.best_z)
        return q

    def sums(self, q):
        w, g = self.imp, self.g
        f = lambda t: (w * t).sum(-1, keepdim=True).double()
        return f(g * q), f(q * q), f(g), f(q), f(torch.ones_like(g))

    def refit(self, q, z=None):
        """The closed-form refit of codes q: (s, z, predicted error)."""
        a, b, sx, sq, sw = self.sums(q)
        if self.sym:
            zz = torch.zeros_like(a)
        elif z is None:
            var = b * sw - sq * sq
            cov = a * sw - sx * sq
            sc = cov / var
            zz = torch.clamp(torch.round(((sc * sq - sx) / (sw * sc)).clamp(self.qmin - 1, self.qmax + 1)),
                             self.qmin, self.qmax)
            zz = torch.where(torch.isfinite(zz), zz, torch.zeros_like(zz))
        else:
            zz = z.double()
        aa = a - zz * sx
        bb = b - 2 * zz * sq + zz * zz * sw
        s = RBF((aa / bb).float())
        s = torch.where((aa > 0) & (bb > 0), s, torch.full_like(s, float("nan")))
        pred = s.double() ** 2 * bb - 2 * s.double() * aa
        pred = torch.where(torch.isfinite(pred), pred, torch.full_like(pred, float("inf")))
        return s, zz.float(), pred


def qparams_from_range(lo, hi, bits, symmetric):
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    lo = torch.minimum(lo, torch.zeros(()))
    hi = torch.maximum(hi, torch.zeros(()))
    if symmetric:
        s = RBF(torch.maximum(lo.abs(), hi) / ((qmax - qmin) / 2))
        return torch.where(s == 0, EPS, s), torch.zeros_like(s)
    s = RBF((hi - lo) / (qmax - qmin))
    s = torch.where(s == 0, EPS, s)
    return s, torch.clamp(torch.round(qmin - lo / s), qmin, qmax)


def refit(w, bits, symmetric, imp_cols=None, steps=8, span=0.2, refits=2, norm=2.0,
          hqq_weighted=False, elem=0.0, shrink=False, hqq_iters=20, group=128):
    o, i = w.shape
    g = w.to(torch.bfloat16).float().reshape(o, i // group, group)
    imp = torch.ones(1, i // group, group) if imp_cols is None else \
        imp_cols.float().reshape(1, i // group, group)
    if elem:
        imp = imp * g.abs() ** elem
    S = Search(g, imp, bits, symmetric, norm)
    lo0, hi0 = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    s0, z0 = qparams_from_range(lo0, hi0, bits, symmetric)
    q = S.consider(s0, z0)
    best_p = S.refit(q)
    def offer(p):
        nonlocal best_p
        b = p[2] < best_p[2]
        best_p = tuple(torch.where(b, x, y) for x, y in zip(p, best_p))
    factors = [1 - k / 100 for k in range(1, 20)] if shrink else \
        [float(np.float32(1 + span * (2 * k / steps - 1))) for k in range(steps + 1)]
    for f in factors:
        if f == 1.0:
            continue
        if symmetric:
            s, z = RBF(s0 * f), z0
        else:
            s, z = qparams_from_range(RBF(lo0 * f), RBF(hi0 * f), bits, symmetric)
        q = S.consider(s, z)
        if refits:
            offer(S.refit(q))
    s, z = best_p[0], best_p[1]
    for _ in range(refits):
        q = S.consider(s, z)
        s, z, _ = S.refit(q)
    if not symmetric and hqq_iters:
        hqq(S, hqq_weighted, iters=hqq_iters)
        q = codes(g, S.best_s, S.best_z, S.qmin, S.qmax)
        s, z, _ = S.refit(q, S.best_z)
        S.consider(s, z)
    q = codes(g, S.best_s, S.best_z, S.qmin, S.qmax)
    return dequant(q, S.best_s, S.best_z).reshape(o, i)


def hqq(S, weighted, p=0.7, beta=10.0, kappa=1.01, iters=20):
    g, s = S.g, S.best_s
    z = S.best_z.clone()
    last = None
    wsum = S.imp.expand_as(g).sum(-1, keepdim=True)
    for _ in range(iters):
        q = torch.clamp(torch.round(g / s + z), S.qmin, S.qmax)
        r = g - (q - z) * s
        a = r.abs()
        e = torch.sign(r) * torch.relu(a - (1.0 / beta) * a.clamp_min(1e-12) ** (p - 1))
        t = q - (g - e) / s
        z = (S.imp * t).sum(-1, keepdim=True) / wsum if weighted else t.mean(-1, keepdim=True)
        zr = torch.clamp(torch.round(z), S.qmin, S.qmax)
        if last is None or not torch.equal(zr, last):
            S.consider(s, zr)
            last = zr
        beta *= kappa


# ---- importances: {module name: per-column weights [in]} ----

def linears(model):
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and "lm_head" not in n]


def imp_gamma(model, power=2.0):
    out = {}
    for n, m in linears(model):
        layer = model.get_submodule(n.rsplit(".", 2)[0])
        short = n.rsplit(".", 1)[1]
        if short in ("q_proj", "k_proj", "v_proj"):
            out[n] = layer.input_layernorm.weight.detach().float().abs() ** power
        elif short in ("gate_proj", "up_proj"):
            out[n] = layer.post_attention_layernorm.weight.detach().float().abs() ** power
    return out


@torch.no_grad()
def imp_prod(model, samples=8192, seed=0):
    """gamma2, and o_proj / down_proj from N(0, I) inputs of the norms."""
    out = imp_gamma(model)
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    for li, layer in enumerate(model.model.layers):
        pre = f"model.layers.{li}."
        h = cfg.hidden_size
        x = torch.randn(samples, h, generator=gen)
        ga = layer.input_layernorm.weight.float()
        v = (x * ga) @ layer.self_attn.v_proj.weight.float().T  # [N, kv * hd]
        hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        var = (v * v).mean(0).reshape(cfg.num_key_value_heads, 1, hd).expand(-1, rep, -1)
        out[pre + "self_attn.o_proj"] = var.reshape(-1)
        gm = layer.post_attention_layernorm.weight.float()
        xm = torch.randn(samples, h, generator=gen) * gm
        act = torch.nn.functional.silu(xm @ layer.mlp.gate_proj.weight.float().T) * \
            (xm @ layer.mlp.up_proj.weight.float().T)
        out[pre + "mlp.down_proj"] = (act * act).mean(0)
    return out


@torch.no_grad()
def imp_act(model, n_blocks=64, seed=0, random_tokens=False):
    """Mean square of each Linear's input over blocks of training text, or
    of tokens drawn uniformly from the vocabulary (random_tokens)."""
    rng = np.random.default_rng(seed)
    if random_tokens:
        ids = torch.from_numpy(rng.integers(0, common.VOCAB_SIZE, size=(n_blocks, common.CONTEXT)))
    else:
        data = np.fromfile(common.TRAIN_TOKENS, dtype=np.uint16).astype(np.int64)
        starts = rng.integers(0, data.size - common.CONTEXT, size=n_blocks)
        ids = torch.from_numpy(np.stack([data[s:s + common.CONTEXT] for s in starts]))
    acc, hooks = {}, []
    for n, m in linears(model):
        def hook(mod, inp, out_, n=n):
            x = inp[0].reshape(-1, inp[0].shape[-1]).double()
            s, c = acc.get(n, (0, 0))
            acc[n] = (s + (x * x).sum(0), c + x.shape[0])
        hooks.append(m.register_forward_hook(hook))
    for b in range(0, n_blocks, 8):
        model(ids[b:b + 8])
    for h in hooks:
        h.remove()
    return {n: (s / c).float() for n, (s, c) in acc.items()}


IMPORTANCE = {
    "none": lambda m: {},
    "gamma2": imp_gamma,
    "gamma1": lambda m: imp_gamma(m, 1.0),
    "gamma4": lambda m: imp_gamma(m, 4.0),
    "prod": imp_prod,
    "act": imp_act,
    "rand": lambda m: imp_act(m, random_tokens=True),
}


def parse(variant):
    """VARIANT: 'minmax', 'mse', or 'refit[-IMPORTANCE][:n2.4][:hqqw]
    [:steps=N][:span=F]'."""
    parts = variant.split(":")
    head = parts[0]
    kw = {}
    for p in parts[1:]:
        if p.startswith("n"):
            kw["norm"] = float(p[1:])
        elif p.startswith("x"):
            kw["elem"] = float(p[1:])
        elif p == "hqqw":
            kw["hqq_weighted"] = True
        elif p == "shrink":
            kw["shrink"] = True
        elif p.startswith("refits="):
            kw["refits"] = int(p[7:])
        elif p.startswith("hqq="):
            kw["hqq_iters"] = int(p[4:])
        elif p.startswith("only="):
            kw["only"] = p[5:]
        elif p.startswith("steps="):
            kw["steps"] = int(p[6:])
        elif p.startswith("span="):
            kw["span"] = float(p[5:])
        else:
            raise SystemExit(f"variants.py: unknown option {p!r} of {variant!r}")
    imp = head.split("-", 1)[1] if "-" in head else "none"
    return head.split("-", 1)[0], imp, kw


def quantized(source, preset, variant, cache):
    bits, sym = PRESETS[preset]
    kind, imp_name, kw = parse(variant)
    only = kw.pop("only", None)
    model = copy.deepcopy(source)
    if kind == "minmax":
        fn = lambda n, w: fakequant.int_minmax(w, bits, 128, sym)
    elif kind == "mse":
        fn = lambda n, w: fakequant.int_mse(w, bits, 128, sym)
    elif kind == "refit":
        if imp_name not in cache:
            cache[imp_name] = IMPORTANCE[imp_name](source)
        imps = cache[imp_name]
        fn = lambda n, w: refit(w, bits, sym, imps.get(n), **kw)
    else:
        raise SystemExit(f"variants.py: unknown variant {variant!r}")
    with torch.no_grad():
        for n, m in linears(model):
            if only is not None and not n.endswith(only):
                continue
            m.weight.copy_(fn(n, m.weight.detach().float()).to(m.weight.dtype))
    return model


DEFAULT = ["minmax", "mse", "refit", "refit-gamma2", "refit-gamma1", "refit-prod", "refit-act",
           "refit:n2.4", "refit-gamma2:n2.4"]


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    model_name, preset, out_path = argv[:3]
    variants = argv[3:] or DEFAULT
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from measure import load
    source, _ = load(f"/mnt/models/{model_name}", False)
    blocks = common.heldout_blocks()
    cache = {}
    models = {v: quantized(source, preset, v, cache) for v in variants}
    stats = kld.block_stats(source, models, blocks)
    with open("/mnt/repo/tools/accuracy/results.json") as f:
        real = json.load(f)["models"][model_name]
    refs = {f"ctquant {m}": np.array(real[f"{preset}-{m}"]["blocks"])
            for m in ("minmax", "mse", "refit")}
    base = stats.get("refit")
    out = {"model": model_name, "preset": preset, "variants": {}}
    for v in variants:
        st = stats[v]
        r = {"kld": kld.summary(st)["kld"], "ci": kld.bootstrap(st), "vs": {}}
        for name, ref in list(refs.items()) + ([("torch refit", base)] if base is not None else []):
            d = r["kld"] - kld.summary(ref)["kld"]
            r["vs"][name] = [d, *kld.bootstrap(st, ref)]
        out["variants"][v] = r
        print(f"{model_name} {preset} {v}: KLD {r['kld']:.5f} [{r['ci'][0]:.5f}, {r['ci'][1]:.5f}]"
              + "".join(f"; vs {k} {d:+.5f} [{lo:+.5f}, {hi:+.5f}]"
                        for k, (d, lo, hi) in r["vs"].items()), flush=True)
        out["variants"][v]["blocks"] = st.tolist()
    common.write_json(out_path, out)


if __name__ == "__main__":
    main(sys.argv[1:])
