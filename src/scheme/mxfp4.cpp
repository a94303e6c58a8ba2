// The `mxfp4-pack-quantized` family (presets MXFP4A16 and MXFP4): FP4 E2M1
// codes packed two per byte and one E8M0 exponent per group of 32 columns,
// no global scale (docs/schemes.md sections 2.2, 2.3, 6.1, 6.2; the
// compressor is compressed-tensors `compressors/mxfp4/base.py`).
//
// Per module M with weight W [N, K] in dtype W (BF16, F16 or F32):
//   M.weight_packed  U8 [N, K/2]   byte [n, j] = code(2j) | code(2j+1) << 4
//   M.weight_scale   U8 [N, K/32]  E8M0: the group's scale is 2^(byte - 127)
//
// MXFP4 also declares MX FP4 input activations (dynamic, groups of 32):
// model_free_ptq accepts it (its activations need no calibration) and vLLM
// serves it (compressed_tensors.py `_is_mxfp4` ignores the input
// activations; CompressedTensorsW4A4Mxfp4 runs W4A4 on SM100 with
// FlashInfer, weight-only Marlin elsewhere). The weights are the same bytes
// as MXFP4A16's.
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

using S = QuantArgs::Strategy;
using mx::kGroup;

const Preset kPresets[] = {
    {"MXFP4A16", mx::mx_args(4), ""},
    {"MXFP4", mx::mx_args(4), mx::kMxfp4InputActivations},
};

// compressors/format.py rule 1 (MXFP4PackedCompressor.can_compress): FLOAT
// weights of 4 bits in groups of 32; the scale dtype is not checked.
bool writes(const QuantArgs& args, bool /*has_input_activations*/) {
  return mx::float_groups_of_32(args) && args.num_bits == 4;
}

// Section 6.2 on groups of 32: v = round_W(w / scale)
// (exact unless it lands among W's subnormals), clamp to [-6, 6], E2M1.
std::optional<std::uint64_t> quantize_ref(const QuantArgs&, const KernelIo& io) {
  const DType t = io.dtype;
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(t) / 8);
  const std::uint64_t groups = io.n_cols / kGroup;
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    const std::byte* row = io.weight + r * io.n_cols * esize;
    std::byte* packed = io.out[0] + r * (io.n_cols / 2);
    std::byte* scales = io.out[1] + r * groups;
    for (std::uint64_t g = 0; g < groups; ++g) {
      const std::uint64_t c0 = g * kGroup;
      float amax = 0.0f;
      for (std::uint64_t c = c0; c < c0 + kGroup; ++c) {
        const float w = load_as_float(t, row + c * esize);
        if (!std::isfinite(w)) return r * io.n_cols + c;
        amax = std::max(amax, std::fabs(w));
      }
      const microscale::MxScale scale = microscale::mx_scale(t, amax, microscale::kMxfp4Offset);
      scales[g] = std::byte{scale.byte};
      for (std::uint64_t c = c0; c < c0 + kGroup; c += 2) {
        std::uint8_t nibbles[2];
        for (int k = 0; k < 2; ++k) {
          const float w = load_as_float(t, row + (c + static_cast<std::uint64_t>(k)) * esize);
          const float v = round_to_dtype(t, w / scale.scale);
          nibbles[k] = e2m1_code(std::clamp(v, -6.0f, 6.0f));
        }
        packed[c / 2] = std::byte{static_cast<std::uint8_t>(nibbles[0] | nibbles[1] << 4)};
      }
    }
  }
  return std::nullopt;
}

std::optional<std::uint64_t> quantize_fast(const QuantArgs& args, const KernelIo& io) {
  if (const auto kernel = microscale::best_kernel(microscale::Format::kMxfp4)) return kernel(io);
  return quantize_ref(args, io);
}

// MXFP4PackedCompressor.decompress: fp4 * 2^(e - 127).
void dequantize(const QuantArgs&, const DequantIo& io) {
  const std::uint64_t groups = io.n_cols / kGroup;
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    for (std::uint64_t c = 0; c < io.n_cols; ++c) {
      const auto byte = std::to_integer<std::uint8_t>(io.in[0][r * (io.n_cols / 2) + c / 2]);
      const auto code = static_cast<std::uint8_t>(c % 2 == 0 ? byte & 0xFu : byte >> 4);
      const auto e = std::to_integer<std::uint8_t>(io.in[1][r * groups + c / kGroup]);
      io.values[r * io.n_cols + c] = e2m1_to_float(code) * e8m0_to_float(e);
    }
  }
}

// The MX rule (in_features per shard a multiple of 32), and the Marlin
// tile of releases that ran MXFP4 weight-only on Marlin without padding
// (marlin_utils_fp4.py prepare_fp4_layer_for_marlin pads since mid-2026).
std::vector<ShapeProblem> vllm_shape_rule(const QuantArgs& args, std::uint64_t rows,
                                          std::uint64_t cols, Parallel parallel) {
  std::vector<ShapeProblem> out = mx::vllm_shape_rule(args, rows, cols, parallel);
  const bool tile = (rows % 64 == 0 && cols % 128 == 0) || (rows % 128 == 0 && cols % 64 == 0);
  if (!tile) {
    out.push_back(
        {false, fmt::format("shard [{}, {}] is not a Marlin tile multiple ([64, 128] "
                            "or [128, 64]), which Marlin (GPUs without FlashInfer MXFP4) needs",
                            rows, cols)});
  }
  return out;
}

void dequantize_rows(const QuantArgs&, const DequantIo& io, std::uint64_t r0, std::uint64_t r1,
                     float* values) {
  mx::dequantize_rows_e8m0(detail::CodeKind::kE2M1, io, r0, r1, values);
}

std::vector<OutputTensorSpec> outputs(const QuantArgs&, DType, std::uint64_t rows,
                                      std::uint64_t cols) {
  using F = OutputTensorSpec::Fill;
  using K = OutputTensorSpec::Kind;
  const std::uint64_t groups = cols / kGroup;
  return {
      {"weight_packed", DType::kU8, {rows, cols / 2}, F::kRows, K::kCodes, 1, 1, cols / 2, 4, cols},
      {"weight_scale", DType::kU8, {rows, groups}, F::kRows, K::kScale, 1, 1, groups, 8, groups},
  };
}

}  // namespace

extern const SchemeFamily kMxfp4Family;
const SchemeFamily kMxfp4Family{
    .id = "mxfp4",
    .format = "mxfp4-pack-quantized",
    .summary = "FP4 E2M1 codes, E8M0 exponents per 32 columns (Marlin, FlashInfer on SM100)",
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
    .vllm_shape_rule = vllm_shape_rule,
    .vllm_source =
        "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py "
        "(_is_mxfp4), vllm/model_executor/layers/quantization/compressed_tensors/schemes/"
        "compressed_tensors_w4a4_mxfp4.py, vllm/model_executor/layers/quantization/utils/"
        "marlin_utils_fp4.py",
};

}  // namespace ctquant
