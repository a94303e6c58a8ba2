// Private: the vector kernel that dequantizes a run of FP8 E4M3 codes with
// one scale into BF16 (source/fp8.hpp, dequantize_fp8_rows). One Highway
// source (fp8_simd.cpp) compiled for every level of simd_levels()
// (simd/simd_dispatch.hpp); its output is bit-identical to the scalar
// step bf16(float(code) * scale) of dequantize_fp8_value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "simd/simd.hpp"

namespace ctquant::detail {

// Dequantizes n E4M3 codes at codes[0..n) with `scale` into n BF16 values
// at out (2n bytes, little-endian). out may start before codes in the same
// buffer (the in-place layout of dequantize_fp8_rows: out = codes - n' with
// n' >= the codes before these), since every vector of codes is read before
// its values are written. Returns the index of the first value that is not
// finite (a NaN code, or a product that overflows BF16), in which case out
// is unspecified from that vector on; nullopt when all are finite.
using Fp8DecodeKernel = std::optional<std::size_t>(const std::uint8_t* codes, std::size_t n,
                                                   float scale, std::uint16_t* out);

// The kernel compiled for `level`, or nullptr when this CPU does not run
// that level (the caller then runs the scalar code).
Fp8DecodeKernel* fp8_decode_kernel(const SimdLevel& level);

}  // namespace ctquant::detail
