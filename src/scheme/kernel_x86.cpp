// The x86-64 vector kernels behind quantize_block(), written with AVX2 /
// AVX-512 intrinsics: symmetric and asymmetric schemes of 4 or 8 bits, BF16 /
// F16 / F32 weights; AVX2 + F16C for group sizes that are multiples of 8,
// AVX-512 (F, BW) for multiples of 16. They run at the avx2 and avx512 levels
// in place of the Highway kernel of kernel_simd.cpp, which is 1.2x slower here
// (docs/performance.md, "Kernel").
//
// It follows section 3 of the format spec step for step with the same IEEE
// operations as quantize_block_ref(), eight elements at a time, so the bytes
// are the same:
// - the group's absolute maximum is taken on the raw bits with the sign bit
//   cleared (for non-negative IEEE values the integer order is the numeric
//   order), which also finds NaN and infinities: their magnitude bits are
//   the largest; max(|lo|, hi) of the spec equals max |w| (both +0 for an
//   all-zero group);
// - the scale is computed with the same scalar code as the reference;
// - w / s is one correctly rounded vdivps (as divss in the reference), then
//   rounded to T: BF16 with the integer round-to-nearest-even the reference
//   uses, F16 with vcvtps2ph (round to nearest even, subnormals kept), F32
//   as is;
// - clamp with vmaxps/vminps (v is finite, so they agree with std::clamp),
//   round half to even with vcvtps2dq (the default rounding mode, as
//   std::nearbyint), offset, pack.
// Asymmetric schemes: the group's minimum and maximum (with 0) are found on
// the raw bits, as integers in the order of the values (the magnitude bits
// of negative values inverted), which also finds NaN and infinities (the
// extreme keys); the scales and zero points of 8 groups of a row are one
// vector step with the operations of asymmetric_scale() in its order (each
// intermediate rounded to T), as the Highway kernel does; each code is
// round_T(round_T(w / s) + z), clamped, rounded to an integer.
// The AVX-512 code does the same sixteen elements at a time and packs with
// vpmovdb / vpmovqb. Both are compiled with function target attributes and
// chosen at run time (kernel_simd.cpp), so the library still runs on CPUs
// without them.
#include "scheme/kernel_x86.hpp"

#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_*(),
// which -Wmaybe-uninitialized reports at every use; the values are fully
// written before they are read. (Clang has no such warning, nor the group.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "ctquant/format/dtype.hpp"
#include "scheme/kernel_steps.hpp"

namespace ctquant::detail::x86 {

namespace {

#define CTQUANT_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define CTQUANT_INLINE_AVX2 __attribute__((target("avx2,f16c"), always_inline)) inline

CTQUANT_INLINE_AVX2 std::uint32_t horizontal_max_u16(__m256i v, __m128i more) {
  __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu16(m, more);
  // minpos finds the smallest u16; on inverted values that is the largest.
  const __m128i ones = _mm_set1_epi32(-1);
  m = _mm_minpos_epu16(_mm_xor_si128(m, ones));
  return 0xFFFFu - static_cast<std::uint32_t>(_mm_extract_epi16(m, 0));
}

CTQUANT_INLINE_AVX2 std::uint32_t horizontal_max_u32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return static_cast<std::uint32_t>(_mm_cvtsi128_si32(m));
}

// Largest magnitude bits (sign cleared) of n elements, n a multiple of 8.
template <DType T>
CTQUANT_INLINE_AVX2 std::uint32_t magnitude_max(const std::byte* p, std::uint64_t n) {
  if constexpr (T == DType::kF32) {
    const __m256i mask = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m0 = _mm256_setzero_si256();
    __m256i m1 = _mm256_setzero_si256();
    std::uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4 * i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4 * i + 32));
      m0 = _mm256_max_epu32(m0, _mm256_and_si256(a, mask));
      m1 = _mm256_max_epu32(m1, _mm256_and_si256(b, mask));
    }
    if (i < n) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4 * i));
      m0 = _mm256_max_epu32(m0, _mm256_and_si256(a, mask));
    }
    return horizontal_max_u32(_mm256_max_epu32(m0, m1));
  } else {
    const __m256i mask = _mm256_set1_epi16(0x7FFF);
    __m256i m0 = _mm256_setzero_si256();
    __m256i m1 = _mm256_setzero_si256();
    std::uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i + 32));
      m0 = _mm256_max_epu16(m0, _mm256_and_si256(a, mask));
      m1 = _mm256_max_epu16(m1, _mm256_and_si256(b, mask));
    }
    for (; i + 16 <= n; i += 16) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i));
      m0 = _mm256_max_epu16(m0, _mm256_and_si256(a, mask));
    }
    __m128i tail = _mm_setzero_si128();
    if (i < n) {  // 8 left
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
      tail = _mm_and_si128(a, _mm256_castsi256_si128(mask));
    }
    return horizontal_max_u16(_mm256_max_epu16(m0, m1), tail);
  }
}

