// The rule every computed scale and global scale obeys before it is written
// or accepted: finite and non-zero. A checkpoint that breaks it dequantizes
// to inf or NaN (codes times an infinite scale, or divided by a global
// scale of 0), whatever loads it, so it is refused as wrong data and
// --allow-unloadable does not cover it. The library (model_free_ptq) writes
// such scales without a word: an observer's `expand` that overflows float32,
// weights near the top of their dtype with an asymmetric scheme (max - min
// overflows), MX exponents of a group whose largest |w| rounds up to
// infinity (docs/observers.md, docs/cli.md "Scales").
//
// Zero points are integers clamped to the code range (schemes.md 3.2), so
// they are always finite; 0 is the zero point of every symmetric group.
//
// The quantize executor checks the scale bytes of every chunk right after
// the family's kernel wrote them and the whole tensors (global scales,
// per-tensor scales) before it writes them, and refuses the run naming the
// tensor and the group (Error{kBadInput}, nothing left behind);
// `verify --against-source` checks the stored bytes of OUTPUT the same way
// and reports each module that breaks the rule (exit 3).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/scheme.hpp"

namespace ctquant {

// Whether an output tensor of this kind holds scales the rule applies to
// (OutputTensorSpec::Kind kScale and kGlobalScale).
bool holds_scales(const OutputTensorSpec& spec);

// The first element of `bytes` (whole elements of `dtype`, little-endian)
// that is not a finite non-zero scale, or nullopt. By dtype: BF16, F16 and
// F32 values (zero of either sign, infinities, NaN); F8_E4M3 (E4M3FN: zero
// 0x00/0x80, NaN 0x7F/0xFF; it has no infinity); U8, the E8M0 exponents of
// MX scales (0xFF is NaN; 0x00 is 2^-127, not zero). Other dtypes hold no
// scales: nullopt. One branch-free pass over the bytes, which the compiler
// vectorizes; the executor runs it on every chunk's scales.
std::optional<std::uint64_t> first_bad_scale(DType dtype, std::span<const std::byte> bytes);

// The value of one scale element as text for messages: "inf", "-inf",
// "nan", "0", "-0", or the number ("0.5"; an E8M0 byte as "2^-3", its NaN
// as "0xFF (NaN in E8M0)").
std::string scale_value_text(DType dtype, const std::byte* element);

// The weight rows and columns that element `element` (row-major) of a kRows
// scale tensor `spec` of a module [rows, cols] quantized with args covers:
// scale tensor row `unit`, column `group` (a group of columns, or a block
// column), weight rows [row_begin, row_end) and columns [col_begin,
// col_end).
struct ScaleGroup {
  std::uint64_t unit = 0;
  std::uint64_t group = 0;
  std::uint64_t row_begin = 0;
  std::uint64_t row_end = 0;
  std::uint64_t col_begin = 0;
  std::uint64_t col_end = 0;
};
ScaleGroup scale_group(const QuantArgs& args, const OutputTensorSpec& spec, std::uint64_t rows,
                       std::uint64_t cols, std::uint64_t element);

// The group in the words messages use: "row 5, group 3 (columns 384-511)",
// "row 5 (its one scale)" for a scale per row, "block [1, 2] (rows 128-255,
// columns 256-383)" for block scales.
std::string describe_scale_group(const QuantArgs& args, const ScaleGroup& g);

}  // namespace ctquant
