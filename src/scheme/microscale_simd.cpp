// The vector kernels of the microscale families, one Highway source compiled
// for every level of simd_levels() (simd_dispatch.hpp says how).
//
// They follow the references of nvfp4.cpp, mxfp4.cpp and mxfp8.cpp (shared/
// spec/schemes.md sections 5.3 and 6) step for step with the same IEEE
// operations, a vector of float lanes at a time:
// - a group's largest |w| is taken on the raw bits with the sign cleared
//   (integer order is numeric order for non-negative IEEE values), which
//   also finds NaN and infinities, whose magnitude bits are the largest;
// - the per-group scale comes from the same scalar functions as the
//   reference (scheme/microscale.hpp), so it is the same by construction;
// - NVFP4: v = w / divisor, one correctly rounded division per lane, as the
//   reference's float32 division;
// - MX: v = round_W(w * 2^-k) where the reference computes round_W(w / 2^k):
//   2^-k is exact in float for every scale (2^-127 .. 2^127, 1.0, and 0 for
//   an infinite scale), so both are the correctly rounded value of the same
//   real number; round_W as in the int kernels (BF16 by integer round to
//   nearest even, F16 by the hardware conversion, F32 none);
// - E2M1: round to nearest even on the E2M1 grid, which is what the
//   thresholds of e2m1_code() (> 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5,
//   >= 3.5, > 5) give, by the float's bits (e2m1_codes below); 8 is added
//   when v < 0 (so -0.0 gives 0), as e2m1_code();
// - E4M3: clamp to 448, then the normal codes by rounding the float's bits
//   to 3 mantissa bits (nearest even, as float_to_f8_e4m3()), the subnormal
//   codes by adding 2^14, whose float ulp is the E4M3 subnormal step 2^-9
//   (the addition rounds to nearest even), and the sign bit of v.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "scheme/microscale_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/simd_dispatch.hpp"
#include "simd/simd_steps-inl.h"

#ifndef CTQUANT_SCHEME_MICROSCALE_SIMD_ONCE
#define CTQUANT_SCHEME_MICROSCALE_SIMD_ONCE

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/minifloat.hpp"
#include "scheme/microscale.hpp"
#include "scheme/microscale_simd.hpp"

namespace ctquant::microscale {
namespace {

template <DType T>
constexpr std::size_t kElementBytes = T == DType::kF32 ? 4 : 2;

// Magnitude bits at and above which a value is NaN or infinite.
template <DType T>
constexpr std::uint32_t kNonFiniteBits = T == DType::kF32    ? 0x7F800000u
                                         : T == DType::kBF16 ? 0x7F80u
                                                             : 0x7C00u;

// Index of the first NaN or infinity of a group known to hold one.
std::uint64_t first_non_finite(DType t, const std::byte* group) {
  const std::size_t esize = t == DType::kF32 ? 4 : 2;
  std::uint64_t c = 0;
  while (std::isfinite(load_as_float(t, group + c * esize))) ++c;
  return c;
}

}  // namespace
}  // namespace ctquant::microscale

#endif  // CTQUANT_SCHEME_MICROSCALE_SIMD_ONCE

