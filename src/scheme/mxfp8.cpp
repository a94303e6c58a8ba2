// The `mxfp8-quantized` family (presets MXFP8A16 and MXFP8): FP8 E4M3 codes,
// one per weight element, and one E8M0 exponent per group of 32 columns
// (docs/schemes.md sections 2.1, 6.1, 6.3; the compressor is
// compressed-tensors `compressors/mxfp8/base.py`).
//
// Per module M with weight W [N, K] in dtype W (BF16, F16 or F32):
//   M.weight        F8_E4M3 [N, K]
//   M.weight_scale  U8 [N, K/32]   E8M0: the group's scale is 2^(byte - 127)
// The exponent is that of MXFP4 with offset 8 (floor(log2 448)) instead of
// 2, so a group's amax / scale lies in [224, 448).
//
// MXFP8 also declares MX FP8 input activations (dynamic, groups of 32):
// model_free_ptq accepts it and vLLM serves it (compressed_tensors.py
// `_is_mxfp8`, CompressedTensorsW8A8Mxfp8: FlashInfer, Marlin or emulation
// kernels). The weights are the same bytes as MXFP8A16's.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "ctquant/format/minifloat.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/microscale.hpp"
#include "scheme/microscale_simd.hpp"
#include "scheme/mx_common.hpp"

namespace ctquant {

namespace {

using mx::kGroup;

const Preset kPresets[] = {
    {"MXFP8A16", mx::mx_args(8), ""},
    {"MXFP8", mx::mx_args(8), mx::kMxfp8InputActivations},
};

// compressors/format.py rule 2 (MXFP8QuantizationCompressor.can_compress):
// FLOAT weights of 8 bits in groups of 32 with uint8 scales.
bool writes(const QuantArgs& args, bool /*has_input_activations*/) {
  return mx::float_groups_of_32(args) && args.num_bits == 8 && args.scale_dtype == DType::kU8;
}

// Section 6.3: v = round_W(w / scale), clamp to [-448, 448], FP8 E4M3.
std::optional<std::uint64_t> quantize_ref(const QuantArgs&, const KernelIo& io) {
  const DType t = io.dtype;
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(t) / 8);
  const std::uint64_t groups = io.n_cols / kGroup;
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    const std::byte* row = io.weight + r * io.n_cols * esize;
    std::byte* codes = io.out[0] + r * io.n_cols;
    std::byte* scales = io.out[1] + r * groups;
    for (std::uint64_t g = 0; g < groups; ++g) {
      const std::uint64_t c0 = g * kGroup;
      float amax = 0.0f;
      for (std::uint64_t c = c0; c < c0 + kGroup; ++c) {
        const float w = load_as_float(t, row + c * esize);
        if (!std::isfinite(w)) return r * io.n_cols + c;
        amax = std::max(amax, std::fabs(w));
      }
      const microscale::MxScale scale = microscale::mx_scale(t, amax, microscale::kMxfp8Offset);
      scales[g] = std::byte{scale.byte};
      for (std::uint64_t c = c0; c < c0 + kGroup; ++c) {
        const float v = round_to_dtype(t, load_as_float(t, row + c * esize) / scale.scale);
        codes[c] = std::byte{float_to_f8_e4m3(std::clamp(v, -448.0f, 448.0f))};
      }
    }
  }
  return std::nullopt;
}

std::optional<std::uint64_t> quantize_fast(const QuantArgs& args, const KernelIo& io) {
  if (const auto kernel = microscale::best_kernel(microscale::Format::kMxfp8)) return kernel(io);
  return quantize_ref(args, io);
}

// MXFP8QuantizationCompressor.decompress: fp8 * 2^(e - 127).
void dequantize(const QuantArgs&, const DequantIo& io) {
  const std::uint64_t groups = io.n_cols / kGroup;
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    for (std::uint64_t c = 0; c < io.n_cols; ++c) {
      const auto code = std::to_integer<std::uint8_t>(io.in[0][r * io.n_cols + c]);
      const auto e = std::to_integer<std::uint8_t>(io.in[1][r * groups + c / kGroup]);
      io.values[r * io.n_cols + c] = f8_e4m3_to_float(code) * e8m0_to_float(e);
    }
  }
}

void dequantize_rows(const QuantArgs&, const DequantIo& io, std::uint64_t r0, std::uint64_t r1,
                     float* values) {
  mx::dequantize_rows_e8m0(detail::CodeKind::kE4M3, io, r0, r1, values);
}

std::vector<OutputTensorSpec> outputs(const QuantArgs&, DType, std::uint64_t rows,
                                      std::uint64_t cols) {
  using F = OutputTensorSpec::Fill;
  using K = OutputTensorSpec::Kind;
  const std::uint64_t groups = cols / kGroup;
  return {
      {"weight", DType::kF8_E4M3, {rows, cols}, F::kRows, K::kCodes, 1, 1, cols, 8, cols},
      {"weight_scale", DType::kU8, {rows, groups}, F::kRows, K::kScale, 1, 1, groups, 8, groups},
  };
}

}  // namespace

extern const SchemeFamily kMxfp8Family;
const SchemeFamily kMxfp8Family{
    .id = "mxfp8",
    .format = "mxfp8-quantized",
    .summary = "FP8 E4M3 codes, E8M0 exponents per 32 columns (FlashInfer, Marlin)",
    .presets = kPresets,
    .writes = writes,
    .supports = mx::supports,
    .refuse = mx::refuse,
    .outputs = outputs,
    .whole_tensor = mx::whole_tensor,
    .row_alignment = mx::row_alignment,
    .needs_tensor_amax = mx::needs_tensor_amax,
    .scratch_bytes = mx::scratch_bytes,
    .quantize_ref = quantize_ref,
    .quantize = quantize_fast,
    .dequantize = dequantize,
    .dequantize_rows = dequantize_rows,
    .vllm_args_rule = mx::vllm_args_rule,
    .vllm_shape_rule = mx::vllm_shape_rule,
    .vllm_source =
        "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py "
        "(_is_mxfp8), vllm/model_executor/layers/quantization/compressed_tensors/schemes/"
        "compressed_tensors_w8a8_mxfp8.py",
};

}  // namespace ctquant
