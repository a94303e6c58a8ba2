"""On-disk layouts of checkpoints quantized by other tools, built from random weights.

Runs inside the realref chroot (torch, numpy, safetensors from Debian). Each writer
reproduces the arithmetic and tensor layout of the tool named in its docstring; the
code is written for this project from reading those sources (cited per function),
not copied from them.

Sources read:
  AutoAWQ  casper-hansen/AutoAWQ 88e4c76b (v0.2.9 final):
           awq/quantize/quantizer.py  AwqQuantizer.pseudo_quantize_tensor, _apply_quant
           awq/modules/linear/gemm.py WQLinear_GEMM.__init__ / from_linear
           awq/modules/linear/gemv.py WQLinear_GEMV.from_linear, calculate_zeros_width
           awq/modules/linear/marlin.py _get_perms, WQLinear_Marlin.from_linear
           awq/utils/packing_utils.py AWQ_ORDER / AWQ_REVERSE_ORDER
           awq/models/_config.py AwqConfig.to_transformers_dict (config.json)
           awq/utils/module.py exclude_layers_to_not_quantize (modules_to_not_convert)
  ModelOpt NVIDIA/Model-Optimizer a2fbac7b (0.47.0dev-81):
           modelopt/torch/quantization/qtensor/nvfp4_tensor.py NVFP4QTensor
             (get_weights_scaling_factor_2, get_weights_scaling_factor, quantize,
             _cast_fp4, get_activation_scaling_factor)
           modelopt/torch/export/unified_export_hf.py _export_quantized_weight,
             _write_hf_export_config
           modelopt/torch/export/quant_utils.py postprocess_state_dict
             (_KV_CACHE_REPLACEMENTS), get_quant_config, process_layer_quant_config,
             _prefix_wildcard_summarize_exclude_modules, preprocess_linear_fusion
           modelopt/torch/export/convert_hf_config.py convert_hf_quant_config_format
"""
import json
import math
import os

import numpy as np
import torch
from safetensors.torch import save_file

# The tiny Llama of every case (same shape family as tests/golden/llama-bf16).
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 256, 384, 2, 4, 2, 64, 64

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def linear_shapes(layers=LAYERS, hidden=HIDDEN, inter=INTER, kv_heads=KV_HEADS):
    """(module name, name inside the decoder layer, out_features, in_features), in order."""
    kv = kv_heads * HEAD_DIM
    shapes = {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
              "o_proj": (hidden, hidden), "gate_proj": (inter, hidden),
              "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    for i in range(layers):
        for proj in ATTN + MLP:
            part = "self_attn" if proj in ATTN else "mlp"
            out, inp = shapes[proj]
            yield f"model.layers.{i}.{part}.{proj}", f"{part}.{proj}", out, inp


def llama_config(dtype, quantization_config=None, layers=LAYERS, hidden=HIDDEN, inter=INTER,
                 vocab=VOCAB):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "max_position_embeddings": 256,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": hidden // HEAD_DIM,
        "num_hidden_layers": layers,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "vocab_size": vocab,
    }
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    return cfg


def write_json(path, obj, indent=2, sort_keys=False):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, sort_keys=sort_keys)
        f.write("\n")


def save_shard(tensors, path):
    # huggingface_hub.save_torch_state_dict / transformers save_pretrained: {"format": "pt"}
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)


def random_weight(gen, out, inp, dtype, salt):
    """Gaussian weights (std 0.02) with the awkward groups the golden inputs carry:
    an all-zero group of 64, a negative-only row segment, one large outlier."""
    w = torch.randn(out, inp, generator=gen, dtype=torch.float32) * 0.02
    r = salt % out
    w[r, 0:64] = 0.0
    w[(r + 1) % out, 64:128] = -w[(r + 1) % out, 64:128].abs() - 0.001
    w[(r + 2) % out, (salt * 7) % inp] = 0.37
    return w.to(dtype)


def dense_tensors(gen, dtype, vocab=VOCAB, hidden=HIDDEN, layers=LAYERS):
    """Embedding, norms and lm_head: never quantized by either tool."""
    t = {"model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=gen) * 0.02).to(dtype),
         "lm_head.weight": (torch.randn(vocab, hidden, generator=gen) * 0.02).to(dtype),
         "model.norm.weight": (1.0 + 0.05 * torch.randn(hidden, generator=gen)).to(dtype)}
    for i in range(layers):
        for n in ("input_layernorm", "post_attention_layernorm"):
            t[f"model.layers.{i}.{n}.weight"] = (1.0 + 0.05 * torch.randn(hidden, generator=gen)).to(dtype)
    return t


# ---------------------------------------------------------------- AutoAWQ

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # awq/utils/packing_utils.py; nibble i holds column AWQ_ORDER[i]


