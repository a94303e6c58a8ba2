// The `nvfp4-pack-quantized` family (preset NVFP4A16): FP4 E2M1 codes
// packed two per byte, one F8_E4M3 scale per group of 16 columns and one F32
// global scale per module (docs/schemes.md sections 2.2, 2.3, 5; the
// compressor is compressed-tensors `compressors/nvfp4/base.py`).
//
// Per module M with weight W [N, K] in dtype W (BF16, F16 or F32):
//   M.weight_packed        U8 [N, K/2]       byte [n, j] = code(2j) | code(2j+1) << 4
//   M.weight_scale         F8_E4M3 [N, K/16]
//   M.weight_global_scale  F32 [1]
// The global scale comes from the largest |w| over the module's fused set
// (scheme/fused_sets.hpp: q/k/v and gate/up share one; split MoE experts do
// not), which the executor's pre-pass passes in as KernelIo::tensor_amax.
// vLLM fuses q/k/v and gate/up into one layer and needs their global scales
// equal (compressed_tensors_w4a4_nvfp4.py takes the largest for q/k/v with a
// warning, which mis-scales the other partitions' block scales); the fused
// sets guarantee it whenever all members are quantized.
//
// NVFP4 (W4A4) is listed as a refused preset: its input activations have
// dynamic "local" (a calibrated per-tensor input global scale), which
// model_free_ptq refuses ("Model Free PTQ cannot calibrate activations",
// schemes.md 5.1 and 10).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "ctquant/format/minifloat.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/dequant_simd.hpp"
#include "scheme/microscale.hpp"
#include "scheme/microscale_simd.hpp"

