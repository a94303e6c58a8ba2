// Private: the vector kernel of the rows that store one code byte per
// weight with scales in the weight's dtype: FP8 E4M3 codes (fp8.cpp:
// float-quantized, naive-quantized) and int8 codes (int8.cpp:
// int-quantized). One Highway source compiled for every level of
// simd_levels() (simd/simd_dispatch.hpp); its output is byte-identical to
// the rows' scalar references.
#pragma once

#include <cstdint>
#include <optional>

#include "ctquant/scheme/scheme.hpp"
#include "simd/simd.hpp"

namespace ctquant::detail {

// Which code a weight becomes: e4m3(clamp(round_W(w / s), -448, 448)) or
// round_half_even(clamp(round_W(w / s), -128, 127)) (scheme/fp8.hpp,
// scheme/int8.hpp).
enum class ByteCode : std::uint8_t { kE4M3, kInt8 };

// A KernelFn of a row (scheme.hpp) with its code, same contract: strategy
// channel, tensor (scale from io.tensor_amax) or block (the chunk starting
// at a block row, as the rows' row_alignment makes it), weights BF16, F16
// or F32.
using ByteCodeKernel = std::optional<std::uint64_t>(ByteCode code, const QuantArgs& args,
                                                    const KernelIo& io);

// The kernel compiled for `level`, or nullptr when this CPU does not run
// that level (the caller then runs its scalar reference).
ByteCodeKernel* byte_code_kernel(const SimdLevel& level);

}  // namespace ctquant::detail
