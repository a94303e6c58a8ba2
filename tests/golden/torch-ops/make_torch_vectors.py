import torch, json, math, struct, sys
# Usage (in the realref stack): python3 make_torch_vectors.py [OUT.json]
torch.manual_seed(23)
out = {"about": "PyTorch 2.14.1 CPU (x86-64) results the MSE observer emulates: x.pow(norm) on BF16/F16 magnitudes and x.sum(-1) of non-negative BF16/F16/F32 rows (random rows; near-tie rows whose exact sum lies within one float32 step of a BF16/F16 rounding midpoint, where the order of the float additions decides the rounding; built rows that tell the vector lanes apart); bits as integers", "pow": [], "sum": []}
def bits(t):
    if t.dtype == torch.float32:
        return [int(b) & 0xffffffff for b in t.view(torch.int32).tolist()]
    return [int(b) & 0xffff for b in t.view(torch.int16).tolist()]
def torch_sum(v):
    return v.reshape(1, 1, 1, v.numel()).sum(dim=(0, -1)).flatten()
def add_sum(name, v, kind):
    out["sum"].append({"dtype": name, "n": v.numel(), "kind": kind, "in": bits(v), "out": bits(torch_sum(v))[0]})
for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
    top = 0x7c00 if dt == torch.float16 else 0x7f80
    sel = torch.cat([torch.randint(0, top, (48,)), torch.tensor([0, 1, 2, 0x0400, 0x2390, 0x3c00, 0x3f80 if dt==torch.bfloat16 else 0x3bff, top-1])]).to(torch.int32)
    x = sel.to(torch.int16).view(dt)
    for norm in (2.4, 2.2, 3.0, 2.0, 1.7):
        y = x.pow(norm)
        out["pow"].append({"dtype": name, "norm": norm, "in": bits(x), "out": bits(y)})
    for n in (16, 32, 48, 64, 100, 128, 256, 3072, 4100, 16384):
        v = (torch.rand(n) * torch.exp(torch.randn(n) * 2)).to(dt)
        add_sum(name, v, "random")

# F32 rows: the float result shows the rounding of every addition.
for n in (5, 16, 24, 32, 40, 100, 128, 256, 1000, 3072, 4100, 16384):
    add_sum("f32", torch.rand(n) * torch.exp(torch.randn(n) * 2), "random")

# Near-tie rows: |exact sum - midpoint| below 1 float32 step.
def f32_ulp(x):
    return math.ldexp(1.0, math.frexp(x)[1] - 24)
def midpoint_distance(s, dt):
    # the midpoint between the two values of dt around s, in float32 steps of s
    b = torch.tensor([s], dtype=torch.float64).to(dt).view(torch.int16)
    if b.view(dt).double().item() > s:
        b = b - 1
    mid = (b.view(dt).double().item() + (b + 1).view(dt).double().item()) / 2
    return abs(s - mid) / f32_ulp(s)
for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
    for n in (16, 32, 48, 128, 256):
        found = 0
        while found < 4:
            rows = (torch.rand(20000, n) * torch.exp2(torch.randint(-10, 0, (20000, n)).float())).to(dt)
            exact = [math.fsum(r) for r in rows.double().tolist()]
            for r, s in zip(rows, exact):
                if found < 4 and midpoint_distance(s, dt) < 1:
                    add_sum(name, r.clone(), "near-tie")
                    found += 1

# Built rows (32 values): 1 at a, a half step of 1 at b (2^-8 BF16, 2^-11
# F16), 2^-24 at c and d. Their sum rounds up only when c and d meet before
# either meets the running sum of the other two, which tells apart which
# elements share a float lane and in which order the lanes are added.
for dt, name, half in ((torch.bfloat16, "bf16", 2.0**-8), (torch.float16, "f16", 2.0**-11)):
    for a, b, c, d in ((0, 1, 16, 17), (0, 16, 1, 17), (0, 1, 8, 9), (8, 9, 0, 1), (4, 5, 0, 1),
                       (2, 3, 0, 1), (12, 13, 4, 5), (15, 14, 0, 7)):
        v = torch.zeros(32)
        v[a] += 1.0; v[b] += half; v[c] += 2.0**-24; v[d] += 2.0**-24
        add_sum(name, v.to(dt), "built")

path = sys.argv[1] if len(sys.argv) > 1 else "torch_vectors.json"
json.dump(out, open(path, "w"))
print("ok", len(out["pow"]), len(out["sum"]))
