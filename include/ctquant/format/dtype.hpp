// Element types of the safetensors format and the scalar conversions the
// quantizer needs.
//
// One constexpr trait table (kDTypeTraits) holds every dtype's tag, width in
// bits and whether it is a float type the quantizer accepts; nothing else in
// the library switches over tags. The tags and widths are those of section 1
// of the format spec (docs/format.md).
//
// The conversions below are exact IEEE-754 round-to-nearest-even, including
// subnormals; they never flush to zero. They are the building blocks of the
// scalar reference kernel and are tested bit for bit.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ctquant {

enum class DType : std::uint8_t {
  kBool,
  kU8,
  kI8,
  kF8_E4M3,
  kF8_E5M2,
  kF8_E8M0,
  kF8_E4M3FNUZ,
  kF8_E5M2FNUZ,
  kF4,
  kF6_E2M3,
  kF6_E3M2,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kI64,
  kU64,
  kF64,
};

struct DTypeTraits {
  DType dtype;
  std::string_view tag;  // as written in a safetensors header
  int bits;              // width of one element
  // The dtype's place in the safetensors writer's `Dtype` enum
  // (huggingface/safetensors safetensors/src/tensor.rs, v0.8.0, the version
  // model_free_ptq's stack writes with): the writer lays the tensors of a
  // file out by this, largest first, then by name, so that every tensor's
  // data starts at a multiple of its element size (section 5 of the format
  // spec).
  int writer_order;
};

// Section 1 of the format spec: tags and sizes in bits.
inline constexpr std::array<DTypeTraits, 22> kDTypeTraits = {{
    {DType::kBool, "BOOL", 8, 0},
    {DType::kU8, "U8", 8, 4},
    {DType::kI8, "I8", 8, 5},
    {DType::kF8_E4M3, "F8_E4M3", 8, 7},
    {DType::kF8_E5M2, "F8_E5M2", 8, 6},
    {DType::kF8_E8M0, "F8_E8M0", 8, 8},
    {DType::kF8_E4M3FNUZ, "F8_E4M3FNUZ", 8, 9},
    {DType::kF8_E5M2FNUZ, "F8_E5M2FNUZ", 8, 10},
    {DType::kF4, "F4", 4, 1},
    {DType::kF6_E2M3, "F6_E2M3", 6, 2},
    {DType::kF6_E3M2, "F6_E3M2", 6, 3},
    {DType::kI16, "I16", 16, 11},
    {DType::kU16, "U16", 16, 12},
    {DType::kF16, "F16", 16, 13},
    {DType::kBF16, "BF16", 16, 14},
    {DType::kI32, "I32", 32, 15},
    {DType::kU32, "U32", 32, 16},
    {DType::kF32, "F32", 32, 17},
    {DType::kC64, "C64", 64, 18},
    {DType::kI64, "I64", 64, 20},
    {DType::kU64, "U64", 64, 21},
    {DType::kF64, "F64", 64, 19},
}};

// The table row of dtype (kDTypeTraits is in enum order), its header tag
// ("BF16") and its width in bits (8 for F8_*, 4 for F4, 6 for F6_*).
// Static storage; never throw.
constexpr const DTypeTraits& traits(DType dtype) {
  return kDTypeTraits[static_cast<std::size_t>(dtype)];
}
constexpr std::string_view dtype_tag(DType dtype) { return traits(dtype).tag; }
constexpr int dtype_bits(DType dtype) { return traits(dtype).bits; }
constexpr int dtype_writer_order(DType dtype) { return traits(dtype).writer_order; }

// The dtype for a header tag, or nullopt for an unknown tag.
std::optional<DType> dtype_from_tag(std::string_view tag);

// True for the dtypes a weight may have to be quantized directly (section 2,
// rule 4 of the format spec): BF16, F16, F32.
constexpr bool is_quantizable_float(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32;
}

// ---- scalar conversions (exact, round-to-nearest-even, no flush-to-zero) ----

// BF16 bits -> float: the upper half of an F32, so exact for every value
// (NaN payloads and the sign of zero kept).
constexpr float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// Rounds a float to the nearest BF16 (ties to even). NaN stays NaN (quiet).
constexpr std::uint16_t float_to_bf16(float value) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
}

// FP8 codes -> float, exact (section 6 of the format spec). Every finite FP8
// value, subnormals included, is exactly representable in float (and in
// BF16), so these never round and never flush to zero.
//
// F8_E4M3 is the "fn" variant: 1 sign bit, 4 exponent bits (bias 7), 3
// mantissa bits; exponent 0 holds the subnormals mantissa * 2^-9; there are
// no infinities; 0x7F and 0xFF are NaN; the largest value is 448 (0x7E).
constexpr float f8_e4m3_to_float(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t exponent = (code >> 3) & 0xFu;
  const std::uint32_t mantissa = code & 0x7u;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-9, exact
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | sign);
  }
  if (exponent == 0xF && mantissa == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);
  return std::bit_cast<float>(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// F8_E5M2: 1 sign bit, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like:
// exponent 0 holds the subnormals mantissa * 2^-16, exponent 31 holds the
// infinities (mantissa 0: 0x7C, 0xFC) and NaNs; the largest finite value is
// 57344 (0x7B).
constexpr float f8_e5m2_to_float(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t exponent = (code >> 2) & 0x1Fu;
  const std::uint32_t mantissa = code & 0x3u;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-16, exact
    const float magnitude = static_cast<float>(mantissa) * 0x1p-16f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | sign);
  }
  if (exponent == 0x1F)
    return std::bit_cast<float>(sign | (mantissa == 0 ? 0x7F800000u : 0x7FC00000u));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 21));
}

// True for the FP8 dtypes whose weights ctquant dequantizes (section 6):
// F8_E4M3 and F8_E5M2. (The FNUZ variants and F8_E8M0 are not among them.)
constexpr bool is_dequantizable_fp8(DType dtype) {
  return dtype == DType::kF8_E4M3 || dtype == DType::kF8_E5M2;
}

// True for every 8-bit float dtype tag (F8_*).
constexpr bool is_fp8(DType dtype) {
  return dtype == DType::kF8_E4M3 || dtype == DType::kF8_E5M2 || dtype == DType::kF8_E8M0 ||
         dtype == DType::kF8_E4M3FNUZ || dtype == DType::kF8_E5M2FNUZ;
}

// IEEE binary16 <-> float. Subnormal halves are exact in float; the float to
// half direction rounds to nearest even, produces subnormals and infinities.
float f16_to_float(std::uint16_t bits);
std::uint16_t float_to_f16(float value);

// The float value of one element of a float dtype (BF16, F16, F32, F8_E4M3 or
// F8_E5M2) whose raw little-endian bits are given; used by the scalar
// reference, the FP8 dequantizer's messages and verify. NaN for other dtypes.
float load_as_float(DType dtype, const void* element);

// round_T(x) of section 3 of the format spec: x rounded to the dtype T
// (BF16, F16 or F32) and widened back to float, exactly. Inline, so that a
// kernel's per-group scalar steps with a constant T fold to one rounding.
inline float round_to_dtype(DType dtype, float value) {
  switch (dtype) {
    case DType::kBF16:
      return bf16_to_float(float_to_bf16(value));
    case DType::kF16:
      return f16_to_float(float_to_f16(value));
    default:
      return value;
  }
}

// eps(T) of section 3 step 3: BF16 2^-7, F16 2^-10, F32 2^-23.
float dtype_eps(DType dtype);

}  // namespace ctquant
