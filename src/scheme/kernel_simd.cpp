// The vector kernel behind quantize_block() for int schemes of 4 or 8 bits,
// symmetric and asymmetric, on BF16 / F16 / F32 weights, written once with
// Google Highway and compiled for every level of simd_levels() (SVE2, SVE and
// NEON on AArch64; AVX-512 and AVX2 on x86-64), chosen at run time
// (simd_dispatch.hpp). On x86-64, quantize_block() runs the hand-written
// kernels of kernel_x86.cpp instead, which are faster there; this one is
// still compiled, tested and benchmarked at those levels
// (quantize_block_hwy_at).
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

#include "simd/simd_dispatch.hpp"
#include "simd/simd_steps-inl.h"

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
using simd_steps::HWY_NAMESPACE::load_as_float;
using simd_steps::HWY_NAMESPACE::magnitude_max;
using simd_steps::HWY_NAMESPACE::round_to_t;

// The raw lanes of T as signed integers in the order of the values they
// encode: IEEE sign-magnitude turned into two's complement order by
// inverting the magnitude bits of negative values (key(-m) = ~m), so that one
// integer Min / Max finds the smallest and largest element without widening.
template <DType T>
using KeyLane = std::conditional_t<T == DType::kF32, std::int32_t, std::int16_t>;

template <DType T, class D>
HWY_INLINE hn::Vec<D> order_key(D d, hn::Vec<D> raw) {
  constexpr int kSignShift = static_cast<int>(sizeof(KeyLane<T>) * 8 - 1);
  const auto magnitude = hn::Set(d, hwy::LimitsMax<KeyLane<T>>());
  return hn::Xor(raw, hn::And(hn::ShiftRight<kSignShift>(raw), magnitude));
}

// The element of dtype T whose order key is k, as a float.
template <DType T>
HWY_INLINE float key_to_float(KeyLane<T> k) {
  const KeyLane<T> raw = k < 0 ? static_cast<KeyLane<T>>(k ^ hwy::LimitsMax<KeyLane<T>>()) : k;
  return load_as_float(T, &raw);
}

// lo = min(min of the n elements at p, 0) and hi = max(max of them, 0), n a
// multiple of 8, as floats (either zero may come out as -0 or +0), in one
// pass on the raw bits with the finite check of the reference: false when
// one of them is NaN or infinite (lo and hi are then meaningless). NaN and
// infinities have the largest magnitude bits, so their keys are the
// extremes: at least key(+inf) or at most key(-inf) = ~key(+inf).
template <DType T>
HWY_INLINE bool min_max_finite(const std::byte* p, std::uint64_t n, float& lo, float& hi) {
  using Key = KeyLane<T>;
  const Key* raw = reinterpret_cast<const Key*>(p);
  const hn::ScalableTag<Key> d;
  const std::size_t lanes = hn::Lanes(d);
  auto vlo = hn::Zero(d);  // key(+0) = 0
  auto vhi = hn::Zero(d);
  std::uint64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto key = order_key<T>(d, hn::LoadU(d, raw + i));
    vlo = hn::Min(vlo, key);
    vhi = hn::Max(vhi, key);
  }
  Key klo = hn::GetLane(hn::MinOfLanes(d, vlo));
  Key khi = hn::GetLane(hn::MaxOfLanes(d, vhi));
  const hn::CappedTag<Key, 8> d8;  // the rest, fewer than a vector
  for (; i < n; i += hn::Lanes(d8)) {
    const auto key = order_key<T>(d8, hn::LoadU(d8, raw + i));
    klo = std::min(klo, hn::GetLane(hn::MinOfLanes(d8, key)));
    khi = std::max(khi, hn::GetLane(hn::MaxOfLanes(d8, key)));
  }
  constexpr Key kInfinity = static_cast<Key>(kNonFiniteBits<T>);
  if (khi >= kInfinity || klo <= static_cast<Key>(~kInfinity)) return false;
  lo = key_to_float<T>(klo);
  hi = key_to_float<T>(khi);
  return true;
}