// Eight elements widened to float, exactly.
template <DType T>
CTQUANT_INLINE_AVX2 __m256 load8(const std::byte* p) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (T == DType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
}

// round_T of section 3 for finite values: round to T (nearest even), widen.
template <DType T>
CTQUANT_INLINE_AVX2 __m256 round_to_t(__m256 v) {
  if constexpr (T == DType::kF32) {
    return v;
  } else if constexpr (T == DType::kF16) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    // As float_to_bf16: add 0x7FFF plus the lowest kept bit, drop 16 bits.
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i biased = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    return _mm256_castsi256_ps(_mm256_and_si256(biased, _mm256_set1_epi32(-65536)));
  }
}

struct QuantConstants {
  __m256 qmin;
  __m256 qmax;
  __m256i offset;
};

// Codes q + 2^(b-1) of eight elements, as int32 lanes; asymmetric: the
// zero point added to w / s, rounded to T again.
template <DType T, bool kAsymmetric>
CTQUANT_INLINE_AVX2 __m256i quantize8(const std::byte* p, __m256 scale, __m256 zero,
                                      const QuantConstants& k) {
  __m256 v = round_to_t<T>(_mm256_div_ps(load8<T>(p), scale));
  if constexpr (kAsymmetric) v = round_to_t<T>(_mm256_add_ps(v, zero));
  v = _mm256_min_ps(_mm256_max_ps(v, k.qmin), k.qmax);
  return _mm256_add_epi32(_mm256_cvtps_epi32(v), k.offset);
}

// ---- asymmetric groups: minimum, maximum, scales and zero points ----

// The raw lanes of T as signed integers in the order of the values they
// encode (the magnitude bits of negative values inverted: key(-m) = ~m).
template <DType T>
using KeyLane = std::conditional_t<T == DType::kF32, std::int32_t, std::int16_t>;

// The element of dtype T whose order key is k, as a float.
template <DType T>
inline float key_to_float(KeyLane<T> k) {
  constexpr KeyLane<T> kMagnitude = std::numeric_limits<KeyLane<T>>::max();
  const KeyLane<T> raw = k < 0 ? static_cast<KeyLane<T>>(k ^ kMagnitude) : k;
  return load_as_float(T, &raw);
}

// Smallest and largest of eight signed 16-bit lanes (minpos works on
// unsigned lanes: biasing by 0x8000 turns signed order into unsigned order).
CTQUANT_INLINE_AVX2 void min_max_i16(__m128i lo, __m128i hi, std::int16_t& min, std::int16_t& max) {
  const __m128i bias = _mm_set1_epi16(static_cast<short>(0x8000));
  const __m128i invert = _mm_set1_epi16(0x7FFF);  // bias, then complement: max becomes min
  min = static_cast<std::int16_t>(
      _mm_extract_epi16(_mm_minpos_epu16(_mm_xor_si128(lo, bias)), 0) ^ 0x8000);
  max = static_cast<std::int16_t>(
      _mm_extract_epi16(_mm_minpos_epu16(_mm_xor_si128(hi, invert)), 0) ^ 0x7FFF);
}

CTQUANT_INLINE_AVX2 void min_max_i32(__m256i lo, __m256i hi, std::int32_t& min, std::int32_t& max) {
  __m128i l = _mm_min_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
  __m128i h = _mm_max_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  l = _mm_min_epi32(l, _mm_shuffle_epi32(l, 0x4E));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  l = _mm_min_epi32(l, _mm_shuffle_epi32(l, 0xB1));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xB1));
  min = _mm_cvtsi128_si32(l);
  max = _mm_cvtsi128_si32(h);
}