HWY_BEFORE_NAMESPACE();
namespace ctquant::microscale::HWY_NAMESPACE {
#if CTQUANT_SIMD_KERNEL_TARGET
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using simd_steps::HWY_NAMESPACE::load_as_float;
using simd_steps::HWY_NAMESPACE::round_to_t;

template <DType T>
using RawLane = std::conditional_t<T == DType::kF32, std::uint32_t, std::uint16_t>;

// Largest magnitude bits (sign cleared) of the kN elements at p.
template <DType T, std::size_t kN>
HWY_INLINE std::uint32_t magnitude_max(const std::byte* p) {
  using Raw = RawLane<T>;
  constexpr Raw kMagnitude = static_cast<Raw>(T == DType::kF32 ? 0x7FFFFFFFu : 0x7FFFu);
  const hn::CappedTag<Raw, kN> d;
  const Raw* raw = reinterpret_cast<const Raw*>(p);
  const std::size_t lanes = hn::Lanes(d);
  auto m = hn::And(hn::LoadU(d, raw), hn::Set(d, kMagnitude));
  for (std::size_t i = lanes; i < kN; i += lanes) {
    m = hn::Max(m, hn::And(hn::LoadU(d, raw + i), hn::Set(d, kMagnitude)));
  }
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

// Largest magnitude bits of 8 consecutive groups of kN elements at p into
// out[0..8), where a vector holds 16 BF16 / F16 or 8 F32 elements (kN a
// multiple of that): each group's vectors are first reduced to one, then the
// eight group vectors together by interleaving (pairs of groups, then pairs
// of pairs, ...; for BF16 / F16 lastly the two 128-bit blocks), each step a
// Max of lanes of the same group, so out[i] is the max over group i as
// magnitude_max() computes it. Returns false (nothing written) on other
// targets: the interleaving is written for x86's 128-bit blocks (AVX2, and
// AVX-512 on 256-bit vectors); NEON and SVE take the group-by-group path.
template <DType T, std::size_t kN>
HWY_INLINE bool magnitude_max_8_groups(const std::byte* p, std::uint32_t* out) {
  using Raw = RawLane<T>;
  constexpr std::size_t kLanes = 32 / sizeof(Raw);  // one 256-bit vector
  constexpr Raw kMagnitude = static_cast<Raw>(T == DType::kF32 ? 0x7FFFFFFFu : 0x7FFFu);
  const hn::CappedTag<Raw, kLanes> d;
  if constexpr (HWY_TARGET != HWY_AVX2 && HWY_TARGET != HWY_AVX3) {
    (void)p;
    (void)out;
    return false;
  } else {
    if (hn::Lanes(d) != kLanes) return false;
    const hn::Repartition<std::uint32_t, decltype(d)> d32;
    const hn::Repartition<std::uint64_t, decltype(d)> d64;
    const auto* raw = reinterpret_cast<const Raw*>(p);
    const auto mask = hn::Set(d, kMagnitude);
    const auto group = [&](std::size_t i) {
      auto m = hn::And(hn::LoadU(d, raw + kN * i), mask);
      for (std::size_t c = kLanes; c < kN; c += kLanes) {
        m = hn::Max(m, hn::And(hn::LoadU(d, raw + kN * i + c), mask));
      }
      return m;
    };
    // Lanes of a and b interleaved (as units of `du` lanes), then the max of
    // the two halves: each output unit holds one group's partial max.
    const auto merge = [&](auto du, auto a, auto b) {
      const auto lo =
          hn::BitCast(d, hn::InterleaveLower(du, hn::BitCast(du, a), hn::BitCast(du, b)));
      const auto hi =
          hn::BitCast(d, hn::InterleaveUpper(du, hn::BitCast(du, a), hn::BitCast(du, b)));
      return hn::Max(lo, hi);
    };
    if constexpr (T == DType::kF32) {
      const auto g01 = merge(d, group(0), group(1));
      const auto g23 = merge(d, group(2), group(3));
      const auto g45 = merge(d, group(4), group(5));
      const auto g67 = merge(d, group(6), group(7));
      const auto g0123 = merge(d64, g01, g23);  // each 128-bit block: groups 0..3
      const auto g4567 = merge(d64, g45, g67);  // groups 4..7
      // Lower blocks [g0123, g4567], upper blocks likewise: their max.
      const auto all =
          hn::Max(hn::ConcatLowerLower(d, g4567, g0123), hn::ConcatUpperUpper(d, g4567, g0123));
      hn::StoreU(all, d, out);
    } else {
      const auto g01 = merge(d, group(0), group(1));
      const auto g23 = merge(d, group(2), group(3));
      const auto g45 = merge(d, group(4), group(5));
      const auto g67 = merge(d, group(6), group(7));
      const auto g0123 = merge(d32, g01, g23);
      const auto g4567 = merge(d32, g45, g67);
      const auto all = merge(d64, g0123, g4567);  // each 128-bit block: groups 0..7
      const hn::Half<decltype(d)> dh;
      const auto m = hn::Max(hn::LowerHalf(dh, all), hn::UpperHalf(dh, all));
      const hn::Rebind<std::uint32_t, decltype(dh)> du32;
      hn::StoreU(hn::PromoteTo(du32, m), du32, out);
    }
    return true;
  }
}

// The values of Lanes(dv) magnitude bit patterns of dtype T (uint32, BF16
// and F16 in the low half), exactly.
template <DType T, class DF>
HWY_INLINE hn::Vec<DF> magnitudes_as_float(DF df, const std::uint32_t* bits) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::Load(du, bits);
  if constexpr (T == DType::kF32) {
    return hn::BitCast(df, u);
  } else if constexpr (T == DType::kF16) {
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<std::uint16_t, DF> du16;
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::BitCast(df16, hn::DemoteTo(du16, hn::BitCast(di, u))));
  } else {
    return hn::BitCast(df, hn::ShiftLeft<16>(u));
  }
}

