// The vector code of expand_codes() (dequant_simd.hpp), written once with
// Google Highway and compiled for every level of simd_levels()
// (simd/simd_dispatch.hpp).
//
// Per row and group of columns, a vector of codes at a time: the codes read
// as floats exactly (integers by conversion; E2M1 and E4M3 by building the
// float's bits, as e2m1_to_float and f8_e4m3_to_float give them), the zero
// point subtracted and the multiplier applied with one IEEE operation each,
// as the scalar code does, and the product rounded to BF16 or F16 by
// round_to_t (simd_steps-inl.h: round_to_dtype's bits; a NaN product is
// kept as it is). The columns of a group after its last whole vector, and
// rows of 4-bit codes whose groups start at odd columns, take the scalar
// steps.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "scheme/dequant_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/simd_dispatch.hpp"
#include "simd/simd_steps-inl.h"

#ifndef CTQUANT_SCHEME_DEQUANT_SIMD_ONCE
#define CTQUANT_SCHEME_DEQUANT_SIMD_ONCE

#include <bit>
#include <cmath>

#include "ctquant/format/minifloat.hpp"
#include "scheme/dequant_simd.hpp"

namespace ctquant::detail {
namespace {

// The value of the code of column c of a row (the scalar step).
inline float code_value(CodeKind kind, const std::byte* row, std::uint64_t c) {
  const auto byte = [&](std::uint64_t i) { return std::to_integer<std::uint8_t>(row[i]); };
  const auto nibble = [&] {
    return static_cast<std::uint8_t>((byte(c / 2) >> (4 * (c % 2))) & 0xFu);
  };
  switch (kind) {
    case CodeKind::kInt4Offset:
      return static_cast<float>(static_cast<int>(nibble()) - 8);
    case CodeKind::kInt8Offset:
      return static_cast<float>(static_cast<int>(byte(c)) - 128);
    case CodeKind::kInt8:
      return static_cast<float>(std::bit_cast<std::int8_t>(byte(c)));
    case CodeKind::kE2M1:
      return e2m1_to_float(nibble());
    case CodeKind::kE4M3:
      return f8_e4m3_to_float(byte(c));
  }
  return 0.0f;
}

// One element: (value - z) * m (without a zero point, value * m), rounded.
inline float expand_one(CodeKind kind, const std::byte* row, std::uint64_t c,
                        const float* zero_point, float multiplier, DType round_to) {
  float v = code_value(kind, row, c);
  if (zero_point != nullptr) v = v - *zero_point;
  return round_to_dtype(round_to, v * multiplier);
}

inline bool four_bit(CodeKind kind) {
  return kind == CodeKind::kInt4Offset || kind == CodeKind::kE2M1;
}

inline std::uint64_t n_groups(const ExpandRows& x) {
  return (x.n_cols + x.group_cols - 1) / x.group_cols;
}

// Row r of x, element by element.
inline void expand_row_ref(const ExpandRows& x, std::uint64_t r) {
  const std::uint64_t groups = n_groups(x);
  const std::byte* row = x.codes + r * x.row_bytes;
  for (std::uint64_t c = 0; c < x.n_cols; ++c) {
    const std::uint64_t g = r * groups + c / x.group_cols;
    x.values[r * x.n_cols + c] =
        expand_one(x.kind, row, c, x.zero_points != nullptr ? x.zero_points + g : nullptr,
                   x.multipliers[g], x.round_to);
  }
}

}  // namespace
}  // namespace ctquant::detail

#endif  // CTQUANT_SCHEME_DEQUANT_SIMD_ONCE

HWY_BEFORE_NAMESPACE();
namespace ctquant::detail::HWY_NAMESPACE {
#if CTQUANT_SIMD_KERNEL_TARGET
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using simd_steps::HWY_NAMESPACE::e4m3_to_float;
using simd_steps::HWY_NAMESPACE::round_to_t;

// Lanes(df) codes of a row from column c (even for 4-bit codes) as floats.
template <CodeKind K, class DF>
HWY_INLINE hn::Vec<DF> code_values(DF df, const std::uint8_t* row, std::uint64_t c) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::uint8_t, DF> d8;
  if constexpr (K == CodeKind::kInt8) {
    const hn::Rebind<std::int8_t, DF> ds8;
    return hn::ConvertTo(
        df, hn::PromoteTo(di, hn::LoadU(ds8, reinterpret_cast<const std::int8_t*>(row + c))));
  } else if constexpr (K == CodeKind::kInt8Offset || K == CodeKind::kE4M3) {
    const auto u = hn::PromoteTo(du, hn::LoadU(d8, row + c));
    if constexpr (K == CodeKind::kE4M3) return e4m3_to_float(df, u);
    return hn::Sub(hn::ConvertTo(df, hn::BitCast(di, u)), hn::Set(df, 128.0f));
  } else {
    // Lanes / 2 bytes, each into a 16-bit lane as (high nibble << 8) | low
    // nibble: read as bytes, the nibbles in column order.
    const hn::Repartition<std::uint16_t, decltype(d8)> d16;
    const hn::Rebind<std::uint8_t, decltype(d16)> d8_half;
    const auto b = hn::PromoteTo(d16, hn::LoadU(d8_half, row + c / 2));
    const auto pairs = hn::Or(hn::And(b, hn::Set(d16, 0xFu)), hn::ShiftLeft<8>(hn::ShiftRight<4>(b)));
    const auto u = hn::PromoteTo(du, hn::BitCast(d8, pairs));
    if constexpr (K == CodeKind::kInt4Offset) {
      return hn::Sub(hn::ConvertTo(df, hn::BitCast(di, u)), hn::Set(df, 8.0f));
    } else {
      // E2M1: magnitude m = u & 7; 0 and 1 are m * 0.5, the others have
      // exponent m >> 1 and mantissa m & 1: bits (m << 22) + (126 << 23).
      const auto m = hn::And(u, hn::Set(du, 7u));
      const auto low = hn::BitCast(
          du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, m)), hn::Set(df, 0.5f)));
      const auto high = hn::Add(hn::ShiftLeft<22>(m), hn::Set(du, 126u << 23));
      const auto bits = hn::IfThenElse(hn::Lt(m, hn::Set(du, 2u)), low, high);
      const auto sign = hn::ShiftLeft<28>(hn::And(u, hn::Set(du, 8u)));
      return hn::BitCast(df, hn::Or(bits, sign));
    }
  }
}

