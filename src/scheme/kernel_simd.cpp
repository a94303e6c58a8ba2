// The vector kernel behind quantize_block() for symmetric schemes of 4 or 8
// bits on BF16 / F16 / F32 weights, written once with Google Highway and
// compiled for every level of simd_levels() (SVE2, SVE and NEON on AArch64;
// AVX-512 and AVX2 on x86-64), chosen at run time (simd_dispatch.hpp). On
// x86-64, quantize_block() runs the hand-written kernels of kernel_x86.cpp
// instead, which are faster there; this one is still compiled, tested and
// benchmarked at those levels (quantize_block_hwy_at).
//
// It follows section 3 of the format spec step for step with the same IEEE
// operations as quantize_block_ref(), one vector of float lanes at a time,
// so the bytes are the same:
// - the group's absolute maximum is taken on the raw bits with the sign bit
//   cleared (for non-negative IEEE values the integer order is the numeric
//   order), which also finds NaN and infinities: their magnitude bits are
//   the largest; max(|lo|, hi) of the spec equals max |w| (both +0 for an
//   all-zero group);
// - the scale is computed with the same scalar code as the reference;
// - w / s is one correctly rounded division per lane (as the reference's
//   scalar division), then rounded to T: BF16 with the integer
//   round-to-nearest-even the reference uses, F16 with the hardware
//   conversion (F16C, AArch64 FCVT: round to nearest even, subnormals kept),
//   F32 as is;
// - clamp with Min/Max (v is finite, so they agree with std::clamp), round
//   half to even to an integer (NearestInt: the default rounding mode, as
//   std::nearbyint), offset by 2^(b-1), pack (section 4).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "scheme/kernel_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "scheme/simd_dispatch.hpp"

#ifndef CTQUANT_SCHEME_KERNEL_SIMD_ONCE
#define CTQUANT_SCHEME_KERNEL_SIMD_ONCE

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ctquant/format/dtype.hpp"
#include "scheme/kernel_simd.hpp"
#include "scheme/kernel_steps.hpp"
#include "scheme/kernel_x86.hpp"

#endif  // CTQUANT_SCHEME_KERNEL_SIMD_ONCE

HWY_BEFORE_NAMESPACE();
namespace ctquant::detail::HWY_NAMESPACE {
#if CTQUANT_SIMD_KERNEL_TARGET
namespace {

namespace hn = hwy::HWY_NAMESPACE;

// The lanes of one stored element: the raw bits of BF16 / F16 (uint16_t) or F32.
template <DType T>
using RawLane = std::conditional_t<T == DType::kF32, std::uint32_t, std::uint16_t>;

// Largest magnitude bits (sign cleared) of n elements at p, n a multiple of 8.
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
  // The rest, fewer than a vector: eight at a time.
  const hn::CappedTag<Raw, 8> d8;
  for (; i < n; i += hn::Lanes(d8)) {
    const auto v = hn::And(hn::LoadU(d8, raw + i), hn::Set(d8, kMagnitude));
    m = std::max<std::uint32_t>(m, hn::GetLane(hn::MaxOfLanes(d8, v)));
  }
  return m;
}

// Lanes(df) elements at p widened to float, exactly.
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

// round_T of section 3 for finite values: round to T (nearest even), widen.
template <DType T, class DF>
HWY_INLINE hn::Vec<DF> round_to_t(DF df, hn::Vec<DF> v) {
  if constexpr (T == DType::kF32) {
    return v;
  } else if constexpr (T == DType::kF16) {
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::DemoteTo(df16, v));
  } else {
    // As float_to_bf16: add 0x7FFF plus the lowest kept bit, drop 16 bits.
    const hn::RebindToUnsigned<DF> du;
    const auto u = hn::BitCast(du, v);
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto biased = hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7FFFu)));
    return hn::BitCast(df, hn::And(biased, hn::Set(du, 0xFFFF0000u)));
  }
}

