#include "ctquant/scheme/kernel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ctquant/scheme/pack.hpp"
#include "scheme/kernel_simd.hpp"
#include "scheme/kernel_steps.hpp"

namespace ctquant {

namespace {

std::size_t element_bytes(DType dtype) { return static_cast<std::size_t>(dtype_bits(dtype) / 8); }

// Stores a float that is already exactly representable in dtype.
void store_as_dtype(DType dtype, float value, std::byte* out) {
  switch (dtype) {
    case DType::kBF16: {
      const std::uint16_t b = float_to_bf16(value);
      std::memcpy(out, &b, 2);
      break;
    }
    case DType::kF16: {
      const std::uint16_t b = float_to_f16(value);
      std::memcpy(out, &b, 2);
      break;
    }
    default:
      std::memcpy(out, &value, 4);
  }
}

}  // namespace

// Section 3 of the format spec, step by step, one group at a time.
std::optional<std::uint64_t> quantize_block_ref(const QuantScheme& scheme,
                                                const KernelBlock& block) {
  const DType t = block.dtype;
  const std::size_t esize = element_bytes(t);
  const std::uint64_t g_size = scheme.effective_group_size(block.n_cols);
  const std::uint64_t n_groups = block.n_cols / g_size;
  const float qmin = static_cast<float>(scheme.qmin());
  const float qmax = static_cast<float>(scheme.qmax());
  const std::uint64_t words_per_row = packed_words_per_row(block.n_cols, scheme.num_bits);
  std::vector<std::int8_t> codes(block.n_cols);

  for (std::uint64_t r = 0; r < block.n_rows; ++r) {
    const std::byte* row = block.weight + r * block.n_cols * esize;
    for (std::uint64_t g = 0; g < n_groups; ++g) {
      const std::uint64_t c0 = g * g_size;
      // Step 1: lo = min(min(group), 0), hi = max(max(group), 0).
      float lo = 0.0f;
      float hi = 0.0f;
      for (std::uint64_t c = c0; c < c0 + g_size; ++c) {
        const float w = load_as_float(t, row + c * esize);
        if (!std::isfinite(w)) return r * block.n_cols + c;
        lo = std::min(lo, w);
        hi = std::max(hi, w);
      }
      if (block.ranges != nullptr) {
        lo = std::min(block.ranges[2 * (r * n_groups + g)], 0.0f);
        hi = std::max(block.ranges[2 * (r * n_groups + g) + 1], 0.0f);
      }
      float s = 0.0f;
      float z = 0.0f;
      if (scheme.symmetric) {
        // Step 2: s = round_T(float32(a) / ((qmax - qmin) / 2)).
        const float a = std::max(std::fabs(lo), hi);
        s = round_to_dtype(t, a / ((qmax - qmin) / 2.0f));
      } else {
        // Asymmetric: every intermediate rounded to T, zero point computed
        // before the eps substitution; a zero-range group gets z = 0.
        s = round_to_dtype(t, round_to_dtype(t, hi - lo) / (qmax - qmin));
        if (s != 0.0f) {
          const float shifted = round_to_dtype(t, qmin - round_to_dtype(t, lo / s));
          z = std::nearbyint(std::clamp(shifted, qmin, qmax));
        }
      }
      // Step 3: a zero scale becomes eps(T).
      if (s == 0.0f) s = dtype_eps(t);
      // Steps 4-5: v = round_T(w / s) (+ z, rounded to T), clamp, round half to even.
      for (std::uint64_t c = c0; c < c0 + g_size; ++c) {
        const float w = load_as_float(t, row + c * esize);
        float v = round_to_dtype(t, w / s);
        if (!scheme.symmetric) v = round_to_dtype(t, v + z);
        codes[c] = static_cast<std::int8_t>(std::nearbyint(std::clamp(v, qmin, qmax)));
      }
      store_as_dtype(t, s, block.scale + (r * n_groups + g) * esize);
      if (!scheme.symmetric) block.zero_point[r * n_groups + g] = static_cast<std::int8_t>(z);
    }
    pack_codes(codes, scheme.num_bits,
               std::span<std::uint32_t>(block.packed + r * words_per_row, words_per_row));
  }
  return std::nullopt;
}

std::optional<std::uint64_t> quantize_block(const QuantScheme& scheme, const KernelBlock& block) {
  if (block.ranges == nullptr && detail::simd_supports(scheme, block)) return detail::quantize_block_simd(scheme, block);
  return quantize_block_ref(scheme, block);
}

const char* kernel_path_name() { return detail::simd_best_level().name; }

}  // namespace ctquant

namespace ctquant {

std::optional<std::uint64_t> max_abs(DType dtype, const std::byte* data, std::uint64_t n,
                                     float& amax) {
  if (const auto bits = detail::max_magnitude_bits_simd(dtype, data, n)) {
    // The largest magnitude of the raw bits is max |w| exactly (the integer
    // order of non-negative IEEE values is their numeric order; -0 is 0).
    const std::uint32_t non_finite = dtype == DType::kF32    ? 0x7F800000u
                                     : dtype == DType::kBF16 ? 0x7F80u
                                                             : 0x7C00u;
    if (*bits >= non_finite) return detail::first_non_finite(dtype, data);
    amax = detail::magnitude_to_float(dtype, *bits);
    return std::nullopt;
  }
  return max_abs_ref(dtype, data, n, amax);
}

std::optional<std::uint64_t> max_abs_ref(DType dtype, const std::byte* data, std::uint64_t n,
                                         float& amax) {
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(dtype) / 8);
  float m = 0.0f;
  for (std::uint64_t i = 0; i < n; ++i) {
    const float w = load_as_float(dtype, data + i * esize);
    if (!std::isfinite(w)) return i;
    m = std::max(m, std::fabs(w));
  }
  amax = m;
  return std::nullopt;
}

}  // namespace ctquant
