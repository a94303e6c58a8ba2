// Private: the vectorised kernel behind quantize_block(). Selected at run time
// when the CPU supports it and the block's scheme and dtype are covered;
// output is byte-identical to quantize_block_ref().
#pragma once

#include <cstdint>
#include <optional>

#include "ctquant/scheme/kernel.hpp"

namespace ctquant::detail {

// The vector instruction sets the kernel has code for, in order.
enum class SimdLevel { kNone, kAvx2, kAvx512 };

// The best level this CPU supports (checked once): kAvx512 needs AVX-512 F
// and BW, kAvx2 needs AVX2 and F16C.
SimdLevel simd_level();
const char* simd_level_name(SimdLevel level);  // "avx512", "avx2", "scalar"

// True when this CPU has the instructions the vector kernel needs (AVX2, F16C).
bool simd_available();

// True when quantize_block_simd() handles this scheme and block.
bool simd_supports(const QuantScheme& scheme, const KernelBlock& block);

// The kernel at simd_level(): AVX-512 for group sizes that are multiples of
// 16, AVX2 for the other multiples of 8, the reference for the rest.
std::optional<std::uint64_t> quantize_block_simd(const QuantScheme& scheme,
                                                 const KernelBlock& block);

// The same at a given level (capped at simd_level()), for tests and benchmarks.
std::optional<std::uint64_t> quantize_block_simd_at(SimdLevel level, const QuantScheme& scheme,
                                                    const KernelBlock& block);

}  // namespace ctquant::detail