namespace ctquant {

namespace {

using S = QuantArgs::Strategy;

constexpr std::uint64_t kGroup = 16;

QuantArgs nvfp4_args() {
  QuantArgs a;
  a.type = QuantArgs::Type::kFloat;
  a.num_bits = 4;
  a.symmetric = true;
  a.strategy = S::kTensorGroup;
  a.group_size = kGroup;
  a.scale_dtype = DType::kF8_E4M3;
  return a;
}

// compressed-tensors `quantization/quant_scheme.py` NVFP4A16, and NVFP4,
// which model_free_ptq refuses (schemes.md 5.1, 10).
const Preset kPresets[] = {
    {"NVFP4A16", nvfp4_args(), ""},
    {"NVFP4", nvfp4_args(), "",
     "its FP4 input activations carry a per-tensor global scale that must be calibrated on "
     "data (\"dynamic\": \"local\"), which model_free_ptq refuses (\"Model Free PTQ cannot "
     "calibrate activations\") and a data-free tool cannot compute; NVFP4A16 writes the same "
     "weights without activation quantization"},
};

// compressors/format.py rule 3 (NVFP4PackedCompressor.can_compress): FLOAT
// weights of 4 bits in groups of 16, whatever the strategy.
bool writes(const QuantArgs& args, bool /*has_input_activations*/) {
  const bool grouped = args.strategy == S::kGroup || args.strategy == S::kTensorGroup;
  return args.type == QuantArgs::Type::kFloat && args.num_bits == 4 && grouped &&
         args.group_size == kGroup;
}

std::string supports(const QuantArgs& args) {
  if (args.strategy != S::kTensorGroup) {
    return fmt::format(
        "FP4 groups of 16 with strategy \"{}\" have no global scale; NVFP4 is strategy "
        "\"tensor_group\"",
        strategy_name(args.strategy));
  }
  if (!args.symmetric) {
    return "FP4 weights are symmetric (compressed-tensors raises \"Asymmetric Quantization is "
           "not supported for FP4\")";
  }
  if (args.scale_dtype != DType::kF8_E4M3) {
    return "NVFP4 group scales are stored as FP8 E4M3 (scale_dtype \"torch.float8_e4m3fn\")";
  }
  return {};
}

// model_free's validation reshapes the weight into groups of 16
// (flatten_for_calibration -> unflatten), which fails when 16 does not
// divide in_features (schemes.md 10).
std::string refuse(const QuantArgs&, std::uint64_t /*rows*/, std::uint64_t cols) {
  if (cols % kGroup != 0) {
    return fmt::format("has in_features {}, not a multiple of the NVFP4 group size 16", cols);
  }
  return {};
}

std::vector<OutputTensorSpec> outputs(const QuantArgs&, DType, std::uint64_t rows,
                                      std::uint64_t cols) {
  using F = OutputTensorSpec::Fill;
  using K = OutputTensorSpec::Kind;
  const std::uint64_t groups = cols / kGroup;
  return {
      {"weight_packed", DType::kU8, {rows, cols / 2}, F::kRows, K::kCodes, 1, 1, cols / 2, 4, cols},
      {"weight_scale",
       DType::kF8_E4M3,
       {rows, groups},
       F::kRows,
       K::kScale,
       1,
       1,
       groups,
       8,
       groups},
      {"weight_global_scale", DType::kF32, {1}, F::kWhole, K::kGlobalScale, 1, 1, 4, 32, 1},
  };
}

// weight_global_scale: F32 [1] holding the value of section 5.3 step 2.
std::vector<std::byte> whole_tensor(const QuantArgs&, DType weight_dtype, std::uint64_t,
                                    std::uint64_t, float tensor_amax, std::size_t) {
  const float gs = microscale::nvfp4_global_scale(weight_dtype, tensor_amax);
  std::vector<std::byte> bytes(4);
  std::memcpy(bytes.data(), &gs, 4);
  return bytes;
}

std::uint64_t row_alignment(const QuantArgs&) { return 1; }
bool needs_tensor_amax(const QuantArgs&) { return true; }

// An F16 module (or fused set) with 0 < max |w| < about 0.041: 2688 / amax
// overflows F16 and the reference takes 1.0 for the global scale (schemes.md
// 5.3 step 2), so each group scale is E4M3 of max|group| / 6 itself, at or
// below E4M3's subnormals, and most codes round to 0.
std::string tensor_amax_warning(const QuantArgs&, DType w, float amax) {
  if (!(amax > 0.0f) || !microscale::nvfp4_global_scale_overflows(w, amax)) return "";
  return fmt::format(
      "max |w| {:.6g} makes the NVFP4 global scale 2688 / max |w| overflow {}, and the "
      "reference's rule (model_free_ptq writes the same bytes) then takes 1.0, so the group "
      "scales fall to E4M3's smallest values and most codes round to 0; keep the weights in "
      "16 bits (--ignore) or pick another scheme",
      amax, dtype_tag(w));
}
std::uint64_t scratch_bytes(const QuantArgs&, std::uint64_t, std::uint64_t) { return 0; }

// Section 5.3 step by step, one group of 16 at a time.
std::optional<std::uint64_t> quantize_ref(const QuantArgs&, const KernelIo& io) {
  const DType t = io.dtype;
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(t) / 8);
  const std::uint64_t groups = io.n_cols / kGroup;
  // Step 2: the global scale of the fused set.
  const float gs = microscale::nvfp4_global_scale(t, io.tensor_amax);
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    const std::byte* row = io.weight + r * io.n_cols * esize;
    std::byte* packed = io.out[0] + r * (io.n_cols / 2);
    std::byte* scales = io.out[1] + r * groups;
    for (std::uint64_t g = 0; g < groups; ++g) {
      const std::uint64_t c0 = g * kGroup;
      // Step 1: amax over the group (max(|min|, |max|, 0)), exact in W.
      float amax = 0.0f;
      for (std::uint64_t c = c0; c < c0 + kGroup; ++c) {
        const float w = load_as_float(t, row + c * esize);
        if (!std::isfinite(w)) return r * io.n_cols + c;
        amax = std::max(amax, std::fabs(w));
      }
      if (io.ranges != nullptr) amax = range_amax(io.ranges, r * groups + g);
      // Steps 3-6: the FP8 group scale (0x20 for a zero one).
      const std::uint8_t scale = microscale::nvfp4_group_scale(t, gs, amax);
      scales[g] = std::byte{scale};
      // Step 7: the float32 divisor scale / global_scale.
      const float divisor = microscale::nvfp4_divisor(scale, gs);
      // Step 8: v = float32(w / divisor), clamp to [-6, 6], round to E2M1, pack.
      for (std::uint64_t c = c0; c < c0 + kGroup; c += 2) {
        std::uint8_t nibbles[2];
        for (int k = 0; k < 2; ++k) {
          const float w = load_as_float(t, row + (c + static_cast<std::uint64_t>(k)) * esize);
          nibbles[k] = e2m1_code(std::clamp(w / divisor, -6.0f, 6.0f));
        }
        packed[c / 2] = std::byte{static_cast<std::uint8_t>(nibbles[0] | nibbles[1] << 4)};
      }
    }
  }
  return std::nullopt;
}

std::optional<std::uint64_t> quantize_fast(const QuantArgs& args, const KernelIo& io) {
  if (io.ranges != nullptr) return quantize_ref(args, io);  // observer ranges
  if (const auto kernel = microscale::best_kernel(microscale::Format::kNvfp4)) return kernel(io);
  return quantize_ref(args, io);
}

// The decompressor (NVFP4PackedCompressor.decompress -> dequantize):
// fp4 * (scale / global_scale), the divisor in float32.
void dequantize(const QuantArgs&, const DequantIo& io) {
  float gs = 0.0f;
  std::memcpy(&gs, io.whole[0], 4);
  const std::uint64_t groups = io.n_cols / kGroup;
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    for (std::uint64_t c = 0; c < io.n_cols; ++c) {
      const auto byte = std::to_integer<std::uint8_t>(io.in[0][r * (io.n_cols / 2) + c / 2]);
      const auto code = static_cast<std::uint8_t>(c % 2 == 0 ? byte & 0xFu : byte >> 4);
      const auto scale = std::to_integer<std::uint8_t>(io.in[1][r * groups + c / kGroup]);
      io.values[r * io.n_cols + c] = e2m1_to_float(code) * microscale::nvfp4_divisor(scale, gs);
    }
  }
}

