// Private: the scalar steps the vector kernels of quantize_block() share with
// each other (section 3 of the format spec, docs/format.md): the group scale from the group's
// largest magnitude, and where the first non-finite weight of a group is.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ctquant/format/dtype.hpp"

namespace ctquant::detail {

// Magnitude bits (sign cleared) at and above which a value of T is NaN or infinite.
template <DType T>
inline constexpr std::uint32_t kNonFiniteBits = T == DType::kF32    ? 0x7F800000u
                                                : T == DType::kBF16 ? 0x7F80u
                                                                    : 0x7C00u;

template <DType T>
inline constexpr std::size_t kElementBytes = T == DType::kF32 ? 4 : 2;

// The value of magnitude bits of t (BF16/F16 bits in the low half).
inline float magnitude_to_float(DType t, std::uint32_t bits) {
  switch (t) {
    case DType::kBF16:
      return bf16_to_float(static_cast<std::uint16_t>(bits));
    case DType::kF16:
      return f16_to_float(static_cast<std::uint16_t>(bits));
    default:
      return std::bit_cast<float>(bits);
  }
}

// Stores a float that is already exactly representable in t.
inline void store_scale(DType t, float s, std::byte* out) {
  if (t == DType::kF32) {
    std::memcpy(out, &s, 4);
    return;
  }
  const std::uint16_t b = t == DType::kBF16 ? float_to_bf16(s) : float_to_f16(s);
  std::memcpy(out, &b, 2);
}

// Steps 2-3 of section 3 from the group's largest magnitude bits, with the
// reference's scalar code (max(|lo|, hi) equals max |w|): stores the scale
// and returns it as a float.
inline float group_scale(DType t, std::uint32_t max_bits, float divisor, std::byte* out) {
  float s = round_to_dtype(t, magnitude_to_float(t, max_bits) / divisor);
  if (s == 0.0f) s = dtype_eps(t);
  store_scale(t, s, out);
  return s;
}

// The asymmetric scale and zero point of section 3 from the group's
// lo = min(min(group), 0) and hi = max(max(group), 0), with the reference's
// scalar code: every intermediate rounded to t, the zero point computed
// before the eps substitution (a zero-range group gets z = 0). Stores the
// scale, returns it as a float and sets z (an integer in [qmin, qmax]).
inline float asymmetric_scale(DType t, float lo, float hi, float qmin, float qmax, float& z,
                              std::byte* out) {
  float s = round_to_dtype(t, round_to_dtype(t, hi - lo) / (qmax - qmin));
  z = 0.0f;
  if (s != 0.0f) {
    const float shifted = round_to_dtype(t, qmin - round_to_dtype(t, lo / s));
    z = std::nearbyint(std::clamp(shifted, qmin, qmax));
  }
  if (s == 0.0f) s = dtype_eps(t);
  store_scale(t, s, out);
  return s;
}

// Index of the first NaN or infinity of a group known to hold one.
inline std::uint64_t first_non_finite(DType t, const std::byte* group) {
  const std::size_t esize = t == DType::kF32 ? 4 : 2;
  std::uint64_t c = 0;
  while (std::isfinite(load_as_float(t, group + c * esize))) ++c;
  return c;
}

}  // namespace ctquant::detail
