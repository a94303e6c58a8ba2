"""Writes the converter golden cases with the real libraries (run INSIDE the realref chroot
by run.sh, not directly).

  python3 make_fixtures.py GOLDEN_DIR SCRATCH_DIR [CASE ...]

For each case: builds input/ in the layout of the quantizing tool (layouts.py), runs
compressed-tensors' convert_checkpoint (pure conversions) or llm-compressor's
model_free_ptq(converter=...) (the mixed case) into expected/, also runs the pure
conversions through model_free_ptq with a scheme that matches no module and compares
the tensors, loads expected/ with transformers (/opt/realref/hf_load_main.py) against a
dequantized reference written to SCRATCH_DIR, and records everything in
GOLDEN_DIR/converter_cases.json. The refusal inputs go to
GOLDEN_DIR/converter-refusals/<case>/ with what the library does with each.
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import traceback

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layouts as L  # noqa: E402

from compressed_tensors.entrypoints.convert import (  # noqa: E402
    AutoAWQConverter,
    ModelOptNvfp4Converter,
    convert_checkpoint,
)
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.quant_scheme import FP8_BLOCK, W4A16  # noqa: E402
from llmcompressor import model_free_ptq  # noqa: E402

NVFP4_TARGETS = [r"re:.*mlp.*\.(gate_up|gate|up|down)_proj$", r"re:.*self_attn.*\.(q|k|v|o)_proj$"]
MIX_CONVERTER_TARGETS = [r"re:.*mlp.*(gate_up|gate|up|down)_proj$"]
MIX_SCHEME_TARGETS = [r"re:.*self_attn.(q|k|v|o)_proj$"]
NO_MODULE = [r"re:^no-such-module$"]
FP8_KV = dict(num_bits=8, type="float", dynamic=False)


def provenance():
    with open("/opt/realref-versions.json") as f:
        v = json.load(f)
    return (f"compressed-tensors {v['compressed_tensors_version']} ({v['compressed_tensors_commit']}); "
            f"llm-compressor {v['llmcompressor_commit']} ({v['llmcompressor_version']}); "
            f"torch {torch.__version__} CPU; python {sys.version.split()[0]}; "
            "via tools/converter-fixtures/run.sh in the realref chroot")


def fresh(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def normalise_modes(folder):
    for root, _, files in os.walk(folder):
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)


def read_tensors(path):
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), framework="pt") as st:
                for k in st.keys():
                    out[k] = st.get_tensor(k)
    return out


def tensor_diff(a_dir, b_dir):
    a, b = read_tensors(a_dir), read_tensors(b_dir)
    diffs = sorted(set(a) ^ set(b))
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape or \
                x.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() != \
                y.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes():
            diffs.append(k)
    return diffs


def common_files(d, dtype, quantization_config, layers, extra=None):
    L.write_json(f"{d}/config.json", L.llama_config(dtype, quantization_config, layers=layers),
                 sort_keys=True)
    L.write_json(f"{d}/generation_config.json",
                 {"bos_token_id": 1, "do_sample": True, "eos_token_id": 2})
    for name, obj in (extra or {}).items():
        L.write_json(f"{d}/{name}", obj, indent=4)


def write_reference(ref_dir, config_src, tensors):
    fresh(ref_dir)
    with open(config_src) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    L.write_json(f"{ref_dir}/config.json", cfg, sort_keys=True)
    L.save_shard(tensors, f"{ref_dir}/model.safetensors")


# ---------------------------------------------------------------- inputs


def build_awq(case_dir, seed, layers, group_size, zero_point, modules_to_not_convert,
              keep_qzeros):
    d = fresh(f"{case_dir}/input")
    gen = torch.Generator().manual_seed(seed)
    tensors = L.dense_tensors(gen, torch.float16, layers=layers)
    for i, (name, rel, out, inp) in enumerate(L.linear_shapes(layers=layers)):
        w = L.random_weight(gen, out, inp, torch.float16, seed + i)
        if modules_to_not_convert and any(key in rel for key in modules_to_not_convert):
            tensors[f"{name}.weight"] = w  # left an nn.Linear in F16 by AutoAWQ
            continue
        mod, _, _ = L.awq_gemm_module(w, group_size, zero_point)
        for p, t in mod.items():
            if p == "qzeros" and not keep_qzeros:
                continue
            tensors[f"{name}.{p}"] = t
    L.save_shard(tensors, f"{d}/model.safetensors")
    common_files(d, "float16", L.awq_quantization_config(4, group_size, zero_point, "gemm",
                                                          modules_to_not_convert), layers)
    return tensors


def build_nvfp4(case_dir, seed, layers, quantized, kv_cache, dtype=torch.bfloat16):
    """ModelOpt unified HF export of a Llama whose modules for which quantized(rel) is true
    are NVFP4 (fused q/k/v and gate/up share weight_scale_2 and input_scale, as
    preprocess_linear_fusion makes them); kv_cache adds FP8 k_proj.k_scale / v_proj.v_scale."""
    d = fresh(f"{case_dir}/input")
    gen = torch.Generator().manual_seed(seed)
    tensors = L.dense_tensors(gen, dtype, layers=layers)
    reference = dict(tensors)
    weights = {}
    for i, (name, rel, out, inp) in enumerate(L.linear_shapes(layers=layers)):
        weights[name] = (rel, L.random_weight(gen, out, inp, dtype, seed + i))
    fused = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up",
             "up_proj": "gate_up"}
    sets = {}
    for name, (rel, w) in weights.items():
        layer = name.split(".")[2]
        proj = rel.split(".")[1]
        sets.setdefault((layer, fused.get(proj, proj)), []).append(name)
    unq, q_layers = ["lm_head"], []
    act = torch.Generator().manual_seed(seed + 1000)
    for key, names in sets.items():
        if not quantized(weights[names[0]][0]):
            for n in names:
                tensors[f"{n}.weight"] = weights[n][1]
                reference[f"{n}.weight"] = weights[n][1]
                unq.append(n)
            continue
        amax = max(weights[n][1].abs().amax().float() for n in names)
        ws2 = amax.float() / (6.0 * 448.0)
        input_amax = 1.0 + 29.0 * torch.rand((), generator=act)
        input_scale = input_amax.float() / (6.0 * 448.0)
        for n in names:
            packed, scale8 = L.nvfp4_weight(weights[n][1], ws2)
            tensors[f"{n}.weight"] = packed
            tensors[f"{n}.weight_scale"] = scale8
            tensors[f"{n}.weight_scale_2"] = ws2.clone().reshape(())
            tensors[f"{n}.input_scale"] = input_scale.clone().reshape(())
            reference[f"{n}.weight"] = L.nvfp4_dequant(packed, scale8, ws2, dtype)
            q_layers.append(n)
    if kv_cache:
        for i in range(layers):
            for kv in ("k", "v"):
                amax = 2.0 + 18.0 * torch.rand((), generator=act)
                # postprocess_state_dict: self_attn.{k,v}_bmm_quantizer._amax / 448 ->
                # self_attn.{k,v}_proj.{k,v}_scale, F32 scalar
                tensors[f"model.layers.{i}.self_attn.{kv}_proj.{kv}_scale"] = \
                    (amax.float() / 448.0).reshape(())
    L.save_shard(tensors, f"{d}/model.safetensors")
    hf = L.modelopt_hf_quant_config("NVFP4", "FP8" if kv_cache else None, 16,
                                    L.summarize_exclude_modules(unq, q_layers))
    common_files(d, "bfloat16", L.modelopt_config_json_quantization(hf), layers,
                 {"hf_quant_config.json": hf})
    return tensors, reference


# ---------------------------------------------------------------- library runs


def capture(fn):
    """Runs fn; returns (exception or None, text the library logged)."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            fn()
        return None, buf.getvalue()
    except Exception as e:  # the library's answer is the record
        return e, buf.getvalue() + traceback.format_exc()


