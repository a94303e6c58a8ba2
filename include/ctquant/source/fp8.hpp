// FP8 input checkpoints: what config.json says about their quantization, how
// a scale tensor covers its FP8 weight, and the exact row dequantizer.
//
// Section 6 of the format spec is the contract. classify_input_quantization()
// reads the input's `quantization_config` and names the kind of checkpoint:
// unquantized, block FP8 (`quant_method: "fp8"` with `weight_block_size`), or
// compressed-tensors float-quantized FP8; every other kind (already
// pack-quantized, other compressed-tensors formats, GPTQ, AWQ, ...) is
// refused. fp8_scale_layout() checks one FP8 weight's scale tensor against
// that description and says which scale element covers each weight element.
// dequantize_fp8_rows() turns a chunk of FP8 rows into BF16, exactly as the
// reference does. The planner (plan.hpp) and executor (executor.hpp) use
// these; the FP8 code decoders themselves are in dtype.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/format/dtype.hpp"

namespace ctquant {

enum class InputQuantKind {
  kNone,                  // no quantization_config: BF16, F16, F32 weights
  kBlockFp8,              // quant_method "fp8" with weight_block_size [bh, bw]
  kCompressedTensorsFp8,  // quant_method "compressed-tensors", format "float-quantized"
};

// What the input's quantization_config says, for the kinds ctquant converts.
struct InputQuantization {
  InputQuantKind kind = InputQuantKind::kNone;
  // Block FP8: weight_block_size [rows, cols]. compressed-tensors: the
  // block_structure of a group with strategy "block", if there is one.
  std::optional<std::array<std::uint64_t, 2>> block_size;
  // compressed-tensors: whether some group has strategy "tensor" / "channel".
  bool per_tensor = false;
  bool per_channel = false;
  // compressed-tensors: the input's ignore list, unchanged (modules that
  // were never FP8). Empty for the other kinds.
  std::vector<std::string> ignore;

  bool is_fp8() const { return kind != InputQuantKind::kNone; }
  // The parameter name of an FP8 weight's scale: "weight_scale_inv" (block
  // FP8) or "weight_scale" (compressed-tensors). Empty for kNone.
  std::string_view scale_param() const;
  // One line for logs, e.g. "block FP8, weight_block_size [128, 128]".
  std::string describe() const;
};

// Classifies config.json's quantization_config (section 6 of the format
// spec). No config, or a config without quantization_config, is kNone.
// Throws Error{kBadInput}, naming config.json, the quant_method and the
// format, for every kind ctquant does not convert: a quant_method other than
// "fp8" and "compressed-tensors"; "fp8" without a valid weight_block_size;
// compressed-tensors with a format other than "float-quantized" (an already
// pack-quantized checkpoint among them), a quantization_status other than
// "compressed", a sparsity or transform config, weights that are not 8-bit
// symmetric floats, or a weight strategy other than tensor, channel or block.
InputQuantization classify_input_quantization(const std::optional<nlohmann::json>& config);

// The parameters an FP8 input carries for activation and KV-cache
// quantization, dropped because the output quantizes weights only:
// input_scale, input_zero_point, output_scale, output_zero_point, k_scale,
// v_scale, q_scale, kv_scale.
inline constexpr std::array<std::string_view, 8> kActivationParams = {
    "input_scale", "input_zero_point", "output_scale", "output_zero_point",
    "k_scale",     "v_scale",          "q_scale",      "kv_scale",
};
bool is_activation_param(std::string_view param);

// How the scale tensor of one FP8 weight [R, C] covers it: weight element
// [i, j] uses element [i / block_rows, j / block_cols] of the row-major scale
// grid [grid_rows, grid_cols] (section 6). Per-tensor scales are one block of
// R x C, per-row scales blocks of 1 x C.
struct Fp8ScaleLayout {
  DType dtype = DType::kF32;  // of the scale tensor: F32 or BF16
  std::uint64_t block_rows = 1;
  std::uint64_t block_cols = 1;
  std::uint64_t grid_rows = 0;
  std::uint64_t grid_cols = 0;

