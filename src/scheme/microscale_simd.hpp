// Private: the vector kernels of the microscale families (NVFP4, MXFP4,
// MXFP8), written once with Google Highway and compiled for every level of
// simd_levels() (simd/simd.hpp, simd_dispatch.hpp). Each returns the same
// bytes, and the same first non-finite index, as its family's scalar
// reference for every input; tests/test_scheme_nvfp4.cpp and
// tests/test_scheme_mx.cpp check that at every level this CPU runs, on
// random and adversarial weights.
#pragma once

#include <cstdint>
#include <optional>

#include "ctquant/scheme/scheme.hpp"
#include "simd/simd.hpp"

namespace ctquant::microscale {

enum class Format : std::uint8_t { kNvfp4, kMxfp4, kMxfp8 };

// A kernel for one format; the format's args are fixed (schemes.md 5.1,
// 6.2, 6.3), the weight dtype (BF16, F16 or F32) is read from io.
using ChunkKernel = std::optional<std::uint64_t> (*)(const KernelIo& io);

// The kernel for format at level, or nullptr when this CPU does not run
// the level (the family then runs its reference).
ChunkKernel kernel_at(const detail::SimdLevel& level, Format format);

// kernel_at(simd_best_level(), format).
ChunkKernel best_kernel(Format format);

}  // namespace ctquant::microscale
