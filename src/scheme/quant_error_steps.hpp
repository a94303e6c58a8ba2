// Private: the scalar steps of the weight error (quant_error.hpp) that the
// reference (quant_error.cpp) and the vector code (quant_error_simd.cpp)
// share, so that both follow one definition: the element step of a lane,
// the max rule and the pairwise sum of the lanes.
#pragma once

#include <cstdint>

#include "ctquant/scheme/quant_error.hpp"

namespace ctquant::detail {

// Step 5: the larger of m and a, never a NaN a.
inline float max_abs_step(float m, float a) { return a > m ? a : m; }

// Steps 2-3 for one element w (weight) and q (its dequantized value) of
// lane `lane`: d = w - q in float, d^2 and w^2 added in double (exact
// squares), |d| into m.
inline void error_element(float w, float q, std::uint64_t lane, double* e, double* n, float& m) {
  const float d = w - q;
  const double dd = d;
  const double wd = w;
  e[lane] += dd * dd;
  n[lane] += wd * wd;
  m = max_abs_step(m, d < 0.0f ? -d : d);
}

// Step 4: lanes [0, count) added pairwise, count a power of two.
inline double pairwise_sum(const double* lanes, std::uint64_t count) {
  if (count == 1) return lanes[0];
  const std::uint64_t half = count / 2;
  return pairwise_sum(lanes, half) + pairwise_sum(lanes + half, half);
}

static_assert((kErrorLanes & (kErrorLanes - 1)) == 0, "kErrorLanes must be a power of two");

}  // namespace ctquant::detail
