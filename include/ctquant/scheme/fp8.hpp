// FP8 E4M3 weights: the `float-quantized` family (FP8 weights with dynamic
// FP8 input activations: the FP8_DYNAMIC and FP8_BLOCK presets, custom
// per-tensor schemes) and the `naive-quantized` family (the same weights
// with no input activations, which compressed-tensors files under its
// fallback format, schemes.md section 1.1 rule 7).
//
// Both write, for a module M with weight [N, K] of dtype W (BF16, F16, F32):
//   M.weight        F8_E4M3 [N, K]
//   M.weight_scale  W       [N, 1] (channel), [ceil(N/128), K/128] (128x128
//                           block), [1] (tensor)
// with the arithmetic of schemes.md sections 2.1, 3 and 4, bit for bit as
// llm-compressor's model_free_ptq (golden llama-bf16-fp8-dynamic,
// llama-f16-fp8-dynamic, odd-bf16-fp8-block; test vector V3):
//   amax = max |w| over the row, block or tensor (in W, exact),
//   s    = round_W(amax / 448), eps(W) when that is 0,
//   code = e4m3(clamp(round_W(w / s), -448, 448)) (float_to_f8_e4m3 of
//          format/minifloat.hpp: round to nearest even, sign of zero kept).
// The weights' args are 8-bit symmetric floats with strategy channel,
// block [128, 128] or tensor and no scale_dtype (the formats ctquant writes
// for vLLM's FP8 schemes, compressed_tensors_w8a8_fp8.py and
// compressed_tensors_w8a16_fp8.py); `supports` explains any other args.
//
// The rows are defined in src/scheme/fp8.cpp; the registry lists them.
#pragma once

#include <cstdint>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/scheme.hpp"

namespace ctquant {

extern const SchemeFamily kFloatQuantizedFamily;  // "float-quantized"
extern const SchemeFamily kNaiveQuantizedFamily;  // "naive-quantized"

// The scale of a row, block or tensor whose largest magnitude is amax
// (a value of dtype W, >= 0): round_W(amax / 448), or eps(W) when that is
// zero (schemes.md 3.2 steps 3 and 7). W is BF16, F16 or F32.
float fp8_weight_scale(DType weight_dtype, float amax);

// The E4M3 code of one weight w (a value of dtype W) under scale s:
// e4m3(clamp(round_W(w / s), -448, 448)) (schemes.md 3.3 and 2.1). w finite.
std::uint8_t fp8_weight_code(DType weight_dtype, float w, float s);

}  // namespace ctquant
