// The vector kernel of the refit observer (scheme/refit.hpp), one Highway
// source compiled for every level of simd_levels() (simd_dispatch.hpp says
// how). It gives exactly the ranges observe_refit_ref() gives, for BF16 and
// F16 integer weights (symmetric and asymmetric) whose scale groups are
// groups of columns or whole rows; other inputs run the reference.
//
// Layout: one lane per scale group, as the MSE search (observer_simd.cpp):
// a set of Lanes() groups is transposed once (vector j holds element j of
// every group of the set). The element loops are vector code that performs,
// lane by lane, the float and double operations of the reference in the
// same order:
// - pass(): one candidate per lane (scale s, zero point z): the codes, the
//   error sum w (x - Q)^2 in double and the least-squares sums in float,
//   as refit.cpp's evaluate(). v = round_W(x / s) is computed as
//   round_W(x * float32(1 / s)) for scales of at least 2^-100, which gives
//   the same W value for W values x and s (observer_simd.cpp says why);
// - hqq_iteration(): one HQQ iteration of every lane, its power and shrink
//   by the steps of hqq_pow_steps (refit_steps.hpp).
// - per group rather than per element (the candidates' scales, their
//   ranges and qparams as calculate_qparams derives them, the comparisons
//   with the best one): the same operations on one lane per group, with
//   std::min, std::max and std::clamp mirrored exactly (min_std and the
//   like: a signed zero decides what they return).
// A pass is skipped only when no lane can change: every lane's candidate is
// the one it just evaluated, or none.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "scheme/refit_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/simd_dispatch.hpp"
#include "simd/simd_steps-inl.h"

#ifndef CTQUANT_SCHEME_REFIT_SIMD_ONCE
#define CTQUANT_SCHEME_REFIT_SIMD_ONCE

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <hwy/aligned_allocator.h>

#include "ctquant/scheme/refit.hpp"
#include "scheme/observer_steps.hpp"
#include "scheme/refit_steps.hpp"

namespace ctquant::detail {

// What one call of the vector kernel needs.
struct RefitSearch {
  const QuantArgs* args = nullptr;
  const RefitParams* params = nullptr;
  const GroupLayout* layout = nullptr;
  DType w = DType::kBF16;
  const std::byte* weight = nullptr;
  float* ranges = nullptr;
};

}  // namespace ctquant::detail

#endif  // CTQUANT_SCHEME_REFIT_SIMD_ONCE

// SVE's vectors are sizeless and cannot be members of the structs below,
// and at NEON g++ 12 does not give the structs' implicit constructors the
// target's attributes (aarch64 cross build: "inlining failed in call to
// always_inline Vec128(): target specific option mismatch"): every Arm
// level runs the reference.
#define CTQUANT_REFIT_SIZELESS_ (!HWY_ARCH_X86)

