// Private: the scalar steps of the refit observer that its reference
// (src/scheme/refit.cpp) and its vector kernel (src/scheme/refit_simd.cpp)
// share, so that both compute the same floats: the candidate factors, HQQ's
// power and shrink operator, and the vector entry point for tests.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ctquant/format/dtype.hpp"

#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/refit.hpp"
#include "ctquant/scheme/scheme.hpp"
#include "scheme/observer_steps.hpp"

namespace ctquant::detail {

// f_k = float32(1 + span * (2k / steps - 1)) of candidate k (steps > 0),
// span the one of the args' bit width (RefitParams::span_for).
inline float refit_factor(const RefitParams& p, const QuantArgs& args, std::uint32_t k) {
  return static_cast<float>(
      1.0 + p.span_for(args.num_bits) *
                (2.0 * static_cast<double>(k) / static_cast<double>(p.steps) - 1.0));
}

// The least-squares scale a / b of a candidate's sums (a = sum w x u, b =
// sum w u^2, float32), rounded to W; NaN when they give none (a group of
// zeros, codes all zero, or NaN sums).
inline float refit_scale(DType w, float a, float b) {
  if (!(a > 0.0f && b > 0.0f)) return std::numeric_limits<float>::quiet_NaN();
  return round_to_dtype(w, a / b);
}

// The least-squares sums of a candidate's codes q over a group, with w the
// importance weight of each element (1, or x^2): a = sum w x q,
// b = sum w q^2, x = sum w x, q = sum w q, w = sum w, accumulated in
// float32 in element order (the products as w * (x q), ...).
struct LsSums {
  float a = 0.0f;
  float b = 0.0f;
  float x = 0.0f;
  float q = 0.0f;
  float w = 0.0f;
};

// The asymmetric candidate with zero point z (an integer) fixed and the
// scale that fits the codes best with it: s = sum w x (q - z) /
// sum w (q - z)^2 (in double, from the sums), as the range of
// refit_detail::asymmetric_range with width round_W(float32(s) * (qmax -
// qmin)); NaN when there is none.
inline std::array<float, 2> asymmetric_fixed_z(const QuantArgs& args, DType w, const LsSums& s,
                                               float z, float qmin, float qmax) {
  const double a = static_cast<double>(s.a) - static_cast<double>(z) * s.x;
  const double b = static_cast<double>(s.b) - 2.0 * static_cast<double>(z) * s.q +
                   static_cast<double>(z) * z * s.w;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (!(a > 0.0 && b > 0.0)) return {nan, nan};
  const float width = round_to_dtype(w, static_cast<float>(a / b) * (qmax - qmin));
  return refit_detail::asymmetric_range(args, w, width, z);
}

// The asymmetric least-squares refit of a candidate's codes: the line
// x = s q + c fitted to them (weighted, in double), its zero point
// z = -c / s rounded to an integer of [qmin, qmax], then the scale with that
// zero point fixed (asymmetric_fixed_z).
inline std::array<float, 2> asymmetric_fit(const QuantArgs& args, DType w, const LsSums& s,
                                           float qmin, float qmax) {
  const double sw = s.w;
  const double var = static_cast<double>(s.b) * sw - static_cast<double>(s.q) * s.q;
  const double cov = static_cast<double>(s.a) * sw - static_cast<double>(s.x) * s.q;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (!(var > 0.0 && cov > 0.0 && sw > 0.0)) return {nan, nan};
  const double scale = cov / var;
  // Clamped in double first: the float conversion of a huge value is not
  // defined.
  const double zd = std::clamp((scale * s.q - s.x) / (sw * scale), static_cast<double>(qmin) - 1.0,
                               static_cast<double>(qmax) + 1.0);
  const float z = std::clamp(std::nearbyint(static_cast<float>(zd)), qmin, qmax);
  return asymmetric_fixed_z(args, w, s, z, qmin, qmax);
}

// The error of scale s and zero point z (0 when symmetric) with the codes
// of the sums kept, sum w (x - s (q - z))^2, less sum w x^2 (the same for
// every candidate of a group): s^2 sum w (q - z)^2 - 2 s sum w x (q - z),
// in double. What the closed-form refits are ranked by.
inline double predicted_error(const LsSums& ls, float s, float z) {
  const double sd = s;
  const double zd = z;
  const double a = static_cast<double>(ls.a) - zd * ls.x;
  const double b = static_cast<double>(ls.b) - 2.0 * zd * ls.q + zd * zd * ls.w;
  return sd * sd * b - 2.0 * sd * a;
}

// A closed-form refit of a candidate's codes: its range, and its error with
// those codes kept (predicted_error of the qparams calculate_qparams
// derives from the range; NaN when there is no refit).
struct Proposal {
  std::array<float, 2> range{std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::quiet_NaN()};
  double predicted = std::numeric_limits<double>::quiet_NaN();
};

inline Proposal propose(const QuantArgs& args, DType w, const std::array<float, 2>& range,
                        const LsSums& ls) {
  Proposal p;
  if (!std::isfinite(range[0]) || !std::isfinite(range[1])) return p;
  const Candidate c = candidate(args, w, range[0], range[1]);
  p.range = range;
  p.predicted = predicted_error(ls, c.s, c.z);
  return p;
}

// The constants of hqq_pow: log2(m) = (2 / ln 2) atanh(s), s = (m - 1) /
// (m + 1) in [0, 1/3) for m in [1, 2), by its series to s^7 (truncation
// below 6e-6); 2^f = e^(f ln 2) for f in [0, 1) by its Taylor series to
// degree 6 (below 2e-5).
inline constexpr float kTwoOverLn2 = 2.8853900817779268f;
inline constexpr float kLn2 = 0.69314718055994531f;

// hqq_pow (refit.hpp), step by step; the vector kernel performs the same
// operations in the same order.
inline float hqq_pow_steps(float a, float t) {
  a = std::fabs(a);
  if (a == 0.0f) return 0.0f;
  const bool sub = a < 0x1p-126f;
  const float as = sub ? a * 0x1p24f : a;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(as);
  const float e = static_cast<float>(static_cast<std::int32_t>(bits >> 23) - (sub ? 151 : 127));
  const float m = std::bit_cast<float>((bits & 0x7FFFFFu) | 0x3F800000u);
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  float p = 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  p = p * s2 + 1.0f;
  p = p * s;
  const float y = t * (e + p * kTwoOverLn2);
  if (!(y < 128.0f)) return std::numeric_limits<float>::infinity();
  if (y < -126.0f) return 0.0f;
  const float k = std::floor(y);
  const float u = (y - k) * kLn2;
  float q = 1.0f / 720.0f;
  q = q * u + 1.0f / 120.0f;
  q = q * u + 1.0f / 24.0f;
  q = q * u + 1.0f / 6.0f;
  q = q * u + 0.5f;
  q = q * u + 1.0f;
  q = q * u + 1.0f;
  return q *
         std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<std::int32_t>(k) + 127) << 23);
}