// Quantizes Lanes(df) elements at p with scale s and stores their codes
// q + 2^(b-1), packed (section 4), at out: Lanes(df) * kBits / 8 bytes.
// Column c of a row is byte c of an 8-bit row and bits 4 (c % 2) of byte
// c / 2 of a 4-bit row (little-endian words).
template <DType T, int kBits, bool kAsymmetric, class DF>
HWY_INLINE void quantize_vector(DF df, const std::byte* p, hn::Vec<DF> s, hn::Vec<DF> z,
                                std::uint8_t* out) {
  constexpr float kQmin = -static_cast<float>(1 << (kBits - 1));
  constexpr float kQmax = static_cast<float>((1 << (kBits - 1)) - 1);
  // 1.5 * 2^23 + 2^(b-1): an even integer in [2^23, 2^24), where floats are
  // the integers. For |v| <= 2^(b-1), v + kRound (one add, rounded to
  // nearest even) is kRound + q with q = v rounded half to even (kRound is
  // even, so the parity of the sum is the parity of q): its low mantissa
  // bits hold q + 2^(b-1), the offset code.
  constexpr float kRound = 12582912.0f + static_cast<float>(1 << (kBits - 1));
  auto v = round_to_t<T>(df, hn::Div(load_as_float<T>(df, p), s));
  if constexpr (kAsymmetric) v = round_to_t<T>(df, hn::Add(v, z));
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

// Steps 4-5 for one group of g_size elements at group with scale s and zero
// point z: a vector at a time, then the rest (fewer than a vector).
template <DType T, int kBits, bool kAsymmetric>
HWY_INLINE void quantize_group(const std::byte* group, std::uint64_t g_size, float s, float z,
                               std::uint8_t* out) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  const hn::CappedTag<float, 8> df8;
  const std::size_t lanes8 = hn::Lanes(df8);
  const auto vs = hn::Set(df, s);
  const auto vz = hn::Set(df, z);
  std::uint64_t c = 0;
  for (; c + lanes <= g_size; c += lanes) {
    quantize_vector<T, kBits, kAsymmetric>(df, group + c * kEsize, vs, vz, out + c * kBits / 8);
  }
  const auto vs8 = hn::Set(df8, s);
  const auto vz8 = hn::Set(df8, z);
  for (; c < g_size; c += lanes8) {
    quantize_vector<T, kBits, kAsymmetric>(df8, group + c * kEsize, vs8, vz8, out + c * kBits / 8);
  }
}

// asymmetric_scale() of kernel_steps.hpp for Lanes(dv) groups at once, one
// group per lane, with the same IEEE operations in the same order (each
// intermediate rounded to T by round_to_t, nearbyint as round half to even):
// from lo = min(group, 0) and hi = max(group, 0) to the scale (eps(T) where
// it is zero) and the zero point (0 where the scale is zero).
template <DType T, class DV>
HWY_INLINE void asymmetric_scales(DV dv, const float* lo, const float* hi, float qmin, float qmax,
                                  float* s_out, float* z_out) {
  const auto vlo = hn::Load(dv, lo);
  const auto vhi = hn::Load(dv, hi);
  const auto vqmin = hn::Set(dv, qmin);
  const auto vqmax = hn::Set(dv, qmax);
  auto s = round_to_t<T>(dv, hn::Div(round_to_t<T>(dv, hn::Sub(vhi, vlo)), hn::Sub(vqmax, vqmin)));
  const auto zero_scale = hn::Eq(s, hn::Zero(dv));
  // Lanes with a zero scale divide by zero here; their z is replaced by 0.
  const auto shifted = round_to_t<T>(dv, hn::Sub(vqmin, round_to_t<T>(dv, hn::Div(vlo, s))));
  const auto z = hn::Round(hn::Min(hn::Max(shifted, vqmin), vqmax));
  hn::Store(hn::IfThenZeroElse(zero_scale, z), dv, z_out);
  s = hn::IfThenElse(zero_scale, hn::Set(dv, dtype_eps(T)), s);
  hn::Store(s, dv, s_out);
}