def hf_load(expected, reference):
    r = subprocess.run([sys.executable, "-B", "/opt/realref/hf_load_main.py", expected, reference],
                       capture_output=True, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1]) if lines else {"loaded": False, "error": r.stderr[-2000:]}
    for k in ("max_abs_logit_diff", "rel_logit_err"):
        if isinstance(res.get(k), float):
            res[k] = float(f"{res[k]:.4g}")
    return res


def model_free_agreement(inp, expected, scratch, converter):
    """model_free_ptq(converter=...) on a pure conversion: it needs a scheme, so one whose
    targets match no module. Returns what it wrote compared with convert_checkpoint's."""
    out = fresh(f"{scratch}/model_free")
    os.rmdir(out)
    err, log = capture(lambda: model_free_ptq(
        inp, out, scheme=QuantizationScheme(targets=list(NO_MODULE), **W4A16),
        ignore=[], max_workers=1, device="cpu", converter=converter))
    if err is not None:
        return {"accepted": False, "error": f"{type(err).__name__}: {err}"}
    diffs = tensor_diff(expected, out)
    same_file = open(f"{expected}/model.safetensors", "rb").read() == \
        open(f"{out}/model.safetensors", "rb").read()
    with open(f"{expected}/config.json") as f:
        a = json.load(f)["quantization_config"]
    with open(f"{out}/config.json") as f:
        b = json.load(f)["quantization_config"]
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return {"accepted": True, "tensors_differ": diffs,
            "model_safetensors_byte_identical": same_file,
            "quantization_config_keys_that_differ": keys,
            "model_free_config_groups": sorted(b.get("config_groups", {})),
            "model_free_format": b.get("format")}


