// Private: what a vector kernel file (src/scheme, src/source) needs to be
// compiled for every level of simd_levels() and called at the level this CPU
// runs.
//
// A kernel is written once with Google Highway (Debian libhwy-dev; the ops
// are documented in /usr/include/hwy/ops/*-inl.h and Highway's
// g3doc/quick_reference.md) and compiled once per level by
// <hwy/foreach_target.h>, which re-includes the file with HWY_TARGET set to
// each target of the build's architecture. A new kernel file follows this
// pattern (src/scheme/kernel_simd.cpp is the worked example):
//
//   // src/scheme/kernel_foo.cpp
//   #undef HWY_TARGET_INCLUDE
//   #define HWY_TARGET_INCLUDE "scheme/kernel_foo.cpp"  // this file, from src/
//   #include <hwy/foreach_target.h>  // before highway.h
//   #include <hwy/highway.h>
//
//   #include "simd/simd_dispatch.hpp"
//
//   #ifndef CTQUANT_SCHEME_KERNEL_FOO_ONCE  // scalar helpers, compiled once
//   #define CTQUANT_SCHEME_KERNEL_FOO_ONCE
//   namespace ctquant::detail { float foo_scale(...); }
//   #endif
//
//   HWY_BEFORE_NAMESPACE();
//   namespace ctquant::detail::HWY_NAMESPACE {
//   #if CTQUANT_SIMD_KERNEL_TARGET  // only the levels of simd_levels()
//   namespace hn = hwy::HWY_NAMESPACE;
//   Result quantize_foo(const Args&... args) { ... hn:: ops ... }
//   #endif
//   }  // namespace ctquant::detail::HWY_NAMESPACE
//   HWY_AFTER_NAMESPACE();
//
//   #if HWY_ONCE  // the last pass: the table and the entry points
//   namespace ctquant::detail {
//   namespace {
//   using QuantizeFoo = Result(const Args&...);
//   constexpr SimdEntry<QuantizeFoo> kQuantizeFoo[] = CTQUANT_SIMD_TABLE(quantize_foo);
//   }  // namespace
//   Result quantize_foo_at(const SimdLevel& level, const Args&... args) {
//     QuantizeFoo* fn = simd_entry(kQuantizeFoo, level);
//     return fn != nullptr ? fn(args...) : quantize_foo_ref(args...);
//   }
//   }  // namespace ctquant::detail
//   #endif
//
// The fast path calls quantize_foo_at(simd_best_level(), ...); tests call it
// at every level of simd_levels() that is supported (and report the others
// as skipped), and compare it with the scalar reference bit for bit.
//
// Why a table rather than HWY_EXPORT / HWY_DYNAMIC_DISPATCH: the same
// dispatch (Highway's foreach_target.h passes and its CPU detection,
// hwy::SupportedTargets()), but every level can also be called by name, so
// tests and benchmarks reach the levels below the best one, and
// kernel_path_name() names exactly the level the fast path takes. Levels
// outside simd_levels() (x86 SSSE3/SSE4 and Highway's scalar emulation, whose
// F16 conversions are not IEEE round-to-nearest-even) get no kernel: on such
// CPUs the fast path is the scalar reference.
//
// Rounding: the kernels rely on the default floating-point environment
// (round to nearest even, subnormals kept: MXCSR on x86, FPCR on AArch64),
// which is what every thread of the process starts with.
#pragma once

#include <cstdint>

#include <hwy/highway.h>

#include "simd/simd.hpp"

// X-macro over the levels of simd_levels() for the build's architecture,
// best first: X(HIGHWAY_TARGET_SUFFIX, "name", ARG).
#if HWY_ARCH_X86_64
#define CTQUANT_SIMD_FOREACH_LEVEL(X, ARG) X(AVX3, "avx512", ARG) X(AVX2, "avx2", ARG)
#elif HWY_ARCH_ARM_A64
#define CTQUANT_SIMD_FOREACH_LEVEL(X, ARG)                                       \
  X(SVE2_128, "sve2_128", ARG) X(SVE_256, "sve_256", ARG) X(SVE2, "sve2", ARG) \
  X(SVE, "sve", ARG) X(NEON, "neon", ARG)
#else
#define CTQUANT_SIMD_FOREACH_LEVEL(X, ARG)
#endif

// In a foreach_target.h pass: true when HWY_TARGET is one of the levels (the
// kernel code is compiled only then).
#define CTQUANT_SIMD_IS_TARGET_(T, NAME, ARG) || HWY_TARGET == HWY_##T
#define CTQUANT_SIMD_KERNEL_TARGET (0 CTQUANT_SIMD_FOREACH_LEVEL(CTQUANT_SIMD_IS_TARGET_, _))

// The initializer of a SimdEntry array for the per-level functions FN
// (ctquant::detail::N_<TARGET>::FN), best level first, nullptr for levels
// this build did not compile, ended by {0, nullptr}.
#define CTQUANT_SIMD_ENTRY_(T, NAME, FN) {HWY_##T, HWY_CHOOSE_##T(FN)},
#define CTQUANT_SIMD_TABLE(FN) \
  { CTQUANT_SIMD_FOREACH_LEVEL(CTQUANT_SIMD_ENTRY_, FN){0, nullptr}, }

namespace ctquant::detail {

// One level's entry point of a kernel; Fn is the function type.
template <class Fn>
struct SimdEntry {
  std::int64_t target = 0;
  Fn* fn = nullptr;
};

// The kernel's entry point for level, or nullptr when level is not
// supported by this CPU or the kernel has none there (the caller then runs
// the scalar reference).
template <class Fn, std::size_t N>
Fn* simd_entry(const SimdEntry<Fn> (&table)[N], const SimdLevel& level) {
  if (!level.supported) return nullptr;
  for (const SimdEntry<Fn>& e : table) {
    if (e.target == level.target) return e.fn;
  }
  return nullptr;
}

}  // namespace ctquant::detail
