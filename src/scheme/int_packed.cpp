// The `pack-quantized` family: integer RTN codes of 1 to 8 bits packed into
// int32 words, scales in the weight's dtype, packed zero points for
// asymmetric schemes (format spec sections 3 and 4; schemes.md 3 and the
// W8A16 / W4A16_ASYM rows of its section 0). Presets W4A16, W4A16_ASYM and
// W8A16 (compressed-tensors `quantization/quant_scheme.py`).
//
// The kernels are quantize_block_ref() / quantize_block() of
// scheme/kernel.hpp; this file adapts them to the registry's KernelIo and
// packs the zero points along dim 0 (pack.hpp).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "ctquant/scheme/kernel.hpp"
#include "ctquant/scheme/pack.hpp"
#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/dequant_simd.hpp"
#include "scheme/observer_steps.hpp"
#include "simd/simd.hpp"

namespace ctquant {

namespace {

using S = QuantArgs::Strategy;

QuantArgs int_group(int bits, bool symmetric) {
  QuantArgs a;
  a.type = QuantArgs::Type::kInt;
  a.num_bits = bits;
  a.symmetric = symmetric;
  a.strategy = S::kGroup;
  a.group_size = 128;
  return a;
}

const Preset kPresets[] = {
    {"W4A16", int_group(4, true), ""},
    {"W4A16_ASYM", int_group(4, false), ""},
    {"W8A16", int_group(8, true), ""},
};

// The kernel's own parameters (kernel.hpp): group_size 0 is channel-wise.
QuantScheme kernel_scheme(const QuantArgs& args) {
  QuantScheme s;
  s.num_bits = args.num_bits;
  s.symmetric = args.symmetric;
  s.group_size = args.strategy == S::kChannel ? 0 : args.group_size;
  return s;
}

// compressors/format.py rule 5: INT weights of 1 to 8 bits whose input
// activations are absent (present ones make rule 4, int-quantized, win).
bool writes(const QuantArgs& args, bool has_input_activations) {
  return args.type == QuantArgs::Type::kInt && args.num_bits >= 1 && args.num_bits <= 8 &&
         !has_input_activations;
}

std::string supports(const QuantArgs& args) {
  if (args.num_bits < 2) return fmt::format("{}-bit integer codes are not written", args.num_bits);
  if (args.strategy != S::kGroup && args.strategy != S::kChannel) {
    return fmt::format("strategy \"{}\" is not written for integer weights (group or channel)",
                       strategy_name(args.strategy));
  }
  return {};
}

std::uint64_t n_groups(const QuantArgs& args, std::uint64_t cols) {
  return cols / args.scale_cols(cols);
}

std::string refuse(const QuantArgs& args, std::uint64_t /*rows*/, std::uint64_t cols) {
  const std::uint64_t g = args.scale_cols(cols);
  if (cols % g != 0) {
    return fmt::format("has in_features {}, not a multiple of the group size {}", cols, g);
  }
  return {};
}

std::vector<OutputTensorSpec> outputs(const QuantArgs& args, DType weight_dtype,
                                      std::uint64_t rows, std::uint64_t cols) {
  using K = OutputTensorSpec::Kind;
  const std::uint64_t words = packed_words_per_row(cols, args.num_bits);
  const std::uint64_t groups = n_groups(args, cols);
  const int esize = dtype_bits(weight_dtype) / 8;
  std::vector<OutputTensorSpec> out;
  out.push_back({"weight_packed", DType::kI32, {rows, words}, OutputTensorSpec::Fill::kRows,
                 K::kCodes, 1, 1, words * 4, args.num_bits, cols});
  out.push_back({"weight_scale", weight_dtype, {rows, groups}, OutputTensorSpec::Fill::kRows,
                 K::kScale, 1, 1, groups * static_cast<std::uint64_t>(esize),
                 dtype_bits(weight_dtype), groups});
  if (!args.symmetric) {
    const std::uint64_t b = static_cast<std::uint64_t>(args.num_bits);
    out.push_back({"weight_zero_point", DType::kI32, {packed_words_per_row(rows, args.num_bits),
                                                     groups},
                   OutputTensorSpec::Fill::kRows, K::kZeroPoint, b, 32, groups * 4,
                   args.num_bits, groups});
  }
  out.push_back({"weight_shape", DType::kI64, {2}, OutputTensorSpec::Fill::kWhole, K::kShape, 1,
                 1, 16, 64, 2});
  return out;
}

std::vector<std::byte> whole_tensor(const QuantArgs&, DType, std::uint64_t rows,
                                    std::uint64_t cols, float, std::size_t) {
  const std::int64_t shape[2] = {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols)};
  std::vector<std::byte> bytes(sizeof shape);
  std::memcpy(bytes.data(), shape, sizeof shape);
  return bytes;
}

// Asymmetric chunks start at multiples of the rows one zero-point word row
// covers, so that each chunk owns whole words.
std::uint64_t row_alignment(const QuantArgs& args) {
  return args.symmetric ? 1 : 32 / std::gcd(32, args.num_bits);
}

bool needs_tensor_amax(const QuantArgs&) { return false; }

// Zero points of asymmetric schemes; with an observer that chooses ranges
// (MSE, refit), the zero points and one unpacked code per weight
// (quantize_ranges_fast).
std::uint64_t scratch_bytes(const QuantArgs& args, std::uint64_t n_rows, std::uint64_t n_cols) {
  if (is_mse_observer(args.observer) || is_refit_observer(args.observer)) {
    return n_rows * n_groups(args, n_cols) + n_rows * n_cols;
  }
  return args.symmetric ? 0 : n_rows * n_groups(args, n_cols);
}

template <auto Kernel>
std::optional<std::uint64_t> run(const QuantArgs& args, const KernelIo& io) {
  const QuantScheme scheme = kernel_scheme(args);
  KernelBlock block;
  block.dtype = io.dtype;
  block.n_rows = io.n_rows;
  block.n_cols = io.n_cols;
  block.weight = io.weight;
  block.packed = reinterpret_cast<std::uint32_t*>(io.out[0]);
  block.scale = io.out[1];
  block.zero_point = reinterpret_cast<std::int8_t*>(io.scratch.data());
  block.ranges = io.ranges;
  const auto bad = Kernel(scheme, block);
  if (!bad && !args.symmetric) {
    const std::uint64_t groups = n_groups(args, io.n_cols);
    const std::uint64_t zp_rows = packed_words_per_row(io.n_rows, args.num_bits);
    pack_zero_points(std::span(block.zero_point, io.n_rows * groups), io.n_rows, groups,
                     args.num_bits,
                     std::span(reinterpret_cast<std::uint32_t*>(io.out[2]), zp_rows * groups));
  }
  return bad;
}

std::optional<std::uint64_t> quantize_ref(const QuantArgs& args, const KernelIo& io) {
  return run<quantize_block_ref>(args, io);
}

// With observer ranges: the codes by the vector kernel of observer_simd.cpp,
// packed by it for 4 and 8 bits; other widths unpacked (in scratch after the
// zero points), then packed row by row.
std::optional<std::uint64_t> quantize_ranges_fast(const QuantArgs& args, const KernelIo& io) {
  const std::uint64_t groups = n_groups(args, io.n_cols);
  std::int8_t* zero_points = reinterpret_cast<std::int8_t*>(io.scratch.data());
  auto* packed = reinterpret_cast<std::uint32_t*>(io.out[0]);
  const bool packs = args.num_bits == 4 || args.num_bits == 8;
  std::int8_t* codes = packs ? nullptr : zero_points + io.n_rows * groups;
  if (io.scratch.size() < io.n_rows * groups + (packs ? 0 : io.n_rows * io.n_cols) ||
      !detail::int_codes_from_ranges_at(detail::simd_best_level(), args, io.dtype, io.n_rows,
                                        io.n_cols, args.scale_cols(io.n_cols), io.weight,
                                        io.ranges, codes, packs ? packed : nullptr, io.out[1],
                                        zero_points)) {
    return run<quantize_block_ref>(args, io);
  }
  if (!packs) {
    const std::uint64_t words = packed_words_per_row(io.n_cols, args.num_bits);
    for (std::uint64_t r = 0; r < io.n_rows; ++r) {
      pack_codes(std::span<const std::int8_t>(codes + r * io.n_cols, io.n_cols), args.num_bits,
                 std::span<std::uint32_t>(packed + r * words, words));
    }
  }
  if (!args.symmetric) {
    pack_zero_points(std::span(zero_points, io.n_rows * groups), io.n_rows, groups, args.num_bits,
                     std::span(reinterpret_cast<std::uint32_t*>(io.out[2]),
                               packed_words_per_row(io.n_rows, args.num_bits) * groups));
  }
  return std::nullopt;
}

std::optional<std::uint64_t> quantize_fast(const QuantArgs& args, const KernelIo& io) {
  if (io.ranges != nullptr) return quantize_ranges_fast(args, io);
  return run<quantize_block>(args, io);
}

// (q - z) * s, the decompressor's order (compressed-tensors
// `quantization/lifecycle/forward.py` dequantize): codes unpacked from the
// words, zero points from their dim-0 packing.
void dequantize(const QuantArgs& args, const DequantIo& io) {
  const std::uint64_t words = packed_words_per_row(io.n_cols, args.num_bits);
  const std::uint64_t groups = n_groups(args, io.n_cols);
  const std::uint64_t g = args.scale_cols(io.n_cols);
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(io.dtype) / 8);
  std::vector<std::int8_t> codes(io.n_cols);
  std::vector<std::int8_t> zero_points;
  if (!args.symmetric) {
    // This chunk's word rows hold exactly its rows' zero points (chunks
    // start at row_alignment multiples).
    const std::uint64_t zp_rows = packed_words_per_row(io.n_rows, args.num_bits);
    std::vector<std::uint32_t> column(zp_rows);
    zero_points.resize(io.n_rows * groups);
    std::vector<std::int8_t> unpacked(io.n_rows);
    for (std::uint64_t j = 0; j < groups; ++j) {
      for (std::uint64_t w = 0; w < zp_rows; ++w) {
        std::memcpy(&column[w], io.in[2] + (w * groups + j) * 4, 4);
      }
      unpack_codes(column, args.num_bits, unpacked);
      for (std::uint64_t r = 0; r < io.n_rows; ++r) zero_points[r * groups + j] = unpacked[r];
    }
  }
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    std::vector<std::uint32_t> row(words);
    std::memcpy(row.data(), io.in[0] + r * words * 4, words * 4);
    unpack_codes(row, args.num_bits, codes);
    for (std::uint64_t c = 0; c < io.n_cols; ++c) {
      const std::uint64_t j = c / g;
      const float s = load_as_float(io.dtype, io.in[1] + (r * groups + j) * esize);
      const float z = args.symmetric ? 0.0f : static_cast<float>(zero_points[r * groups + j]);
      io.values[r * io.n_cols + c] = (static_cast<float>(codes[c]) - z) * s;
    }
  }
}

