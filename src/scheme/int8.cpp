// The `int-quantized` family (scheme/int8.hpp): presets W8A8 and INT8,
// format inference, shapes, the scalar reference kernel, the fast path, the
// dequantizer and vLLM's rule.
//
// Sources: schemes.md sections 1.1 (rule 4), 3 (scale, double rounding),
// 12 V5; compressed-tensors `quantization/quant_scheme.py` (INT8_W8A8) and
// `compressors/naive_quantized/base.py` (IntQuantizationCompressor);
// vLLM `quantization/compressed_tensors/compressed_tensors.py`
// (_is_dynamic_token_w8a8, _is_dynamic_token_w4a8_int) and
// `schemes/compressed_tensors_w8a8_int8.py`.
#include "ctquant/scheme/int8.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "scheme/byte_code_simd.hpp"
#include "scheme/dequant_simd.hpp"
#include "scheme/row_support.hpp"

namespace ctquant {

namespace {

using S = QuantArgs::Strategy;
using detail::element_bytes;

constexpr float kInt8Min = -128.0f;
constexpr float kInt8Max = 127.0f;
constexpr float kInt8HalfRange = 127.5f;  // (127 - (-128)) / 2, schemes.md 3.2

QuantArgs int8_channel() {
  QuantArgs a;
  a.type = QuantArgs::Type::kInt;
  a.num_bits = 8;
  a.symmetric = true;
  a.strategy = S::kChannel;
  a.group_size = 0;
  return a;
}

// compressed-tensors `quantization/quant_scheme.py` INT8_W8A8, registered
// as "W8A8" and "INT8"; its input activations as model_dump writes them.
constexpr const char* kInt8TokenActivations =
    R"({"actorder": null, "block_structure": null, "dynamic": true, "group_size": null, )"
    R"("num_bits": 8, "observer": null, "observer_kwargs": {}, "scale_dtype": null, )"
    R"("strategy": "token", "symmetric": true, "type": "int", "zp_dtype": null})";

const Preset kIntQuantizedPresets[] = {
    {"W8A8", int8_channel(), kInt8TokenActivations},
    {"INT8", int8_channel(), kInt8TokenActivations},
};

// compressors/format.py rule 4 (IntQuantizationCompressor.can_compress):
// integer weights with input activations present, whatever the bit width.
bool writes(const QuantArgs& args, bool has_input_activations) {
  return args.type == QuantArgs::Type::kInt && has_input_activations;
}

std::string supports(const QuantArgs& args) {
  if (args.type != QuantArgs::Type::kInt) {
    return "float weights: this format is written for integer weights only";
  }
  if (args.num_bits != 8) {
    return fmt::format(
        "{}-bit integer weights with input activations are written int-quantized, as "
        "unpacked values in an int8 tensor; vLLM runs those only on CPU and XPU "
        "(CompressedTensorsW4A8Int: no NVIDIA GPU kernel; on Hopper the config is routed "
        "to CompressedTensorsW4A8Fp8, which expects packed weights). Quantize the weights "
        "only (W4A16, pack-quantized) instead",
        args.num_bits);
  }
  if (!args.symmetric) {
    return "asymmetric int8 weights: vLLM's int8 W8A8 kernels take symmetric weights only "
           "(compressed_tensors.py, _is_dynamic_token_w8a8)";
  }
  if (args.strategy != S::kChannel && args.strategy != S::kTensor) {
    return fmt::format(
        "int8 weights with strategy \"{}\": vLLM's int8 W8A8 kernels take per-channel or "
        "per-tensor weight scales (compressed_tensors.py, _is_dynamic_token_w8a8)",
        strategy_name(args.strategy));
  }
  if (args.scale_dtype) {
    return fmt::format(
        "scale_dtype {}: int8 weight scales are stored in the weight's dtype (no scale_dtype)",
        dtype_tag(*args.scale_dtype));
  }
  return {};
}

std::string refuse(const QuantArgs&, std::uint64_t rows, std::uint64_t cols) {
  if (rows == 0 || cols == 0) return "has no elements: there is no maximum to scale by";
  return {};
}

std::vector<OutputTensorSpec> outputs(const QuantArgs& args, DType weight_dtype,
                                      std::uint64_t rows, std::uint64_t cols) {
  using K = OutputTensorSpec::Kind;
  std::vector<OutputTensorSpec> out;
  out.push_back(detail::rows_tensor("weight", DType::kI8, rows, cols, 1, K::kCodes));
  if (args.strategy == S::kTensor) {
    out.push_back(detail::whole_tensor_spec("weight_scale", weight_dtype, {1}, K::kScale));
  } else {
    out.push_back(detail::rows_tensor("weight_scale", weight_dtype, rows, 1, 1, K::kScale));
  }
  return out;
}

std::vector<std::byte> whole_tensor(const QuantArgs&, DType weight_dtype, std::uint64_t,
                                    std::uint64_t, float tensor_amax, std::size_t) {
  std::vector<std::byte> bytes(element_bytes(weight_dtype));
  detail::store_as_dtype(weight_dtype, int8_weight_scale(weight_dtype, tensor_amax),
                         bytes.data());
  return bytes;
}

std::uint64_t row_alignment(const QuantArgs&) { return 1; }

bool needs_tensor_amax(const QuantArgs& args) { return args.strategy == S::kTensor; }

std::uint64_t scratch_bytes(const QuantArgs&, std::uint64_t, std::uint64_t) { return 0; }

// Section 3 of schemes.md for 8-bit symmetric weights, one row (or the
// whole tensor) at a time.
std::optional<std::uint64_t> quantize_ref(const QuantArgs& args, const KernelIo& io) {
  if (const auto bad = detail::first_non_finite(io)) return bad;
  const DType t = io.dtype;
  const std::size_t esize = element_bytes(t);
  const auto w = [&](std::uint64_t r, std::uint64_t c) {
    return load_as_float(t, io.weight + (r * io.n_cols + c) * esize);
  };
  const float tensor_scale = int8_weight_scale(t, io.tensor_amax);
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    float s = tensor_scale;
    if (args.strategy == S::kChannel) {
      float amax = 0.0f;
      for (std::uint64_t c = 0; c < io.n_cols; ++c) amax = std::max(amax, std::fabs(w(r, c)));
      s = int8_weight_scale(t, amax);
      detail::store_as_dtype(t, s, io.out[1] + r * esize);
    }
    for (std::uint64_t c = 0; c < io.n_cols; ++c) {
      io.out[0][r * io.n_cols + c] =
          static_cast<std::byte>(std::bit_cast<std::uint8_t>(int8_weight_code(t, w(r, c), s)));
    }
  }
  return std::nullopt;
}

// The vector kernel at the best level this CPU runs (byte_code_simd.cpp),
// else the reference.
std::optional<std::uint64_t> quantize_fast(const QuantArgs& args, const KernelIo& io) {
  if (detail::ByteCodeKernel* kernel = detail::byte_code_kernel(detail::simd_best_level())) {
    return kernel(detail::ByteCode::kInt8, args, io);
  }
  return quantize_ref(args, io);
}

// code * scale, rounded to the weight's dtype (the decompressor's
// `x_q.to(scale.dtype) * scale`, compressed-tensors
// `quantization/lifecycle/forward_helpers.py` _dequantize).
void dequantize(const QuantArgs& args, const DequantIo& io) {
  const DType t = io.dtype;
  const std::size_t esize = element_bytes(t);
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    const float s = load_as_float(t, args.strategy == S::kTensor ? io.whole[0] : io.in[1] + r * esize);
    for (std::uint64_t c = 0; c < io.n_cols; ++c) {
      const auto q = std::bit_cast<std::int8_t>(
          std::to_integer<std::uint8_t>(io.in[0][r * io.n_cols + c]));
      io.values[r * io.n_cols + c] = round_to_dtype(t, static_cast<float>(q) * s);
    }
  }
}