// dequantize's values for rows [r0, r1): each group's divisor computed as
// dequantize computes it, then fp4 * divisor by the vector decoder
// (dequant_simd.hpp).
void dequantize_rows(const QuantArgs&, const DequantIo& io, std::uint64_t r0, std::uint64_t r1,
                     float* values) {
  float gs = 0.0f;
  std::memcpy(&gs, io.whole[0], 4);
  const std::uint64_t groups = io.n_cols / kGroup;
  std::vector<float> divisors((r1 - r0) * groups);
  for (std::uint64_t k = 0; k < divisors.size(); ++k) {
    divisors[k] =
        microscale::nvfp4_divisor(std::to_integer<std::uint8_t>(io.in[1][r0 * groups + k]), gs);
  }
  detail::ExpandRows x;
  x.kind = detail::CodeKind::kE2M1;
  x.codes = io.in[0] + r0 * (io.n_cols / 2);
  x.row_bytes = io.n_cols / 2;
  x.n_rows = r1 - r0;
  x.n_cols = io.n_cols;
  x.group_cols = kGroup;
  x.multipliers = divisors.data();
  x.values = values;
  detail::expand_codes(x);
}

// vLLM: compressed_tensors.py `_is_nvfp4_format` (tensor_group, group 16,
// float, 4 bits, symmetric) selects CompressedTensorsW4A4Fp4 with use_a16
// when the input activations are absent; it runs on Marlin FP4 (SM >= 75)
// or the Blackwell CUTLASS / FlashInfer kernels.
std::string vllm_args_rule(const QuantArgs& args) {
  if (args.strategy != S::kTensorGroup || args.group_size != kGroup || !args.symmetric) {
    return "vLLM's NVFP4 kernels need symmetric FP4 in tensor_group groups of 16";
  }
  return {};
}

// Per shard: the weight_scale parameter is [N_p, K_p / 16] (floor division,
// compressed_tensors_w4a4_nvfp4.py create_weights), so a shard's in_features
// must be a multiple of 16 or the checkpoint tensor does not fit. Current
// vLLM pads N and K for its kernels (CUTLASS to 32, nvfp4_utils.py
// pad_nvfp4_weight_for_cutlass; Marlin FP4 to a tile, marlin_utils_fp4.py
// prepare_fp4_layer_for_marlin); releases before mid-2026 crashed in
// gptq_marlin_repack when the Marlin FP4 path (GPUs without FP4 tensor
// cores) met a shard that is not tile-aligned ([N_p % 64, K_p % 128] or
// [N_p % 128, K_p % 64]).
std::vector<ShapeProblem> vllm_shape_rule(const QuantArgs&, std::uint64_t rows, std::uint64_t cols,
                                          Parallel) {
  std::vector<ShapeProblem> out;
  if (cols % kGroup != 0) {
    out.push_back({true, fmt::format("in_features {} per shard is not a multiple of the NVFP4 "
                                     "group size 16 (weight_scale is [N, K/16])",
                                     cols)});
  }
  const bool tile = (rows % 64 == 0 && cols % 128 == 0) || (rows % 128 == 0 && cols % 64 == 0);
  if (!tile) {
    out.push_back(
        {false, fmt::format("shard [{}, {}] is not a Marlin tile multiple ([64, 128] "
                            "or [128, 64]), which Marlin FP4 (GPUs without FP4 tensor cores) needs",
                            rows, cols)});
  }
  return out;
}

}  // namespace

extern const SchemeFamily kNvfp4Family;
const SchemeFamily kNvfp4Family{
    .id = "nvfp4",
    .format = "nvfp4-pack-quantized",
    .summary =
        "FP4 E2M1 codes, FP8 E4M3 scales per 16 columns, F32 global scale per fused set "
        "(Marlin FP4, Blackwell CUTLASS)",
    .presets = kPresets,
    .writes = writes,
    .supports = supports_with_observer<supports>,
    .refuse = refuse,
    .outputs = outputs,
    .whole_tensor = whole_tensor,
    .row_alignment = row_alignment,
    .needs_tensor_amax = needs_tensor_amax,
    .tensor_amax_warning = tensor_amax_warning,
    .scratch_bytes = scratch_bytes,
    .quantize_ref = quantize_ref,
    .quantize = quantize_fast,
    .dequantize = dequantize,
    .dequantize_rows = dequantize_rows,
    .vllm_args_rule = vllm_args_rule,
    .vllm_shape_rule = vllm_shape_rule,
    .vllm_source =
        "vllm/model_executor/layers/quantization/compressed_tensors/schemes/"
        "compressed_tensors_w4a4_nvfp4.py, vllm/model_executor/layers/quantization/utils/"
        "nvfp4_utils.py, vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py",
    .vllm_one_global_scale = true,
};

}  // namespace ctquant