// HQQ's shrink operator (hqq_shrink of refit.hpp) with the cut below which
// it is zero: sign(r) max(|r| - |r|^(p - 1) / beta, 0) is zero wherever
// |r|^(2 - p) <= 1 / beta, so for |r| < cut = hqq_cut(beta, p) (half the
// point where that changes) the power is not computed at all. Residuals
// are mostly far below it (a fraction of the scale), which saves the
// vector kernel its power on nearly every element.
inline float hqq_cut(double beta, double p) {
  return static_cast<float>(0.5 * std::pow(beta, -1.0 / (2.0 - p)));
}

// The constants of HQQ's iterations i = 0 .. iters - 1: float32(1 / beta_i)
// and hqq_cut(beta_i), beta_i = beta * kappa^i (multiplied in double, as
// the loop does), and the least cut (kappa >= 1: the last one's, or none).
// An iteration whose zero point equals the one it started from, with
// every |r| below min_cut, is the last one that can change anything: every
// later iteration computes the same codes, residuals (all shrunk to zero)
// and zero point, so the search stops there.
struct HqqSchedule {
  std::vector<float> inv_beta;
  std::vector<float> cut;
  float min_cut = 0.0f;
};

inline HqqSchedule hqq_schedule(const RefitParams& p) {
  HqqSchedule h;
  double beta = p.beta;
  for (std::uint32_t i = 0; i < p.iters; ++i) {
    h.inv_beta.push_back(static_cast<float>(1.0 / beta));
    h.cut.push_back(hqq_cut(beta, p.p));
    beta *= p.kappa;
  }
  h.min_cut = h.cut.empty() ? 0.0f : *std::min_element(h.cut.begin(), h.cut.end());
  return h;
}

inline float hqq_shrink_steps(float r, float inv_beta, float p_minus_1, float cut) {
  const float a = std::fabs(r);
  if (a < cut) return std::copysign(0.0f, r);
  const float v = std::max(a - inv_beta * hqq_pow_steps(a, p_minus_1), 0.0f);
  return std::copysign(v, r);
}

struct SimdLevel;

// The vector kernel at `level`; false when it does not cover these args
// (integer weights with group scales of a multiple of 16 columns, up to
// 4096) or this dtype (BF16 and F16), or the CPU lacks the level: the
// caller then runs observe_refit_ref.
bool observe_refit_at(const SimdLevel& level, const QuantArgs& args, const RefitParams& params,
                      const ObserveIo& io);

}  // namespace ctquant::detail