HWY_BEFORE_NAMESPACE();
namespace ctquant::detail::HWY_NAMESPACE {
#if CTQUANT_SIMD_KERNEL_TARGET && !CTQUANT_REFIT_SIZELESS_

namespace hn = hwy::HWY_NAMESPACE;
namespace ss = ctquant::simd_steps::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using V = hn::Vec<DF>;
using M = hn::Mask<DF>;
using DH = hn::Half<DF>;
using DD = hn::Rebind<double, DH>;
using VD = hn::Vec<DD>;

// std::min, std::max and std::clamp of the reference, lane by lane: the
// first argument unless the comparison says otherwise (so a signed zero
// compares as the reference's does).
HWY_INLINE V min_std(V a, V b) { return hn::IfThenElse(hn::Lt(b, a), b, a); }
HWY_INLINE V max_std(V a, V b) { return hn::IfThenElse(hn::Lt(a, b), b, a); }
HWY_INLINE V clamp_std(V v, V lo, V hi) {
  return hn::IfThenElse(hn::Lt(v, lo), lo, hn::IfThenElse(hn::Lt(hi, v), hi, v));
}

// What a pass gives per lane: the error (two halves of double lanes) and
// the least-squares sums (LsSums of refit_steps.hpp; x, q and w only for
// the asymmetric search).
struct Sums {
  VD e_lo, e_hi;
  V a, b, x, q, w;
};

// One candidate per lane over the set's g elements (xt: element j of every
// lane at xt + j * lanes): evaluate() of refit.cpp lane by lane. With kXW
// also sum w x and sum w, which are the same for every candidate of a
// group: the asymmetric search computes them with its first candidate and
// copies them to the others.
template <DType T, bool kAsym, bool kLs, bool kX2, bool kXW = false>
HWY_NOINLINE Sums pass(const float* xt, std::size_t g, const V s, const V z, const V qmin,
                       const V qmax) {
  const DF df;
  const DH dh;
  const DD dd;
  const std::size_t n = hn::Lanes(df);
  const V inv = hn::Div(hn::Set(df, 1.0f), s);
  const bool divide = !hn::AllTrue(df, hn::Ge(s, hn::Set(df, 0x1p-100f)));
  VD e_lo = hn::Zero(dd);
  VD e_hi = hn::Zero(dd);
  V a = hn::Zero(df);
  V b = hn::Zero(df);
  V sx = hn::Zero(df);
  V sq = hn::Zero(df);
  V sw = hn::Zero(df);
  const auto body = [&](auto divide_by_s) HWY_ATTR {
    for (std::size_t j = 0; j < g; ++j) {
      const V x = hn::Load(df, xt + j * n);
      V v = ss::round_to_t<T>(df, decltype(divide_by_s)::value ? hn::Div(x, s) : hn::Mul(x, inv));
      if constexpr (kAsym) v = ss::round_to_t<T>(df, hn::Add(v, z));
      // clamp: the bounds are not zero, so Min and Max are std::clamp here.
      const V q = hn::Round(hn::Min(hn::Max(v, qmin), qmax));
      V u = q;
      if constexpr (kAsym) u = ss::round_to_t<T>(df, hn::Sub(q, z));
      const V d = hn::Sub(x, ss::round_to_t<T>(df, hn::Mul(u, s)));
      const VD d_lo = hn::PromoteTo(dd, hn::LowerHalf(dh, d));
      const VD d_hi = hn::PromoteTo(dd, hn::UpperHalf(dh, d));
      VD t_lo = hn::Mul(d_lo, d_lo);
      VD t_hi = hn::Mul(d_hi, d_hi);
      if constexpr (kX2) {
        const VD x_lo = hn::PromoteTo(dd, hn::LowerHalf(dh, x));
        const VD x_hi = hn::PromoteTo(dd, hn::UpperHalf(dh, x));
        t_lo = hn::Mul(t_lo, hn::Mul(x_lo, x_lo));
        t_hi = hn::Mul(t_hi, hn::Mul(x_hi, x_hi));
      }
      e_lo = hn::Add(e_lo, t_lo);
      e_hi = hn::Add(e_hi, t_hi);
      if constexpr (kLs) {
        V xq = hn::Mul(x, q);
        V qq = hn::Mul(q, q);
        if constexpr (kX2) {
          const V wt = hn::Mul(x, x);
          xq = hn::Mul(xq, wt);
          qq = hn::Mul(qq, wt);
          if constexpr (kAsym) sq = hn::Add(sq, hn::Mul(q, wt));
          if constexpr (kXW) {
            sx = hn::Add(sx, hn::Mul(x, wt));
            sw = hn::Add(sw, wt);
          }
        } else {
          if constexpr (kAsym) sq = hn::Add(sq, q);
          if constexpr (kXW) {
            sx = hn::Add(sx, x);
            sw = hn::Add(sw, hn::Set(df, 1.0f));
          }
        }
        a = hn::Add(a, xq);
        b = hn::Add(b, qq);
      }
    }
  };
  if (divide) {
    body(std::true_type{});
  } else {
    body(std::false_type{});
  }
  return Sums{e_lo, e_hi, a, b, sx, sq, sw};
}

// hqq_pow_steps of refit_steps.hpp for every lane: the same float steps.
HWY_INLINE V hqq_pow(const V a, const V t) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto sub = hn::Lt(a, hn::Set(df, 0x1p-126f));
  const V as = hn::IfThenElse(sub, hn::Mul(a, hn::Set(df, 0x1p24f)), a);
  const auto bits = hn::BitCast(du, as);
  const auto bias = hn::IfThenElse(hn::RebindMask(di, sub), hn::Set(di, 151), hn::Set(di, 127));
  const V e = hn::ConvertTo(df, hn::Sub(hn::BitCast(di, hn::ShiftRight<23>(bits)), bias));
  const V one = hn::Set(df, 1.0f);
  const V m =
      hn::BitCast(df, hn::Or(hn::And(bits, hn::Set(du, 0x7FFFFFu)), hn::Set(du, 0x3F800000u)));
  const V s = hn::Div(hn::Sub(m, one), hn::Add(m, one));
  const V s2 = hn::Mul(s, s);
  V p = hn::Set(df, 1.0f / 7.0f);
  p = hn::Add(hn::Mul(p, s2), hn::Set(df, 1.0f / 5.0f));
  p = hn::Add(hn::Mul(p, s2), hn::Set(df, 1.0f / 3.0f));
  p = hn::Add(hn::Mul(p, s2), one);
  p = hn::Mul(p, s);
  const V y = hn::Mul(t, hn::Add(e, hn::Mul(p, hn::Set(df, kTwoOverLn2))));
  const V k = hn::Floor(y);
  const V u = hn::Mul(hn::Sub(y, k), hn::Set(df, kLn2));
  V q = hn::Set(df, 1.0f / 720.0f);
  q = hn::Add(hn::Mul(q, u), hn::Set(df, 1.0f / 120.0f));
  q = hn::Add(hn::Mul(q, u), hn::Set(df, 1.0f / 24.0f));
  q = hn::Add(hn::Mul(q, u), hn::Set(df, 1.0f / 6.0f));
  q = hn::Add(hn::Mul(q, u), hn::Set(df, 0.5f));
  q = hn::Add(hn::Mul(q, u), one);
  q = hn::Add(hn::Mul(q, u), one);
  const auto low = hn::Lt(y, hn::Set(df, -126.0f));
  const auto high = hn::Not(hn::Lt(y, hn::Set(df, 128.0f)));
  // 2^k for the lanes in range (the others are replaced below).
  const auto ki = hn::IfThenZeroElse(hn::RebindMask(di, hn::Or(low, high)), hn::ConvertTo(di, k));
  const V scale = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(ki, hn::Set(di, 127))));
  V r = hn::IfThenZeroElse(low, hn::Mul(q, scale));
  r = hn::IfThenElse(high, hn::Set(df, std::numeric_limits<float>::infinity()), r);
  return hn::IfThenZeroElse(hn::Eq(a, hn::Zero(df)), r);
}

