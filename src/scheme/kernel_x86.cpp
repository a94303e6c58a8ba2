// The x86-64 vector kernels behind quantize_block(), written with AVX2 /
// AVX-512 intrinsics: symmetric schemes of 4 or 8 bits, BF16 / F16 / F32
// weights; AVX2 + F16C for group sizes that are multiples of 8, AVX-512 (F,
// BW) for multiples of 16. They run at the avx2 and avx512 levels in place of
// the Highway kernel of kernel_simd.cpp, which is 1.2x slower here
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

// Codes q + 2^(b-1) of eight elements, as int32 lanes.
template <DType T>
CTQUANT_INLINE_AVX2 __m256i quantize8(const std::byte* p, __m256 scale, const QuantConstants& k) {
  __m256 v = round_to_t<T>(_mm256_div_ps(load8<T>(p), scale));
  v = _mm256_min_ps(_mm256_max_ps(v, k.qmin), k.qmax);
  return _mm256_add_epi32(_mm256_cvtps_epi32(v), k.offset);
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

template <DType T, int kBits>
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

  for (std::uint64_t r = 0; r < block.n_rows; ++r) {
    const std::byte* row = block.weight + r * n_cols * kEsize;
    std::uint32_t* out = block.packed + r * words_per_row;
    std::byte* scale_out = block.scale + r * n_groups * kEsize;
    __m256i codes[4];
    int n_codes = 0;
    for (std::uint64_t c0 = 0; c0 < n_cols; c0 += g_size) {
      const std::byte* group = row + c0 * kEsize;
      // Steps 1-3 of section 3 (and the finite check of the reference).
      const std::uint32_t max_bits = magnitude_max<T>(group, g_size);
      if (max_bits >= kNonFiniteBits<T>) return r * n_cols + c0 + first_non_finite(T, group);
      const float s = group_scale(T, max_bits, divisor, scale_out + (c0 / g_size) * kEsize);
      const __m256 vs = _mm256_set1_ps(s);
      // Steps 4-5, eight elements at a time, packed 32 codes at a time.
      if (g_size % 32 == 0) {  // whole blocks of 32 codes (n_codes stays 0)
        for (std::uint64_t c = 0; c < g_size; c += 32) {
          const std::byte* p = group + c * kEsize;
          const __m256i codes32[4] = {quantize8<T>(p, vs, k), quantize8<T>(p + 8 * kEsize, vs, k),
                                      quantize8<T>(p + 16 * kEsize, vs, k),
                                      quantize8<T>(p + 24 * kEsize, vs, k)};
          pack32<kBits>(codes32, out);
          out += kBits;
        }
        continue;
      }
      for (std::uint64_t c = 0; c < g_size; c += 8) {
        codes[n_codes++] = quantize8<T>(group + c * kEsize, vs, k);
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

// Quantizes sixteen elements and stores their 16 * kBits / 32 words.
template <DType T, int kBits>
CTQUANT_INLINE_AVX512 void quantize16(const std::byte* p, __m512 scale, __m512 qmin, __m512 qmax,
                                      std::uint32_t* out) {
  __m512 v = round_to_t_512<T>(_mm512_div_ps(load16<T>(p), scale));
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

template <DType T, int kBits>
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

  for (std::uint64_t r = 0; r < block.n_rows; ++r) {
    const std::byte* row = block.weight + r * n_cols * kEsize;
    std::uint32_t* out = block.packed + r * words_per_row;
    std::byte* scale_out = block.scale + r * n_groups * kEsize;
    for (std::uint64_t c0 = 0; c0 < n_cols; c0 += g_size) {
      const std::byte* group = row + c0 * kEsize;
      const std::uint32_t max_bits = magnitude_max_512<T>(group, g_size);
      if (max_bits >= kNonFiniteBits<T>) return r * n_cols + c0 + first_non_finite(T, group);
      const float s = group_scale(T, max_bits, divisor, scale_out + (c0 / g_size) * kEsize);
      const __m512 vs = _mm512_set1_ps(s);
      for (std::uint64_t c = 0; c < g_size; c += 16) {
        quantize16<T, kBits>(group + c * kEsize, vs, vqmin, vqmax, out);
        out += kBits / 2;  // 16 codes of kBits bits are kBits / 2 words
      }
    }
  }
  return std::nullopt;
}

template <DType T>
std::optional<std::uint64_t> quantize_rows_for(bool avx512, const QuantScheme& scheme,
                                               const KernelBlock& block) {
  const bool wide = avx512 && scheme.effective_group_size(block.n_cols) % 16 == 0;
  if (scheme.num_bits == 4) {
    return wide ? quantize_rows_512<T, 4>(scheme, block) : quantize_rows<T, 4>(scheme, block);
  }
  return wide ? quantize_rows_512<T, 8>(scheme, block) : quantize_rows<T, 8>(scheme, block);
}

std::optional<std::uint64_t> quantize_symmetric(bool avx512, const QuantScheme& scheme,
                                                const KernelBlock& block) {
  switch (block.dtype) {
    case DType::kBF16:
      return quantize_rows_for<DType::kBF16>(avx512, scheme, block);
    case DType::kF16:
      return quantize_rows_for<DType::kF16>(avx512, scheme, block);
    default:
      return quantize_rows_for<DType::kF32>(avx512, scheme, block);
  }
}

}  // namespace

std::optional<std::uint64_t> quantize_symmetric_avx2(const QuantScheme& scheme,
                                                     const KernelBlock& block) {
  return quantize_symmetric(false, scheme, block);
}

std::optional<std::uint64_t> quantize_symmetric_avx512(const QuantScheme& scheme,
                                                       const KernelBlock& block) {
  return quantize_symmetric(true, scheme, block);
}

}  // namespace ctquant::detail::x86

#endif  // __x86_64__