template <DType T, int kBits, bool kAsymmetric>
std::optional<std::uint64_t> quantize_rows(const QuantScheme& scheme, const KernelBlock& block) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  const std::uint64_t n_cols = block.n_cols;
  const std::uint64_t g_size = scheme.effective_group_size(n_cols);
  const std::uint64_t n_groups = n_cols / g_size;
  const std::uint64_t words_per_row = packed_words_per_row(n_cols, kBits);
  const float qmin = static_cast<float>(scheme.qmin());
  const float qmax = static_cast<float>(scheme.qmax());
  const float divisor = (qmax - qmin) / 2.0f;
  // Asymmetric: the scales of up to kBlock groups of a row are computed
  // together (asymmetric_scales), after their minimum and maximum.
  constexpr std::size_t kBlock = 8;
  const hn::CappedTag<float, kBlock> dv;
  const std::size_t block_groups = hn::Lanes(dv);
  HWY_ALIGN float lo[kBlock];
  HWY_ALIGN float hi[kBlock];
  HWY_ALIGN float scales[kBlock];
  HWY_ALIGN float zeros[kBlock];

  for (std::uint64_t r = 0; r < block.n_rows; ++r) {
    const std::byte* row = block.weight + r * n_cols * kEsize;
    auto* out = reinterpret_cast<std::uint8_t*>(block.packed + r * words_per_row);
    std::byte* scale_out = block.scale + r * n_groups * kEsize;
    if constexpr (kAsymmetric) {
      for (std::uint64_t g0 = 0; g0 < n_groups; g0 += block_groups) {
        const std::size_t n =
            static_cast<std::size_t>(std::min<std::uint64_t>(block_groups, n_groups - g0));
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint64_t c0 = (g0 + i) * g_size;
          const std::byte* group = row + c0 * kEsize;
          // lo and hi, and the finite check of the reference.
          if (!min_max_finite<T>(group, g_size, lo[i], hi[i])) {
            return r * n_cols + c0 + first_non_finite(T, group);
          }
        }
        for (std::size_t i = n; i < block_groups; ++i) lo[i] = hi[i] = 0.0f;
        asymmetric_scales<T>(dv, lo, hi, qmin, qmax, scales, zeros);
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint64_t g = g0 + i;
          store_scale(T, scales[i], scale_out + g * kEsize);
          block.zero_point[r * n_groups + g] = static_cast<std::int8_t>(zeros[i]);
          quantize_group<T, kBits, true>(row + g * g_size * kEsize, g_size, scales[i], zeros[i],
                                         out + g * g_size * kBits / 8);
        }
      }
    } else {
      for (std::uint64_t c0 = 0; c0 < n_cols; c0 += g_size) {
        const std::byte* group = row + c0 * kEsize;
        // Steps 1-3 of section 3 (and the finite check of the reference).
        const std::uint32_t max_bits = magnitude_max<T>(group, g_size);
        if (max_bits >= kNonFiniteBits<T>) return r * n_cols + c0 + first_non_finite(T, group);
        const float s = group_scale(T, max_bits, divisor, scale_out + (c0 / g_size) * kEsize);
        quantize_group<T, kBits, false>(group, g_size, s, 0.0f, out + c0 * kBits / 8);
      }
    }
  }
  return std::nullopt;
}

template <DType T>
std::optional<std::uint64_t> quantize_rows_of(const QuantScheme& scheme, const KernelBlock& block) {
  if (scheme.symmetric) {
    return scheme.num_bits == 4 ? quantize_rows<T, 4, false>(scheme, block)
                                : quantize_rows<T, 8, false>(scheme, block);
  }
  return scheme.num_bits == 4 ? quantize_rows<T, 4, true>(scheme, block)
                              : quantize_rows<T, 8, true>(scheme, block);
}

}  // namespace

// The per-level entry point (see simd_dispatch.hpp); simd_supports() holds.
std::optional<std::uint64_t> quantize_int(const QuantScheme& scheme, const KernelBlock& block) {
  switch (block.dtype) {
    case DType::kBF16:
      return quantize_rows_of<DType::kBF16>(scheme, block);
    case DType::kF16:
      return quantize_rows_of<DType::kF16>(scheme, block);
    default:
      return quantize_rows_of<DType::kF32>(scheme, block);
  }
}