// One HQQ iteration of every lane (refit.cpp's loop body, element by
// element): the sum over the elements of q - (x - e) / s, and in max_r the
// largest |r|.
HWY_NOINLINE V hqq_iteration(const float* xt, std::size_t g, const V s, const V inv, const V z,
                             const V qmin, const V qmax, const V inv_beta, const V pm1, const V cut,
                             V& max_r) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  const V zero = hn::Zero(df);
  V acc = zero;
  V top = zero;
  for (std::size_t j = 0; j < g; ++j) {
    const V x = hn::Load(df, xt + j * n);
    const V q = hn::Min(hn::Max(hn::Round(hn::Add(hn::Mul(x, inv), z)), qmin), qmax);
    const V r = hn::Sub(x, hn::Mul(hn::Sub(q, z), s));
    const V ar = hn::Abs(r);
    const auto below = hn::Lt(ar, cut);
    V e = hn::CopySign(zero, r);
    if (HWY_UNLIKELY(!hn::AllTrue(df, below))) {
      const V v = max_std(hn::Sub(ar, hn::Mul(inv_beta, hqq_pow(ar, pm1))), zero);
      e = hn::IfThenElse(below, e, hn::CopySign(v, r));
    }
    acc = hn::Add(acc, hn::Sub(q, hn::Mul(hn::Sub(x, e), inv)));
    top = max_std(top, ar);
  }
  max_r = top;
  return acc;
}

// The set's groups transposed into xt (missing lanes zero).
template <DType T>
void load_set(const RefitSearch& m, std::uint64_t set, float* xt) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  const GroupLayout& layout = *m.layout;
  const std::size_t g = layout.group;
  const std::size_t valid =
      static_cast<std::size_t>(std::min<std::uint64_t>(n, layout.n_groups - set));
  const auto group_at = [&](std::size_t lane) {
    const std::uint64_t group = set + lane;
    return m.weight + (group / layout.per_row * layout.n_cols + group % layout.per_row * g) * 2;
  };
#if HWY_TARGET == HWY_AVX3
  if (T == DType::kBF16 && valid == 16 && g % 16 == 0) {
    const std::byte* groups[16];
    for (std::size_t lane = 0; lane < 16; ++lane) groups[lane] = group_at(lane);
    ss::transpose_bf16_16(groups, g, xt);
    return;
  }
#endif
  for (std::size_t lane = 0; lane < n; ++lane) {
    if (lane >= valid) {
      for (std::size_t j = 0; j < g; ++j) xt[j * n + lane] = 0.0f;
      continue;
    }
    const std::byte* p = group_at(lane);
    for (std::size_t j = 0; j < g; ++j) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, p + j * 2, 2);
      xt[j * n + lane] = T == DType::kBF16 ? bf16_to_float(bits) : f16_to_float(bits);
    }
  }
}

// One candidate per lane: its range, whether it is one (a finite range),
// and its qparams as calculate_qparams derives them (scale 1 and zero point
// 0 where there is none, so that a pass stays finite).
struct Cand {
  V lo, hi, s, z;
  M ok;
};

// The constants of the args (Candidate's).
struct Consts {
  V qmin, qmax, bit_range, half, eps, zero, one;
};