def awq_pseudo_quantize(w, group_size, zero_point, bits=4):
    """AwqQuantizer.pseudo_quantize_tensor on an F16 weight [out, in] (all arithmetic in F16,
    as _apply_quant calls it after linear_layer.half()). Returns the fake-quantized weight,
    scales [out, in/g] and zeros [out, in/g] (None without zero point)."""
    out, inp = w.shape
    g = w.reshape(-1, group_size)
    if zero_point:
        max_val = g.amax(dim=1, keepdim=True)
        min_val = g.amin(dim=1, keepdim=True)
        max_int, min_int = 2**bits - 1, 0
        scales = (max_val - min_val).clamp(min=1e-5) / max_int
        zeros = (-torch.round(min_val / scales)).clamp_(min_int, max_int)
        g = (torch.clamp(torch.round(g / scales) + zeros, min_int, max_int) - zeros) * scales
        zeros = zeros.view(out, -1)
    else:
        max_val = g.abs().amax(dim=1, keepdim=True).clamp(min=1e-5)
        max_int, min_int = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
        scales = max_val / max_int
        zeros = None
        g = torch.clamp(torch.round(g / scales), min_int, max_int) * scales
    return g.reshape(out, inp), scales.view(out, -1), zeros


def awq_codes(w_fq, scales_t, zeros_t, group_size):
    """The integer codes WQLinear_GEMM.from_linear / WQLinear_GEMV.from_linear compute:
    round((w + zeros*scales) / scales) per input column, in F16 (scales_t, zeros_t are
    [in/g, out]). Returns int32 [out, in]."""
    scale_zeros = zeros_t * scales_t
    cols = torch.arange(w_fq.shape[1]) // group_size
    q = torch.round((w_fq + scale_zeros[cols].t()) / scales_t[cols].t())
    return q.to(torch.int32)


def pack_awq_gemm_rows(values):
    """[rows, cols] ints in 0..15 -> int32 [rows, cols/8]: word c, nibble i (bits 4i..4i+3)
    holds column 8c + AWQ_ORDER[i] (WQLinear_GEMM.from_linear)."""
    rows, cols = values.shape
    v = values.to(torch.int64).reshape(rows, cols // 8, 8)[:, :, AWQ_ORDER]
    word = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for i in range(8):
        word |= v[:, :, i] << (4 * i)
    return torch.from_numpy(word.numpy().astype(np.uint32).view(np.int32))


def awq_gemm_module(w16, group_size, zero_point):
    """One Linear as WQLinear_GEMM stores it: qweight int32 [in, out/8], qzeros int32
    [in/g, out/8], scales F16 [in/g, out]. Without zero point AutoAWQ's own GEMM path
    asserts (from_linear needs zeros), so the symmetric layout is the one the converter
    and the GEMM kernel agree on: codes q + 8 with every zero point 8."""
    w_fq, scales, zeros = awq_pseudo_quantize(w16, group_size, zero_point)
    scales_t = scales.t().contiguous()
    if zeros is None:
        zeros_t = torch.full_like(scales_t, 8.0)
    else:
        zeros_t = zeros.t().contiguous()
    q = awq_codes(w_fq, scales_t, zeros_t, group_size)  # [out, in]
    bad = int(((q < 0) | (q > 15)).sum())
    assert bad == 0, f"{bad} AWQ codes outside 0..15"
    qweight = pack_awq_gemm_rows(q.t().contiguous())
    qzeros = pack_awq_gemm_rows(zeros_t.to(torch.int32))
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales_t.half()}, q, zeros_t


def awq_gemv_module(w16, group_size):
    """WQLinear_GEMV layout (natural nibble order, packed along in_features):
    qweight [out, in/8], qzeros [out, W], scales F16 [out, 8W] zero-padded,
    W = calculate_zeros_width(in, g) = ceil(in / g / 8) * size multiplier."""
    out, inp = w16.shape
    w_fq, scales, zeros = awq_pseudo_quantize(w16, group_size, True)
    mult = {128: 1, 64: 2, 32: 4}[group_size]
    width = math.ceil(inp / group_size / 8) * mult
    q = awq_codes(w_fq, scales.t().contiguous(), zeros.t().contiguous(), group_size)
    qscales = torch.zeros(out, width * 8, dtype=torch.float16)
    qscales[:, : scales.shape[1]] = scales
    v = q.to(torch.int64).reshape(out, inp // 8, 8)
    qw = sum(v[:, :, i] << (4 * i) for i in range(8))
    z = torch.zeros(out, width * 8, dtype=torch.int64)
    z[:, : zeros.shape[1]] = zeros.to(torch.int64)
    z = z.reshape(out, width, 8)
    qz = sum(z[:, :, i] << (4 * i) for i in range(8))
    as_i32 = lambda t: torch.from_numpy(t.numpy().astype(np.uint32).view(np.int32))
    return {"qweight": as_i32(qw), "qzeros": as_i32(qz), "scales": qscales}


def _marlin_perms():
    """WQLinear_Marlin's tile permutation of 1024 codes and its scale permutation (64)."""
    perm = []
    for i in range(32):
        block = []
        col = i // 4
        for half in (0, 1):
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1):
                block.append(16 * row + col + 8 * half)
        for j in range(4):
            perm.extend(p + 256 * j for p in block)
    perm = np.array(perm).reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]].ravel()
    scale_perm = [i + 8 * j for i in range(8) for j in range(8)]
    return torch.from_numpy(perm), scale_perm