// The E2M1 codes of v (e2m1_code), as int32 lanes. e2m1_code's thresholds
// (> 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5) are round to
// nearest even on the E2M1 grid, which is computed here as for E4M3:
// - |v| >= 1 (E2M1 normals): the float's bits rounded to 1 mantissa bit,
//   nearest even, then exponent and that bit as the code (float 1.0, bits
//   0x3F800000, gives (254 << 22) and code 2); |v| is first clamped to 6,
//   whose code 7 every larger value takes;
// - |v| < 1 (0, 0.5 and the 1.0 it may round up to): the number of steps of
//   0.5 in |v| + 2^22, whose float ulp is 0.5 (the addition rounds to
//   nearest even);
// 8 is added when v < 0 (so -0.0 gives 0).
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> e2m1_codes(DF df, hn::Vec<DF> v) {
  const hn::RebindToSigned<DF> di;
  const auto a = hn::Min(hn::Abs(v), hn::Set(df, 6.0f));
  const auto u = hn::BitCast(di, a);
  const auto odd = hn::And(hn::ShiftRight<22>(u), hn::Set(di, 1));
  const auto normal = hn::Sub(hn::ShiftRight<22>(hn::Add(u, hn::Add(odd, hn::Set(di, 0x1FFFFF)))),
                              hn::Set(di, 252));
  const auto magic = hn::Set(df, 4194304.0f);  // 2^22
  const auto small = hn::Sub(hn::BitCast(di, hn::Add(a, magic)), hn::BitCast(di, magic));
  const auto code = hn::IfThenElse(hn::RebindMask(di, hn::Lt(a, hn::Set(df, 1.0f))), small, normal);
  const auto negative = hn::RebindMask(di, hn::Lt(v, hn::Zero(df)));
  return hn::Or(code, hn::IfThenElseZero(negative, hn::Set(di, 8)));
}

// Stores Lanes(di) E2M1 codes (int32 lanes) as Lanes(di) / 2 bytes: column
// 2j in the low nibble of byte j, column 2j + 1 in the high one.
template <class DI>
HWY_INLINE void store_nibbles(DI /*di*/, hn::Vec<DI> codes, std::byte* out) {
  const hn::Repartition<std::uint64_t, DI> d64;
  const auto pairs = hn::BitCast(d64, codes);
  const auto bytes = hn::Or(pairs, hn::ShiftRight<28>(pairs));
  const hn::Rebind<std::uint8_t, decltype(d64)> d8;
  hn::StoreU(hn::TruncateTo(d8, bytes), d8, reinterpret_cast<std::uint8_t*>(out));
}

// The E4M3 codes of v (float_to_f8_e4m3 of finite v), as uint32 lanes.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> e4m3_codes(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const auto a = hn::Min(hn::Abs(v), hn::Set(df, 448.0f));
  const auto u = hn::BitCast(du, a);
  // Normal: keep 3 mantissa bits, nearest even; rebias 127 -> 7.
  const auto odd = hn::And(hn::ShiftRight<20>(u), hn::Set(du, 1u));
  const auto normal = hn::Sub(hn::ShiftRight<20>(hn::Add(u, hn::Add(odd, hn::Set(du, 0x7FFFFu)))),
                              hn::Set(du, 120u << 3));
  // Below 2^-6: k * 2^-9, k = the steps of 2^-9 that a + 2^14 holds.
  const auto magic = hn::Set(df, 16384.0f);
  const auto subnormal = hn::Sub(hn::BitCast(du, hn::Add(a, magic)), hn::BitCast(du, magic));
  const auto code =
      hn::IfThenElse(hn::RebindMask(du, hn::Lt(a, hn::Set(df, 0x1p-6f))), subnormal, normal);
  const auto sign = hn::And(hn::ShiftRight<24>(hn::BitCast(du, v)), hn::Set(du, 0x80u));
  return hn::Or(code, sign);
}