// Whether the smallest (klo) and largest (khi) keys of a group leave out NaN
// and infinities, whose keys are the extremes; then lo and hi as floats.
template <DType T>
inline bool finite_keys(KeyLane<T> klo, KeyLane<T> khi, float& lo, float& hi) {
  constexpr auto kInfinity = static_cast<KeyLane<T>>(kNonFiniteBits<T>);
  if (khi >= kInfinity || klo <= static_cast<KeyLane<T>>(~kInfinity)) return false;
  lo = key_to_float<T>(klo);
  hi = key_to_float<T>(khi);
  return true;
}

// lo = min(min of the n elements at p, 0), hi = max(max of them, 0) as
// floats (either zero may come out as -0 or +0), n a multiple of 8, with
// the finite check of the reference: false when one of them is NaN or
// infinite.
template <DType T>
CTQUANT_INLINE_AVX2 bool min_max_finite(const std::byte* p, std::uint64_t n, float& lo, float& hi) {
  if constexpr (T == DType::kF32) {
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i vlo = _mm256_setzero_si256();  // key(+0) = 0
    __m256i vhi = _mm256_setzero_si256();
    for (std::uint64_t i = 0; i < n; i += 8) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4 * i));
      const __m256i key = _mm256_xor_si256(raw, _mm256_and_si256(_mm256_srai_epi32(raw, 31), magnitude));
      vlo = _mm256_min_epi32(vlo, key);
      vhi = _mm256_max_epi32(vhi, key);
    }
    std::int32_t klo = 0;
    std::int32_t khi = 0;
    min_max_i32(vlo, vhi, klo, khi);
    return finite_keys<T>(klo, khi, lo, hi);
  } else {
    const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
    __m256i vlo = _mm256_setzero_si256();
    __m256i vhi = _mm256_setzero_si256();
    std::uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i));
      const __m256i key = _mm256_xor_si256(raw, _mm256_and_si256(_mm256_srai_epi16(raw, 15), magnitude));
      vlo = _mm256_min_epi16(vlo, key);
      vhi = _mm256_max_epi16(vhi, key);
    }
    __m128i lo8 = _mm_min_epi16(_mm256_castsi256_si128(vlo), _mm256_extracti128_si256(vlo, 1));
    __m128i hi8 = _mm_max_epi16(_mm256_castsi256_si128(vhi), _mm256_extracti128_si256(vhi, 1));
    if (i < n) {  // 8 left
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
      const __m128i key = _mm_xor_si128(
          raw, _mm_and_si128(_mm_srai_epi16(raw, 15), _mm256_castsi256_si128(magnitude)));
      lo8 = _mm_min_epi16(lo8, key);
      hi8 = _mm_max_epi16(hi8, key);
    }
    std::int16_t klo = 0;
    std::int16_t khi = 0;
    min_max_i16(lo8, hi8, klo, khi);
    return finite_keys<T>(klo, khi, lo, hi);
  }
}

// asymmetric_scale() of kernel_steps.hpp for 8 groups at once, one group
// per lane, with its operations in its order: from lo and hi to the scale
// (eps(T) where it is zero) and the zero point (0 where the scale is zero;
// those lanes divide by zero first, and their results are replaced).
template <DType T>
CTQUANT_INLINE_AVX2 void asymmetric_scales8(const float* lo, const float* hi, float qmin,
                                            float qmax, float* s_out, float* z_out) {
  const __m256 vlo = _mm256_load_ps(lo);
  const __m256 vqmin = _mm256_set1_ps(qmin);
  const __m256 vqmax = _mm256_set1_ps(qmax);
  __m256 s = round_to_t<T>(_mm256_div_ps(round_to_t<T>(_mm256_sub_ps(_mm256_load_ps(hi), vlo)),
                                         _mm256_sub_ps(vqmax, vqmin)));
  const __m256 zero_scale = _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_EQ_OQ);
  const __m256 shifted = round_to_t<T>(_mm256_sub_ps(vqmin, round_to_t<T>(_mm256_div_ps(vlo, s))));
  const __m256 z = _mm256_round_ps(_mm256_min_ps(_mm256_max_ps(shifted, vqmin), vqmax),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_store_ps(z_out, _mm256_andnot_ps(zero_scale, z));
  _mm256_store_ps(s_out, _mm256_blendv_ps(s, _mm256_set1_ps(dtype_eps(T)), zero_scale));
}

