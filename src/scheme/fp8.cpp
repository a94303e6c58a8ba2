// The FP8 E4M3 weight families `float-quantized` and `naive-quantized`
// (scheme/fp8.hpp): presets, format inference, shapes, the scalar reference
// kernel, the dequantizer and vLLM's shape rule.
//
// Sources: schemes.md sections 2.1 (the E4M3 cast), 3 (scale and quotient),
// 4 (FP8_DYNAMIC, FP8_BLOCK, per-tensor FP8); compressed-tensors
// `quantization/quant_scheme.py` (presets), `compressors/format.py` and
// `compressors/naive_quantized/base.py` (formats, padding of blocks);
// vLLM `quantization/compressed_tensors/compressed_tensors.py` (which
// scheme serves which args) and `quantization/utils/fp8_utils.py`
// (validate_fp8_block_shape).
#include "ctquant/scheme/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/minifloat.hpp"

#include "scheme/byte_code_simd.hpp"
#include "scheme/dequant_simd.hpp"
#include "scheme/row_support.hpp"

namespace ctquant {

namespace {

using S = QuantArgs::Strategy;
using detail::element_bytes;

constexpr float kE4M3Max = 448.0f;            // finfo(float8_e4m3fn).max
constexpr std::uint64_t kVllmBlock = 128;     // the only FP8 block vLLM runs

QuantArgs fp8_weights(S strategy) {
  QuantArgs a;
  a.type = QuantArgs::Type::kFloat;
  a.num_bits = 8;
  a.symmetric = true;
  a.strategy = strategy;
  a.group_size = 0;
  if (strategy == S::kBlock) a.block = {kVllmBlock, kVllmBlock};
  return a;
}

// compressed-tensors `quantization/quant_scheme.py` FP8_DYNAMIC and
// FP8_BLOCK; their input_activations as model_dump writes them (schemes.md
// 4.1, 4.2). The FP8 preset (static per-tensor activations) is refused by
// model_free_ptq: see scheme/refused_presets.hpp.
const Preset kFloatQuantizedPresets[] = {
    {"FP8_DYNAMIC", fp8_weights(S::kChannel),
     R"({"actorder": null, "block_structure": null, "dynamic": true, "group_size": null, )"
     R"("num_bits": 8, "observer": null, "observer_kwargs": {}, "scale_dtype": null, )"
     R"("strategy": "token", "symmetric": true, "type": "float", "zp_dtype": null})"},
    {"FP8_BLOCK", fp8_weights(S::kBlock),
     R"({"actorder": null, "block_structure": null, "dynamic": true, "group_size": 128, )"
     R"("num_bits": 8, "observer": null, "observer_kwargs": {}, "scale_dtype": null, )"
     R"("strategy": "group", "symmetric": true, "type": "float", "zp_dtype": null})"},
};

// compressors/format.py rule 6 (FloatQuantizationCompressor.can_compress):
// float weights with input activations present. The MX and NVFP4 formats
// come earlier in the priority order and take their args first.
bool writes_float_quantized(const QuantArgs& args, bool has_input_activations) {
  return args.type == QuantArgs::Type::kFloat && has_input_activations;
}

// Rule 7 (NaiveQuantizationCompressor.can_compress): any weights, the
// fallback after every other format.
bool writes_naive_quantized(const QuantArgs&, bool) { return true; }

std::string supports(const QuantArgs& args) {
  if (args.type != QuantArgs::Type::kFloat || args.num_bits != 8) {
    return fmt::format(
        "{}-bit {} weights: this format is written for FP8 (8-bit float) weights only",
        args.num_bits, args.type == QuantArgs::Type::kInt ? "integer" : "float");
  }
  if (!args.symmetric) {
    return "asymmetric FP8 weights: vLLM's FP8 kernels take symmetric weights only "
           "(compressed_tensors.py, _is_fp8_w8a8 / _is_fp8_w8a16)";
  }
  switch (args.strategy) {
    case S::kChannel:
    case S::kTensor:
      break;
    case S::kBlock:
      if (args.block[0] != kVllmBlock || args.block[1] != kVllmBlock) {
        return fmt::format(
            "FP8 block_structure [{}, {}]: vLLM's block FP8 kernels take 128x128 blocks "
            "(kFp8Static128BlockSym in compressed_tensors/utils.py)",
            args.block[0], args.block[1]);
      }
      break;
    default:
      return fmt::format(
          "FP8 weights with strategy \"{}\": vLLM's FP8 kernels take tensor, channel or "
          "128x128 block scales (MXFP8 is group_size 32 with scale_dtype torch.uint8)",
          strategy_name(args.strategy));
  }
  if (args.scale_dtype) {
    return fmt::format(
        "scale_dtype {}: FP8 weight scales are stored in the weight's dtype (no scale_dtype)",
        dtype_tag(*args.scale_dtype));
  }
  return {};
}

std::string refuse(const QuantArgs& args, std::uint64_t rows, std::uint64_t cols) {
  if (rows == 0 || cols == 0) return "has no elements: there is no maximum to scale by";
  // schemes.md 4.2: the block statistics pad the weight to whole blocks;
  // when K is padded, the FP8 weight cut back to [N, K] is a column slice
  // (non-contiguous) and safetensors' save_file raises "You are trying to
  // save a non contiguous tensor" after validation. N may be ragged.
  if (args.strategy == S::kBlock && cols % args.block[1] != 0) {
    return fmt::format(
        "has in_features {}, not a multiple of the FP8 block width {}: model_free_ptq fails "
        "to save such a weight (its FP8 codes, cut back from the padded blocks, are a "
        "non-contiguous tensor that safetensors refuses)",
        cols, args.block[1]);
  }
  return {};
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

std::vector<OutputTensorSpec> outputs(const QuantArgs& args, DType weight_dtype,
                                      std::uint64_t rows, std::uint64_t cols) {
  using K = OutputTensorSpec::Kind;
  std::vector<OutputTensorSpec> out;
  out.push_back(detail::rows_tensor("weight", DType::kF8_E4M3, rows, cols, 1, K::kCodes));
  switch (args.strategy) {
    case S::kBlock:
      out.push_back(detail::rows_tensor("weight_scale", weight_dtype, ceil_div(rows, args.block[0]),
                                        ceil_div(cols, args.block[1]), args.block[0], K::kScale));
      break;
    case S::kTensor:
      // Shape (1,), not a 0-d tensor (initialize_qparams, schemes.md 1.1).
      out.push_back(detail::whole_tensor_spec("weight_scale", weight_dtype, {1}, K::kScale));
      break;
    default:
      out.push_back(detail::rows_tensor("weight_scale", weight_dtype, rows, 1, 1, K::kScale));
  }
  return out;
}

// The per-tensor scale, from the module's amax.
std::vector<std::byte> whole_tensor(const QuantArgs&, DType weight_dtype, std::uint64_t,
                                    std::uint64_t, float tensor_amax, std::size_t) {
  std::vector<std::byte> bytes(element_bytes(weight_dtype));
  detail::store_as_dtype(weight_dtype, fp8_weight_scale(weight_dtype, tensor_amax), bytes.data());
  return bytes;
}

// Block scales: chunks hold whole row blocks (each grid row is computed
// from all the rows it covers).
std::uint64_t row_alignment(const QuantArgs& args) {
  return args.strategy == S::kBlock ? args.block[0] : 1;
}

bool needs_tensor_amax(const QuantArgs& args) { return args.strategy == S::kTensor; }

std::uint64_t scratch_bytes(const QuantArgs&, std::uint64_t, std::uint64_t) { return 0; }

// Section 4 of schemes.md, one row, block or tensor at a time: a plain loop
// that reads like the spec. Non-finite weights are looked for first, in
// row-major order, so the index reported is the first one whatever the
// strategy visits first.
std::optional<std::uint64_t> quantize_ref(const QuantArgs& args, const KernelIo& io) {
  if (const auto bad = detail::first_non_finite(io)) return bad;
  const DType t = io.dtype;
  const std::size_t esize = element_bytes(t);
  const auto w = [&](std::uint64_t r, std::uint64_t c) {
    return load_as_float(t, io.weight + (r * io.n_cols + c) * esize);
  };
  const auto code = [&](std::uint64_t r, std::uint64_t c, float s) {
    io.out[0][r * io.n_cols + c] = std::byte{fp8_weight_code(t, w(r, c), s)};
  };
  switch (args.strategy) {
    case S::kChannel:
      for (std::uint64_t r = 0; r < io.n_rows; ++r) {
        float amax = 0.0f;
        for (std::uint64_t c = 0; c < io.n_cols; ++c) amax = std::max(amax, std::fabs(w(r, c)));
        const float s = fp8_weight_scale(t, amax);
        for (std::uint64_t c = 0; c < io.n_cols; ++c) code(r, c, s);
        detail::store_as_dtype(t, s, io.out[1] + r * esize);
      }
      break;
    case S::kBlock: {
      // A partial bottom block holds only the weight's rows; the zeros the
      // reference pads it with do not change max |w|.
      const std::uint64_t bh = args.block[0];
      const std::uint64_t bw = args.block[1];
      const std::uint64_t grid_cols = ceil_div(io.n_cols, bw);
      for (std::uint64_t i = 0; i < ceil_div(io.n_rows, bh); ++i) {
        const std::uint64_t r0 = i * bh;
        const std::uint64_t r1 = std::min(r0 + bh, io.n_rows);
        for (std::uint64_t j = 0; j < grid_cols; ++j) {
          const std::uint64_t c0 = j * bw;
          const std::uint64_t c1 = std::min(c0 + bw, io.n_cols);
          float amax = 0.0f;
          for (std::uint64_t r = r0; r < r1; ++r) {
            for (std::uint64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w(r, c)));
          }
          const float s = fp8_weight_scale(t, amax);
          for (std::uint64_t r = r0; r < r1; ++r) {
            for (std::uint64_t c = c0; c < c1; ++c) code(r, c, s);
          }
          detail::store_as_dtype(t, s, io.out[1] + (i * grid_cols + j) * esize);
        }
      }
      break;
    }
    default: {  // kTensor: one scale from the module's amax
      const float s = fp8_weight_scale(t, io.tensor_amax);
      for (std::uint64_t r = 0; r < io.n_rows; ++r) {
        for (std::uint64_t c = 0; c < io.n_cols; ++c) code(r, c, s);
      }
    }
  }
  return std::nullopt;
}

// The vector kernel at the best level this CPU runs (byte_code_simd.cpp),
// else the reference.
std::optional<std::uint64_t> quantize_fast(const QuantArgs& args, const KernelIo& io) {
  if (detail::ByteCodeKernel* kernel = detail::byte_code_kernel(detail::simd_best_level())) {
    return kernel(detail::ByteCode::kE4M3, args, io);
  }
  return quantize_ref(args, io);
}

// code * scale, rounded to the weight's dtype: the decompressor's
// `x_q.to(scale.dtype) * scale` (compressed-tensors
// `quantization/lifecycle/forward_helpers.py`, _dequantize).
void dequantize(const QuantArgs& args, const DequantIo& io) {
  const DType t = io.dtype;
  const std::size_t esize = element_bytes(t);
  const std::uint64_t grid_cols =
      args.strategy == S::kBlock ? ceil_div(io.n_cols, args.block[1]) : 1;
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    for (std::uint64_t c = 0; c < io.n_cols; ++c) {
      const std::byte* scale = nullptr;
      switch (args.strategy) {
        case S::kChannel:
          scale = io.in[1] + r * esize;
          break;
        case S::kBlock:
          scale = io.in[1] + ((r / args.block[0]) * grid_cols + c / args.block[1]) * esize;
          break;
        default:
          scale = io.whole[0];
      }
      const float q = f8_e4m3_to_float(std::to_integer<std::uint8_t>(io.in[0][r * io.n_cols + c]));
      io.values[r * io.n_cols + c] = round_to_dtype(t, q * load_as_float(t, scale));
    }
  }
}

// dequantize's values for rows [r0, r1): each scale read as dequantize
// reads it, then code * scale rounded to the weight's dtype by the vector
// decoder (dequant_simd.hpp).
void dequantize_rows(const QuantArgs& args, const DequantIo& io, std::uint64_t r0,
                     std::uint64_t r1, float* values) {
  const DType t = io.dtype;
  const std::size_t esize = element_bytes(t);
  const std::uint64_t n = r1 - r0;
  const std::uint64_t group = args.strategy == S::kBlock ? args.block[1] : io.n_cols;
  const std::uint64_t groups = ceil_div(io.n_cols, group);
  std::vector<float> scales(n * groups);
  for (std::uint64_t r = 0; r < n; ++r) {
    for (std::uint64_t j = 0; j < groups; ++j) {
      const std::byte* scale = io.whole[0];
      if (args.strategy == S::kChannel) {
        scale = io.in[1] + (r0 + r) * esize;
      } else if (args.strategy == S::kBlock) {
        scale = io.in[1] + (((r0 + r) / args.block[0]) * groups + j) * esize;
      }
      scales[r * groups + j] = load_as_float(t, scale);
    }
  }
  detail::ExpandRows x;
  x.kind = detail::CodeKind::kE4M3;
  x.codes = io.in[0] + r0 * io.n_cols;
  x.row_bytes = io.n_cols;
  x.n_rows = n;
  x.n_cols = io.n_cols;
  x.group_cols = group;
  x.multipliers = scales.data();
  x.round_to = t;
  x.values = values;
  detail::expand_codes(x);
}

// Every args `supports` takes has a vLLM kernel: CompressedTensorsW8A8Fp8
// (SM89+; W8A16 Marlin FP8 below) with input activations,
// CompressedTensorsW8A16Fp8 without (compressed_tensors.py, _is_fp8_w8a8,
// _is_fp8_w8a16).
std::string vllm_args_rule(const QuantArgs&) { return {}; }

// vLLM fp8_utils.py validate_fp8_block_shape (called by
// CompressedTensorsW8A8Fp8 and CompressedTensorsW8A16Fp8 for block
// weights) raises a ValueError at load: a row-parallel shard's in_features
// and each logical output partition of a column-parallel layer must be
// multiples of the block. (At tp 1 it checks the partitions of a merged
// layer, q/k/v or gate/up, except the last: lint passes those as kColumn,
// the other column layers at tp 1 as kReplicated.) Tensor and channel scales have
// no shape rule: CUTLASS FP8 falls back to Triton when K or N is not a
// multiple of 16 (vllm/_custom_ops.py cutlass_scaled_mm).
std::vector<ShapeProblem> vllm_shape_rule(const QuantArgs& args, std::uint64_t rows,
                                          std::uint64_t cols, Parallel parallel) {
  std::vector<ShapeProblem> out;
  if (args.strategy != S::kBlock) return out;
  if (parallel == Parallel::kRow && cols % args.block[1] != 0) {
    out.push_back({true, fmt::format("in_features {} per shard is not a multiple of the FP8 "
                                     "block width {}",
                                     cols, args.block[1])});
  }
  if (parallel == Parallel::kColumn && rows % args.block[0] != 0) {
    out.push_back({true, fmt::format("out_features {} per shard is not a multiple of the FP8 "
                                     "block height {}",
                                     rows, args.block[0])});
  }
  return out;
}

}  // namespace