// Quantizes Lanes(df) elements at p with scale s and stores their codes
// q + 2^(b-1), packed (section 4), at out: Lanes(df) * kBits / 8 bytes.
// Column c of a row is byte c of an 8-bit row and bits 4 (c % 2) of byte
// c / 2 of a 4-bit row (little-endian words).
template <DType T, int kBits, class DF>
HWY_INLINE void quantize_vector(DF df, const std::byte* p, hn::Vec<DF> s, std::uint8_t* out) {
  constexpr float kQmin = -static_cast<float>(1 << (kBits - 1));
  constexpr float kQmax = static_cast<float>((1 << (kBits - 1)) - 1);
  // 1.5 * 2^23 + 2^(b-1): an even integer in [2^23, 2^24), where floats are
  // the integers. For |v| <= 2^(b-1), v + kRound (one add, rounded to
  // nearest even) is kRound + q with q = v rounded half to even (kRound is
  // even, so the parity of the sum is the parity of q): its low mantissa
  // bits hold q + 2^(b-1), the offset code.
  constexpr float kRound = 12582912.0f + static_cast<float>(1 << (kBits - 1));
  auto v = round_to_t<T>(df, hn::Div(load_as_float<T>(df, p), s));
  v = hn::Min(hn::Max(v, hn::Set(df, kQmin)), hn::Set(df, kQmax));
  const hn::RebindToUnsigned<DF> du;
  const auto biased = hn::BitCast(du, hn::Add(v, hn::Set(df, kRound)));
  if constexpr (kBits == 8) {
    const hn::Rebind<std::uint8_t, decltype(du)> d8;
    hn::StoreU(hn::TruncateTo(d8, biased), d8, out);
  } else {
    // Each 64-bit lane holds columns 2i (low half) and 2i+1 (high half):
    // bring the high code down to bits 4-7, keep the low byte of each lane.
    const hn::Repartition<std::uint64_t, decltype(du)> d64;
    const auto pairs = hn::BitCast(d64, hn::And(biased, hn::Set(du, 0xFu)));
    const auto bytes = hn::Or(pairs, hn::ShiftRight<28>(pairs));
    const hn::Rebind<std::uint8_t, decltype(d64)> d8;
    hn::StoreU(hn::TruncateTo(d8, bytes), d8, out);
  }
}

template <DType T, int kBits>
std::optional<std::uint64_t> quantize_rows(const QuantScheme& scheme, const KernelBlock& block) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  const std::uint64_t n_cols = block.n_cols;
  const std::uint64_t g_size = scheme.effective_group_size(n_cols);
  const std::uint64_t n_groups = n_cols / g_size;
  const std::uint64_t words_per_row = packed_words_per_row(n_cols, kBits);
  const float divisor = static_cast<float>(scheme.qmax() - scheme.qmin()) / 2.0f;
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const hn::CappedTag<float, 8> df8;  // the rest of a group, fewer than a vector
  const std::size_t lanes8 = hn::Lanes(df8);

  for (std::uint64_t r = 0; r < block.n_rows; ++r) {
    const std::byte* row = block.weight + r * n_cols * kEsize;
    auto* out = reinterpret_cast<std::uint8_t*>(block.packed + r * words_per_row);
    std::byte* scale_out = block.scale + r * n_groups * kEsize;
    for (std::uint64_t c0 = 0; c0 < n_cols; c0 += g_size) {
      const std::byte* group = row + c0 * kEsize;
      // Steps 1-3 of section 3 (and the finite check of the reference).
      const std::uint32_t max_bits = magnitude_max<T>(group, g_size);
      if (max_bits >= kNonFiniteBits<T>) return r * n_cols + c0 + first_non_finite(T, group);
      const float s = group_scale(T, max_bits, divisor, scale_out + (c0 / g_size) * kEsize);
      // Steps 4-5, a vector at a time.
      const auto vs = hn::Set(df, s);
      std::uint64_t c = 0;
      for (; c + lanes <= g_size; c += lanes) {
        quantize_vector<T, kBits>(df, group + c * kEsize, vs, out + (c0 + c) * kBits / 8);
      }
      const auto vs8 = hn::Set(df8, s);
      for (; c < g_size; c += lanes8) {
        quantize_vector<T, kBits>(df8, group + c * kEsize, vs8, out + (c0 + c) * kBits / 8);
      }
    }
  }
  return std::nullopt;
}

}  // namespace