// Steps 1-3 of groups [g0, g0 + n) of a row (n <= 8) given their lo and hi
// (lanes past n zero): s[i] and z[i], and the scales and zero points stored.
template <DType T>
CTQUANT_INLINE_AVX2 void store_asymmetric_block(const float* lo, const float* hi, std::uint64_t g0,
                                                std::size_t n, float qmin, float qmax,
                                                std::byte* scale_out, std::int8_t* zero_out,
                                                float* s, float* z) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  asymmetric_scales8<T>(lo, hi, qmin, qmax, s, z);
  for (std::size_t i = 0; i < n; ++i) {
    store_scale(T, s[i], scale_out + (g0 + i) * kEsize);
    zero_out[g0 + i] = static_cast<std::int8_t>(z[i]);
  }
}

// Packs 32 offset codes (four vectors of eight, in column order) into
// 32 * bits / 32 words: 4 words for 4 bits, 8 for 8 bits (section 4).
template <int kBits>
CTQUANT_INLINE_AVX2 void pack32(const __m256i* c, std::uint32_t* out) {
  const __m256i w16a = _mm256_packs_epi32(c[0], c[1]);
  const __m256i w16b = _mm256_packs_epi32(c[2], c[3]);
  // packs work within 128-bit lanes; this puts the 4-byte runs back in order.
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w16a, w16b),
                                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if constexpr (kBits == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes);
  } else {
    // Byte pairs (even, odd) -> even | odd << 4: column 8j+k lands in bits 4k.
    const __m256i nibbles = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(0x1001));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(nibbles, nibbles), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  }
}

// Fewer than 32 offset codes (a multiple of 8) into their words.
template <int kBits>
CTQUANT_INLINE_AVX2 void pack_tail(const __m256i* c, int n_vectors, std::uint32_t* out) {
  alignas(32) std::uint32_t codes[24];
  for (int i = 0; i < n_vectors; ++i) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 8 * i), c[i]);
  }
  constexpr int kPerWord = 32 / kBits;
  for (int w = 0; w < n_vectors * 8 / kPerWord; ++w) {
    std::uint32_t word = 0;
    for (int i = 0; i < kPerWord; ++i) word |= codes[w * kPerWord + i] << (kBits * i);
    out[w] = word;
  }
}