// Zero point of chunk row r and group j from the word rows of the chunk
// (dim-0 packing: column j's bit stream runs down the rows), as dequantize
// unpacks it.
float zero_point_at(const std::byte* words, std::uint64_t r, std::uint64_t j,
                    std::uint64_t groups, int bits) {
  std::uint32_t value = 0;
  for (int k = 0; k < bits; ++k) {
    const std::uint64_t at = r * static_cast<std::uint64_t>(bits) + static_cast<std::uint64_t>(k);
    std::uint32_t word = 0;
    std::memcpy(&word, words + ((at / 32) * groups + j) * 4, 4);
    value |= ((word >> (at % 32)) & 1u) << k;
  }
  return static_cast<float>(static_cast<int>(value) - (1 << (bits - 1)));
}

// dequantize's values for rows [r0, r1): each group's scale and zero point
// read as dequantize reads them, then (q - z) * s by the vector decoder for
// 4- and 8-bit codes (dequant_simd.hpp), element by element for the others.
void dequantize_rows(const QuantArgs& args, const DequantIo& io, std::uint64_t r0,
                     std::uint64_t r1, float* values) {
  const std::uint64_t n = r1 - r0;
  const std::uint64_t words = packed_words_per_row(io.n_cols, args.num_bits);
  const std::uint64_t groups = n_groups(args, io.n_cols);
  const std::uint64_t g = args.scale_cols(io.n_cols);
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(io.dtype) / 8);
  std::vector<float> scales(n * groups);
  std::vector<float> zeros(args.symmetric ? 0 : n * groups);
  for (std::uint64_t r = 0; r < n; ++r) {
    for (std::uint64_t j = 0; j < groups; ++j) {
      scales[r * groups + j] = load_as_float(io.dtype, io.in[1] + ((r0 + r) * groups + j) * esize);
      if (!args.symmetric) {
        zeros[r * groups + j] = zero_point_at(io.in[2], r0 + r, j, groups, args.num_bits);
      }
    }
  }
  const std::byte* codes = io.in[0] + r0 * words * 4;
  if (args.num_bits == 4 || args.num_bits == 8) {
    detail::ExpandRows x;
    x.kind = args.num_bits == 4 ? detail::CodeKind::kInt4Offset : detail::CodeKind::kInt8Offset;
    x.codes = codes;
    x.row_bytes = words * 4;
    x.n_rows = n;
    x.n_cols = io.n_cols;
    x.group_cols = g;
    x.multipliers = scales.data();
    x.zero_points = args.symmetric ? nullptr : zeros.data();
    x.values = values;
    detail::expand_codes(x);
    return;
  }
  std::vector<std::uint32_t> row(words);
  std::vector<std::int8_t> q(io.n_cols);
  for (std::uint64_t r = 0; r < n; ++r) {
    std::memcpy(row.data(), codes + r * words * 4, words * 4);
    unpack_codes(row, args.num_bits, q);
    for (std::uint64_t c = 0; c < io.n_cols; ++c) {
      const std::uint64_t k = r * groups + c / g;
      const float z = args.symmetric ? 0.0f : zeros[k];
      values[r * io.n_cols + c] = (static_cast<float>(q[c]) - z) * scales[k];
    }
  }
}