// The values of E4M3 codes 0..0x7E (as uint32 lanes), as f8_e4m3_to_float.
template <class DF>
HWY_INLINE hn::Vec<DF> e4m3_values(DF df, hn::Vec<hn::RebindToUnsigned<DF>> codes) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(codes), hn::Set(du, 120u << 23)));
  const auto subnormal =
      hn::Mul(hn::ConvertTo(df, hn::BitCast(di, codes)), hn::Set(df, 0x1p-9f));  // k * 2^-9
  return hn::IfThenElse(hn::RebindMask(df, hn::Lt(codes, hn::Set(du, 8u))), subnormal, normal);
}

// ---- NVFP4 (schemes.md 5.3) ----
//
// The scales of a block of Lanes(dv) groups are computed together, one
// group per lane, with the operations of nvfp4_group_scale() and
// nvfp4_divisor(): s = round_W(amax / 6), t = gs * s, the E4M3 code of t
// (0x20 for zero), divisor = value(code) / gs.

template <DType T>
std::optional<std::uint64_t> nvfp4_rows(const KernelIo& io) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  constexpr std::size_t kGroup = 16;
  constexpr std::size_t kMaxBlock = 16;
  const hn::CappedTag<float, kGroup> df;  // the elements of a group
  const std::size_t lanes = hn::Lanes(df);
  const hn::RebindToSigned<decltype(df)> di;
  const hn::CappedTag<float, kMaxBlock> dv;  // one lane per group of a block
  const hn::RebindToUnsigned<decltype(dv)> duv;
  const hn::Rebind<std::uint8_t, decltype(duv)> d8v;
  const std::size_t block = hn::Lanes(dv);
  HWY_ALIGN std::uint32_t max_bits[kMaxBlock];
  HWY_ALIGN float divisors[kMaxBlock];
  HWY_ALIGN std::uint8_t codes[kMaxBlock];
  const std::uint64_t groups = io.n_cols / kGroup;
  const float gs = nvfp4_global_scale(T, io.tensor_amax);
  const auto vgs = hn::Set(dv, gs);
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    const std::byte* row = io.weight + r * io.n_cols * kEsize;
    std::byte* packed = io.out[0] + r * (io.n_cols / 2);
    std::byte* scales = io.out[1] + r * groups;
    for (std::uint64_t g0 = 0; g0 < groups; g0 += block) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(block, groups - g0));
      // Step 1: each group's amax (and the reference's finite check).
      std::size_t i = 0;
      for (; i + 8 <= n &&
             magnitude_max_8_groups<T, kGroup>(row + (g0 + i) * kGroup * kEsize, max_bits + i);
           i += 8) {
      }
      for (; i < n; ++i) max_bits[i] = magnitude_max<T, kGroup>(row + (g0 + i) * kGroup * kEsize);
      for (i = 0; i < n; ++i) {
        if (max_bits[i] >= kNonFiniteBits<T>) {
          const std::byte* group = row + (g0 + i) * kGroup * kEsize;
          return r * io.n_cols + (g0 + i) * kGroup + first_non_finite(T, group);
        }
      }
      for (i = n; i < block; ++i) max_bits[i] = 0;
      // Steps 3-7, one group per lane.
      const auto amax = magnitudes_as_float<T>(dv, max_bits);
      const auto s = round_to_t<T>(dv, hn::Div(amax, hn::Set(dv, 6.0f)));
      auto code = e4m3_codes(dv, hn::Mul(vgs, s));
      code = hn::IfThenElse(hn::Eq(code, hn::Zero(duv)), hn::Set(duv, 0x20u), code);
      hn::Store(hn::Div(e4m3_values(dv, code), vgs), dv, divisors);
      hn::Store(hn::TruncateTo(d8v, code), d8v, codes);
      std::memcpy(scales + g0, codes, n);
      // Step 8, a vector of elements at a time.
      for (i = 0; i < n; ++i) {
        const std::byte* group = row + (g0 + i) * kGroup * kEsize;
        const auto divisor = hn::Set(df, divisors[i]);
        for (std::size_t c = 0; c < kGroup; c += lanes) {
          const auto v = hn::Div(load_as_float<T>(df, group + c * kEsize), divisor);
          store_nibbles(di, e2m1_codes(df, v), packed + ((g0 + i) * kGroup + c) / 2);
        }
      }
    }
  }
  return std::nullopt;
}

// ---- MXFP4 and MXFP8 (schemes.md 6) ----
//
// The scales of a block of Lanes(dv) groups are computed together, one
// group per lane, with the operations of mx_scale() on the bits of each
// group's amax in W: p2 = (bits + half step) & sign-and-exponent mask;
// e = 0 for p2 = 0, 255 for an infinite p2, else clamp(127 + log2(p2) -
// offset, 0, 255); scale = round_W(2^(e - 127)), 1.0 (byte 127) when that is
// zero, byte 255 when infinite.