// candidate() of observer_steps.hpp for every lane, from lo, hi.
template <DType T>
HWY_INLINE Cand candidate_of(const Consts& k, bool asymmetric, const V lo, const V hi) {
  const DF df;
  Cand c{lo, hi, k.one, k.zero, hn::And(hn::IsFinite(lo), hn::IsFinite(hi))};
  const V lo_c = min_std(lo, k.zero);
  const V hi_c = max_std(hi, k.zero);
  if (asymmetric) {
    V s = ss::round_to_t<T>(df, hn::Div(ss::round_to_t<T>(df, hn::Sub(hi_c, lo_c)), k.bit_range));
    const auto s_zero = hn::Eq(s, k.zero);
    const V shifted =
        ss::round_to_t<T>(df, hn::Sub(k.qmin, ss::round_to_t<T>(df, hn::Div(lo_c, s))));
    c.z = hn::IfThenZeroElse(s_zero, hn::Round(clamp_std(shifted, k.qmin, k.qmax)));
    c.s = hn::IfThenElse(s_zero, k.eps, s);
  } else {
    const V s = ss::round_to_t<T>(df, hn::Div(max_std(hn::Neg(lo_c), hi_c), k.half));
    c.s = hn::IfThenElse(hn::Eq(s, k.zero), k.eps, s);
  }
  c.s = hn::IfThenElse(c.ok, c.s, k.one);
  c.z = hn::IfThenElseZero(c.ok, c.z);
  return c;
}

// symmetric_range of refit.hpp: {-h, h}, h = s * half.
HWY_INLINE void symmetric_range(const Consts& k, const V s, V& lo, V& hi) {
  hi = hn::Mul(s, k.half);
  lo = hn::Neg(hi);
}

// asymmetric_range of refit.hpp for width and zero point z.
template <DType T>
HWY_INLINE void asymmetric_range(const Consts& k, const V width, const V z, V& lo, V& hi) {
  const DF df;
  const V s = ss::round_to_t<T>(df, hn::Div(width, k.bit_range));
  lo = hn::Mul(hn::Sub(k.qmin, z), s);
  hi = hn::Add(lo, width);
}

// refit_scale of refit_steps.hpp.
template <DType T>
HWY_INLINE V refit_scale_of(const V a, const V b) {
  const DF df;
  const auto has = hn::And(hn::Gt(a, hn::Zero(df)), hn::Gt(b, hn::Zero(df)));
  return hn::IfThenElse(has, ss::round_to_t<T>(df, hn::Div(a, b)),
                        hn::Set(df, std::numeric_limits<float>::quiet_NaN()));
}

// The float lanes of the double masks of the two halves.
HWY_INLINE M float_mask(const hn::Mask<DD> m_lo, const hn::Mask<DD> m_hi) {
  const DF df;
  const DH dh;
  const DD dd;
  const VD one = hn::Set(dd, 1.0);
  const V flag = hn::Combine(df, hn::DemoteTo(dh, hn::IfThenElseZero(m_hi, one)),
                             hn::DemoteTo(dh, hn::IfThenElseZero(m_lo, one)));
  return hn::Gt(flag, hn::Zero(df));
}

// NaN where a lane has no candidate, 0 elsewhere, as the two halves of
// double lanes (added to an error, it leaves a number as it is).
HWY_INLINE void none_as_nan(const M ok, VD& lo, VD& hi) {
  const DF df;
  const DH dh;
  const DD dd;
  const V none = hn::IfThenZeroElse(ok, hn::Set(df, std::numeric_limits<float>::quiet_NaN()));
  lo = hn::PromoteTo(dd, hn::LowerHalf(dh, none));
  hi = hn::PromoteTo(dd, hn::UpperHalf(dh, none));
}

// The best candidate of every lane so far: its error, range and sums.
struct Best {
  VD e_lo, e_hi;
  V lo, hi;
  Sums sums;
};

// Best::consider of refit.cpp for every lane with a candidate: replaced
// where the error is strictly lower.
HWY_INLINE void consider(Best& best, const Sums& sums, const Cand& c) {
  VD n_lo, n_hi;
  none_as_nan(c.ok, n_lo, n_hi);
  const VD e_lo = hn::Add(sums.e_lo, n_lo);
  const VD e_hi = hn::Add(sums.e_hi, n_hi);
  const auto m_lo = hn::Lt(e_lo, best.e_lo);
  const auto m_hi = hn::Lt(e_hi, best.e_hi);
  best.e_lo = hn::IfThenElse(m_lo, e_lo, best.e_lo);
  best.e_hi = hn::IfThenElse(m_hi, e_hi, best.e_hi);
  const M better = float_mask(m_lo, m_hi);
  best.lo = hn::IfThenElse(better, c.lo, best.lo);
  best.hi = hn::IfThenElse(better, c.hi, best.hi);
  best.sums.a = hn::IfThenElse(better, sums.a, best.sums.a);
  best.sums.b = hn::IfThenElse(better, sums.b, best.sums.b);
  best.sums.x = hn::IfThenElse(better, sums.x, best.sums.x);
  best.sums.q = hn::IfThenElse(better, sums.q, best.sums.q);
  best.sums.w = hn::IfThenElse(better, sums.w, best.sums.w);
}

// The best predicted refit of every lane so far (Proposals of refit.cpp).
struct BestProposal {
  VD p_lo, p_hi;  // predicted errors, NaN while there is none
  V lo, hi;       // its range
};