def awq_lossless(tensors, expected, group, zero_point):
    """Unpacks expected/ with compressed-tensors' own unpack_from_int32 and checks every
    converted module's (q - zp) * scale equals the input's AWQ (q - z) * s exactly."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    out = read_tensors(expected)
    checked, bad = 0, []
    for name in tensors:
        if not name.endswith(".qweight"):
            continue
        m = name[: -len(".qweight")]
        q_awq = L.unpack_awq_gemm_rows(tensors[name]).t()  # [out, in]
        n_out, n_in = q_awq.shape
        cols = torch.arange(n_in) // group
        z_awq = (L.unpack_awq_gemm_rows(tensors[m + ".qzeros"]).t() if zero_point
                 else torch.full((n_out, n_in // group), 8))
        w_awq = (q_awq - z_awq[:, cols]).float() * tensors[m + ".scales"].t().float()[:, cols]
        shape = torch.Size(out[m + ".weight_shape"].tolist())
        q_ct = unpack_from_int32(out[m + ".weight_packed"], 4, shape).to(torch.int64)
        zp_ct = (unpack_from_int32(out[m + ".weight_zero_point"], 4,
                                   torch.Size([n_out, n_in // group]), packed_dim=0).to(torch.int64)
                 if zero_point else torch.zeros(n_out, n_in // group, dtype=torch.int64))
        w_ct = (q_ct - zp_ct[:, cols]).float() * out[m + ".weight_scale"].float()[:, cols]
        checked += 1
        if not torch.equal(w_awq, w_ct):
            bad.append(m)
    return {"modules_checked": checked, "modules_differing": bad}


def nvfp4_scalar_checks(tensors, expected):
    """The converter's 1/x against IEEE float32 division, and the kv-scale cast against
    round-to-nearest-even F32 -> BF16, over every scalar of the case."""
    import numpy as np
    out = read_tensors(expected)
    recip, recip_bad, kv, kv_bad = 0, [], 0, []
    for name, t in tensors.items():
        m, _, p = name.rpartition(".")
        if p in ("weight_scale_2", "input_scale"):
            new = out[f"{m}.{'weight_global_scale' if p == 'weight_scale_2' else 'input_global_scale'}"]
            ieee = np.float32(1.0) / t.numpy().astype(np.float32)
            recip += 1
            if new.dtype != torch.float32 or new.shape != t.shape or \
                    new.numpy().tobytes() != np.asarray(ieee, dtype=np.float32).tobytes():
                recip_bad.append(name)
        if p in ("k_scale", "v_scale"):
            bits = int(t.numpy().astype(np.float32).view(np.uint32))
            rne = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            kv += 1
            if out[name].dtype != torch.bfloat16 or \
                    int(out[name].reshape(1).view(torch.int16).item()) & 0xFFFF != rne:
                kv_bad.append(name)
    return {"reciprocals": recip, "reciprocals_not_ieee_f32_division": recip_bad,
            "kv_scales": kv, "kv_scales_not_rne_bf16": kv_bad}


AWQ_CASES = [
    ("awq-gemm-zp-g128", 101, 2, 128, True, ["self_attn.o_proj"], True,
     "AutoAWQ GEMM, zero point, group 128, modules_to_not_convert [\"self_attn.o_proj\"]: "
     "o_proj stays an F16 .weight and lands in the ignore list as re:.*self_attn\\.o_proj.*; "
     "qweight/qzeros in AWQ nibble order [0,2,4,6,1,3,5,7] -> weight_packed / weight_zero_point "
     "in compressed-tensors order; all-zero groups (scale 1e-5 clamp), negative-only groups"),
    ("awq-gemm-zp-g64", 102, 1, 64, True, None, True,
     "AutoAWQ GEMM, zero point, group 64 (4 groups per 256 columns, 6 for down_proj), "
     "modules_to_not_convert null: ignore list just lm_head"),
    ("awq-gemm-sym-g128", 103, 1, 128, False, None, True,
     "AutoAWQ GEMM layout without zero point (codes q+8, qzeros all 8): the converter drops "
     "qzeros, writes no weight_zero_point and a symmetric config group"),
    ("awq-gemm-sym-g64-noqzeros", 104, 1, 64, False, None, False,
     "zero_point false and no qzeros tensors at all (the converter does not need them), group 64"),
]


def run_awq(golden, scratch, case, seed, layers, group, zp, mtnc, keep_qzeros, exercises):
    cdir = f"{golden}/{case}"
    tensors = build_awq(cdir, seed, layers, group, zp, mtnc, keep_qzeros)
    inp, exp = f"{cdir}/input", fresh(f"{cdir}/expected")
    err, log = capture(lambda: convert_checkpoint(
        inp, exp, AutoAWQConverter.from_pretrained(inp), max_workers=1))
    if err is not None:
        raise RuntimeError(f"{case}: convert_checkpoint failed\n{log}")
    normalise_modes(cdir)
    ref = f"{scratch}/{case}-reference"
    write_reference(ref, f"{inp}/config.json", L.awq_dequant_reference(tensors, group, zp))
    return {
        "case": case,
        "kind": "conversion",
        "source_format": "autoawq-gemm",
        "converter": "AutoAWQConverter",
        "converter_args": {"from_pretrained": "input"},
        "converter_resolved": {"bits": 4, "group_size": group, "zero_point": zp,
                               "version": "gemm", "targets": ["Linear"],
                               "ignore": AutoAWQConverter.from_pretrained(inp).ignore},
        "entry_point": "compressed_tensors.entrypoints.convert.convert_checkpoint("
                       "input, expected, AutoAWQConverter.from_pretrained(input), max_workers=1)",
        "dtype": "float16",
        "shards": 1,
        "layers": layers,
        "lossless": awq_lossless(tensors, exp, group, zp),
        "num_bits": 4,
        "symmetric": not zp,
        "group_size": group,
        "strategy": "group",
        "ignore": AutoAWQConverter.from_pretrained(inp).ignore,
        "exercises": exercises,
        "model_free_ptq": model_free_agreement(inp, exp, scratch,
                                               AutoAWQConverter.from_pretrained(inp)),
        "hf_load": hf_load(exp, ref),
        "hf_load_reference": "the input dequantized as AutoAWQ does ((q - z) * s, F16), "
                             "written outside the fixtures",
    }


def nvfp4_converter(kv):
    return ModelOptNvfp4Converter(targets=list(NVFP4_TARGETS), ignore=["lm_head"],
                                  kv_cache_scheme=QuantizationArgs(**FP8_KV) if kv else None)


def run_nvfp4(golden, scratch):
    case = "modelopt-nvfp4-kv"
    cdir = f"{golden}/{case}"
    tensors, reference = build_nvfp4(cdir, 201, 1, lambda rel: True, kv_cache=True)
    inp, exp = f"{cdir}/input", fresh(f"{cdir}/expected")
    err, log = capture(lambda: convert_checkpoint(inp, exp, nvfp4_converter(True), max_workers=1))
    if err is not None:
        raise RuntimeError(f"{case}: convert_checkpoint failed\n{log}")
    normalise_modes(cdir)
    ref = f"{scratch}/{case}-reference"
    write_reference(ref, f"{inp}/config.json", reference)
    return {
        "case": case,
        "kind": "conversion",
        "source_format": "modelopt-nvfp4",
        "converter": "ModelOptNvfp4Converter",
        "converter_args": {"targets": NVFP4_TARGETS, "ignore": ["lm_head"],
                           "kv_cache_scheme": FP8_KV},
        "entry_point": "compressed_tensors.entrypoints.convert.convert_checkpoint("
                       "input, expected, ModelOptNvfp4Converter(...), max_workers=1)",
        "dtype": "bfloat16",
        "shards": 1,
        "layers": 1,
        "scalar_checks": nvfp4_scalar_checks(tensors, exp),
        "ignore": ["lm_head"],
        "exercises": "ModelOpt NVFP4 (W4A4) on every Linear of both layers with FP8 kv cache: "
                     "weight -> weight_packed (bytes unchanged), weight_scale F8_E4M3 kept, "
                     "weight_scale_2 / input_scale F32 [] -> weight_global_scale / "
                     "input_global_scale = 1/x (F32 []), k_proj.k_scale / v_proj.v_scale "
                     "F32 [] -> BF16 []; hf_quant_config.json copied; exclude_modules "
                     "[\"lm_head\"] given as ignore; all-zero blocks (scale 1.0)",
        "model_free_ptq": model_free_agreement(inp, exp, scratch, nvfp4_converter(True)),
        "hf_load": hf_load(exp, ref),
        "hf_load_reference": "the input dequantized as ModelOpt does (e2m1 * weight_scale * "
                             "weight_scale_2, BF16), activations not quantized",
        "hf_load_note": "transformers (compressed-tensors' HF quantizer) wants the kv-cache "
                        "scales at self_attn.k_scale / self_attn.v_scale; the converter keeps "
                        "ModelOpt's self_attn.k_proj.k_scale / v_proj.v_scale (vLLM's "
                        "maybe_remap_kv_scale_name maps those to self_attn.attn.k_scale), so "
                        "transformers reports them missing/unexpected and runs with "
                        "uninitialised kv scales: the logits are far off. With the two names "
                        "changed by hand it loads clean (rel_logit_err 0.13 against the same "
                        "checkpoint without kv-cache quantization).",
    }


def run_mix(golden, scratch):
    case = "modelopt-nvfp4-mlp-fp8-block-attn"
    cdir = f"{golden}/{case}"
    _, reference = build_nvfp4(cdir, 301, 1, lambda rel: rel.startswith("mlp."), kv_cache=False)
    inp, exp = f"{cdir}/input", f"{cdir}/expected"
    if os.path.exists(exp):
        shutil.rmtree(exp)
    scheme = QuantizationScheme(**FP8_BLOCK, targets=list(MIX_SCHEME_TARGETS))
    conv = ModelOptNvfp4Converter(targets=list(MIX_CONVERTER_TARGETS))
    err, log = capture(lambda: model_free_ptq(inp, exp, scheme=scheme, ignore=["lm_head"],
                                              max_workers=1, device="cpu", converter=conv))
    if err is not None:
        raise RuntimeError(f"{case}: model_free_ptq failed\n{log}")
    normalise_modes(cdir)
    ref = f"{scratch}/{case}-reference"
    write_reference(ref, f"{inp}/config.json", reference)
    return {
        "case": case,
        "kind": "mixed",
        "source_format": "modelopt-nvfp4",
        "converter": "ModelOptNvfp4Converter",
        "converter_args": {"targets": MIX_CONVERTER_TARGETS},
        "scheme": "config_group_0",
        "config": {"targets": MIX_SCHEME_TARGETS, "preset": "FP8_BLOCK"},
        "entry_point": "llmcompressor.model_free_ptq(input, expected, scheme=QuantizationScheme("
                       "**FP8_BLOCK, targets=[...]), ignore=[\"lm_head\"], max_workers=1, "
                       "device=\"cpu\", converter=ModelOptNvfp4Converter(targets=[...]))",
        "dtype": "bfloat16",
        "shards": 1,
        "layers": 1,
        "ignore": ["lm_head"],
        "exercises": "examples/model_free_ptq/deepseek_r1_nvfp4_fp8_block.py on a Llama layout "
                     "(DeepSeek's MLA/MoE layout left out for size): ModelOpt NVFP4 MLP "
                     "(exclude_modules lists the BF16 attention as model.layers.N.self_attn*) "
                     "converted, BF16 q/k/v/o quantized FP8_BLOCK 128x128 in the same run; "
                     "config = converter group config_group_0 + scheme group merged as "
                     "config_group_1, format mixed-precision; the ignore= list of "
                     "model_free_ptq does not reach the written config",
        "hf_load": hf_load(exp, ref),
        "hf_load_reference": "attention BF16 as in the input, MLP dequantized as ModelOpt does",
    }


# ---------------------------------------------------------------- refusals


def refusal_dir(golden, name):
    return fresh(f"{golden}/converter-refusals/{name}")


SMALL = dict(layers=1, hidden=128, inter=256)


def small_config(d, dtype, qc, extra=None):
    L.write_json(f"{d}/config.json", L.llama_config(dtype, qc, **SMALL), sort_keys=True)
    for name, obj in (extra or {}).items():
        L.write_json(f"{d}/{name}", obj, indent=4)


def small_linears():
    return [s for s in L.linear_shapes(**SMALL) if s[1] in ("self_attn.q_proj", "mlp.down_proj")]


def awq_refusal(golden, name, version, bits, layout, zero_point=True):
    d = refusal_dir(golden, name)
    gen = torch.Generator().manual_seed(400 + len(name))
    t = {}
    for i, (mod, rel, out, inp) in enumerate(small_linears()):
        w = L.random_weight(gen, out, inp, torch.float16, i)
        for p, v in layout(w).items():
            t[f"{mod}.{p}"] = v
    L.save_shard(t, f"{d}/model.safetensors")
    small_config(d, "float16", L.awq_quantization_config(bits, 128, zero_point, version, None))
    return d, lambda out: convert_checkpoint(d, out, AutoAWQConverter.from_pretrained(d))


def awq_8bit_layout(w):
    """No AutoAWQ code writes 8-bit GEMM (WQLinear_GEMM raises for w_bit != 4): 4 codes per
    int32 in natural order along out_features, F16 scales, zero points 128 (an assumption)."""
    _, scales, zeros = L.awq_pseudo_quantize(w, 128, True, bits=8)
    import numpy as np
    w_fq, _, _ = L.awq_pseudo_quantize(w, 128, True, bits=8)
    q = L.awq_codes(w_fq, scales.t().contiguous(), zeros.t().contiguous(), 128).t()
    v = q.to(torch.int64).reshape(q.shape[0], -1, 4)
    word = sum(v[:, :, i] << (8 * i) for i in range(4))
    z = zeros.t().to(torch.int64).reshape(zeros.shape[1], -1, 4)
    zw = sum(z[:, :, i] << (8 * i) for i in range(4))
    i32 = lambda x: torch.from_numpy(x.numpy().astype(np.uint32).view(np.int32))
    return {"qweight": i32(word), "qzeros": i32(zw), "scales": scales.t().contiguous().half()}


def modelopt_refusal(golden, name, modules, quant_algo, hf_extra, converter):
    """modules: rel name -> 'nvfp4' | 'fp8' | 'w4a16_nvfp4' | 'bf16'."""
    d = refusal_dir(golden, name)
    gen = torch.Generator().manual_seed(500 + len(name))
    t, q_layers, unq, per_layer = {}, [], ["lm_head"], {}
    for i, (mod, rel, out, inp) in enumerate(small_linears()):
        w = L.random_weight(gen, out, inp, torch.bfloat16, i)
        kind = modules[rel]
        if kind == "bf16":
            t[f"{mod}.weight"] = w
            unq.append(mod)
            continue
        q_layers.append(mod)
        if kind == "fp8":
            # _export_quantized_weight, QUANTIZATION_FP8: per-tensor F32 weight_scale = amax/448,
            # input_scale = act_amax/448, weight = (w / weight_scale).to(F8_E4M3)
            ws = (w.abs().amax().float() / 448.0).reshape(())
            t[f"{mod}.weight"] = (w.float() / ws).to(torch.float8_e4m3fn)
            t[f"{mod}.weight_scale"] = ws
            t[f"{mod}.input_scale"] = torch.tensor(6.5 / 448.0, dtype=torch.float32)
            per_layer[mod] = {"quant_algo": "FP8"}
        else:
            ws2 = w.abs().amax().float() / (6.0 * 448.0)
            packed, scale8 = L.nvfp4_weight(w, ws2)
            t[f"{mod}.weight"] = packed
            t[f"{mod}.weight_scale"] = scale8
            t[f"{mod}.weight_scale_2"] = ws2.reshape(())
            if kind == "nvfp4":
                t[f"{mod}.input_scale"] = torch.tensor(6.5 / (6.0 * 448.0), dtype=torch.float32)
                per_layer[mod] = {"quant_algo": "NVFP4", "group_size": 16}
            else:
                per_layer[mod] = {"quant_algo": "W4A16_NVFP4", "group_size": 16}
    L.save_shard(t, f"{d}/model.safetensors")
    hf = L.modelopt_hf_quant_config(quant_algo, None, hf_extra.get("group_size"),
                                    L.summarize_exclude_modules(unq, q_layers),
                                    quantized_layers=per_layer)
    small_config(d, "bfloat16", L.modelopt_config_json_quantization(hf),
                 {"hf_quant_config.json": hf})
    return d, lambda out: convert_checkpoint(d, out, converter)


def run_refusals(golden, scratch):
    nv_targets = [r"re:.*mlp.*\.(gate_up|gate|up|down)_proj$", r"re:.*self_attn.*\.(q|k|v|o)_proj$"]
    specs = [
        ("awq-gemv", "AutoAWQ GEMV (version gemv): qweight [out, in/8] packed along in_features "
         "in natural order, qzeros [out, W], scales [out, 8W] zero-padded",
         lambda g: awq_refusal(g, "awq-gemv", "gemv", 4, lambda w: L.awq_gemv_module(w, 128))),
        ("awq-marlin", "AutoAWQ Marlin (version marlin, zero_point false): qweight [in/16, "
         "2*out] of permuted 16x16 tiles, permuted scales, no qzeros",
         lambda g: awq_refusal(g, "awq-marlin", "marlin", 4,
                               lambda w: L.awq_marlin_module(w, 128), zero_point=False)),
        ("awq-exllama", "version exllama (transformers' AwqConfig names a kernel, not a layout; "
         "the tensors are GEMM-packed)",
         lambda g: awq_refusal(g, "awq-exllama", "exllama", 4,
                               lambda w: L.awq_gemm_module(w, 128, True)[0])),
        ("awq-gemm-uppercase-version", "version \"GEMM\" in upper case (AutoAWQ's own "
         "quant_config default; AutoAWQ lower-cases it when it writes config.json, older "
         "checkpoints and hand-made configs keep it); tensors GEMM-packed",
         lambda g: awq_refusal(g, "awq-gemm-uppercase-version", "GEMM", 4,
                               lambda w: L.awq_gemm_module(w, 128, True)[0])),
        ("awq-8bit", "bits 8, version gemm (no AutoAWQ kernel writes it: 4 codes per int32 in "
         "natural order is this fixture's assumption)",
         lambda g: awq_refusal(g, "awq-8bit", "gemm", 8, awq_8bit_layout)),
        ("awq-not-converted-module-quantized", "modules_to_not_convert names mlp.down_proj but "
         "the shard holds down_proj.qweight/qzeros/scales (config and tensors disagree)",
         lambda g: awq_refusal_mtnc(g)),
        ("modelopt-fp8", "ModelOpt FP8 (quant_algo FP8): F8_E4M3 weight, F32 [] weight_scale and "
         "input_scale, no weight_scale_2; run with the NVFP4 targets",
         lambda g: modelopt_refusal(g, "modelopt-fp8", {"self_attn.q_proj": "fp8", "mlp.down_proj": "fp8"},
                                    "FP8", {}, ModelOptNvfp4Converter(targets=nv_targets))),
        ("modelopt-mixed-precision", "ModelOpt MIXED_PRECISION: q_proj FP8, down_proj NVFP4 "
         "(quantized_layers, no exclude_modules); converter targets the NVFP4 module only",
         lambda g: modelopt_refusal(g, "modelopt-mixed-precision",
                                    {"self_attn.q_proj": "fp8", "mlp.down_proj": "nvfp4"},
                                    "MIXED_PRECISION", {},
                                    ModelOptNvfp4Converter(targets=[r"re:.*mlp\.down_proj$"]))),
        ("modelopt-mixed-precision-fp8-ignored", "the same input with the FP8 module in the "
         "converter's ignore list",
         lambda g: modelopt_refusal(g, "modelopt-mixed-precision-fp8-ignored",
                                    {"self_attn.q_proj": "fp8", "mlp.down_proj": "nvfp4"},
                                    "MIXED_PRECISION", {},
                                    ModelOptNvfp4Converter(targets=[r"re:.*mlp\.down_proj$"],
                                                           ignore=[r"re:.*self_attn.*"]))),
        ("modelopt-w4a16-nvfp4", "ModelOpt W4A16_NVFP4 (weight-only NVFP4: no input_scale); run "
         "with the NVFP4 targets",
         lambda g: modelopt_refusal(g, "modelopt-w4a16-nvfp4",
                                    {"self_attn.q_proj": "w4a16_nvfp4", "mlp.down_proj": "w4a16_nvfp4"},
                                    "W4A16_NVFP4", {"group_size": 16},
                                    ModelOptNvfp4Converter(targets=nv_targets))),
    ]
    records = []
    for name, what, build in specs:
        d, call = build(golden)
        out = fresh(f"{scratch}/refusal-{name}")
        err, log = capture(lambda: call(out))
        rec = {"case": f"converter-refusals/{name}", "kind": "refusal", "input": what}
        if err is not None:
            rec["library"] = {"raised": type(err).__name__, "message": str(err)}
        else:
            t = read_tensors(out)
            with open(f"{out}/config.json") as f:
                qc = json.load(f).get("quantization_config")
            rec["library"] = {"raised": None, "silent_output": {
                "tensors": {k: [str(v.dtype).replace("torch.", ""), list(v.shape)]
                            for k, v in sorted(t.items())},
                "quantization_config": qc}}
        normalise_modes(d)
        records.append(rec)
    return records


def awq_refusal_mtnc(golden):
    d = refusal_dir(golden, "awq-not-converted-module-quantized")
    gen = torch.Generator().manual_seed(450)
    t = {}
    for i, (mod, rel, out, inp) in enumerate(small_linears()):
        w = L.random_weight(gen, out, inp, torch.float16, i)
        for p, v in L.awq_gemm_module(w, 128, True)[0].items():
            t[f"{mod}.{p}"] = v
    L.save_shard(t, f"{d}/model.safetensors")
    small_config(d, "float16", L.awq_quantization_config(4, 128, True, "gemm", ["mlp.down_proj"]))
    return d, lambda out: convert_checkpoint(d, out, AutoAWQConverter.from_pretrained(d))


def run_probes(golden, scratch):
    """Library behaviour the spec cites that needs no fixture files (kind "probe")."""
    records = []
    # 1. A scheme that targets "Linear" beside the converter: which tensors each takes, and
    #    whether model_free_ptq's ignore list reaches the written config.
    src = f"{scratch}/probe-mix-linear"
    build_nvfp4(src, 311, 1, lambda rel: rel.startswith("mlp."), kv_cache=False)
    out = f"{scratch}/probe-mix-linear-out"
    scheme = QuantizationScheme(**FP8_BLOCK, targets=["Linear"])
    conv = ModelOptNvfp4Converter(targets=list(MIX_CONVERTER_TARGETS))
    err, log = capture(lambda: model_free_ptq(f"{src}/input", out, scheme=scheme,
                                              ignore=["lm_head", "model.embed_tokens"],
                                              max_workers=1, device="cpu", converter=conv))
    rec = {"case": "probe/mix-scheme-targets-linear", "kind": "probe",
           "call": "model_free_ptq(scheme=QuantizationScheme(**FP8_BLOCK, targets=[\"Linear\"]), "
                   "ignore=[\"lm_head\", \"model.embed_tokens\"], converter="
                   "ModelOptNvfp4Converter(targets=[mlp regex])) on a 1-layer NVFP4-MLP input"}
    if err is not None:
        rec["library"] = {"raised": type(err).__name__, "message": str(err)}
    else:
        t = read_tensors(out)
        with open(f"{out}/config.json") as f:
            qc = json.load(f)["quantization_config"]
        rec["library"] = {"raised": None,
                          "tensors": {k: [str(v.dtype).replace("torch.", ""), list(v.shape)]
                                      for k, v in sorted(t.items())},
                          "ignore": qc["ignore"], "format": qc["format"],
                          "groups": {g: {"targets": v["targets"], "format": v["format"]}
                                     for g, v in qc["config_groups"].items()}}
    records.append(rec)
    # 2. The converter with no targets: every module's "weight" is renamed.
    def empty_targets():
        c = ModelOptNvfp4Converter()
        t = {"model.embed_tokens.weight": torch.zeros(4, 4, dtype=torch.bfloat16),
             "model.norm.weight": torch.ones(4, dtype=torch.bfloat16),
             "lm_head.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}
        return sorted(c.process(dict(t))), sorted(
            n for n in t if c.get_dependencies(n))
    names, deps = empty_targets()
    records.append({"case": "probe/modelopt-converter-empty-targets", "kind": "probe",
                    "call": "ModelOptNvfp4Converter().process({embed_tokens.weight, norm.weight, "
                            "lm_head.weight})",
                    "library": {"raised": None, "tensor_names_after": names,
                                "names_with_dependencies": deps}})
    # 3. AWQ group_size -1 (per-channel) in the written config.
    err, _ = capture(lambda: AutoAWQConverter(group_size=-1).create_config())
    rec = {"case": "probe/awq-group-size-minus-1", "kind": "probe",
           "call": "AutoAWQConverter(group_size=-1).create_config()"}
    if err is not None:
        rec["library"] = {"raised": type(err).__name__, "message": str(err)[:400]}
    else:
        w = AutoAWQConverter(group_size=-1).create_config().config_groups["config_group_0"].weights
        rec["library"] = {"raised": None, "weights": w.model_dump(mode="json")}
    records.append(rec)
    return records


def main(argv):
    golden, scratch = argv[0], argv[1]
    only = set(argv[2:])
    want = lambda c: not only or c in only
    prov = provenance()
    cases = []
    for spec in AWQ_CASES:
        if want(spec[0]):
            cases.append(run_awq(golden, scratch, *spec))
    if want("modelopt-nvfp4-kv"):
        cases.append(run_nvfp4(golden, scratch))
    if want("modelopt-nvfp4-mlp-fp8-block-attn"):
        cases.append(run_mix(golden, scratch))
    if want("refusals"):
        cases.extend(run_refusals(golden, scratch))
    if want("probes"):
        cases.extend(run_probes(golden, scratch))
    for c in cases:
        c["expected_by"] = prov
    path = f"{golden}/converter_cases.json"
    if only and os.path.exists(path):
        with open(path) as f:
            old = {c["case"]: c for c in json.load(f)}
        for c in cases:
            old[c["case"]] = c
        cases = list(old.values())
    L.write_json(path, cases)
    os.chmod(path, 0o644)
    print(json.dumps([{k: c.get(k) for k in ("case", "hf_load", "library")} for c in cases],
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
