// Private: the scale arithmetic the microscale families share (NVFP4 global
// and group scales, MX E8M0 exponents), as the scalar steps of
// docs/schemes.md sections 5.3 and 6.1. The reference kernels of
// nvfp4.cpp, mxfp4.cpp and mxfp8.cpp and the vector kernels of
// microscale_simd.cpp call the same functions for their per-group scalars,
// so the scales agree by construction. They are inline: the vector kernels
// call them once per group of 16 or 32 weights, with the dtype a constant.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "ctquant/format/dtype.hpp"
#include "ctquant/format/minifloat.hpp"

namespace ctquant::microscale {

// round_W(v): v rounded to the weight dtype w (BF16, F16 or F32, nearest
// even) and widened back, exactly (format/dtype.hpp round_to_dtype).
inline float round_w(DType w, float v) {
  if (w == DType::kBF16) return bf16_to_float(float_to_bf16(v));
  if (w == DType::kF16) return f16_to_float(float_to_f16(v));
  return v;
}

// finfo(W).tiny, the smallest normal value: BF16 and F32 2^-126, F16 2^-14.
inline float dtype_tiny(DType w) { return w == DType::kF16 ? 0x1p-14f : 0x1p-126f; }

// The NVFP4 global scale of a module (or fused set) whose largest |w| is
// amax, a value of the weight dtype w (schemes.md 5.3 step 2; compressed-
// tensors `quantization/utils/helpers.py` `generate_gparam`):
// a = max(amax, tiny(W)); r = round_W(1 / a); gs = round_W(r * 2688), as
// PyTorch computes `2688.0 / tensor` in W (reciprocal, then multiply, each
// op in float32 rounded to W; the product is exact in float32 for BF16 and
// F16 operands); an infinite or NaN result is 1.0 (torch.nan_to_num). So an
// F16 weight with amax below about 0.041 gets 1.0 (2688 / amax overflows
// F16), as does an all-zero weight. Stored as F32 `weight_global_scale`.
// round_W(round_W(1 / a) * 2688) before that rule: infinite when it overflows W.
inline float nvfp4_global_scale_in_w(DType w, float amax) {
  const float a = std::max(amax, dtype_tiny(w));
  const float r = round_w(w, 1.0f / a);
  return round_w(w, r * 2688.0f);
}

inline bool nvfp4_global_scale_overflows(DType w, float amax) {
  return (std::bit_cast<std::uint32_t>(nvfp4_global_scale_in_w(w, amax)) & 0x7FFFFFFFu) >=
         0x7F800000u;
}

inline float nvfp4_global_scale(DType w, float amax) {
  return nvfp4_global_scale_overflows(w, amax) ? 1.0f : nvfp4_global_scale_in_w(w, amax);
}

// The F8_E4M3 byte of the NVFP4 scale of a group of 16 whose largest |w| is
// group_amax, under global scale gs (schemes.md 5.3 steps 3-6):
// s = round_W(group_amax / 6) (amax / (bit_range / 2), in W);
// t = float32(gs * s) (W times a float32 [1] tensor promotes to float32);
// fp8(clamp(t, +-448)); 0x20 (0.125, eps of E4M3) when that is zero.
inline std::uint8_t nvfp4_group_scale(DType w, float gs, float group_amax) {
  const float s = round_w(w, group_amax / 6.0f);
  const float t = gs * s;
  const std::uint8_t code = float_to_f8_e4m3(t);
  return (code & 0x7Fu) == 0 ? std::uint8_t{0x20} : code;
}

// The divisor a group's elements are quantized with (schemes.md 5.3 step 7):
// float32(fp8 value of scale_code / gs), `scale / global_scale`.
inline float nvfp4_divisor(std::uint8_t scale_code, float gs) {
  return f8_e4m3_to_float(scale_code) / gs;
}

// The MX scale of a group of 32 (schemes.md 6.1).
struct MxScale {
  std::uint8_t byte = 0;  // the stored E8M0 exponent
  float scale = 0.0f;     // the divisor, as held in the weight's dtype
};
inline constexpr int kMxfp4Offset = 2;  // floor(log2 6), `_MX_ELEM_OFFSET`
inline constexpr int kMxfp8Offset = 8;  // floor(log2 448)

// group_amax is the group's largest |w|, a non-negative value of dtype w.
// 1. p2 = round_to_power_2(amax) on the bits of amax in W: add
//    1 << (mantissa bits - 2) (half a step of FP4's one mantissa bit, so
//    mantissas from 1.75 round up), keep sign and exponent: 0 (a zero or
//    small subnormal amax), a normal power of two, or infinity.
// 2. e = 127 + log2(p2) - offset, clamped to [0, 255] (log2(0) = -inf -> 0).
// 3. scale = round_W(2^(e - 127)); a zero scale (F16 below 2^-24) becomes
//    eps(uint8) = 1.0.
// 4. byte = 127 + log2(scale) (compress_mx_scale): e, or 127 where the
//    scale became 1.0. e = 255 (mantissa >= 1.75 at W's largest exponent)
//    gives an infinite scale, whose stored byte the reference leaves
//    undefined (int32 of infinity); this writes 0xFF.
inline MxScale mx_scale(DType w, float group_amax, int offset) {
  std::uint32_t p = 0;
  std::uint32_t inf_bits = 0;
  int mantissa_bits = 0;
  int bias = 0;
  if (w == DType::kF32) {
    p = (std::bit_cast<std::uint32_t>(group_amax) + (1u << 21)) & 0xFF800000u;
    inf_bits = 0x7F800000u;
    mantissa_bits = 23;
    bias = 127;
  } else if (w == DType::kF16) {
    p = (std::uint32_t{float_to_f16(group_amax)} + (1u << 8)) & 0xFC00u;
    inf_bits = 0x7C00u;
    mantissa_bits = 10;
    bias = 15;
  } else {
    p = (std::uint32_t{float_to_bf16(group_amax)} + (1u << 5)) & 0xFF80u;
    inf_bits = 0x7F80u;
    mantissa_bits = 7;
    bias = 127;
  }
  const int log2_p2 = static_cast<int>(p >> mantissa_bits) - bias;
  const int e = p == 0 ? 0 : p == inf_bits ? 255 : std::clamp(127 + log2_p2 - offset, 0, 255);
  MxScale out;
  out.scale = round_w(w, e8m0_to_float(static_cast<std::uint8_t>(e)));
  out.byte = static_cast<std::uint8_t>(e);
  if (out.scale == 0.0f) {
    out.scale = 1.0f;
    out.byte = 127;
  }
  if (std::bit_cast<std::uint32_t>(out.scale) == 0x7F800000u) out.byte = 0xFF;
  return out;
}

}  // namespace ctquant::microscale
