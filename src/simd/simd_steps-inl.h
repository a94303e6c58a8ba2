// Private: the vector steps the Highway kernels share (kernel_simd.cpp,
// byte_code_simd.cpp, microscale_simd.cpp, observer_simd.cpp, refit_simd.cpp), compiled once per
// level like them: a Highway per-target header (re-included by foreach_target.h for each level,
// hence the toggled guard). Include it after <hwy/highway.h>, outside any namespace. Each step
// gives exactly the bits of the scalar code it names, so the kernels built on them stay
// byte-identical to their references.
#if defined(CTQUANT_SIMD_SIMD_STEPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CTQUANT_SIMD_SIMD_STEPS_INL_H_
#undef CTQUANT_SIMD_SIMD_STEPS_INL_H_
#else
#define CTQUANT_SIMD_SIMD_STEPS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <hwy/highway.h>

#include "ctquant/format/dtype.hpp"

HWY_BEFORE_NAMESPACE();
namespace ctquant::simd_steps::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// The lanes of one stored element: the raw bits of BF16 / F16 (uint16_t) or F32.
template <DType T>
using RawLane = std::conditional_t<T == DType::kF32, std::uint32_t, std::uint16_t>;

// Largest magnitude bits (sign cleared) of the n elements of dtype T at p.
// For non-negative IEEE values the integer order is the numeric order, and
// NaN and infinities have the largest magnitude bits, so this also finds them.
template <DType T>
HWY_INLINE std::uint32_t magnitude_max(const std::byte* p, std::uint64_t n) {
  using Raw = RawLane<T>;
  constexpr Raw kMagnitude = static_cast<Raw>(T == DType::kF32 ? 0x7FFFFFFFu : 0x7FFFu);
  const Raw* raw = reinterpret_cast<const Raw*>(p);
  const hn::ScalableTag<Raw> d;
  const std::size_t lanes = hn::Lanes(d);
  const auto mask = hn::Set(d, kMagnitude);
  auto m0 = hn::Zero(d);
  auto m1 = hn::Zero(d);
  std::uint64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    m0 = hn::Max(m0, hn::And(hn::LoadU(d, raw + i), mask));
    m1 = hn::Max(m1, hn::And(hn::LoadU(d, raw + i + lanes), mask));
  }
  if (i + lanes <= n) {
    m0 = hn::Max(m0, hn::And(hn::LoadU(d, raw + i), mask));
    i += lanes;
  }
  std::uint32_t m = hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
  for (; i < n; ++i) {
    Raw bits;
    std::memcpy(&bits, p + i * sizeof(Raw), sizeof(Raw));
    m = std::max<std::uint32_t>(m, bits & kMagnitude);
  }
  return m;
}

// Lanes(df) elements of dtype T at p widened to float, exactly.
template <DType T, class DF>
HWY_INLINE hn::Vec<DF> load_as_float(DF df, const std::byte* p) {
  if constexpr (T == DType::kF32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(p));
  } else if constexpr (T == DType::kF16) {
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(p)));
  } else {
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<std::uint16_t, DF> du16;
    const auto bits = hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const std::uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(bits));
  }
}

// round_to_dtype(T, v) for finite v: round to T (nearest even), widen. BF16
// with the integer rounding of float_to_bf16 (add 0x7FFF plus the lowest
// kept bit, drop 16 bits), F16 with the hardware conversion (F16C, AArch64
// FCVT: nearest even, subnormals kept), F32 as is.
template <DType T, class DF>
HWY_INLINE hn::Vec<DF> round_to_t(DF df, hn::Vec<DF> v) {
  if constexpr (T == DType::kF32) {
    return v;
  } else if constexpr (T == DType::kF16) {
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::DemoteTo(df16, v));
  } else {
    const hn::RebindToUnsigned<DF> du;
    const auto u = hn::BitCast(du, v);
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto biased = hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7FFFu)));
    return hn::BitCast(df, hn::And(biased, hn::Set(du, 0xFFFF0000u)));
  }
}

// f8_e4m3_to_float of the codes in the low byte of each lane of `codes`
// (the other bits zero): the 7 magnitude bits shifted into a float's
// exponent and mantissa fields, rebiased (exponent + 120) for the normal
// codes, k * 2^-9 for the subnormal ones (magnitude < 8), the NaN bits
// 0x7FC00000 for magnitude 0x7F, the sign bit or'ed back (code 0x80 is -0.0).
template <class DF>
HWY_INLINE hn::Vec<DF> e4m3_to_float(DF df, hn::Vec<hn::RebindToUnsigned<DF>> codes) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto magnitude = hn::And(codes, hn::Set(du, 0x7Fu));
  const auto sign = hn::ShiftLeft<24>(hn::And(codes, hn::Set(du, 0x80u)));
  const auto normal = hn::Add(hn::ShiftLeft<20>(magnitude), hn::Set(du, 120u << 23));
  const auto subnormal = hn::BitCast(
      du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, magnitude)), hn::Set(df, 0x1p-9f)));
  auto bits = hn::IfThenElse(hn::Lt(magnitude, hn::Set(du, 8u)), subnormal, normal);
  bits = hn::IfThenElse(hn::Eq(magnitude, hn::Set(du, 0x7Fu)), hn::Set(du, 0x7FC00000u), bits);
  return hn::BitCast(df, hn::Or(bits, sign));
}

#if HWY_TARGET == HWY_AVX3
// xt[j * 16 + lane] = element j of the BF16 group at groups[lane], as a
// float, for 16 groups of g elements (g a multiple of 16): 16 x 16 blocks
// widened (BF16 bits shifted into a float's high half) and transposed by
// the four unpack and shuffle stages.
HWY_INLINE void transpose_bf16_16(const std::byte* const* groups, std::size_t g, float* xt) {
  for (std::size_t j0 = 0; j0 < g; j0 += 16) {
    __m512 r[16];
    for (int lane = 0; lane < 16; ++lane) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(groups[lane] + 2 * j0));
      r[lane] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    __m512 t[16];
    for (int k = 0; k < 8; ++k) {
      t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; ++k) {
      for (int h = 0; h < 2; ++h) {
        const __m512 a = t[4 * k + h];
        const __m512 b = t[4 * k + 2 + h];
        r[4 * k + h] = _mm512_shuffle_ps(a, b, 0x44);
        r[4 * k + 2 + h] = _mm512_shuffle_ps(a, b, 0xEE);
      }
    }
    // Each 128-bit block of r[4k + q] holds one column of rows 4k .. 4k + 3;
    // the shuffles of 128-bit blocks gather the four row quads of a column.
    for (int k = 0; k < 2; ++k) {
      for (int q = 0; q < 4; ++q) {
        const __m512 a = r[8 * k + q];
        const __m512 b = r[8 * k + 4 + q];
        t[8 * k + q] = _mm512_shuffle_f32x4(a, b, 0x88);
        t[8 * k + 4 + q] = _mm512_shuffle_f32x4(a, b, 0xDD);
      }
    }
    for (int q = 0; q < 8; ++q) {
      r[q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0x88);
      r[8 + q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0xDD);
    }
    // Which column each register now holds.
    static constexpr int kColumn[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    for (int k = 0; k < 16; ++k) _mm512_store_ps(xt + (j0 + kColumn[k]) * 16, r[k]);
  }
}
#endif

}  // namespace ctquant::simd_steps::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