// vLLM's weight-only int kernels (compressed_tensors_wNa16.py choosing a
// mixed-precision kernel; Marlin in quantization/utils/marlin_utils.py:
// MARLIN_SUPPORTED_GROUP_SIZES, GPTQ_MARLIN_MIN_THREAD_N/K): 4- and 8-bit
// codes; group sizes -1 (channel), 32, 64, 128; zero points for 4-bit only
// (8-bit asymmetric runs only on Machete, SM90).
std::string vllm_args_rule(const QuantArgs& args) {
  if (args.num_bits != 4 && args.num_bits != 8) {
    return fmt::format("vLLM has no weight-only kernel for {}-bit integer codes (Marlin: 4, 8)",
                       args.num_bits);
  }
  if (args.strategy == S::kGroup && args.group_size != 32 && args.group_size != 64 &&
      args.group_size != 128) {
    return fmt::format(
        "group size {} is not one vLLM's Marlin kernels run (channel-wise, 32, 64, 128); only "
        "Exllama does, for F16 symmetric models",
        args.group_size);
  }
  if (!args.symmetric && args.num_bits == 8) {
    return "8-bit zero points run only on Machete (Hopper, SM90); Marlin's zero points are 4-bit";
  }
  return {};
}

std::vector<ShapeProblem> vllm_shape_rule(const QuantArgs& args, std::uint64_t rows,
                                          std::uint64_t cols, Parallel) {
  std::vector<ShapeProblem> out;
  const std::uint64_t g = args.scale_cols(cols);
  if (args.strategy == S::kGroup && cols % g != 0) {
    out.push_back({true, fmt::format("in_features {} per shard is not a multiple of the group "
                                     "size {}",
                                     cols, g)});
  }
  // Current vLLM zero-pads these to a Marlin thread tile on load
  // (`marlin_padded_nk` in quantization/utils/marlin_utils.py, vLLM pull
  // request 45295, merged June 2026); releases before it reject Marlin for
  // them (`verify_marlin_supports_shape`) and fall back to a slower kernel or,
  // when none fits, refuse the layer. A group split across ranks stays an
  // error in every release (above).
  if (rows % 64 != 0) {
    out.push_back({false, fmt::format("out_features {} per shard is not a multiple of 64", rows)});
  }
  if (cols % 128 != 0) {
    out.push_back({false, fmt::format("in_features {} per shard is not a multiple of 128", cols)});
  }
  return out;
}

}  // namespace

extern const SchemeFamily kIntPackedFamily;
const SchemeFamily kIntPackedFamily{
    .id = "int-packed",
    .format = "pack-quantized",
    .summary = "integer RTN codes packed into int32, scales in the weight's dtype (Marlin)",
    .presets = kPresets,
    .writes = writes,
    .supports = supports_with_observer<supports>,
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
        "compressed_tensors_wNa16.py, vllm/model_executor/layers/quantization/utils/"
        "marlin_utils.py",
    .writes_weight_shape = true,
    .vllm_int_weight_only = true,
};

}  // namespace ctquant
