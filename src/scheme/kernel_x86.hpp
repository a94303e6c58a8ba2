// Private: the hand-written x86-64 kernels of the int schemes, symmetric and
// asymmetric (AVX2 + F16C, and AVX-512 F + BW), which quantize_block() runs
// at the avx2 and avx512 levels (kernel_simd.cpp). Defined on x86-64 builds
// only.
#pragma once

#include <cstdint>
#include <optional>

#include "ctquant/scheme/kernel.hpp"

namespace ctquant::detail::x86 {

// The same contract and bytes as quantize_block_ref(), for blocks that
// simd_supports() accepts of a symmetric, respectively asymmetric, scheme,
// on a CPU that runs the level (the caller checks both). The AVX-512 kernel takes group sizes that are multiples of 16 and
// passes the others to the AVX2 code.
std::optional<std::uint64_t> quantize_symmetric_avx2(const QuantScheme& scheme,
                                                     const KernelBlock& block);
std::optional<std::uint64_t> quantize_symmetric_avx512(const QuantScheme& scheme,
                                                       const KernelBlock& block);
std::optional<std::uint64_t> quantize_asymmetric_avx2(const QuantScheme& scheme,
                                                      const KernelBlock& block);
std::optional<std::uint64_t> quantize_asymmetric_avx512(const QuantScheme& scheme,
                                                        const KernelBlock& block);

}  // namespace ctquant::detail::x86