// dequantize's values for rows [r0, r1): each row's scale read as
// dequantize reads it, then code * scale rounded to the weight's dtype by
// the vector decoder (dequant_simd.hpp).
void dequantize_rows(const QuantArgs& args, const DequantIo& io, std::uint64_t r0,
                     std::uint64_t r1, float* values) {
  const DType t = io.dtype;
  const std::size_t esize = element_bytes(t);
  std::vector<float> scales(r1 - r0);
  for (std::uint64_t r = r0; r < r1; ++r) {
    scales[r - r0] =
        load_as_float(t, args.strategy == S::kTensor ? io.whole[0] : io.in[1] + r * esize);
  }
  detail::ExpandRows x;
  x.kind = detail::CodeKind::kInt8;
  x.codes = io.in[0] + r0 * io.n_cols;
  x.row_bytes = io.n_cols;
  x.n_rows = r1 - r0;
  x.n_cols = io.n_cols;
  x.group_cols = std::max<std::uint64_t>(1, io.n_cols);
  x.multipliers = scales.data();
  x.round_to = t;
  x.values = values;
  detail::expand_codes(x);
}

// Every args `supports` takes (8-bit symmetric, channel or tensor) selects
// CompressedTensorsW8A8Int8 (SM75+) with dynamic per-token inputs
// (compressed_tensors.py, _is_dynamic_token_w8a8).
std::string vllm_args_rule(const QuantArgs&) { return {}; }

// CompressedTensorsW8A8Int8 has no shape rule: CUTLASS int8 scaled_mm falls
// back to Triton when K or N is not a multiple of 16 (vllm/_custom_ops.py).
std::vector<ShapeProblem> vllm_shape_rule(const QuantArgs&, std::uint64_t, std::uint64_t,
                                          Parallel) {
  return {};
}

}  // namespace

float int8_weight_scale(DType weight_dtype, float amax) {
  const float s = round_to_dtype(weight_dtype, amax / kInt8HalfRange);
  return s == 0.0f ? dtype_eps(weight_dtype) : s;
}

std::int8_t int8_weight_code(DType weight_dtype, float w, float s) {
  const float y = std::clamp(round_to_dtype(weight_dtype, w / s), kInt8Min, kInt8Max);
  return static_cast<std::int8_t>(std::nearbyint(y));
}

const SchemeFamily kIntQuantizedFamily{
    .id = "int8",
    .format = "int-quantized",
    .summary = "int8 weights (per channel or per tensor), scales in the weight's dtype, "
               "dynamic per-token int8 activations (vLLM W8A8 int8)",
    .presets = kIntQuantizedPresets,
    .writes = writes,
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
        "compressed_tensors_w8a8_int8.py, vllm/model_executor/layers/quantization/"
        "compressed_tensors/compressed_tensors.py",
};

}  // namespace ctquant
