import torch, json
torch.manual_seed(23)
out = {"about": "PyTorch 2.14.1 CPU (AVX-512) results the MSE observer emulates: x.pow(norm) on BF16/F16 magnitudes and x.sum(-1) of non-negative BF16/F16 rows; bits as integers", "pow": [], "sum": []}
def bits(t):
    return [int(b) & 0xffff for b in t.view(torch.int16).tolist()]
for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
    top = 0x7c00 if dt == torch.float16 else 0x7f80
    sel = torch.cat([torch.randint(0, top, (48,)), torch.tensor([0, 1, 2, 0x0400, 0x2390, 0x3c00, 0x3f80 if dt==torch.bfloat16 else 0x3bff, top-1])]).to(torch.int32)
    x = sel.to(torch.int16).view(dt)
    for norm in (2.4, 2.2, 3.0, 2.0, 1.7):
        y = x.pow(norm)
        out["pow"].append({"dtype": name, "norm": norm, "in": bits(x), "out": bits(y)})
    for n in (16, 32, 48, 64, 100, 128, 256, 3072, 4100, 16384):
        v = (torch.rand(n) * torch.exp(torch.randn(n) * 2)).to(dt)
        s = v.reshape(1, 1, 1, n).sum(dim=(0, -1))
        out["sum"].append({"dtype": name, "n": n, "in": bits(v), "out": bits(s.flatten())[0]})
json.dump(out, open("/mnt/obs/torch_vectors.json", "w"))
print("ok", len(out["pow"]), len(out["sum"]))
