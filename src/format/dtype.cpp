#include "ctquant/format/dtype.hpp"

#include <cmath>
#include <cstddef>
#include <cstring>

namespace ctquant {

std::optional<DType> dtype_from_tag(std::string_view tag) {
  for (const DTypeTraits& t : kDTypeTraits) {
    if (t.tag == tag) return t.dtype;
  }
  return std::nullopt;
}

float f16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | sign);
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

std::uint16_t float_to_f16(float value) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7FFFFFFFu;
  if (u >= 0x7F800000u) {  // infinity or NaN (NaN stays quiet NaN)
    return sign | (u > 0x7F800000u ? 0x7E00u : 0x7C00u);
  }
  if (u >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: infinity
  if (u < 0x38800000u) {
    // Below 2^-14: the result is a subnormal half (or zero). Adding 0.5f
    // lines the half's 2^-24 unit up with the last mantissa bit of the float,
    // so the float adder performs the round-to-nearest-even for us.
    const float shifted = std::bit_cast<float>(u) + 0.5f;
    return sign | static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(shifted) - 0x3F000000u);
  }
  // Normal half: rebias the exponent and round the 13 dropped bits to even.
  const std::uint32_t odd = (u >> 13) & 1u;
  u += 0xC8000FFFu + odd;  // (15 - 127) << 23, plus the rounding bias
  return sign | static_cast<std::uint16_t>(u >> 13);
}

float load_as_float(DType dtype, const void* element) {
  switch (dtype) {
    case DType::kBF16: {
      std::uint16_t b;
      std::memcpy(&b, element, 2);
      return bf16_to_float(b);
    }
    case DType::kF16: {
      std::uint16_t b;
      std::memcpy(&b, element, 2);
      return f16_to_float(b);
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, element, 4);
      return f;
    }
    case DType::kF8_E4M3:
      return f8_e4m3_to_float(
          std::to_integer<std::uint8_t>(*static_cast<const std::byte*>(element)));
    case DType::kF8_E5M2:
      return f8_e5m2_to_float(
          std::to_integer<std::uint8_t>(*static_cast<const std::byte*>(element)));
    default:
      return std::nanf("");
  }
}

float dtype_eps(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 0x1p-7f;
    case DType::kF16:
      return 0x1p-10f;
    default:
      return 0x1p-23f;
  }
}

}  // namespace ctquant