template <DType T, class DV>
HWY_INLINE void mx_scales(DV dv, int offset, const std::uint32_t* max_bits, float* inverses,
                          std::uint8_t* bytes) {
  const hn::RebindToUnsigned<DV> du;
  const hn::RebindToSigned<DV> di;
  const hn::Rebind<std::uint8_t, decltype(du)> d8;
  constexpr std::uint32_t kHalfStep = T == DType::kF32   ? 1u << 21
                                      : T == DType::kF16 ? 1u << 8
                                                         : 1u << 5;
  constexpr std::uint32_t kMask = T == DType::kF32   ? 0xFF800000u
                                  : T == DType::kF16 ? 0xFC00u
                                                     : 0xFF80u;
  constexpr std::uint32_t kInfinity = kNonFiniteBits<T>;
  constexpr int kMantissaBits = T == DType::kF32 ? 23 : T == DType::kF16 ? 10 : 7;
  constexpr std::int32_t kBias = T == DType::kF16 ? 15 : 127;
  const auto p =
      hn::And(hn::Add(hn::Load(du, max_bits), hn::Set(du, kHalfStep)), hn::Set(du, kMask));
  const auto log2_p2 =
      hn::Sub(hn::BitCast(di, hn::ShiftRight<kMantissaBits>(p)), hn::Set(di, kBias));
  auto e =
      hn::Min(hn::Max(hn::Add(log2_p2, hn::Set(di, 127 - offset)), hn::Zero(di)), hn::Set(di, 255));
  e = hn::IfThenZeroElse(hn::RebindMask(di, hn::Eq(p, hn::Zero(du))), e);
  e = hn::IfThenElse(hn::RebindMask(di, hn::Eq(p, hn::Set(du, kInfinity))), hn::Set(di, 255), e);
  // 2^(e - 127) (e8m0_to_float), rounded to W.
  const auto ue = hn::BitCast(du, e);
  const auto power = hn::BitCast(
      dv,
      hn::IfThenElse(hn::Eq(ue, hn::Zero(du)), hn::Set(du, 0x00400000u), hn::ShiftLeft<23>(ue)));
  auto scale = round_to_t<T>(dv, power);
  auto byte = ue;
  const auto underflow = hn::Eq(scale, hn::Zero(dv));
  scale = hn::IfThenElse(underflow, hn::Set(dv, 1.0f), scale);
  byte = hn::IfThenElse(hn::RebindMask(du, underflow), hn::Set(du, 127u), byte);
  const auto infinite = hn::Eq(hn::BitCast(du, scale), hn::Set(du, 0x7F800000u));
  byte = hn::IfThenElse(infinite, hn::Set(du, 0xFFu), byte);
  hn::Store(hn::Div(hn::Set(dv, 1.0f), scale), dv, inverses);
  hn::Store(hn::TruncateTo(d8, byte), d8, bytes);
}

