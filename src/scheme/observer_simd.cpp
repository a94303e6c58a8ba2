// The vector kernel of the MSE observer's search (scheme/observer.hpp), one
// Highway source compiled for every level of simd_levels()
// (simd_dispatch.hpp says how). It computes exactly what
// observe_ranges_ref() computes, lane by lane, with the same IEEE
// operations, for BF16 and F16 weights whose scale groups are groups of
// columns (strategy group or tensor_group); other inputs run the reference.
//
// Layout: one lane per scale group. A set of Lanes() groups is transposed
// once (vector j holds element j of every group of the set), then for every
// candidate:
// - the candidate's scale and zero point per lane, as candidate() computes
//   them (the divisions are vector divisions, correctly rounded like the
//   scalar ones; MX exponents through the scalar mx_scale per lane);
// - v = round_W(w / s) as round_W(w * float32(1 / s)): for W values w and s
//   (8- or 11-bit significands) the quotient is exact or at least 2^-23
//   relative away from every point where rounding to W changes, farther
//   than the 2^-24 error of the product, so both round to the same value;
//   scales below 2^-100 (whose reciprocal could overflow) take the division;
// - the E4M3 and E2M1 roundings by adding and subtracting the constant whose
//   float ulp is the grid step (nearest even, as the float addition rounds),
//   the E4M3 normal range by rounding the float's bits to 3 mantissa bits;
// - |Q - W| of every element of the set is stored first, then raised to the
//   norm in a loop of its own (pow_terms): from the same table as the
//   reference (a gather); for BF16 at AVX-512 from two tables of at most 128
//   floats held in registers (pow_reg: a few permutes, about a sixth of a
//   gather's time), the rare lanes it flags from the table; for norms 2 and
//   (BF16) 3 by the products PyTorch computes. The separate loop lets the
//   CPU overlap the lookups, whose iterations are independent (about 20%
//   less CPU time than one loop);
// - the group's sum by the same additions in the same order as the reference
//   (torch_sum_program), as vector additions of whole slots.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "scheme/observer_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/simd_dispatch.hpp"
#include "simd/simd_steps-inl.h"

#ifndef CTQUANT_SCHEME_OBSERVER_SIMD_ONCE
#define CTQUANT_SCHEME_OBSERVER_SIMD_ONCE

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <hwy/aligned_allocator.h>

#include "ctquant/scheme/observer.hpp"
#include "scheme/kernel_steps.hpp"
#include "scheme/observer_steps.hpp"

namespace ctquant::detail {

// What one call of the vector search needs.
struct MseSearch {
  const QuantArgs* args = nullptr;
  const ObserverParams* params = nullptr;
  std::uint32_t cutoff = 0;
  const GroupLayout* layout = nullptr;
  DType w = DType::kBF16;
  const std::byte* weight = nullptr;
  float* ranges = nullptr;
  ImprovedSteps* improved = nullptr;
  const PowTable* table = nullptr;
  const SumProgram* program = nullptr;
  // How |d|^norm is computed: from the table (a gather), or as PyTorch
  // computes exponents 2 (x * x) and 3 (BF16: x * x * x, rounded after each
  // product), as pow_w does.
  // kRegister: BF16 at AVX-512, from PowRegTables (pow_reg below) with the
  // table for the lanes it flags.
  enum class Pow : std::uint8_t { kTable, kSquare, kCube, kRegister };
  Pow pow = Pow::kTable;
  const struct PowRegTables* reg = nullptr;
};

// x^e for BF16 magnitudes x = 2^E m (m = 1 + j / 128) and e = round_BF16(norm)
// = num / 2^log2p: x^e = 2^I 2^(r / 2^log2p) m^e with num E = I 2^log2p + r,
// 0 <= r < 2^log2p. pow_reg computes z = mant[j] * frac[r] (each correctly
// rounded, so z is within 2 float ulps of 2^(r/P) m^e), adds I to z's
// exponent and rounds to BF16: the value PyTorch gives (the correctly rounded
// float, rounded to BF16) unless z lies within 8 float ulps of a BF16
// rounding midpoint, or the result or x is not a normal float; those lanes
// are flagged and take pow_table. Both tables (at most 128 floats each) sit
// in vector registers, so a lookup is a few permutes instead of a gather.
// Used only when pow_reg_check found, for every BF16 magnitude it does not
// flag, the value of pow_table.
struct PowRegTables {
  alignas(64) float mant[128] = {};
  alignas(64) float frac[128] = {};
  std::int32_t num = 0;
  int log2p = 0;
  std::uint32_t flagged = 0;  // magnitudes pow_reg leaves to the table (of 32,640)
  bool exact = false;         // every other magnitude gives pow_table's value
};

// What one call of the int codes kernel needs.
struct IntCodes {
  const QuantArgs* args = nullptr;
  DType w = DType::kBF16;
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;
  std::uint64_t group = 0;
  const std::byte* weight = nullptr;
  const float* ranges = nullptr;
  std::int8_t* codes = nullptr;   // n_rows * n_cols
  std::byte* scale = nullptr;     // per group, W
  std::int8_t* zero_point = nullptr;  // per group (asymmetric)
};


}  // namespace ctquant::detail