float fp8_weight_scale(DType weight_dtype, float amax) {
  const float s = round_to_dtype(weight_dtype, amax / kE4M3Max);
  return s == 0.0f ? dtype_eps(weight_dtype) : s;
}

std::uint8_t fp8_weight_code(DType weight_dtype, float w, float s) {
  const float y = std::clamp(round_to_dtype(weight_dtype, w / s), -kE4M3Max, kE4M3Max);
  return float_to_f8_e4m3(y);
}

const SchemeFamily kFloatQuantizedFamily{
    .id = "fp8",
    .format = "float-quantized",
    .summary = "FP8 E4M3 weights (per channel, 128x128 blocks or per tensor), scales in the "
               "weight's dtype, dynamic FP8 activations (vLLM W8A8 FP8)",
    .presets = kFloatQuantizedPresets,
    .writes = writes_float_quantized,
    .supports = supports,
    .refuse = refuse,
    .outputs = outputs,
    .whole_tensor = whole_tensor,
    .row_alignment = row_alignment,
    .needs_tensor_amax = needs_tensor_amax,
    .scratch_bytes = scratch_bytes,
    .quantize_ref = quantize_ref,
    .quantize = quantize_fast,
    .dequantize = dequantize,
    .dequantize_rows = dequantize_rows,
    .vllm_args_rule = vllm_args_rule,
    .vllm_shape_rule = vllm_shape_rule,
    .vllm_source =
        "vllm/model_executor/layers/quantization/compressed_tensors/schemes/"
        "compressed_tensors_w8a8_fp8.py, vllm/model_executor/layers/quantization/utils/"
        "fp8_utils.py",
};

