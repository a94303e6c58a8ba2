"""Fake quantization in torch: weights replaced by what compressed-tensors
dequantizes, for quick looks during training and for trying methods before
they are built into ctquant. The figures of docs/accuracy.md never come from
here: they come from ctquant's real outputs (measure.py).

Weights are [out, in]; groups run along `in`. Like compressed-tensors, the
quotient w / scale is rounded in the weight's dtype (BF16 here) before it is
rounded to an integer (spec/schemes.md, the double rounding).
"""
import torch


def _round_bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def int_minmax(w, bits=4, group=128, symmetric=True):
    """Min-max RTN, as memoryless_minmax: returns the dequantized weight."""
    o, i = w.shape
    g = w.to(torch.bfloat16).float().reshape(o, i // group, group)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    lo = torch.minimum(g.amin(-1, keepdim=True), torch.zeros(()))
    hi = torch.maximum(g.amax(-1, keepdim=True), torch.zeros(()))
    if symmetric:
        scale = _round_bf16(torch.maximum(lo.abs(), hi) / ((qmax - qmin) / 2))
        zp = torch.zeros_like(scale)
    else:
        scale = _round_bf16((hi - lo) / (qmax - qmin))
        scale = torch.where(scale == 0, torch.full_like(scale, 2 ** -7), scale)
        zp = torch.clamp(torch.round(qmin - lo / scale), qmin, qmax)
    scale = torch.where(scale == 0, torch.full_like(scale, 2 ** -7), scale)
    q = torch.clamp(torch.round(_round_bf16(g / scale) + zp), qmin, qmax)
    return ((q - zp) * scale).to(torch.bfloat16).float().reshape(o, i)


def quantize_model_(model, fn, skip=("lm_head", "embed_tokens")):
    """Replaces every nn.Linear weight not named in skip by fn(weight)."""
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and not any(s in name for s in skip):
                mod.weight.copy_(fn(mod.weight.detach().float()).to(mod.weight.dtype))
    return model


def _codes(g, scale, zp, qmin, qmax):
    return torch.clamp(torch.round(_round_bf16(g / scale) + zp), qmin, qmax)


def int_refit(w, bits=4, group=128, symmetric=True, importance=None, steps=20, span=0.3, norm=2.0):
    """Prototype of `--observer refit`: per group, candidate scales around
    the min-max scale; for each, the codes, then the least-squares scale
    sum(i*w*q) / sum(i*q^2) rounded to BF16, the codes again, and the
    weighted squared error; the lowest wins. Asymmetric: HQQ's zero-point
    search (integer zero points) first, then the same refit of the scale
    with the zero point fixed."""
    o, i = w.shape
    g = w.to(torch.bfloat16).float().reshape(o, i // group, group)
    imp = torch.ones_like(g) if importance is None else importance(g)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    lo = torch.minimum(g.amin(-1, keepdim=True), torch.zeros(()))
    hi = torch.maximum(g.amax(-1, keepdim=True), torch.zeros(()))
    eps = 2 ** -7
    if symmetric:
        base = torch.maximum(lo.abs(), hi) / ((qmax - qmin) / 2)
        zp = torch.zeros_like(base)
    else:
        base = (hi - lo) / (qmax - qmin)
        zp = torch.clamp(torch.round(qmin - lo / torch.where(base == 0, eps, base)), qmin, qmax)
        base, zp = _hqq(g, torch.where(base == 0, eps, base), zp, qmin, qmax)
    base = torch.where(base == 0, eps, base)
    best_s = _round_bf16(base)
    best_s = torch.where(best_s == 0, eps, best_s)
    best_e = (imp * (g - (_codes(g, best_s, zp, qmin, qmax) - zp) * best_s).abs() ** norm).sum(-1, keepdim=True)
    for k in range(steps + 1):
        c = base * (1 - span + 2 * span * k / steps)
        c = torch.where(c == 0, eps, _round_bf16(c))
        c = torch.where(c == 0, eps, c)
        q = _codes(g, c, zp, qmin, qmax) - zp
        num = (imp * g * q).sum(-1, keepdim=True)
        den = (imp * q * q).sum(-1, keepdim=True)
        s = torch.where(den > 0, num / torch.where(den > 0, den, 1), c)
        s = _round_bf16(s)
        s = torch.where(s <= 0, c, s)
        for cand in (c, s):
            e = (imp * (g - (_codes(g, cand, zp, qmin, qmax) - zp) * cand).abs() ** norm).sum(-1, keepdim=True)
            better = e < best_e
            best_e = torch.where(better, e, best_e)
            best_s = torch.where(better, cand, best_s)
    q = _codes(g, best_s, zp, qmin, qmax)
    return ((q - zp) * best_s).to(torch.bfloat16).float().reshape(o, i)


def _hqq(g, scale, zp, qmin, qmax, p=0.7, beta=10.0, kappa=1.01, iters=20):
    """HQQ's half-quadratic zero-point search with the scale fixed, the zero
    point kept an integer in [qmin, qmax]; returns the scale and the best
    zero point (lowest squared error)."""
    def err(z):
        return ((g - (_codes(g, scale, z, qmin, qmax) - z) * scale) ** 2).sum(-1, keepdim=True)
    best_z, best_e = zp, err(zp)
    z = zp.clone()
    for _ in range(iters):
        q = _codes(g, scale, z, qmin, qmax)
        r = (q - z) * scale
        e = g - r
        we = torch.sign(e) * torch.relu(e.abs() - (1.0 / beta) * e.abs().clamp_min(1e-12) ** (p - 1))
        z = torch.clamp(torch.round((q - (g - we) / scale).mean(-1, keepdim=True)), qmin, qmax)
        beta *= kappa
        ez = err(z)
        better = ez < best_e
        best_e = torch.where(better, ez, best_e)
        best_z = torch.where(better, z, best_z)
    return scale, best_z


def int_mse(w, bits=4, group=128, symmetric=True, grid=100, maxshrink=0.2, norm=2.4):
    """memoryless_mse, approximately (shrunk ranges, |Q - W|^norm)."""
    o, i = w.shape
    g = w.to(torch.bfloat16).float().reshape(o, i // group, group)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    lo0 = torch.minimum(g.amin(-1, keepdim=True), torch.zeros(()))
    hi0 = torch.maximum(g.amax(-1, keepdim=True), torch.zeros(()))
    best = None
    for k in range(int(maxshrink * grid)):
        f = 1 - k / grid
        lo, hi = lo0 * f, hi0 * f
        if symmetric:
            s = _round_bf16(torch.maximum(lo.abs(), hi) / ((qmax - qmin) / 2))
            z = torch.zeros_like(s)
        else:
            s = _round_bf16((hi - lo) / (qmax - qmin))
            s = torch.where(s == 0, 2 ** -7, s)
            z = torch.clamp(torch.round(qmin - lo / s), qmin, qmax)
        s = torch.where(s == 0, 2 ** -7, s)
        dq = (_codes(g, s, z, qmin, qmax) - z) * s
        e = ((g - dq).abs() ** norm).sum(-1, keepdim=True)
        if best is None:
            best, best_dq = e, dq
        else:
            m = e < best
            best = torch.where(m, e, best)
            best_dq = torch.where(m, dq, best_dq)
    return best_dq.to(torch.bfloat16).float().reshape(o, i)


def _cast_fp4(v):
    """cast_to_fp4 of compressed-tensors (spec/schemes.md 2.2): RNE on the
    E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties as the table there."""
    a = v.abs()
    q = torch.zeros_like(a)
    q = torch.where((a > 0.25) & (a < 0.75), 0.5, q)
    q = torch.where((a >= 0.75) & (a <= 1.25), 1.0, q)
    q = torch.where((a > 1.25) & (a < 1.75), 1.5, q)
    q = torch.where((a >= 1.75) & (a <= 2.5), 2.0, q)
    q = torch.where((a > 2.5) & (a < 3.5), 3.0, q)
    q = torch.where((a >= 3.5) & (a <= 5.0), 4.0, q)
    q = torch.where(a > 5.0, 6.0, q)
    return q * torch.sign(v)


def mxfp4(w, group=32):
    """MXFP4A16 min-max (spec/schemes.md 6.1, 6.2): per group of 32 input
    columns an E8M0 scale 2^(E' - 2), E' the exponent of the BF16 amax
    plus one when its mantissa is >= 1.75; codes FP4 E2M1 of the BF16
    quotient clamped to +-6. Returns the dequantized weight."""
    o, i = w.shape
    g = w.to(torch.bfloat16).reshape(o, i // group, group)
    amax = g.abs().amax(-1, keepdim=True)
    u = amax.view(torch.int16).to(torch.int32) & 0xFFFF
    p2 = ((u + 32) & 0xFF80).to(torch.int16).view(torch.bfloat16).float()
    e = torch.where(p2 > 0, 127 + torch.floor(torch.log2(p2.clamp_min(2.0 ** -133))) - 2,
                    torch.zeros_like(p2))
    e = e.clamp(0, 255)
    scale = torch.pow(2.0, e - 127)
    v = (g.float() / scale).to(torch.bfloat16).float().clamp(-6, 6)
    return (_cast_fp4(v) * scale).to(torch.bfloat16).float().reshape(o, i)