// The two halves of a float vector as doubles.
HWY_INLINE void halves(const V v, VD& lo, VD& hi) {
  const DH dh;
  const DD dd;
  lo = hn::PromoteTo(dd, hn::LowerHalf(dh, v));
  hi = hn::PromoteTo(dd, hn::UpperHalf(dh, v));
}

// A float vector from the two halves of doubles, each rounded to float.
HWY_INLINE V to_float(const VD lo, const VD hi) {
  const DF df;
  const DH dh;
  return hn::Combine(df, hn::DemoteTo(dh, hi), hn::DemoteTo(dh, lo));
}

// predicted_error of refit_steps.hpp for one half of the lanes.
HWY_INLINE VD predicted_half(const VD s, const VD z, const VD a, const VD b, const VD x, const VD q,
                             const VD w) {
  const DD dd;
  const VD two = hn::Set(dd, 2.0);
  const VD az = hn::Sub(a, hn::Mul(z, x));
  const VD bz = hn::Add(hn::Sub(b, hn::Mul(hn::Mul(two, z), q)), hn::Mul(hn::Mul(z, z), w));
  return hn::Sub(hn::Mul(hn::Mul(s, s), bz), hn::Mul(hn::Mul(two, s), az));
}

// Proposals::offer of refit.cpp for every lane: the refit whose qparams
// are c (none where c.ok is not set), with the codes of sums s kept.
HWY_INLINE void offer(BestProposal& best, const Cand& c, const Sums& s) {
  VD s_lo, s_hi, z_lo, z_hi, a_lo, a_hi, b_lo, b_hi, x_lo, x_hi, q_lo, q_hi, w_lo, w_hi, n_lo, n_hi;
  halves(c.s, s_lo, s_hi);
  halves(c.z, z_lo, z_hi);
  halves(s.a, a_lo, a_hi);
  halves(s.b, b_lo, b_hi);
  halves(s.x, x_lo, x_hi);
  halves(s.q, q_lo, q_hi);
  halves(s.w, w_lo, w_hi);
  none_as_nan(c.ok, n_lo, n_hi);
  const VD p_lo = hn::Add(predicted_half(s_lo, z_lo, a_lo, b_lo, x_lo, q_lo, w_lo), n_lo);
  const VD p_hi = hn::Add(predicted_half(s_hi, z_hi, a_hi, b_hi, x_hi, q_hi, w_hi), n_hi);
  const auto take_lo =
      hn::Or(hn::Lt(p_lo, best.p_lo), hn::AndNot(hn::IsNaN(p_lo), hn::IsNaN(best.p_lo)));
  const auto take_hi =
      hn::Or(hn::Lt(p_hi, best.p_hi), hn::AndNot(hn::IsNaN(p_hi), hn::IsNaN(best.p_hi)));
  best.p_lo = hn::IfThenElse(take_lo, p_lo, best.p_lo);
  best.p_hi = hn::IfThenElse(take_hi, p_hi, best.p_hi);
  const M take = float_mask(take_lo, take_hi);
  best.lo = hn::IfThenElse(take, c.lo, best.lo);
  best.hi = hn::IfThenElse(take, c.hi, best.hi);
}

// asymmetric_fixed_z of refit_steps.hpp for every lane: the range of zero
// point z with the scale that fits the codes of sums s best.
template <DType T>
HWY_INLINE void fixed_z_range(const Consts& k, const Sums& s, const V z, V& lo, V& hi) {
  const DF df;
  const DD dd;
  VD z_lo, z_hi, a_lo, a_hi, b_lo, b_hi, x_lo, x_hi, q_lo, q_hi, w_lo, w_hi;
  halves(z, z_lo, z_hi);
  halves(s.a, a_lo, a_hi);
  halves(s.b, b_lo, b_hi);
  halves(s.x, x_lo, x_hi);
  halves(s.q, q_lo, q_hi);
  halves(s.w, w_lo, w_hi);
  const VD two = hn::Set(dd, 2.0);
  const VD zero = hn::Zero(dd);
  const auto ratio = [&](VD zd, VD a, VD b, VD x, VD q, VD w) HWY_ATTR {
    const VD az = hn::Sub(a, hn::Mul(zd, x));
    const VD bz = hn::Add(hn::Sub(b, hn::Mul(hn::Mul(two, zd), q)), hn::Mul(hn::Mul(zd, zd), w));
    const auto has = hn::And(hn::Gt(az, zero), hn::Gt(bz, zero));
    return hn::IfThenElse(has, hn::Div(az, bz),
                          hn::Set(dd, std::numeric_limits<double>::quiet_NaN()));
  };
  const V sf = to_float(ratio(z_lo, a_lo, b_lo, x_lo, q_lo, w_lo),
                        ratio(z_hi, a_hi, b_hi, x_hi, q_hi, w_hi));
  asymmetric_range<T>(k, ss::round_to_t<T>(df, hn::Mul(sf, k.bit_range)), z, lo, hi);
}

