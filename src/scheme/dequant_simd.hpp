// Private: the vector decoder behind the families' dequantize_rows
// (scheme.hpp): stored codes times a multiplier per group of columns, the
// shape every family's decompressor has once its scales are read. A family
// computes each group's multiplier (and zero point) with the scalar
// arithmetic of its own dequantize, then expand_codes() does the per-element
// part. One Highway source (dequant_simd.cpp) compiled for every level of
// simd_levels() (simd/simd_dispatch.hpp); expand_codes_ref() is its
// scalar reference, and every level gives its bits (a NaN where it gives a
// NaN; tests/test_quant_error.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ctquant/format/dtype.hpp"
#include "simd/simd.hpp"

namespace ctquant::detail {

// How a stored code reads as a number. Four-bit codes are nibbles, column c
// in byte c / 2, the low nibble first (int32 words of pack-quantized codes
// are little-endian, schemes.md section 4; FP4 pairs, section 5.2).
enum class CodeKind : std::uint8_t {
  kInt4Offset,  // nibble u, value u - 8 (pack-quantized, 4 bits)
  kInt8Offset,  // byte u, value u - 128 (pack-quantized, 8 bits)
  kInt8,        // byte as int8 (int-quantized)
  kE2M1,        // nibble, FP4 E2M1 (e2m1_to_float)
  kE4M3,        // byte, FP8 E4M3 "fn" (f8_e4m3_to_float; 0x7F, 0xFF NaN)
};

// n_rows rows of codes, as values[r * n_cols + c] =
//   round((value(r, c) - zero_points[r * groups + g]) * multipliers[r * groups + g])
// with g = c / group_cols, groups = ceil(n_cols / group_cols); without
// zero_points, value(r, c) * multipliers[...]; round is round_to_dtype
// (round_to) for kBF16 and kF16 (a NaN product is left a NaN), none for any
// other dtype.
struct ExpandRows {
  CodeKind kind = CodeKind::kInt4Offset;
  const std::byte* codes = nullptr;  // row r's codes start at codes + r * row_bytes
  std::uint64_t row_bytes = 0;
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;
  std::uint64_t group_cols = 1;
  const float* multipliers = nullptr;
  const float* zero_points = nullptr;  // may be null
  DType round_to = DType::kF32;
  float* values = nullptr;
};

void expand_codes_ref(const ExpandRows& rows);

using ExpandCodesKernel = void(const ExpandRows& rows);
// The vector code compiled for level, or nullptr when this CPU does not run
// it.
ExpandCodesKernel* expand_codes_kernel(const SimdLevel& level);

// At the best level this CPU runs (the reference when it runs none).
void expand_codes(const ExpandRows& rows);

}  // namespace ctquant::detail