  // The scale grid rows that weight rows [row_begin, row_end) use, as
  // [grid_row_begin(row_begin), grid_row_end(row_end)).
  std::uint64_t grid_row_begin(std::uint64_t row_begin) const { return row_begin / block_rows; }
  std::uint64_t grid_row_end(std::uint64_t row_end) const {
    // Not (row_end + block_rows - 1) / block_rows: block_rows comes from
    // config.json and may be up to 2^64 - 1.
    return row_end / block_rows + (row_end % block_rows != 0 ? 1 : 0);
  }
  std::uint64_t scale_bytes_per_grid_row() const {
    return grid_cols * static_cast<std::uint64_t>(dtype_bits(dtype) / 8);
  }
};

// The layout of the scale tensor (scale_dtype, scale_shape) of an FP8 weight
// [rows, cols] in a checkpoint described by q (which must be an FP8 kind):
// - block FP8: F32 (or BF16) grid [ceil(rows/bh), ceil(cols/bw)] with
//   [bh, bw] = weight_block_size; edge blocks may be partial;
// - compressed-tensors: F32 or BF16 of shape [] or [1] (strategy tensor),
//   [rows] or [rows, 1] (strategy channel), or the block grid (strategy block).
// The shape is checked exactly, so a transposed grid is caught whenever its
// shape differs from the expected one. Throws Error{kBadInput} with a message
// (without a file or tensor name; the caller adds them) that says what was
// found and what was expected.
Fp8ScaleLayout fp8_scale_layout(const InputQuantization& q, std::uint64_t rows, std::uint64_t cols,
                                DType scale_dtype, const std::vector<std::uint64_t>& scale_shape);

// Rows [row_begin, row_begin + n_rows) of an FP8 weight with n_cols columns.
//
// codes:  n_rows * n_cols codes of code_dtype, row-major.
// scales: the scale grid rows [layout.grid_row_begin(row_begin),
//         layout.grid_row_end(row_begin + n_rows)), each grid_cols elements
//         of layout.dtype, little-endian.
// out:    n_rows * n_cols BF16 values, little-endian. out may share its
//         buffer with codes in one way only: codes == out + n_rows * n_cols
//         bytes (the codes in the second half of a buffer of BF16 size), so
//         a chunk can be dequantized in place.
struct Fp8Rows {
  DType code_dtype = DType::kF8_E4M3;  // F8_E4M3 or F8_E5M2
  std::uint64_t row_begin = 0;
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;
  const std::byte* codes = nullptr;
  const std::byte* scales = nullptr;
  std::byte* out = nullptr;
};

// One dequantized value, section 6: round_bf16(round_S(float32(code) *
// float32(scale))) where S is the scale's dtype. For a BF16 scale the float32
// product is exact, so this is one rounding; for F32 it is the float32
// product rounded to BF16. Returns the BF16 bits.
std::uint16_t dequantize_fp8_value(DType code_dtype, std::uint8_t code, float scale);

// Dequantizes rows to BF16 (section 6), exactly, with no flush to zero.
// Returns the index (row * n_cols + col, within the chunk) of the first
// element whose BF16 value is not finite (a NaN code, an E5M2 infinity, a
// non-finite scale, or a product beyond the BF16 range); the rest of out is
// then unspecified. nullopt when every value is finite. Does not allocate or
// throw.
// E4M3 codes run a vector kernel at the best level this CPU has
// (src/source/fp8_simd.hpp); everything else, and CPUs without one, run
// dequantize_fp8_rows_scalar(), which gives the same bits.
std::optional<std::uint64_t> dequantize_fp8_rows(const Fp8ScaleLayout& layout, const Fp8Rows& rows);

// The scalar loops behind dequantize_fp8_rows(), same contract (the reference
// the vector kernel is tested against).
std::optional<std::uint64_t> dequantize_fp8_rows_scalar(const Fp8ScaleLayout& layout,
                                                        const Fp8Rows& rows);

}  // namespace ctquant