// asymmetric_fit of refit_steps.hpp for every lane (none where ok is not
// set): the line x = s q + c fitted to the codes of sums s, its zero point
// rounded, then fixed_z_range.
template <DType T>
HWY_INLINE void fit_range(const Consts& k, const Sums& s, const M ok, V& lo, V& hi) {
  const DD dd;
  VD a_lo, a_hi, b_lo, b_hi, x_lo, x_hi, q_lo, q_hi, w_lo, w_hi;
  halves(s.a, a_lo, a_hi);
  halves(s.b, b_lo, b_hi);
  halves(s.x, x_lo, x_hi);
  halves(s.q, q_lo, q_hi);
  halves(s.w, w_lo, w_hi);
  const VD zlo = hn::Set(dd, static_cast<double>(hn::GetLane(k.qmin)) - 1.0);
  const VD zhi = hn::Set(dd, static_cast<double>(hn::GetLane(k.qmax)) + 1.0);
  const VD zero = hn::Zero(dd);
  const VD nan = hn::Set(dd, std::numeric_limits<double>::quiet_NaN());
  const auto zero_point = [&](VD a, VD b, VD x, VD q, VD w) HWY_ATTR {
    const VD var = hn::Sub(hn::Mul(b, w), hn::Mul(q, q));
    const VD cov = hn::Sub(hn::Mul(a, w), hn::Mul(x, q));
    const auto has = hn::And(hn::And(hn::Gt(var, zero), hn::Gt(cov, zero)), hn::Gt(w, zero));
    const VD scale = hn::Div(cov, var);
    const VD zd = hn::Div(hn::Sub(hn::Mul(scale, q), x), hn::Mul(w, scale));
    // std::clamp in double.
    const VD zc = hn::IfThenElse(hn::Lt(zd, zlo), zlo, hn::IfThenElse(hn::Lt(zhi, zd), zhi, zd));
    return hn::IfThenElse(has, zc, nan);
  };
  const V zf =
      to_float(zero_point(a_lo, b_lo, x_lo, q_lo, w_lo), zero_point(a_hi, b_hi, x_hi, q_hi, w_hi));
  V z = clamp_std(hn::Round(zf), k.qmin, k.qmax);
  z = hn::IfThenElse(ok, z, hn::Set(DF(), std::numeric_limits<float>::quiet_NaN()));
  fixed_z_range<T>(k, s, z, lo, hi);
}

// refit_lloyd of refit.cpp for every lane: from the best proposal (lo, hi),
// evaluate, refit (next: the ranges of the refits of a candidate's sums),
// `refits` times, each lane until its refit gives the qparams it came from.
template <DType T, bool kAsym, class Evaluate, class Next>
HWY_INLINE void lloyd(const Consts& k, std::uint32_t refits, V lo, V hi, Best& best,
                      const Evaluate& evaluate, const Next& next) {
  const DF df;
  M alive = hn::Eq(k.zero, k.zero);
  Cand last{};
  for (std::uint32_t i = 0; i < refits; ++i) {
    const Cand c0 = candidate_of<T>(k, kAsym, lo, hi);
    alive = hn::And(alive, c0.ok);
    if (i > 0) {
      alive = hn::AndNot(hn::And(hn::Eq(c0.s, last.s), hn::Eq(c0.z, last.z)), alive);
    }
    if (hn::AllFalse(df, alive)) return;
    Cand c = c0;
    c.ok = alive;
    const Sums s = evaluate(c);
    consider(best, s, c);
    last = c;
    next(c, s, lo, hi);
  }
}

template <DType T, bool kX2>
void refit_symmetric_set(const QuantArgs& args, const RefitParams& p, const float* xt,
                         std::size_t g, const Consts& k, Best& best) {
  const DF df;
  const V nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  // The refit of candidate c with sums s (none where c is none).
  const auto refit = [&](const Cand& c, const Sums& s, V& lo, V& hi) HWY_ATTR {
    symmetric_range(k, hn::IfThenElse(c.ok, refit_scale_of<T>(s.a, s.b), nan), lo, hi);
  };
  BestProposal proposal{hn::Set(DD(), std::numeric_limits<double>::quiet_NaN()),
                        hn::Set(DD(), std::numeric_limits<double>::quiet_NaN()), nan, nan};
  const auto offer_refit = [&](const Cand& c, const Sums& s) HWY_ATTR {
    V lo, hi;
    refit(c, s, lo, hi);
    offer(proposal, candidate_of<T>(k, false, lo, hi), s);
  };
  // min-max: every lane's first candidate, its range as observed.
  const Cand c0 = candidate_of<T>(k, false, best.lo, best.hi);
  const Sums s0 = pass<T, false, true, kX2>(xt, g, c0.s, k.zero, k.qmin, k.qmax);
  best.e_lo = s0.e_lo;
  best.e_hi = s0.e_hi;
  offer_refit(c0, s0);
  for (std::uint32_t i = 0; p.steps > 0 && i <= p.steps; ++i) {
    const float f = refit_factor(p, args, i);
    if (f == 1.0f) continue;
    V lo, hi;
    symmetric_range(k, ss::round_to_t<T>(df, hn::Mul(c0.s, hn::Set(df, f))), lo, hi);
    const Cand c = candidate_of<T>(k, false, lo, hi);
    const Sums s = pass<T, false, true, kX2>(xt, g, c.s, k.zero, k.qmin, k.qmax);
    consider(best, s, c);
    offer_refit(c, s);
  }
  lloyd<T, false>(
      k, p.refits, proposal.lo, proposal.hi, best,
      [&](const Cand& c)
          HWY_ATTR { return pass<T, false, true, kX2>(xt, g, c.s, k.zero, k.qmin, k.qmax); },
      refit);
}