#endif  // CTQUANT_SCHEME_OBSERVER_SIMD_ONCE

HWY_BEFORE_NAMESPACE();
namespace ctquant::detail::HWY_NAMESPACE {
#if CTQUANT_SIMD_KERNEL_TARGET

namespace hn = hwy::HWY_NAMESPACE;
namespace ss = ctquant::simd_steps::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3
// The 128-entry lookup of t (eight registers) at the low 7 bits of j.
HWY_INLINE __m512 lookup128(const __m512* t, __m512i j) {
  const __m512 a0 = _mm512_permutex2var_ps(t[0], j, t[1]);
  const __m512 a1 = _mm512_permutex2var_ps(t[2], j, t[3]);
  const __m512 a2 = _mm512_permutex2var_ps(t[4], j, t[5]);
  const __m512 a3 = _mm512_permutex2var_ps(t[6], j, t[7]);
  const __mmask16 b5 = _mm512_test_epi32_mask(j, _mm512_set1_epi32(32));
  const __mmask16 b6 = _mm512_test_epi32_mask(j, _mm512_set1_epi32(64));
  return _mm512_mask_blend_ps(b6, _mm512_mask_blend_ps(b5, a0, a1),
                              _mm512_mask_blend_ps(b5, a2, a3));
}

// pow_reg (PowRegTables) for 16 magnitudes ad; bad gets the lanes that take
// the table. mant and frac: the tables loaded into registers.
HWY_INLINE __m512 pow_reg(const PowRegTables& t, const __m512* mant, const __m512* frac, __m512 ad,
                          __mmask16& bad) {
  const __m512i bits = _mm512_castps_si512(ad);
  const __m512i ef = _mm512_srli_epi32(bits, 23);
  const __m512i j = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(127));
  const __m512i ne = _mm512_mullo_epi32(_mm512_sub_epi32(ef, _mm512_set1_epi32(127)),
                                        _mm512_set1_epi32(t.num));
  const __m512i i = _mm512_srai_epi32(ne, static_cast<unsigned>(t.log2p));
  const __m512i r = _mm512_and_si512(ne, _mm512_set1_epi32((1 << t.log2p) - 1));
  const __m512 b = t.log2p <= 5 ? _mm512_permutex2var_ps(frac[0], r, frac[1]) : lookup128(frac, r);
  const __m512i z = _mm512_castps_si512(_mm512_mul_ps(lookup128(mant, j), b));
  const __m512i exp_out = _mm512_add_epi32(_mm512_srli_epi32(z, 23), i);
  const __m512i y = _mm512_add_epi32(z, _mm512_slli_epi32(i, 23));
  // Within 8 float ulps of a BF16 midpoint (low half 0x8000).
  const __m512i low = _mm512_sub_epi32(_mm512_and_si512(y, _mm512_set1_epi32(0xFFFF)),
                                       _mm512_set1_epi32(0x8000 - 8));
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(bits, _mm512_setzero_si512());
  bad = _mm512_cmple_epu32_mask(low, _mm512_set1_epi32(16)) |
        _mm512_cmplt_epi32_mask(exp_out, _mm512_set1_epi32(1)) |
        _mm512_cmpgt_epi32_mask(exp_out, _mm512_set1_epi32(254)) |
        _mm512_cmpeq_epi32_mask(ef, _mm512_setzero_si512());
  bad &= static_cast<__mmask16>(~zero);
  // Round to BF16, nearest even.
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(y, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(
      _mm512_add_epi32(y, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))),
      _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  return _mm512_castsi512_ps(_mm512_maskz_mov_epi32(static_cast<__mmask16>(~zero), rounded));
}