def awq_marlin_module(w16, group_size):
    """WQLinear_Marlin layout (symmetric, no qzeros): qweight int32 [in/16, out*16/8] of
    16x16 tiles permuted for the kernel, scales F16 [in/g, out] permuted."""
    out, inp = w16.shape
    _, scales, _ = awq_pseudo_quantize(w16, group_size, False)
    perm, scale_perm = _marlin_perms()
    s = scales.t()  # [in/g, out]
    w = w16.t()     # [in, out]
    w = w.reshape(-1, group_size, out).permute(1, 0, 2).reshape(group_size, -1)
    s = s.reshape(1, -1)
    w = torch.clamp(torch.round(w / s).int() + 8, 0, 15)
    w = w.reshape(group_size, -1, out).permute(1, 0, 2).reshape(inp, out).contiguous()
    s = s.reshape(-1, len(scale_perm))[:, scale_perm].reshape(-1, out).contiguous()
    w = w.reshape(inp // 16, 16, out // 16, 16).permute(0, 2, 1, 3).reshape(inp // 16, out * 16)
    w = w.reshape(-1, perm.numel())[:, perm].reshape(w.shape).numpy().astype(np.uint32)
    q = np.zeros((w.shape[0], w.shape[1] // 8), dtype=np.uint32)
    for i in range(8):
        q |= w[:, i::8] << np.uint32(4 * i)
    return {"qweight": torch.from_numpy(q.view(np.int32)), "scales": s.half()}


def awq_quantization_config(bits, group_size, zero_point, version, modules_to_not_convert):
    """AwqConfig.to_transformers_dict, as save_quantized puts it into config.json."""
    return {"quant_method": "awq", "zero_point": zero_point, "group_size": group_size,
            "bits": bits, "version": version, "modules_to_not_convert": modules_to_not_convert}


def awq_dequant_reference(tensors, group_size, zero_point):
    """(q - z) * s per module, as AutoAWQ's dequantize_gemm, for a logits reference."""
    out = {}
    for name, t in tensors.items():
        if not name.endswith(".qweight"):
            if not (name.endswith(".qzeros") or name.endswith(".scales")):
                out[name] = t
            continue
        m = name[: -len(".qweight")]
        q = unpack_awq_gemm_rows(t)  # [in, out]
        z = unpack_awq_gemm_rows(tensors[m + ".qzeros"]) if zero_point else torch.full(
            (q.shape[0] // group_size, q.shape[1]), 8)
        s = tensors[m + ".scales"].float()
        rows = torch.arange(q.shape[0]) // group_size
        out[m + ".weight"] = ((q - z[rows]).float() * s[rows]).t().contiguous().to(torch.float16)
    return out


def unpack_awq_gemm_rows(words):
    w = torch.from_numpy(words.numpy().view(np.uint32).astype(np.int64))
    rows, n = w.shape
    nib = torch.stack([(w >> (4 * i)) & 15 for i in range(8)], dim=-1)  # [rows, n, 8]
    v = torch.empty_like(nib)
    v[:, :, AWQ_ORDER] = nib
    return v.reshape(rows, n * 8)


# ---------------------------------------------------------------- ModelOpt NVFP4

E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])


def cast_fp4_codes(x):
    """NVFP4QTensor._cast_fp4: sign bit 3, magnitude index by searchsorted over the bounds,
    ties at 0.75 / 1.75 / 3.5 rounded up (to the even code)."""
    sign = (x < 0).to(torch.uint8)
    a = x.abs()
    idx = torch.searchsorted(E2M1_BOUNDS, a, out_int32=True).to(torch.uint8)
    tie = ((a == 0.75) | (a == 1.75) | (a == 3.5)).to(torch.uint8)
    return (sign << 3) + idx + tie


def nvfp4_weight(w, weight_scale_2, block=16):
    """NVFP4QTensor.get_weights_scaling_factor + quantize on a BF16/F16 weight [N, K] with a
    given F32 scalar weight_scale_2: per-block scale = amax / (6 * ws2) in F32, zero -> 1.0,
    clamped to [2^-9, 448], cast to F8_E4M3; codes of w / (scale * ws2) in F32; packed
    uint8 [N, K/2] with element 2j in the low nibble."""
    n, k = w.shape
    blocks = w.view(n, k // block, block)
    amax = blocks.abs().amax(dim=-1).float()
    scale = amax / (6.0 * weight_scale_2)
    scale[scale == 0] = 1.0
    scale8 = scale.clamp(min=2**-9, max=448.0).to(torch.float8_e4m3fn)
    scaled = blocks / (scale8.to(torch.float32) * weight_scale_2).unsqueeze(-1)
    codes = cast_fp4_codes(scaled.view(n, k))
    packed = (codes[:, 1::2] << 4) | codes[:, 0::2]
    return packed, scale8


def nvfp4_dequant(packed, scale8, weight_scale_2, dtype):
    n = packed.shape[0]
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(n, -1).long()
    vals = E2M1_VALUES[codes].view(n, -1, 16)
    return (vals * (scale8.float() * weight_scale_2).unsqueeze(-1)).view(n, -1).to(dtype)


def modelopt_hf_quant_config(quant_algo, kv_cache_quant_algo, group_size, exclude_modules,
                             quantized_layers=None, version="0.46.0"):
    """hf_quant_config.json as get_quant_config / process_layer_quant_config write it."""
    q = {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_cache_quant_algo}
    if quant_algo == "MIXED_PRECISION":
        q["quantized_layers"] = quantized_layers
    else:
        if group_size is not None:
            q["group_size"] = group_size
        q["exclude_modules"] = sorted(exclude_modules)
    return {"producer": {"name": "modelopt", "version": version}, "quantization": q}


def modelopt_config_json_quantization(hf_quant_config):
    """convert_hf_quant_config_format: what ModelOpt puts into config.json's
    quantization_config (quant_method "modelopt")."""
    d = hf_quant_config["quantization"]
    algo = d.get("quant_algo")
    new = {}
    if algo == "FP8":
        new["config_groups"] = {"group_0": {
            "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
            "weights": {"dynamic": False, "num_bits": 8, "type": "float"}, "targets": ["Linear"]}}
    elif algo == "NVFP4":
        gs = d.get("group_size", 16)
        new["config_groups"] = {"group_0": {
            "input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": gs},
            "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": gs},
            "targets": ["Linear"]}}
    elif algo == "MIXED_PRECISION":
        groups, by_cfg = {}, {}
        for layer, cfg in d["quantized_layers"].items():
            by_cfg.setdefault(tuple(sorted(cfg.items())), []).append(layer)
        for i, (key, layers) in enumerate(by_cfg.items()):
            cfg = dict(key)
            if cfg["quant_algo"] == "FP8":
                g = {"input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                     "weights": {"dynamic": False, "num_bits": 8, "type": "float"}}
            else:
                gs = cfg.get("group_size") or 16
                g = {"input_activations": {"dynamic": False, "num_bits": 4, "type": "float",
                                           "group_size": gs},
                     "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": gs}}
            g["targets"] = sorted(layers)
            groups[f"group_{i}"] = g
        new["config_groups"] = groups
        new["quantized_layers"] = d["quantized_layers"]
    excl = d.get("exclude_modules")
    new["ignore"] = excl if excl is not None else []
    if algo:
        new["quant_algo"] = algo
    kv = d.get("kv_cache_quant_algo")
    if kv:
        new["kv_cache_scheme"] = ({"dynamic": False, "num_bits": 8, "type": "float"}
                                  if kv == "FP8" else kv)
    new["producer"] = hf_quant_config["producer"]
    new["quant_method"] = "modelopt"
    return new


def summarize_exclude_modules(unquantized, quantized):
    """quant_utils._prefix_wildcard_summarize_exclude_modules: each unquantized layer is
    covered by the shortest dot-boundary prefix wildcard ("a.b*", or "a.b.*" when "a.b*"
    would be too wide) that matches no quantized layer, else by its own name."""
    negative = set()
    for layer in quantized:
        negative.add(layer)
        negative.update(layer[:i] + "*" for i in range(len(layer) + 1))
    summary = set()
    for layer in unquantized:
        options = []
        for i, ch in enumerate(layer):
            if ch == ".":
                options.append([layer[:i] + "*"])
                options.append([layer[:i], layer[:i] + ".*"])
        options.append([layer])
        chosen = []
        for wildcards in options:
            if any(w in negative for w in wildcards):
                continue
            if all(w in summary for w in wildcards):
                chosen = []
                break
            chosen = wildcards
            break
        if len(chosen) == 2 and chosen[1] == chosen[0] + ".*":
            summary.add(chosen[1])
        else:
            summary.update(chosen)
    return sorted(summary)
