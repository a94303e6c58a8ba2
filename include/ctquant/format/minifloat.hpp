// Encoders and decoders of the small float formats the microscale schemes
// write: FP4 E2M1 codes (NVFP4, MXFP4 weights), FP8 E4M3 codes (NVFP4 group
// scales, MXFP8 weights) and E8M0 exponents (MX group scales).
//
// Every encoder rounds exactly as the PyTorch operation compressed-tensors
// uses (docs/schemes.md section 2): they are the scalar building
// blocks of the reference kernels in src/scheme/ and are tested bit for bit,
// over every code and at every rounding threshold.
#pragma once

#include <bit>
#include <cstdint>

namespace ctquant {

// ---- FP4 E2M1 (schemes.md 2.2, 2.3) ----

// The magnitudes of the eight E2M1 codes 0..7; code | 8 is the negative.
inline constexpr float kE2M1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// The 4-bit code of v as compressed-tensors' eager `cast_to_fp4` rounds it
// and `pack_fp4_to_uint8` encodes it (compressed-tensors
// `quantization/utils/fp4_utils.py`, `compressors/nvfp4/helpers.py`):
// |v| is rounded to nearest on the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} with
// ties to even (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
// 3.5 -> 4, 5 -> 4) and everything above 5 becomes 6, so the caller's clamp
// to [-6, 6] is implied. The sign bit (8) is set exactly when v < 0:
// `cast_to_fp4` multiplies by torch.sign(v), which is 0 for -0.0, so a
// negative value that rounds to 0 is -0.0 (code 8) while -0.0 itself gives
// +0.0 (code 0). NaN gives an unspecified code.
constexpr std::uint8_t e2m1_code(float v) {
  const float a = v < 0.0f ? -v : v;
  std::uint8_t code = 7;
  if (a <= 0.25f) {
    code = 0;
  } else if (a < 0.75f) {
    code = 1;
  } else if (a <= 1.25f) {
    code = 2;
  } else if (a < 1.75f) {
    code = 3;
  } else if (a <= 2.5f) {
    code = 4;
  } else if (a < 3.5f) {
    code = 5;
  } else if (a <= 5.0f) {
    code = 6;
  }
  return static_cast<std::uint8_t>(code | (v < 0.0f ? 8u : 0u));
}

// The value of a 4-bit E2M1 code (only the low 4 bits are read): -0.0 for 8.
constexpr float e2m1_to_float(std::uint8_t code) {
  const float magnitude = kE2M1Values[code & 7u];
  return (code & 8u) != 0 ? -magnitude : magnitude;
}

// ---- FP8 E4M3 ("fn", schemes.md 2.1) ----

// The F8_E4M3 code of v clamped to [-448, 448] first, as compressed-tensors
// does before every cast to float8_e4m3fn (`round_to_quantized_type_args`,
// `round_to_quantized_type_dtype` in compressed-tensors
// `quantization/quant_args.py`), then rounded to nearest even like PyTorch's
// cast (c10 `fp8e4m3fn_from_fp32_value`): subnormals k * 2^-9, ties to even
// (1.0625 -> 1.0, 232 -> 224, 2^-10 -> 0). The sign is kept for zero: -0.0
// and every negative value that rounds to 0 give 0x80. NaN gives 0x7F
// (0xFF when its sign bit is set).
constexpr std::uint8_t float_to_f8_e4m3(float v) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);
  if (magnitude > 0x43E00000u) magnitude = 0x43E00000u;  // clamp to 448
  if (magnitude < 0x3C800000u) {
    // Below 2^-6: a subnormal code k * 2^-9. Scaling by 2^9 is exact, and
    // k = 8 (the value 2^-6) is the smallest normal code, 0x08.
    const float scaled = std::bit_cast<float>(magnitude) * 512.0f;
    const auto k = static_cast<std::uint32_t>(scaled);  // truncates
    const float rest = scaled - static_cast<float>(k);  // exact
    const std::uint32_t rounded = k + ((rest > 0.5f || (rest == 0.5f && (k & 1u) != 0)) ? 1u : 0u);
    return static_cast<std::uint8_t>(sign | rounded);
  }
  // Normal: keep 3 mantissa bits, rounding the 20 dropped bits to nearest
  // even; a carry moves into the exponent. Rebias 127 -> 7.
  const std::uint32_t odd = (magnitude >> 20) & 1u;
  const std::uint32_t rounded = (magnitude + 0x7FFFFu + odd) >> 20;
  return static_cast<std::uint8_t>(sign | (rounded - (120u << 3)));
}

// ---- E8M0 (MX scales, schemes.md 6.1) ----

// The scale an E8M0 byte stands for, 2^(e - 127), as float (exact): 2^-127
// (a float subnormal) for 0, and infinity for 255, as compressed-tensors'
// `2.0 ** (e - 127)` gives in float32 (`maybe_convert_from_mx_exp`,
// `decompress_mx_scale`); the MX writers produce 255 only for groups whose
// amax rounds up past the dtype's largest power of two.
constexpr float e8m0_to_float(std::uint8_t e) {
  if (e == 0) return std::bit_cast<float>(0x00400000u);
  return std::bit_cast<float>(static_cast<std::uint32_t>(e) << 23);
}

}  // namespace ctquant
