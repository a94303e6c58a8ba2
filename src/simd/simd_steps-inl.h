// Private: the vector steps the Highway kernels share (kernel_simd.cpp,
// byte_code_simd.cpp, microscale_simd.cpp), compiled once per level like
// them: a Highway per-target header (re-included by foreach_target.h for each
// level, hence the toggled guard). Include it after <hwy/highway.h>, outside
// any namespace. Each step gives exactly the bits of the scalar code it
// names, so the kernels built on them stay byte-identical to their
// references.
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

}  // namespace ctquant::simd_steps::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
