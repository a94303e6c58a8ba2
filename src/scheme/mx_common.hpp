// Private: the parts of the two MX registry rows (mxfp4.cpp, mxfp8.cpp) that
// do not depend on the element format: presets' arguments, support and
// refusal rules, the vLLM rules (docs/schemes.md sections 6 and 10;
// research notes on vllm compressed_tensors_w4a4_mxfp4.py and
// compressed_tensors_w8a8_mxfp8.py).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/minifloat.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/dequant_simd.hpp"

namespace ctquant::mx {

inline constexpr std::uint64_t kGroup = 32;

// The MX presets' weights (compressed-tensors `quantization/quant_scheme.py`
// MXFP4A16 / MXFP8A16): FLOAT, symmetric, GROUP 32, uint8 scales.
inline QuantArgs mx_args(int bits) {
  QuantArgs a;
  a.type = QuantArgs::Type::kFloat;
  a.num_bits = bits;
  a.symmetric = true;
  a.strategy = QuantArgs::Strategy::kGroup;
  a.group_size = kGroup;
  a.scale_dtype = DType::kU8;
  return a;
}

// The input activations of the MXFP4 and MXFP8 presets as config.json
// writes them (schemes.md 6.2, 6.3): dynamic MX groups of 32.
inline constexpr std::string_view kMxfp4InputActivations =
    R"({"actorder": null, "block_structure": null, "dynamic": true, "group_size": 32, )"
    R"("num_bits": 4, "observer": null, "observer_kwargs": {}, "scale_dtype": "torch.uint8", )"
    R"("strategy": "group", "symmetric": true, "type": "float", "zp_dtype": null})";
inline constexpr std::string_view kMxfp8InputActivations =
    R"({"actorder": null, "block_structure": null, "dynamic": true, "group_size": 32, )"
    R"("num_bits": 8, "observer": null, "observer_kwargs": {}, "scale_dtype": "torch.uint8", )"
    R"("strategy": "group", "symmetric": true, "type": "float", "zp_dtype": null})";

// FLOAT weights in groups of 32 (the part of compressors/format.py rules 1
// and 2 the two formats share).
inline bool float_groups_of_32(const QuantArgs& args) {
  const bool grouped = args.strategy == QuantArgs::Strategy::kGroup ||
                       args.strategy == QuantArgs::Strategy::kTensorGroup;
  return args.type == QuantArgs::Type::kFloat && grouped && args.group_size == kGroup;
}

inline std::string supports(const QuantArgs& args) {
  if (args.strategy != QuantArgs::Strategy::kGroup) {
    return fmt::format("MX weights are strategy \"group\" (got \"{}\")",
                       strategy_name(args.strategy));
  }
  if (!args.symmetric) return "MX weights are symmetric";
  // Without uint8 scales the reference computes amax / 6 float scales and
  // its compressor then floors them to powers of two (schemes.md 6.4).
  if (args.scale_dtype != DType::kU8) {
    return "MX scales are E8M0 exponents (scale_dtype \"torch.uint8\")";
  }
  return {};
}

// model_free's validation reshapes the weight into groups of 32 and fails
// when 32 does not divide in_features (schemes.md 6.2, 10).
inline std::string refuse(const QuantArgs&, std::uint64_t /*rows*/, std::uint64_t cols) {
  if (cols % kGroup != 0) {
    return fmt::format("has in_features {}, not a multiple of the MX group size 32", cols);
  }
  return {};
}

inline std::vector<std::byte> whole_tensor(const QuantArgs&, DType, std::uint64_t, std::uint64_t,
                                           float, std::size_t) {
  return {};  // MX formats have no whole tensors
}
// The decompressors' fp * 2^(e - 127) for rows [r0, r1) of a chunk whose
// codes are of `kind` (E2M1 nibbles or E4M3 bytes), e the group's E8M0
// byte: the dequantize_rows of both rows (scheme.hpp), by the vector
// decoder (dequant_simd.hpp).
inline void dequantize_rows_e8m0(detail::CodeKind kind, const DequantIo& io, std::uint64_t r0,
                                 std::uint64_t r1, float* values) {
  const std::uint64_t groups = io.n_cols / kGroup;
  const std::uint64_t row_bytes = kind == detail::CodeKind::kE2M1 ? io.n_cols / 2 : io.n_cols;
  std::vector<float> scales((r1 - r0) * groups);
  for (std::uint64_t k = 0; k < scales.size(); ++k) {
    scales[k] = e8m0_to_float(std::to_integer<std::uint8_t>(io.in[1][r0 * groups + k]));
  }
  detail::ExpandRows x;
  x.kind = kind;
  x.codes = io.in[0] + r0 * row_bytes;
  x.row_bytes = row_bytes;
  x.n_rows = r1 - r0;
  x.n_cols = io.n_cols;
  x.group_cols = kGroup;
  x.multipliers = scales.data();
  x.values = values;
  detail::expand_codes(x);
}

inline std::uint64_t row_alignment(const QuantArgs&) { return 1; }
inline bool needs_tensor_amax(const QuantArgs&) { return false; }
inline std::uint64_t scratch_bytes(const QuantArgs&, std::uint64_t, std::uint64_t) { return 0; }

// compressed_tensors.py `_is_mxfp4` / `_is_mxfp8`: group 32, float,
// symmetric, 4 or 8 bits, and for MXFP8 uint8 scales. Releases without
// `_is_mxfp4` (before 2026) do not load either format.
inline std::string vllm_args_rule(const QuantArgs& args) {
  if (args.strategy != QuantArgs::Strategy::kGroup || args.group_size != kGroup ||
      !args.symmetric || args.scale_dtype != DType::kU8) {
    return "vLLM's MX kernels need symmetric float weights in groups of 32 with uint8 scales";
  }
  return {};
}

// Per shard: weight_scale is [N_p, K_p / 32] (compressed_tensors_w4a4_mxfp4.py,
// compressed_tensors_w8a8_mxfp8.py create_weights; one release raises "MXFP8
// requires input dimension to be divisible by 32"), so a shard's
// in_features must be a multiple of 32.
inline std::vector<ShapeProblem> vllm_shape_rule(const QuantArgs&, std::uint64_t /*rows*/,
                                                 std::uint64_t cols, Parallel) {
  std::vector<ShapeProblem> out;
  if (cols % kGroup != 0) {
    out.push_back({true, fmt::format("in_features {} per shard is not a multiple of the MX group "
                                     "size 32 (weight_scale is [N, K/32])",
                                     cols)});
  }
  return out;
}

}  // namespace ctquant::mx