template <DType T, bool kFp4>
std::optional<std::uint64_t> mx_rows(const KernelIo& io) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  constexpr std::size_t kGroup = 32;
  constexpr std::size_t kMaxBlock = 16;
  const hn::CappedTag<float, kGroup> df;  // the elements of a group
  const std::size_t lanes = hn::Lanes(df);
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint8_t, decltype(du)> d8;
  const hn::CappedTag<float, kMaxBlock> dv;  // one lane per group of a block
  const std::size_t block = hn::Lanes(dv);
  HWY_ALIGN std::uint32_t max_bits[kMaxBlock];
  HWY_ALIGN float inverses[kMaxBlock];
  HWY_ALIGN std::uint8_t bytes[kMaxBlock];
  const std::uint64_t groups = io.n_cols / kGroup;
  const std::uint64_t out_row = kFp4 ? io.n_cols / 2 : io.n_cols;
  const auto limit = hn::Set(df, kFp4 ? 6.0f : 448.0f);
  for (std::uint64_t r = 0; r < io.n_rows; ++r) {
    const std::byte* row = io.weight + r * io.n_cols * kEsize;
    std::byte* codes = io.out[0] + r * out_row;
    std::byte* scales = io.out[1] + r * groups;
    for (std::uint64_t g0 = 0; g0 < groups; g0 += block) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(block, groups - g0));
      std::size_t i = 0;
      for (; i + 8 <= n &&
             magnitude_max_8_groups<T, kGroup>(row + (g0 + i) * kGroup * kEsize, max_bits + i);
           i += 8) {
      }
      for (; i < n; ++i) max_bits[i] = magnitude_max<T, kGroup>(row + (g0 + i) * kGroup * kEsize);
      for (i = 0; i < n; ++i) {
        if (max_bits[i] >= kNonFiniteBits<T>) {
          const std::byte* group = row + (g0 + i) * kGroup * kEsize;
          return r * io.n_cols + (g0 + i) * kGroup + first_non_finite(T, group);
        }
      }
      for (i = n; i < block; ++i) max_bits[i] = 0;
      mx_scales<T>(dv, kFp4 ? kMxfp4Offset : kMxfp8Offset, max_bits, inverses, bytes);
      std::memcpy(scales + g0, bytes, n);
      for (i = 0; i < n; ++i) {
        const std::byte* group = row + (g0 + i) * kGroup * kEsize;
        // w / 2^k as w * 2^-k: 2^-k is exact in float, so both round the same real.
        const auto inverse = hn::Set(df, inverses[i]);
        for (std::size_t c = 0; c < kGroup; c += lanes) {
          auto v = round_to_t<T>(df, hn::Mul(load_as_float<T>(df, group + c * kEsize), inverse));
          v = hn::Min(hn::Max(v, hn::Neg(limit)), limit);
          const std::size_t column = (g0 + i) * kGroup + c;
          if constexpr (kFp4) {
            store_nibbles(di, e2m1_codes(df, v), codes + column / 2);
          } else {
            hn::StoreU(hn::TruncateTo(d8, e4m3_codes(df, v)), d8,
                       reinterpret_cast<std::uint8_t*>(codes + column));
          }
        }
      }
    }
  }
  return std::nullopt;
}

template <template <DType> class Rows>
std::optional<std::uint64_t> by_dtype(const KernelIo& io) {
  switch (io.dtype) {
    case DType::kBF16:
      return Rows<DType::kBF16>::run(io);
    case DType::kF16:
      return Rows<DType::kF16>::run(io);
    default:
      return Rows<DType::kF32>::run(io);
  }
}

template <DType T>
struct Nvfp4 {
  static std::optional<std::uint64_t> run(const KernelIo& io) { return nvfp4_rows<T>(io); }
};
template <DType T>
struct Mxfp4 {
  static std::optional<std::uint64_t> run(const KernelIo& io) { return mx_rows<T, true>(io); }
};
template <DType T>
struct Mxfp8 {
  static std::optional<std::uint64_t> run(const KernelIo& io) { return mx_rows<T, false>(io); }
};

}  // namespace

// The per-level entry points (see simd_dispatch.hpp).
std::optional<std::uint64_t> quantize_nvfp4(const KernelIo& io) { return by_dtype<Nvfp4>(io); }
std::optional<std::uint64_t> quantize_mxfp4(const KernelIo& io) { return by_dtype<Mxfp4>(io); }
std::optional<std::uint64_t> quantize_mxfp8(const KernelIo& io) { return by_dtype<Mxfp8>(io); }

#endif  // CTQUANT_SIMD_KERNEL_TARGET
}  // namespace ctquant::microscale::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ctquant::microscale {
namespace {

using detail::SimdEntry;
using Quantize = std::optional<std::uint64_t>(const KernelIo&);
constexpr SimdEntry<Quantize> kNvfp4[] = CTQUANT_SIMD_TABLE(quantize_nvfp4);
constexpr SimdEntry<Quantize> kMxfp4[] = CTQUANT_SIMD_TABLE(quantize_mxfp4);
constexpr SimdEntry<Quantize> kMxfp8[] = CTQUANT_SIMD_TABLE(quantize_mxfp8);

}  // namespace

ChunkKernel kernel_at(const detail::SimdLevel& level, Format format) {
  switch (format) {
    case Format::kNvfp4:
      return detail::simd_entry(kNvfp4, level);
    case Format::kMxfp4:
      return detail::simd_entry(kMxfp4, level);
    default:
      return detail::simd_entry(kMxfp8, level);
  }
}

ChunkKernel best_kernel(Format format) { return kernel_at(detail::simd_best_level(), format); }

}  // namespace ctquant::microscale
#endif  // HWY_ONCE