template <DType T, int kBits, bool kAsymmetric>
CTQUANT_TARGET_AVX2 std::optional<std::uint64_t> quantize_rows(const QuantScheme& scheme,
                                                               const KernelBlock& block) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  const std::uint64_t n_cols = block.n_cols;
  const std::uint64_t g_size = scheme.effective_group_size(n_cols);
  const std::uint64_t n_groups = n_cols / g_size;
  const std::uint64_t words_per_row = packed_words_per_row(n_cols, kBits);
  const float qmin = static_cast<float>(scheme.qmin());
  const float qmax = static_cast<float>(scheme.qmax());
  const float divisor = (qmax - qmin) / 2.0f;
  const QuantConstants k{_mm256_set1_ps(qmin), _mm256_set1_ps(qmax),
                         _mm256_set1_epi32(1 << (kBits - 1))};
  alignas(32) float scales[8];
  alignas(32) float zeros[8];

  for (std::uint64_t r = 0; r < block.n_rows; ++r) {
    const std::byte* row = block.weight + r * n_cols * kEsize;
    std::uint32_t* out = block.packed + r * words_per_row;
    std::byte* scale_out = block.scale + r * n_groups * kEsize;
    __m256i codes[4];
    int n_codes = 0;
    for (std::uint64_t g = 0; g < n_groups; ++g) {
      const std::uint64_t c0 = g * g_size;
      const std::byte* group = row + c0 * kEsize;
      __m256 vs;
      __m256 vz = _mm256_setzero_ps();
      if constexpr (kAsymmetric) {
        // Steps 1-3 of 8 groups at a time (and the finite check).
        if (g % 8 == 0) {
          const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(8, n_groups - g));
          alignas(32) float lo[8] = {};
          alignas(32) float hi[8] = {};
          for (std::size_t i = 0; i < n; ++i) {
            const std::byte* gi = row + (g + i) * g_size * kEsize;
            if (!min_max_finite<T>(gi, g_size, lo[i], hi[i])) {
              return r * n_cols + (g + i) * g_size + first_non_finite(T, gi);
            }
          }
          store_asymmetric_block<T>(lo, hi, g, n, qmin, qmax, scale_out,
                                    block.zero_point + r * n_groups, scales, zeros);
        }
        vs = _mm256_set1_ps(scales[g % 8]);
        vz = _mm256_set1_ps(zeros[g % 8]);
      } else {
        // Steps 1-3 of section 3 (and the finite check of the reference).
        const std::uint32_t max_bits = magnitude_max<T>(group, g_size);
        if (max_bits >= kNonFiniteBits<T>) return r * n_cols + c0 + first_non_finite(T, group);
        vs = _mm256_set1_ps(group_scale(T, max_bits, divisor, scale_out + g * kEsize));
      }
      // Steps 4-5, eight elements at a time, packed 32 codes at a time.
      if (g_size % 32 == 0) {  // whole blocks of 32 codes (n_codes stays 0)
        for (std::uint64_t c = 0; c < g_size; c += 32) {
          const std::byte* p = group + c * kEsize;
          const __m256i codes32[4] = {quantize8<T, kAsymmetric>(p, vs, vz, k),
                                      quantize8<T, kAsymmetric>(p + 8 * kEsize, vs, vz, k),
                                      quantize8<T, kAsymmetric>(p + 16 * kEsize, vs, vz, k),
                                      quantize8<T, kAsymmetric>(p + 24 * kEsize, vs, vz, k)};
          pack32<kBits>(codes32, out);
          out += kBits;
        }
        continue;
      }
      for (std::uint64_t c = 0; c < g_size; c += 8) {
        codes[n_codes++] = quantize8<T, kAsymmetric>(group + c * kEsize, vs, vz, k);
        if (n_codes == 4) {
          pack32<kBits>(codes, out);
          out += kBits;  // 32 codes of kBits bits are kBits words
          n_codes = 0;
        }
      }
    }
    if (n_codes > 0) pack_tail<kBits>(codes, n_codes, out);
  }
  return std::nullopt;
}

// ---- AVX-512 (F + BW): the same steps, sixteen elements at a time ----

#define CTQUANT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx2,f16c")))
#define CTQUANT_INLINE_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx2,f16c"), always_inline)) inline

// Largest magnitude bits (sign cleared) of n elements, n a multiple of 16.
template <DType T>
CTQUANT_INLINE_AVX512 std::uint32_t magnitude_max_512(const std::byte* p, std::uint64_t n) {
  if constexpr (T == DType::kF32) {
    const __m512i mask = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i m = _mm512_setzero_si512();
    for (std::uint64_t i = 0; i < n; i += 16) {
      m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(p + 4 * i), mask));
    }
    return _mm512_reduce_max_epu32(m);
  } else {
    const __m512i mask = _mm512_set1_epi16(0x7FFF);
    __m512i m = _mm512_setzero_si512();
    std::uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_loadu_si512(p + 2 * i), mask));
    }
    if (i < n) {  // 16 left
      m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_maskz_loadu_epi16(0xFFFF, p + 2 * i), mask));
    }
    return horizontal_max_u16(
        _mm256_max_epu16(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1)),
        _mm_setzero_si128());
  }
}

template <DType T>
CTQUANT_INLINE_AVX512 __m512 load16(const std::byte* p) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (T == DType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
}

template <DType T>
CTQUANT_INLINE_AVX512 __m512 round_to_t_512(__m512 v) {
  if constexpr (T == DType::kF32) {
    return v;
  } else if constexpr (T == DType::kF16) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i biased = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    return _mm512_castsi512_ps(_mm512_and_si512(biased, _mm512_set1_epi32(-65536)));
  }
}