template <DType T, bool kX2>
void refit_asymmetric_set(const QuantArgs& args, const RefitParams& p, const HqqSchedule& hqq_sched,
                          const float* xt, std::size_t g, const Consts& k, Best& best) {
  const DF df;
  const Cand c0 = candidate_of<T>(k, true, best.lo, best.hi);
  best.sums = pass<T, true, true, kX2, true>(xt, g, c0.s, c0.z, k.qmin, k.qmax);
  // Every other candidate's evaluation, with sum w x and sum w of the first.
  const V sum_x = best.sums.x;
  const V sum_w = best.sums.w;
  const auto evaluate = [&](const Cand& c) HWY_ATTR {
    Sums s = pass<T, true, true, kX2>(xt, g, c.s, c.z, k.qmin, k.qmax);
    s.x = sum_x;
    s.w = sum_w;
    return s;
  };
  best.e_lo = best.sums.e_lo;
  best.e_hi = best.sums.e_hi;
  const V lo0 = best.lo;
  const V hi0 = best.hi;
  const V nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  BestProposal proposal{hn::Set(DD(), std::numeric_limits<double>::quiet_NaN()),
                        hn::Set(DD(), std::numeric_limits<double>::quiet_NaN()), nan, nan};
  const auto refit = [&](const Cand& c, const Sums& s, V& lo, V& hi)
                         HWY_ATTR { fit_range<T>(k, s, c.ok, lo, hi); };
  const auto offer_fit = [&](const Cand& c, const Sums& s) HWY_ATTR {
    V lo, hi;
    refit(c, s, lo, hi);
    offer(proposal, candidate_of<T>(k, true, lo, hi), s);
  };
  offer_fit(c0, best.sums);
  for (std::uint32_t i = 0; p.steps > 0 && i <= p.steps; ++i) {
    const float f = refit_factor(p, args, i);
    if (f == 1.0f) continue;
    const V vf = hn::Set(df, f);
    const Cand c = candidate_of<T>(k, true, ss::round_to_t<T>(df, hn::Mul(lo0, vf)),
                                   ss::round_to_t<T>(df, hn::Mul(hi0, vf)));
    const Sums s = evaluate(c);
    consider(best, s, c);
    offer_fit(c, s);
  }
  lloyd<T, true>(k, p.refits, proposal.lo, proposal.hi, best, evaluate, refit);
  // HQQ at the best scale so far, every lane at once (lanes whose 1 / s is
  // not finite take no part, as in the reference).
  const Cand cb = candidate_of<T>(k, true, best.lo, best.hi);
  const V width =
      ss::round_to_t<T>(df, hn::Sub(max_std(best.hi, k.zero), min_std(best.lo, k.zero)));
  const V s = cb.s;
  const V inv = hn::Div(k.one, s);
  const M hqq = hn::IsFinite(inv);
  const V pm1 = hn::Set(df, static_cast<float>(p.p - 1.0));
  const V count = hn::Set(df, static_cast<float>(g));
  V z = cb.z;
  V last = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  // Lanes still iterating (a lane that has converged would repeat itself:
  // HqqSchedule says why; the reference stops there).
  M active = hqq;
  const V min_cut = hn::Set(df, hqq_sched.min_cut);
  for (std::uint32_t it = 0; it < p.iters && !hn::AllFalse(df, active); ++it) {
    const V before = z;
    V max_r;
    z = hn::Div(hqq_iteration(xt, g, s, inv, z, k.qmin, k.qmax, hn::Set(df, hqq_sched.inv_beta[it]),
                              pm1, hn::Set(df, hqq_sched.cut[it]), max_r),
                count);
    const V zr = hn::Min(hn::Max(hn::Round(z), k.qmin), k.qmax);
    const M fresh = hn::AndNot(hn::Eq(zr, last), active);
    last = hn::IfThenElse(fresh, zr, last);
    active = hn::AndNot(hn::And(hn::Eq(z, before), hn::Lt(max_r, min_cut)), active);
    V lo, hi;
    asymmetric_range<T>(k, width, zr, lo, hi);
    Cand c = candidate_of<T>(k, true, lo, hi);
    c.ok = hn::And(c.ok, fresh);
    if (hn::AllFalse(df, c.ok)) continue;
    consider(best, evaluate(c), c);
  }
  // The closed-form scale with the best zero point fixed.
  const Cand cz = candidate_of<T>(k, true, best.lo, best.hi);
  V lo, hi;
  fixed_z_range<T>(k, best.sums, cz.z, lo, hi);
  const Cand c = candidate_of<T>(k, true, lo, hi);
  if (hn::AllFalse(df, c.ok)) return;
  consider(best, pass<T, true, false, kX2>(xt, g, c.s, c.z, k.qmin, k.qmax), c);
}