HWY_INLINE void load_reg_tables(const PowRegTables& t, __m512* mant, __m512* frac) {
  for (int k = 0; k < 8; ++k) {
    mant[k] = _mm512_load_ps(t.mant + 16 * k);
    frac[k] = _mm512_load_ps(t.frac + 16 * k);
  }
}
#endif

// Sets t.exact and t.flagged: pow_reg against pow_table on every finite
// BF16 magnitude (AVX-512 only; elsewhere t.exact stays false).
void pow_reg_check(PowRegTables& t, const PowTable& table) {
#if HWY_TARGET == HWY_AVX3
  __m512 mant[8];
  __m512 frac[8];
  load_reg_tables(t, mant, frac);
  alignas(64) float in[16];
  alignas(64) float out[16];
  t.exact = true;
  t.flagged = 0;
  for (std::uint32_t b0 = 0; b0 < 0x7F80u; b0 += 16) {
    for (std::uint32_t l = 0; l < 16; ++l) in[l] = bf16_to_float(static_cast<std::uint16_t>(b0 + l));
    __mmask16 bad = 0;
    _mm512_store_ps(out, pow_reg(t, mant, frac, _mm512_load_ps(in), bad));
    for (std::uint32_t l = 0; l < 16; ++l) {
      if (((bad >> l) & 1u) != 0) {
        ++t.flagged;
      } else if (std::bit_cast<std::uint32_t>(out[l]) !=
                 std::bit_cast<std::uint32_t>(table.value[b0 + l])) {
        t.exact = false;
      }
    }
  }
#else
  (void)table;
  t.exact = false;
#endif
}

// terms[j] = |d_j|^norm for the n vectors of |d| at terms, in place (the
// value pow_table gives).
template <DType T, class DF>
HWY_INLINE void pow_terms(DF df, const MseSearch& m, float* terms, std::size_t n) {
  using V = hn::Vec<DF>;
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  const std::size_t n_lanes = hn::Lanes(df);
  const auto from_table = [&](V ad) {  // pow_table's value of |d|
    hn::Vec<decltype(du)> index;
    if constexpr (T == DType::kBF16) {
      index = hn::ShiftRight<16>(hn::BitCast(du, ad));
    } else {
      const hn::Rebind<hwy::float16_t, DF> df16;
      const hn::Rebind<std::uint16_t, DF> du16;
      index = hn::PromoteTo(du, hn::BitCast(du16, hn::DemoteTo(df16, ad)));
    }
    return hn::GatherIndex(df, m.table->value.data(), hn::BitCast(di, index));
  };
  switch (m.pow) {
    case MseSearch::Pow::kSquare:
      for (std::size_t j = 0; j < n; ++j) {
        const V ad = hn::Load(df, terms + j * n_lanes);
        hn::Store(ss::round_to_t<T>(df, hn::Mul(ad, ad)), df, terms + j * n_lanes);
      }
      return;
    case MseSearch::Pow::kCube:
      for (std::size_t j = 0; j < n; ++j) {
        const V ad = hn::Load(df, terms + j * n_lanes);
        hn::Store(ss::round_to_t<T>(df, hn::Mul(ss::round_to_t<T>(df, hn::Mul(ad, ad)), ad)), df,
                  terms + j * n_lanes);
      }
      return;
    case MseSearch::Pow::kTable:
      for (std::size_t j = 0; j < n; ++j) {
        hn::Store(from_table(hn::Load(df, terms + j * n_lanes)), df, terms + j * n_lanes);
      }
      return;
    case MseSearch::Pow::kRegister:
#if HWY_TARGET == HWY_AVX3
      if constexpr (T == DType::kBF16) {
        __m512 mant[8];
        __m512 frac[8];
        load_reg_tables(*m.reg, mant, frac);
        for (std::size_t j = 0; j < n; ++j) {
          const __m512 ad = _mm512_load_ps(terms + j * n_lanes);
          __mmask16 bad = 0;
          __m512 pw = pow_reg(*m.reg, mant, frac, ad, bad);
          if (HWY_UNLIKELY(bad != 0)) {
            pw = _mm512_mask_mov_ps(pw, bad, from_table(V{ad}).raw);
          }
          _mm512_store_ps(terms + j * n_lanes, pw);
        }
        return;
      }
#endif
      for (std::size_t j = 0; j < n; ++j) {
        hn::Store(from_table(hn::Load(df, terms + j * n_lanes)), df, terms + j * n_lanes);
      }
      return;
  }
}

