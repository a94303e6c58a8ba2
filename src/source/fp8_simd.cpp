// The vector kernel of fp8_simd.hpp: FP8 E4M3 codes times one scale,
// rounded to BF16, written once with Google Highway and compiled for every
// level of simd_levels() (simd/simd_dispatch.hpp).
//
// It follows the scalar step of dequantize_fp8_value with the same IEEE
// operations, one vector of float lanes at a time, so the bits are the same:
// - decode: the code's 7 magnitude bits shifted into a float's exponent and
//   mantissa fields (bits << 20) are 2^-120 times the E4M3 value, for the
//   subnormal codes too (they land on float subnormals), so one exact
//   multiplication by 2^120 gives the value f8_e4m3_to_float gives; the
//   sign bit is or'ed back (code 0x80 is -0.0);
// - one float multiplication by the scale per lane (as the scalar code);
// - rounding to BF16 as float_to_bf16 does for non-NaN values: add 0x7FFF
//   plus the lowest kept bit, keep the high 16 bits;
// - a lane is bad when its code is NaN (magnitude 0x7F), its product is
//   not finite, or its BF16 value is not finite: exactly where the scalar
//   code's bf16_is_finite fails. The first bad lane's index is returned.
//   With a finite scale the product of a finite code is never NaN, and an
//   infinite product rounds to an infinite BF16 value, so the product test
//   is left out there (the usual case: one check fewer per lane).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "source/fp8_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/simd_dispatch.hpp"

#ifndef CTQUANT_SOURCE_FP8_SIMD_ONCE
#define CTQUANT_SOURCE_FP8_SIMD_ONCE

#include <cmath>
#include <cstring>

#include "ctquant/format/dtype.hpp"
#include "source/fp8_simd.hpp"

#endif  // CTQUANT_SOURCE_FP8_SIMD_ONCE

HWY_BEFORE_NAMESPACE();
namespace ctquant::detail::HWY_NAMESPACE {
#if CTQUANT_SIMD_KERNEL_TARGET
namespace hn = hwy::HWY_NAMESPACE;

template <bool kFiniteScale>
HWY_INLINE std::optional<std::size_t> decode_e4m3_with(const std::uint8_t* codes, std::size_t n,
                                                      float scale, std::uint16_t* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint8_t, decltype(du)> d8;
  const hn::Rebind<std::uint16_t, decltype(du)> d16;
  const std::size_t lanes = hn::Lanes(df);
  const auto magnitude_mask = hn::Set(du, 0x7Fu);
  const auto nan_code = hn::Set(du, 0x7Fu);
  const auto exponent_mask = hn::Set(du, 0x7F800000u);
  const auto bf16_exponent = hn::Set(du, 0x7F80u);
  const auto rebias = hn::Set(df, 0x1p120f);
  const auto vscale = hn::Set(df, scale);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto c = hn::PromoteTo(du, hn::LoadU(d8, codes + i));
    const auto magnitude = hn::And(c, magnitude_mask);
    const auto sign = hn::ShiftLeft<24>(hn::AndNot(magnitude_mask, c));
    const auto value = hn::BitCast(
        df, hn::Or(hn::BitCast(du, hn::Mul(hn::BitCast(df, hn::ShiftLeft<20>(magnitude)), rebias)),
                   sign));
    const auto u = hn::BitCast(du, hn::Mul(value, vscale));
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto bits = hn::ShiftRight<16>(hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7FFFu))));
    auto bad = hn::Or(hn::Eq(magnitude, nan_code), hn::Eq(hn::And(bits, bf16_exponent), bf16_exponent));
    if constexpr (!kFiniteScale) {
      bad = hn::Or(bad, hn::Eq(hn::And(u, exponent_mask), exponent_mask));
    }
    if (!hn::AllFalse(du, bad)) {
      return i + static_cast<std::size_t>(hn::FindFirstTrue(du, bad));
    }
    hn::StoreU(hn::TruncateTo(d16, bits), d16, out + i);
  }
  // The rest, fewer than a vector: the scalar step.
  for (; i < n; ++i) {
    const std::uint16_t b = float_to_bf16(f8_e4m3_to_float(codes[i]) * scale);
    if ((b & 0x7F80u) == 0x7F80u) return i;  // not finite
    std::memcpy(out + i, &b, 2);
  }
  return std::nullopt;
}

std::optional<std::size_t> decode_e4m3(const std::uint8_t* codes, std::size_t n, float scale,
                                       std::uint16_t* out) {
  if (std::isfinite(scale)) return decode_e4m3_with<true>(codes, n, scale, out);
  return decode_e4m3_with<false>(codes, n, scale, out);
}

#endif  // CTQUANT_SIMD_KERNEL_TARGET
}  // namespace ctquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ctquant::detail {
namespace {

constexpr SimdEntry<Fp8DecodeKernel> kDecodeE4m3[] = CTQUANT_SIMD_TABLE(decode_e4m3);

}  // namespace

Fp8DecodeKernel* fp8_decode_kernel(const SimdLevel& level) {
  return simd_entry(kDecodeE4m3, level);
}

}  // namespace ctquant::detail
#endif  // HWY_ONCE
