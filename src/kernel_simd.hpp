// Private: the vectorised kernel behind quantize_block(). Selected at run time
// when the CPU supports it and the block's scheme and dtype are covered;
// output is byte-identical to quantize_block_ref().
#pragma once

#include <cstdint>
#include <optional>

#include "ctquant/kernel.hpp"

namespace ctquant::detail {

// True when this CPU has the instructions the vector kernel needs.
bool simd_available();

// True when quantize_block_simd() handles this scheme and block.
bool simd_supports(const QuantScheme& scheme, const KernelBlock& block);

std::optional<std::uint64_t> quantize_block_simd(const QuantScheme& scheme,
                                                 const KernelBlock& block);

}  // namespace ctquant::detail