template <DType T>
void refit_t(const RefitSearch& m) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  const GroupLayout& layout = *m.layout;
  const std::size_t g = layout.group;
  const Candidate proto = candidate(*m.args, T, 0.0f, 0.0f);
  Consts k;
  k.qmin = hn::Set(df, proto.qmin);
  k.qmax = hn::Set(df, proto.qmax);
  k.bit_range = hn::Set(df, proto.qmax - proto.qmin);
  k.half = hn::Set(df, (proto.qmax - proto.qmin) / 2.0f);
  k.eps = hn::Set(df, dtype_eps(T));
  k.zero = hn::Zero(df);
  k.one = hn::Set(df, 1.0f);
  const bool x2 = m.params->weight_x2;
  auto xt = hwy::AllocateAligned<float>(g * n);
  auto lane_buf = hwy::AllocateAligned<float>(n);
  const HqqSchedule hqq = hqq_schedule(*m.params);
  for (std::uint64_t set = 0; set < layout.n_groups; set += n) {
    const std::size_t valid =
        static_cast<std::size_t>(std::min<std::uint64_t>(n, layout.n_groups - set));
    load_set<T>(m, set, xt.get());
    // min_element and max_element of the reference: the first extreme.
    Best best;
    best.lo = hn::Load(df, xt.get());
    best.hi = best.lo;
    for (std::size_t j = 1; j < g; ++j) {
      const V v = hn::Load(df, xt.get() + j * n);
      best.lo = min_std(best.lo, v);
      best.hi = max_std(best.hi, v);
    }
    best.sums.a = best.sums.b = best.sums.x = best.sums.q = best.sums.w = k.zero;
    if (proto.asymmetric) {
      x2 ? refit_asymmetric_set<T, true>(*m.args, *m.params, hqq, xt.get(), g, k, best)
         : refit_asymmetric_set<T, false>(*m.args, *m.params, hqq, xt.get(), g, k, best);
    } else {
      x2 ? refit_symmetric_set<T, true>(*m.args, *m.params, xt.get(), g, k, best)
         : refit_symmetric_set<T, false>(*m.args, *m.params, xt.get(), g, k, best);
    }
    hn::Store(best.lo, df, lane_buf.get());
    for (std::size_t l = 0; l < valid; ++l) m.ranges[2 * (set + l)] = lane_buf[l];
    hn::Store(best.hi, df, lane_buf.get());
    for (std::size_t l = 0; l < valid; ++l) m.ranges[2 * (set + l) + 1] = lane_buf[l];
  }
}

bool refit_search(const RefitSearch& m) {
  if (m.w == DType::kBF16) {
    refit_t<DType::kBF16>(m);
  } else {
    refit_t<DType::kF16>(m);
  }
  return true;
}

#elif CTQUANT_SIMD_KERNEL_TARGET
bool refit_search(const RefitSearch&) { return false; }
#endif  // CTQUANT_SIMD_KERNEL_TARGET
}  // namespace ctquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ctquant {
namespace detail {
namespace {
using RefitSearchFn = bool(const RefitSearch&);
constexpr SimdEntry<RefitSearchFn> kRefitSearch[] = CTQUANT_SIMD_TABLE(refit_search);
}  // namespace

bool observe_refit_at(const SimdLevel& level, const QuantArgs& args, const RefitParams& params,
                      const ObserveIo& io) {
  RefitSearchFn* fn = simd_entry(kRefitSearch, level);
  if (fn == nullptr || (io.dtype != DType::kBF16 && io.dtype != DType::kF16) ||
      args.type != QuantArgs::Type::kInt ||
      (args.strategy != QuantArgs::Strategy::kGroup &&
       args.strategy != QuantArgs::Strategy::kChannel)) {
    return false;
  }
  const GroupLayout layout = group_layout(args, io.n_rows, io.n_cols);
  if (layout.group == 0 || layout.group > (std::uint64_t{1} << 16)) return false;
  return fn(RefitSearch{&args, &params, &layout, io.dtype, io.weight, io.ranges});
}

}  // namespace detail

void observe_refit(const QuantArgs& args, const RefitParams& params, const ObserveIo& io) {
  if (!detail::observe_refit_at(detail::simd_best_level(), args, params, io)) {
    observe_refit_ref(args, params, io);
  }
}

}  // namespace ctquant
#endif  // HWY_ONCE
