// Private: the vector instruction sets ("levels") the kernels under
// src/scheme and src/source are compiled for, and which of them this CPU
// runs. The kernels are written once with Google Highway (Debian libhwy-dev)
// and compiled for every level of the build's architecture;
// simd_dispatch.hpp says how a kernel file is laid out. This header does not
// include Highway, so tests and benchmarks can name levels without Highway's
// target macros.
#pragma once

#include <cstdint>
#include <vector>

namespace ctquant::detail {

// One instruction set a vector kernel is compiled for.
struct SimdLevel {
  // Highway's target bit (HWY_AVX2, HWY_NEON, ...); 0 for the scalar reference.
  std::int64_t target = 0;
  // "avx512" (AVX-512 F, VL, DQ, BW), "avx2" (AVX2, F16C, FMA, BMI2),
  // "sve2_128" (SVE2, 128-bit vectors), "sve_256" (SVE, 256-bit vectors),
  // "sve2", "sve", "neon" (AArch64 Advanced SIMD), or "scalar".
  const char* name = "scalar";
  bool supported = false;  // this CPU runs it (checked once)
};

// Every level compiled into this build for its architecture, best first,
// whether or not this CPU runs it: avx512, avx2 on x86-64; sve2_128,
// sve_256, sve2, sve, neon on AArch64; none elsewhere.
const std::vector<SimdLevel>& simd_levels();

// The first level of simd_levels() this CPU runs, or the scalar level
// (target 0, "scalar") when it runs none. Checked once. On a thread where a
// ScopedSimdLevel lives, its level instead.
const SimdLevel& simd_best_level();

// For tests: while it lives, simd_best_level() returns `level` on the
// calling thread, so every fast path that looks the level up per call (each
// SchemeFamily::quantize) runs that level's vector kernel, or its scalar
// reference where this CPU does not run the level. A kernel pointer cached
// in a function-local static keeps the level of its first call. Nests.
class ScopedSimdLevel {
 public:
  explicit ScopedSimdLevel(const SimdLevel& level);
  ~ScopedSimdLevel();
  ScopedSimdLevel(const ScopedSimdLevel&) = delete;
  ScopedSimdLevel& operator=(const ScopedSimdLevel&) = delete;

 private:
  const SimdLevel* previous_;
};

}  // namespace ctquant::detail
