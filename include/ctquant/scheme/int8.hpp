// Integer weights with dynamic int8 activations: the `int-quantized` family
// (presets W8A8 and its alias INT8).
//
// For a module M with weight [N, K] of dtype W (BF16, F16, F32) it writes
//   M.weight        I8 [N, K]   the codes, unpacked
//   M.weight_scale  W  [N, 1]   (channel) or [1] (tensor)
// with the arithmetic of schemes.md section 3, bit for bit as
// llm-compressor's model_free_ptq (test vector V5):
//   amax = max |w| over the row or tensor (in W, exact),
//   s    = round_W(amax / 127.5), eps(W) when that is 0 (127.5, not 127:
//          half of the int8 range 255),
//   code = round_half_even(clamp(round_W(w / s), -128, 127)): the quotient
//          is rounded to W first, a double rounding (in a BF16 row with
//          amax 1.0, s = 0x3C01 and w = 0.515625 give 65.488, which rounds
//          to 65.5 and then to 66, not 65).
// Only 8-bit symmetric channel or tensor weights are written: those are
// what vLLM's int8 W8A8 kernels load (compressed_tensors_w8a8_int8.py).
// compressed-tensors also writes 2- to 7-bit weights with input
// activations (W4A8, W4AFP8, W4A4, ...) in this format, as unpacked values
// in I8; vLLM has no NVIDIA GPU kernel for those (CompressedTensorsW4A8Int
// runs on CPU and XPU only), so `supports` refuses them (docs/fp8-int8.md).
//
// The row is defined in src/scheme/int8.cpp; the registry lists it.
#pragma once

#include <cstdint>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/scheme.hpp"

namespace ctquant {

extern const SchemeFamily kIntQuantizedFamily;  // "int-quantized"

// The scale of a row or tensor whose largest magnitude is amax (a value of
// dtype W, >= 0): round_W(amax / 127.5), or eps(W) when that is zero
// (schemes.md 3.2). W is BF16, F16 or F32.
float int8_weight_scale(DType weight_dtype, float amax);

// The int8 code of one weight w (a value of dtype W, finite) under scale s:
// round_half_even(clamp(round_W(w / s), -128, 127)) (schemes.md 3.3, 2.4).
std::int8_t int8_weight_code(DType weight_dtype, float w, float s);

}  // namespace ctquant