// min_max_finite() for n a multiple of 16, 32 16-bit (16 32-bit) keys at a time.
template <DType T>
CTQUANT_INLINE_AVX512 bool min_max_finite_512(const std::byte* p, std::uint64_t n, float& lo,
                                              float& hi) {
  if constexpr (T == DType::kF32) {
    const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i vlo = _mm512_setzero_si512();  // key(+0) = 0
    __m512i vhi = _mm512_setzero_si512();
    for (std::uint64_t i = 0; i < n; i += 16) {
      const __m512i raw = _mm512_loadu_si512(p + 4 * i);
      const __m512i key = _mm512_xor_si512(raw, _mm512_and_si512(_mm512_srai_epi32(raw, 31), magnitude));
      vlo = _mm512_min_epi32(vlo, key);
      vhi = _mm512_max_epi32(vhi, key);
    }
    return finite_keys<T>(_mm512_reduce_min_epi32(vlo), _mm512_reduce_max_epi32(vhi), lo, hi);
  } else {
    const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
    __m512i vlo = _mm512_setzero_si512();
    __m512i vhi = _mm512_setzero_si512();
    std::uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512i raw = _mm512_loadu_si512(p + 2 * i);
      const __m512i key = _mm512_xor_si512(raw, _mm512_and_si512(_mm512_srai_epi16(raw, 15), magnitude));
      vlo = _mm512_min_epi16(vlo, key);
      vhi = _mm512_max_epi16(vhi, key);
    }
    __m256i lo16 = _mm256_min_epi16(_mm512_castsi512_si256(vlo), _mm512_extracti64x4_epi64(vlo, 1));
    __m256i hi16 = _mm256_max_epi16(_mm512_castsi512_si256(vhi), _mm512_extracti64x4_epi64(vhi, 1));
    if (i < n) {  // 16 left
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i));
      const __m256i key = _mm256_xor_si256(
          raw, _mm256_and_si256(_mm256_srai_epi16(raw, 15), _mm512_castsi512_si256(magnitude)));
      lo16 = _mm256_min_epi16(lo16, key);
      hi16 = _mm256_max_epi16(hi16, key);
    }
    std::int16_t klo = 0;
    std::int16_t khi = 0;
    min_max_i16(_mm_min_epi16(_mm256_castsi256_si128(lo16), _mm256_extracti128_si256(lo16, 1)),
                _mm_max_epi16(_mm256_castsi256_si128(hi16), _mm256_extracti128_si256(hi16, 1)),
                klo, khi);
    return finite_keys<T>(klo, khi, lo, hi);
  }
}

// Quantizes sixteen elements and stores their 16 * kBits / 32 words;
// asymmetric: the zero point added to w / s, rounded to T again.
template <DType T, int kBits, bool kAsymmetric>
CTQUANT_INLINE_AVX512 void quantize16(const std::byte* p, __m512 scale, __m512 zero, __m512 qmin,
                                      __m512 qmax, std::uint32_t* out) {
  __m512 v = round_to_t_512<T>(_mm512_div_ps(load16<T>(p), scale));
  if constexpr (kAsymmetric) v = round_to_t_512<T>(_mm512_add_ps(v, zero));
  v = _mm512_min_ps(_mm512_max_ps(v, qmin), qmax);
  const __m512i codes =
      _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(1 << (kBits - 1)));
  if constexpr (kBits == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(codes));
  } else {
    // Each 64-bit lane holds columns 2i (low) and 2i+1 (high); bring the
    // high code down to bits 4-7, then keep the low byte of every lane.
    const __m512i pairs = _mm512_or_si512(codes, _mm512_srli_epi64(codes, 28));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm512_cvtepi64_epi8(pairs));
  }
}