// The per-level entry point (see simd_dispatch.hpp); simd_supports() holds.
std::optional<std::uint64_t> quantize_symmetric(const QuantScheme& scheme,
                                                const KernelBlock& block) {
  const bool four = scheme.num_bits == 4;
  switch (block.dtype) {
    case DType::kBF16:
      return four ? quantize_rows<DType::kBF16, 4>(scheme, block)
                  : quantize_rows<DType::kBF16, 8>(scheme, block);
    case DType::kF16:
      return four ? quantize_rows<DType::kF16, 4>(scheme, block)
                  : quantize_rows<DType::kF16, 8>(scheme, block);
    default:
      return four ? quantize_rows<DType::kF32, 4>(scheme, block)
                  : quantize_rows<DType::kF32, 8>(scheme, block);
  }
}

#endif  // CTQUANT_SIMD_KERNEL_TARGET
}  // namespace ctquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ctquant::detail {
namespace {

using QuantizeSymmetric = std::optional<std::uint64_t>(const QuantScheme&, const KernelBlock&);

// The Highway kernel at every level.
constexpr SimdEntry<QuantizeSymmetric> kQuantizeSymmetricHwy[] =
    CTQUANT_SIMD_TABLE(quantize_symmetric);

// What quantize_block() runs at each level: on x86-64 the hand-written
// kernels of kernel_x86.cpp (the Highway kernel is 1.2x slower there,
// docs/performance.md), elsewhere the Highway kernel.
#if HWY_ARCH_X86_64
constexpr SimdEntry<QuantizeSymmetric> kQuantizeSymmetric[] = {
    {HWY_AVX3, &x86::quantize_symmetric_avx512},
    {HWY_AVX2, &x86::quantize_symmetric_avx2},
    {0, nullptr},
};
#else
constexpr const auto& kQuantizeSymmetric = kQuantizeSymmetricHwy;
#endif

std::optional<std::uint64_t> run_at(QuantizeSymmetric* fn, const QuantScheme& scheme,
                                    const KernelBlock& block) {
  if (fn == nullptr || !simd_supports(scheme, block)) return quantize_block_ref(scheme, block);
  return fn(scheme, block);
}

}  // namespace

bool simd_available() { return simd_best_level().supported; }

bool simd_supports(const QuantScheme& scheme, const KernelBlock& block) {
  if (!simd_available() || !scheme.symmetric) return false;
  if (scheme.num_bits != 4 && scheme.num_bits != 8) return false;
  if (block.dtype != DType::kBF16 && block.dtype != DType::kF16 && block.dtype != DType::kF32) {
    return false;
  }
  const std::uint64_t g_size = scheme.effective_group_size(block.n_cols);
  return g_size > 0 && g_size % 8 == 0 && block.n_cols % g_size == 0;
}

std::optional<std::uint64_t> quantize_block_simd(const QuantScheme& scheme,
                                                 const KernelBlock& block) {
  return quantize_block_simd_at(simd_best_level(), scheme, block);
}

std::optional<std::uint64_t> quantize_block_simd_at(const SimdLevel& level,
                                                    const QuantScheme& scheme,
                                                    const KernelBlock& block) {
  return run_at(simd_entry(kQuantizeSymmetric, level), scheme, block);
}

bool simd_hand_written() { return HWY_ARCH_X86_64 != 0; }

std::optional<std::uint64_t> quantize_block_hwy_at(const SimdLevel& level,
                                                   const QuantScheme& scheme,
                                                   const KernelBlock& block) {
  return run_at(simd_entry(kQuantizeSymmetricHwy, level), scheme, block);
}

}  // namespace ctquant::detail
#endif  // HWY_ONCE