template <DType T>
void search_t(const MseSearch& m) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  using V = hn::Vec<decltype(df)>;
  const std::size_t n_lanes = hn::Lanes(df);
  const GroupLayout& layout = *m.layout;
  const QuantArgs& args = *m.args;
  const std::size_t g = layout.group;
  const std::size_t esize = T == DType::kF32 ? 4 : 2;
  const SumProgram& program = *m.program;

  // The candidate's constants (candidate() in observer_steps.hpp).
  const Candidate proto = candidate(args, T, 0.0f, 0.0f);
  const bool mx = is_mx(args);
  const bool asym = proto.asymmetric;
  const float bit_range = proto.qmax - proto.qmin;
  const V qmin = hn::Set(df, proto.qmin);
  const V qmax = hn::Set(df, proto.qmax);
  const V zero = hn::Zero(df);
  const V eps = hn::Set(df, dtype_eps(T));
  const V expand = hn::Set(df, static_cast<float>(m.params->expand));
  const float start_error = T == DType::kBF16 ? 0x1.FEp127f : 65504.0f;

  auto xt = hwy::AllocateAligned<float>(g * n_lanes);
  auto slots = hwy::AllocateAligned<float>(std::size_t{program.slots} * n_lanes);
  auto lane_buf = hwy::AllocateAligned<float>(n_lanes);
  const std::uint32_t steps = m.params->steps();

  for (std::uint64_t set = 0; set < layout.n_groups; set += n_lanes) {
    const std::size_t valid = static_cast<std::size_t>(
        std::min<std::uint64_t>(n_lanes, layout.n_groups - set));
    // Transpose the set (a group's columns are contiguous); missing lanes
    // hold zeros.
    for (std::size_t lane = 0; lane < n_lanes; ++lane) {
      if (lane >= valid) {
        for (std::size_t j = 0; j < g; ++j) xt[j * n_lanes + lane] = 0.0f;
        continue;
      }
      const std::uint64_t group = set + lane;
      const std::byte* p =
          m.weight + (group / layout.per_row * layout.n_cols + group % layout.per_row * g) * esize;
      for (std::size_t j = 0; j < g; ++j) {
        std::uint16_t b = 0;
        std::memcpy(&b, p + j * esize, 2);
        xt[j * n_lanes + lane] = T == DType::kBF16 ? bf16_to_float(b) : f16_to_float(b);
      }
    }
    V lo = hn::Load(df, xt.get());
    V hi = lo;
    for (std::size_t j = 1; j < g; ++j) {
      const V v = hn::Load(df, xt.get() + j * n_lanes);
      lo = hn::Min(lo, v);
      hi = hn::Max(hi, v);
    }
    const V lo0 = ss::round_to_t<T>(df, hn::Mul(lo, expand));
    const V hi0 = ss::round_to_t<T>(df, hn::Mul(hi, expand));
    V best = hn::Set(df, start_error);
    V best_lo = lo0;
    V best_hi = hi0;
    const auto valid_mask = hn::FirstN(df, valid);

    for (std::uint32_t i = 0; i <= m.cutoff && i < steps; ++i) {
      const V p = hn::Set(df, static_cast<float>(1.0 - static_cast<double>(i) / m.params->grid));
      const V clo = ss::round_to_t<T>(df, hn::Mul(lo0, p));
      const V chi = ss::round_to_t<T>(df, hn::Mul(hi0, p));
      const V lo_c = hn::Min(clo, zero);
      const V hi_c = hn::Max(chi, zero);
      V s;
      V z = zero;
      if (asym) {
        s = ss::round_to_t<T>(
            df, hn::Div(ss::round_to_t<T>(df, hn::Sub(hi_c, lo_c)), hn::Set(df, bit_range)));
        const auto s_zero = hn::Eq(s, zero);
        const V shifted =
            ss::round_to_t<T>(df, hn::Sub(qmin, ss::round_to_t<T>(df, hn::Div(lo_c, s))));
        z = hn::IfThenZeroElse(s_zero, hn::Round(hn::Min(hn::Max(shifted, qmin), qmax)));
        s = hn::IfThenElse(s_zero, eps, s);
      } else {
        const V amax = hn::Max(hn::Neg(lo_c), hi_c);
        if (mx) {
          hn::Store(amax, df, lane_buf.get());
          const int offset =
              args.num_bits == 4 ? microscale::kMxfp4Offset : microscale::kMxfp8Offset;
          for (std::size_t lane = 0; lane < n_lanes; ++lane) {
            lane_buf[lane] = microscale::mx_scale(T, lane_buf[lane], offset).scale;
          }
          s = hn::Load(df, lane_buf.get());
        } else {
          s = ss::round_to_t<T>(df, hn::Div(amax, hn::Set(df, bit_range / 2.0f)));
          s = hn::IfThenElse(hn::Eq(s, zero), eps, s);
        }
      }
      const bool divide = !hn::AllTrue(df, hn::Ge(s, hn::Set(df, 0x1p-100f)));
      const V inv = hn::Div(hn::Set(df, 1.0f), s);

      for (std::size_t j = 0; j < g; ++j) {
        const V xv = hn::Load(df, xt.get() + j * n_lanes);
        V v = ss::round_to_t<T>(df, divide ? hn::Div(xv, s) : hn::Mul(xv, inv));
        if (asym) v = ss::round_to_t<T>(df, hn::Add(v, z));
        v = hn::Min(hn::Max(v, qmin), qmax);
        V q;
        switch (proto.kind) {
          case Candidate::Kind::kInt:
            q = hn::Round(v);
            break;
          case Candidate::Kind::kFp8: {
            const V a = hn::Abs(v);
            const auto u = hn::BitCast(du, a);
            const auto lsb = hn::And(hn::ShiftRight<20>(u), hn::Set(du, 1u));
            const V normal = hn::BitCast(
                df, hn::And(hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7FFFFu))),
                            hn::Set(du, 0xFFF00000u)));
            const V c = hn::Set(df, 0x1p14f);
            const V sub = hn::Sub(hn::Add(a, c), c);
            q = hn::CopySign(hn::IfThenElse(hn::Lt(a, hn::Set(df, 0x1p-6f)), sub, normal), v);
            break;
          }
          case Candidate::Kind::kFp4: {
            const V a = hn::Abs(v);
            const V c = hn::IfThenElse(
                hn::Lt(a, hn::Set(df, 2.0f)), hn::Set(df, 0x1p22f),
                hn::IfThenElse(hn::Lt(a, hn::Set(df, 4.0f)), hn::Set(df, 0x1p23f),
                               hn::Set(df, 0x1p24f)));
            q = hn::CopySign(hn::Sub(hn::Add(a, c), c), v);
            break;
          }
        }
        const V dq = asym ? ss::round_to_t<T>(
                                df, hn::Mul(ss::round_to_t<T>(df, hn::Sub(q, z)), s))
                          : ss::round_to_t<T>(df, hn::Mul(q, s));
        const V d = ss::round_to_t<T>(df, hn::Sub(dq, xv));
        hn::Store(hn::Abs(d), df, slots.get() + j * n_lanes);
      }
      pow_terms<T>(df, m, slots.get(), g);
      for (const SumStep& step : program.steps) {
        hn::Store(hn::Add(hn::Load(df, slots.get() + std::size_t{step.a} * n_lanes),
                          hn::Load(df, slots.get() + std::size_t{step.b} * n_lanes)),
                  df, slots.get() + std::size_t{step.dst} * n_lanes);
      }
      const V err = program.result < 0
                        ? zero
                        : ss::round_to_t<T>(
                              df, hn::Load(df, slots.get() +
                                                   static_cast<std::size_t>(program.result) *
                                                       n_lanes));
      const auto improved = hn::And(hn::Lt(err, best), valid_mask);
      if (!hn::AllFalse(df, improved)) {
        best = hn::IfThenElse(improved, err, best);
        best_lo = hn::IfThenElse(improved, clo, best_lo);
        best_hi = hn::IfThenElse(improved, chi, best_hi);
        if (m.improved != nullptr) (*m.improved)[i / 64] |= std::uint64_t{1} << (i % 64);
      }
    }
    hn::Store(best_lo, df, lane_buf.get());
    for (std::size_t lane = 0; lane < valid; ++lane) m.ranges[2 * (set + lane)] = lane_buf[lane];
    hn::Store(best_hi, df, lane_buf.get());
    for (std::size_t lane = 0; lane < valid; ++lane) {
      m.ranges[2 * (set + lane) + 1] = lane_buf[lane];
    }
  }
}