// Weights-only FP8 (no input_activations): vLLM reads `naive-quantized` as
// an activation-quantization format (is_activation_quantization_format in
// compressed_tensors/utils.py), accepts the missing input activations for
// float weights and serves tensor, channel and block FP8 weights with
// CompressedTensorsW8A16Fp8 (Marlin FP8, SM75+); not for fused MoE experts.
const SchemeFamily kNaiveQuantizedFamily{
    .id = "fp8-weights-only",
    .format = "naive-quantized",
    .summary = "FP8 E4M3 weights without activation quantization (vLLM W8A16 FP8, Marlin)",
    .presets = {},
    .writes = writes_naive_quantized,
    .supports = supports,
    .refuse = refuse,
    .outputs = outputs,
    .whole_tensor = whole_tensor,
    .row_alignment = row_alignment,
    .needs_tensor_amax = needs_tensor_amax,
    .scratch_bytes = scratch_bytes,
    .quantize_ref = quantize_ref,
    .quantize = quantize_fast,
    .dequantize = dequantize,
    .dequantize_rows = dequantize_rows,
    .vllm_args_rule = vllm_args_rule,
    .vllm_shape_rule = vllm_shape_rule,
    .vllm_source =
        "vllm/model_executor/layers/quantization/compressed_tensors/schemes/"
        "compressed_tensors_w8a16_fp8.py, vllm/model_executor/layers/quantization/utils/"
        "fp8_utils.py",
};

}  // namespace ctquant
