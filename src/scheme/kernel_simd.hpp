// Private: the vector kernels behind quantize_block() for 4- and 8-bit int
// schemes (W4A16, W4A16_ASYM, W8A16), run at the best level of
// simd_levels() (simd/simd.hpp) this CPU has: one Highway source
// (kernel_simd.cpp) compiled for every level, and on x86-64 the hand-written
// AVX2 / AVX-512 kernels (kernel_x86.cpp), which quantize_block() runs there
// instead for symmetric schemes. Every one is byte-identical to
// quantize_block_ref().
#pragma once

#include <cstdint>
#include <optional>

#include "ctquant/scheme/kernel.hpp"
#include "simd/simd.hpp"

namespace ctquant::detail {

// True when the CPU runs a level of simd_levels().
bool simd_available();

// True when the vector kernel handles this scheme and block (on a CPU that
// runs a level): 4 or 8 bits, symmetric or asymmetric, BF16/F16/F32
// weights, and a group size that is a multiple of 8 dividing n_cols.
bool simd_supports(const QuantScheme& scheme, const KernelBlock& block);

// The kernel at simd_best_level() (the reference when there is none or the
// block is not supported).
std::optional<std::uint64_t> quantize_block_simd(const QuantScheme& scheme,
                                                 const KernelBlock& block);

// The same at one level of simd_levels(), for tests and benchmarks; a level
// this CPU does not run, or a block the kernel does not handle, goes to the
// reference.
std::optional<std::uint64_t> quantize_block_simd_at(const SimdLevel& level,
                                                    const QuantScheme& scheme,
                                                    const KernelBlock& block);

// True when quantize_block_simd_at() runs hand-written kernels rather than
// the Highway kernel (x86-64).
bool simd_hand_written();

// The Highway kernel at one level, with the same fallbacks (on AArch64 this
// is quantize_block_simd_at()).
std::optional<std::uint64_t> quantize_block_hwy_at(const SimdLevel& level,
                                                   const QuantScheme& scheme,
                                                   const KernelBlock& block);

// The largest magnitude bits (sign cleared; BF16 and F16 in the low half)
// of n elements of a BF16, F16 or F32 weight, by the vector code of the best
// level this CPU runs; nullopt when it runs none or for another dtype. The
// bits of a NaN or infinity are at or above the dtype's exponent mask.
std::optional<std::uint32_t> max_magnitude_bits_simd(DType dtype, const std::byte* data,
                                                     std::uint64_t n);

// The same at one level of simd_levels(), for tests and benchmarks; nullopt
// when this CPU does not run that level or for another dtype.
std::optional<std::uint32_t> max_magnitude_bits_simd_at(const SimdLevel& level, DType dtype,
                                                        const std::byte* data, std::uint64_t n);

}  // namespace ctquant::detail