// Integer codes and scales of rows whose ranges an observer chose
// (int-packed with an MSE observer): per group the candidate's scale and
// zero point (candidate(), the same as quantize_block_ref's from lo, hi),
// then v = round_W(w * float32(1 / s)) for BF16 and F16 (as in search_t;
// F32: w / s), + z, clamp, round half to even. Group sizes that are multiples of the lane count.
template <DType T>
void int_codes_t(const IntCodes& k) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<std::int8_t, decltype(df)> d8;
  using V = hn::Vec<decltype(df)>;
  const std::size_t n_lanes = hn::Lanes(df);
  const std::size_t esize = T == DType::kF32 ? 4 : 2;
  const Candidate proto = candidate(*k.args, T, 0.0f, 0.0f);
  const V qmin = hn::Set(df, proto.qmin);
  const V qmax = hn::Set(df, proto.qmax);
  const std::uint64_t groups = k.n_cols / k.group;
  for (std::uint64_t r = 0; r < k.n_rows; ++r) {
    for (std::uint64_t gi = 0; gi < groups; ++gi) {
      const std::uint64_t idx = r * groups + gi;
      const Candidate c = candidate(*k.args, T, k.ranges[2 * idx], k.ranges[2 * idx + 1]);
      store_scale(T, c.s, k.scale + idx * esize);
      if (c.asymmetric) k.zero_point[idx] = static_cast<std::int8_t>(c.z);
      const V s = hn::Set(df, c.s);
      const V z = hn::Set(df, c.z);
      // F32 weights: no W rounding to absorb the product's error, divide.
      const bool divide = T == DType::kF32 || !(c.s >= 0x1p-100f);
      const V inv = hn::Set(df, 1.0f / c.s);
      const std::byte* row = k.weight + (r * k.n_cols + gi * k.group) * esize;
      std::int8_t* out = k.codes + r * k.n_cols + gi * k.group;
      for (std::uint64_t j = 0; j < k.group; j += n_lanes) {
        const V x = ss::load_as_float<T>(df, row + j * esize);
        V v = ss::round_to_t<T>(df, divide ? hn::Div(x, s) : hn::Mul(x, inv));
        if (c.asymmetric) v = ss::round_to_t<T>(df, hn::Add(v, z));
        const auto q = hn::ConvertTo(di, hn::Round(hn::Min(hn::Max(v, qmin), qmax)));
        hn::StoreU(hn::DemoteTo(d8, q), d8, out + j);
      }
    }
  }
}