template <CodeKind K, DType R>
void expand_rows(const ExpandRows& x) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const std::uint64_t groups = n_groups(x);
  const bool vector_rows = !four_bit(K) || x.group_cols % 2 == 0;
  for (std::uint64_t r = 0; r < x.n_rows; ++r) {
    if (!vector_rows) {
      expand_row_ref(x, r);
      continue;
    }
    const auto* row = reinterpret_cast<const std::uint8_t*>(x.codes + r * x.row_bytes);
    float* out = x.values + r * x.n_cols;
    for (std::uint64_t j = 0; j < groups; ++j) {
      const std::uint64_t g = r * groups + j;
      const float* z = x.zero_points != nullptr ? x.zero_points + g : nullptr;
      const float m = x.multipliers[g];
      const auto vm = hn::Set(df, m);
      const auto vz = hn::Set(df, z != nullptr ? *z : 0.0f);
      const std::uint64_t c1 = std::min(x.n_cols, (j + 1) * x.group_cols);
      std::uint64_t c = j * x.group_cols;
      for (; c + lanes <= c1; c += lanes) {
        auto v = code_values<K>(df, row, c);
        if (z != nullptr) v = hn::Sub(v, vz);
        auto p = hn::Mul(v, vm);
        if constexpr (R == DType::kBF16 || R == DType::kF16) {
          p = hn::IfThenElse(hn::IsNaN(p), p, round_to_t<R>(df, p));
        }
        hn::StoreU(p, df, out + c);
      }
      for (; c < c1; ++c) out[c] = expand_one(K, x.codes + r * x.row_bytes, c, z, m, R);
    }
  }
}

template <DType R>
void expand_rows_of(const ExpandRows& x) {
  switch (x.kind) {
    case CodeKind::kInt4Offset:
      return expand_rows<CodeKind::kInt4Offset, R>(x);
    case CodeKind::kInt8Offset:
      return expand_rows<CodeKind::kInt8Offset, R>(x);
    case CodeKind::kInt8:
      return expand_rows<CodeKind::kInt8, R>(x);
    case CodeKind::kE2M1:
      return expand_rows<CodeKind::kE2M1, R>(x);
    case CodeKind::kE4M3:
      return expand_rows<CodeKind::kE4M3, R>(x);
  }
}

}  // namespace

// The per-level entry point (see simd_dispatch.hpp).
void expand_codes_simd(const ExpandRows& x) {
  switch (x.round_to) {
    case DType::kBF16:
      return expand_rows_of<DType::kBF16>(x);
    case DType::kF16:
      return expand_rows_of<DType::kF16>(x);
    default:
      return expand_rows_of<DType::kF32>(x);
  }
}

#endif  // CTQUANT_SIMD_KERNEL_TARGET
}  // namespace ctquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ctquant::detail {
namespace {

constexpr SimdEntry<ExpandCodesKernel> kExpandCodes[] = CTQUANT_SIMD_TABLE(expand_codes_simd);

}  // namespace

void expand_codes_ref(const ExpandRows& rows) {
  for (std::uint64_t r = 0; r < rows.n_rows; ++r) expand_row_ref(rows, r);
}

ExpandCodesKernel* expand_codes_kernel(const SimdLevel& level) {
  return simd_entry(kExpandCodes, level);
}

void expand_codes(const ExpandRows& rows) {
  static ExpandCodesKernel* const kernel = expand_codes_kernel(simd_best_level());
  if (kernel == nullptr) return expand_codes_ref(rows);
  kernel(rows);
}

}  // namespace ctquant::detail
#endif  // HWY_ONCE