// Largest magnitude bits (sign cleared) of n elements of dtype (BF16, F16 or
// F32; the 16-bit types in the low half): max_abs() of kernel.hpp.
std::uint32_t max_magnitude_bits(DType dtype, const std::byte* data, std::uint64_t n) {
  switch (dtype) {
    case DType::kBF16:
      return magnitude_max<DType::kBF16>(data, n);
    case DType::kF16:
      return magnitude_max<DType::kF16>(data, n);
    default:
      return magnitude_max<DType::kF32>(data, n);
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
constexpr SimdEntry<QuantizeSymmetric> kQuantizeSymmetricHwy[] = CTQUANT_SIMD_TABLE(quantize_int);

// What quantize_block() runs at each level for symmetric and asymmetric
// schemes: on x86-64 the hand-written kernels of kernel_x86.cpp (the Highway
// kernel is 1.2x slower there, docs/performance.md), elsewhere the Highway
// kernel.
#if HWY_ARCH_X86_64
constexpr SimdEntry<QuantizeSymmetric> kQuantizeSymmetric[] = {
    {HWY_AVX3, &x86::quantize_symmetric_avx512},
    {HWY_AVX2, &x86::quantize_symmetric_avx2},
    {0, nullptr},
};
constexpr SimdEntry<QuantizeSymmetric> kQuantizeAsymmetric[] = {
    {HWY_AVX3, &x86::quantize_asymmetric_avx512},
    {HWY_AVX2, &x86::quantize_asymmetric_avx2},
    {0, nullptr},
};
#else
constexpr const auto& kQuantizeSymmetric = kQuantizeSymmetricHwy;
constexpr const auto& kQuantizeAsymmetric = kQuantizeSymmetricHwy;
#endif

std::optional<std::uint64_t> run_at(QuantizeSymmetric* fn, const QuantScheme& scheme,
                                    const KernelBlock& block) {
  if (fn == nullptr || !simd_supports(scheme, block)) return quantize_block_ref(scheme, block);
  return fn(scheme, block);
}

}  // namespace

bool simd_available() { return simd_best_level().supported; }

bool simd_supports(const QuantScheme& scheme, const KernelBlock& block) {
  if (!simd_available()) return false;
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
  if (!scheme.symmetric) return run_at(simd_entry(kQuantizeAsymmetric, level), scheme, block);
  return run_at(simd_entry(kQuantizeSymmetric, level), scheme, block);
}

bool simd_hand_written() { return HWY_ARCH_X86_64 != 0; }

using MaxMagnitudeBits = std::uint32_t(DType, const std::byte*, std::uint64_t);
constexpr SimdEntry<MaxMagnitudeBits> kMaxMagnitudeBits[] = CTQUANT_SIMD_TABLE(max_magnitude_bits);

std::optional<std::uint32_t> max_magnitude_bits_simd(DType dtype, const std::byte* data,
                                                     std::uint64_t n) {
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) return std::nullopt;
  static MaxMagnitudeBits* const fn = simd_entry(kMaxMagnitudeBits, simd_best_level());
  if (fn == nullptr) return std::nullopt;
  return fn(dtype, data, n);
}

std::optional<std::uint32_t> max_magnitude_bits_simd_at(const SimdLevel& level, DType dtype,
                                                        const std::byte* data, std::uint64_t n) {
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) return std::nullopt;
  MaxMagnitudeBits* const fn = simd_entry(kMaxMagnitudeBits, level);
  if (fn == nullptr) return std::nullopt;
  return fn(dtype, data, n);
}

std::optional<std::uint64_t> quantize_block_hwy_at(const SimdLevel& level,
                                                   const QuantScheme& scheme,
                                                   const KernelBlock& block) {
  return run_at(simd_entry(kQuantizeSymmetricHwy, level), scheme, block);
}

}  // namespace ctquant::detail
#endif  // HWY_ONCE