void int_codes(const IntCodes& k) {
  switch (k.w) {
    case DType::kBF16:
      int_codes_t<DType::kBF16>(k);
      break;
    case DType::kF16:
      int_codes_t<DType::kF16>(k);
      break;
    default:
      int_codes_t<DType::kF32>(k);
  }
}

void mse_search(const MseSearch& m) {
  if (m.w == DType::kBF16) {
    search_t<DType::kBF16>(m);
  } else {
    search_t<DType::kF16>(m);
  }
}

#endif  // CTQUANT_SIMD_KERNEL_TARGET
}  // namespace ctquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ctquant {
namespace detail {
namespace {
using MseSearchFn = void(const MseSearch&);
constexpr SimdEntry<MseSearchFn> kMseSearch[] = CTQUANT_SIMD_TABLE(mse_search);
using PowRegCheckFn = void(PowRegTables&, const PowTable&);
constexpr SimdEntry<PowRegCheckFn> kPowRegCheck[] = CTQUANT_SIMD_TABLE(pow_reg_check);

// PowRegTables for BF16 and this norm at this level, or nullptr when the
// level has no register path, the exponent's denominator is over 128 or
// the exhaustive check failed. Built and checked once per (level, norm).
const PowRegTables* pow_reg_tables(const SimdLevel& level, double norm) {
  PowRegCheckFn* check = simd_entry(kPowRegCheck, level);
  if (check == nullptr) return nullptr;
  static std::mutex mutex;
  static std::map<std::pair<std::int64_t, std::uint64_t>, std::unique_ptr<PowRegTables>> built;
  const std::lock_guard lock(mutex);
  auto& slot = built[{level.target, std::bit_cast<std::uint64_t>(norm)}];
  if (!slot) {
    slot = std::make_unique<PowRegTables>();
    PowRegTables& t = *slot;
    const double e = round_to_dtype(DType::kBF16, static_cast<float>(norm));
    int log2p = 0;
    while (log2p <= 7 && std::ldexp(e, log2p) != std::floor(std::ldexp(e, log2p))) ++log2p;
    if (log2p <= 7 && e > 0.0 && std::ldexp(e, log2p) < 65536.0) {
      t.log2p = log2p;
      t.num = static_cast<std::int32_t>(std::ldexp(e, log2p));
      for (int k = 0; k < 128; ++k) {
        t.mant[k] = static_cast<float>(std::pow(1.0 + k / 128.0, e));
        t.frac[k] = static_cast<float>(std::exp2(static_cast<double>(k) / std::ldexp(1.0, log2p)));
      }
      check(t, pow_table(DType::kBF16, norm));
    }
  }
  return slot->exact ? slot.get() : nullptr;
}
}  // namespace

PowRegCheck pow_reg_check_at(const SimdLevel& level, double norm) {
  const PowRegTables* t = pow_reg_tables(level, norm);
  return t == nullptr ? PowRegCheck{} : PowRegCheck{true, t->flagged};
}

// The vector search at `level`; false when it does not cover these args
// (the caller then runs the reference).
bool observe_ranges_at(const SimdLevel& level, const QuantArgs& args,
                       const ObserverParams& params, std::uint32_t cutoff, const ObserveIo& io,
                       ImprovedSteps* improved) {
  MseSearchFn* fn = simd_entry(kMseSearch, level);
  if (fn == nullptr || !params.mse || io.dtype == DType::kF32 ||
      (args.strategy != QuantArgs::Strategy::kGroup &&
       args.strategy != QuantArgs::Strategy::kTensorGroup) ||
      args.group_size > 4096) {
    return false;
  }
  const GroupLayout layout = group_layout(args, io.n_rows, io.n_cols);
  MseSearch m;
  m.args = &args;
  m.params = &params;
  m.cutoff = cutoff;
  m.layout = &layout;
  m.w = io.dtype;
  m.weight = io.weight;
  m.ranges = io.ranges;
  m.improved = improved;
  if (improved != nullptr) improved->resize((params.steps() + 63) / 64, 0);
  m.table = &pow_table(io.dtype, params.norm);
  m.program = &torch_sum_program(io.dtype, layout.group);
  const float norm = round_to_dtype(io.dtype, static_cast<float>(params.norm));
  if (norm == 2.0f) {
    m.pow = MseSearch::Pow::kSquare;
  } else if (norm == 3.0f && io.dtype == DType::kBF16) {
    m.pow = MseSearch::Pow::kCube;
  } else if (io.dtype == DType::kBF16) {
    m.reg = pow_reg_tables(level, params.norm);
    if (m.reg != nullptr) m.pow = MseSearch::Pow::kRegister;
  }
  fn(m);
  return true;
}

namespace {
using IntCodesFn = void(const IntCodes&);
constexpr SimdEntry<IntCodesFn> kIntCodes[] = CTQUANT_SIMD_TABLE(int_codes);
}  // namespace

bool int_codes_from_ranges_at(const SimdLevel& level, const QuantArgs& args, DType w,
                              std::uint64_t n_rows, std::uint64_t n_cols, std::uint64_t group,
                              const std::byte* weight, const float* ranges, std::int8_t* codes,
                              std::byte* scale, std::int8_t* zero_point) {
  IntCodesFn* fn = simd_entry(kIntCodes, level);
  if (fn == nullptr || args.type != QuantArgs::Type::kInt || group == 0 ||
      group % 16 != 0 || n_cols % group != 0) {
    return false;
  }
  fn(IntCodes{&args, w, n_rows, n_cols, group, weight, ranges, codes, scale, zero_point});
  return true;
}

}  // namespace detail

void observe_ranges(const QuantArgs& args, const ObserverParams& params, std::uint32_t cutoff,
                    const ObserveIo& io, ImprovedSteps* improved) {
  if (!detail::observe_ranges_at(detail::simd_best_level(), args, params, cutoff, io, improved)) {
    observe_ranges_ref(args, params, cutoff, io, improved);
  }
}

}  // namespace ctquant
#endif  // HWY_ONCE