template <DType T, int kBits, bool kAsymmetric>
CTQUANT_TARGET_AVX512 std::optional<std::uint64_t> quantize_rows_512(const QuantScheme& scheme,
                                                                     const KernelBlock& block) {
  constexpr std::size_t kEsize = kElementBytes<T>;
  const std::uint64_t n_cols = block.n_cols;
  const std::uint64_t g_size = scheme.effective_group_size(n_cols);
  const std::uint64_t n_groups = n_cols / g_size;
  const std::uint64_t words_per_row = packed_words_per_row(n_cols, kBits);
  const float qmin = static_cast<float>(scheme.qmin());
  const float qmax = static_cast<float>(scheme.qmax());
  const float divisor = (qmax - qmin) / 2.0f;
  const __m512 vqmin = _mm512_set1_ps(qmin);
  const __m512 vqmax = _mm512_set1_ps(qmax);
  alignas(32) float scales[8];
  alignas(32) float zeros[8];

  for (std::uint64_t r = 0; r < block.n_rows; ++r) {
    const std::byte* row = block.weight + r * n_cols * kEsize;
    std::uint32_t* out = block.packed + r * words_per_row;
    std::byte* scale_out = block.scale + r * n_groups * kEsize;
    for (std::uint64_t g = 0; g < n_groups; ++g) {
      const std::byte* group = row + g * g_size * kEsize;
      __m512 vs;
      __m512 vz = _mm512_setzero_ps();
      if constexpr (kAsymmetric) {
        if (g % 8 == 0) {
          const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(8, n_groups - g));
          alignas(32) float lo[8] = {};
          alignas(32) float hi[8] = {};
          for (std::size_t i = 0; i < n; ++i) {
            const std::byte* gi = row + (g + i) * g_size * kEsize;
            if (!min_max_finite_512<T>(gi, g_size, lo[i], hi[i])) {
              return r * n_cols + (g + i) * g_size + first_non_finite(T, gi);
            }
          }
          store_asymmetric_block<T>(lo, hi, g, n, qmin, qmax, scale_out,
                                    block.zero_point + r * n_groups, scales, zeros);
        }
        vs = _mm512_set1_ps(scales[g % 8]);
        vz = _mm512_set1_ps(zeros[g % 8]);
      } else {
        const std::uint32_t max_bits = magnitude_max_512<T>(group, g_size);
        if (max_bits >= kNonFiniteBits<T>) {
          return r * n_cols + g * g_size + first_non_finite(T, group);
        }
        vs = _mm512_set1_ps(group_scale(T, max_bits, divisor, scale_out + g * kEsize));
      }
      for (std::uint64_t c = 0; c < g_size; c += 16) {
        quantize16<T, kBits, kAsymmetric>(group + c * kEsize, vs, vz, vqmin, vqmax, out);
        out += kBits / 2;  // 16 codes of kBits bits are kBits / 2 words
      }
    }
  }
  return std::nullopt;
}

template <DType T, bool kAsymmetric>
std::optional<std::uint64_t> quantize_rows_for(bool avx512, const QuantScheme& scheme,
                                               const KernelBlock& block) {
  const bool wide = avx512 && scheme.effective_group_size(block.n_cols) % 16 == 0;
  if (scheme.num_bits == 4) {
    return wide ? quantize_rows_512<T, 4, kAsymmetric>(scheme, block)
                : quantize_rows<T, 4, kAsymmetric>(scheme, block);
  }
  return wide ? quantize_rows_512<T, 8, kAsymmetric>(scheme, block)
              : quantize_rows<T, 8, kAsymmetric>(scheme, block);
}

template <bool kAsymmetric>
std::optional<std::uint64_t> quantize_int(bool avx512, const QuantScheme& scheme,
                                          const KernelBlock& block) {
  switch (block.dtype) {
    case DType::kBF16:
      return quantize_rows_for<DType::kBF16, kAsymmetric>(avx512, scheme, block);
    case DType::kF16:
      return quantize_rows_for<DType::kF16, kAsymmetric>(avx512, scheme, block);
    default:
      return quantize_rows_for<DType::kF32, kAsymmetric>(avx512, scheme, block);
  }
}

}  // namespace

std::optional<std::uint64_t> quantize_symmetric_avx2(const QuantScheme& scheme,
                                                     const KernelBlock& block) {
  return quantize_int<false>(false, scheme, block);
}

std::optional<std::uint64_t> quantize_symmetric_avx512(const QuantScheme& scheme,
                                                       const KernelBlock& block) {
  return quantize_int<false>(true, scheme, block);
}

std::optional<std::uint64_t> quantize_asymmetric_avx2(const QuantScheme& scheme,
                                                      const KernelBlock& block) {
  return quantize_int<true>(false, scheme, block);
}

std::optional<std::uint64_t> quantize_asymmetric_avx512(const QuantScheme& scheme,
                                                        const KernelBlock& block) {
  return quantize_int<true>(true, scheme, block);
}

}  // namespace ctquant::detail::x86

#endif  // __x86_64__
