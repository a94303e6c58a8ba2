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
//   reference (a gather); for BF16 at AVX-512 from two tables of 128 and 32
//   floats held in registers (pow_reg: five permutes, about a sixth of a
//   gather's time), the rare lanes it flags from the table; for norms 2 and
//   (BF16) 3 by the products PyTorch computes. The separate loop lets the
//   CPU overlap the lookups, whose iterations are independent;
// - the group's sum by the same additions in the same order as the reference:
//   for groups of 16 to 1008 elements (multiples of 16) in registers, in
//   the order torch_sum_order gives for such rows (ordered_sum), otherwise
//   by the steps of torch_sum_program as vector additions of whole slots.
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
#include <type_traits>
#include <utility>
#include <vector>

#include <hwy/aligned_allocator.h>

#include "ctquant/scheme/observer.hpp"
#include "ctquant/scheme/refit.hpp"
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
// = num / 32 (e with at most 5 fraction bits, as 2.4 rounds to 77/32):
// x^e = 2^I 2^(r / 32) m^e with num (E - 127) = 32 I + r, 0 <= r < 32.
// pow_reg computes z = mant[j] * frac[r] (each correctly rounded, so z is
// within 2 float ulps of 2^(r/32) m^e), adds I to z's exponent and rounds to
// BF16: the value PyTorch gives (the correctly rounded float, rounded to
// BF16) unless z lies within 8 float ulps of a BF16 rounding midpoint (then
// the rounding is ambiguous), or x lies outside [lo, lo + span] (float bits),
// the magnitudes whose power and x are normal floats; those lanes are
// flagged and take pow_table, zero gives zero. Away from a midpoint the
// rounding is half up, one addition. Both tables (160 floats) sit in vector
// registers, so a lookup is a few permutes instead of a gather. Used only
// when pow_reg_check found, for every BF16 magnitude it does not flag, the
// value of pow_table.
struct PowRegTables {
  alignas(64) float mant[128] = {};
  alignas(64) float frac[32] = {};
  std::int32_t num = 0;
  std::uint32_t lo = 0;    // float bits of the least magnitude computed in registers
  std::uint32_t span = 0;  // and of the greatest, minus lo
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
  std::int8_t* codes = nullptr;   // n_rows * n_cols, or:
  std::uint8_t* packed = nullptr;  // 4 or 8 bits: the packed rows (section 4)
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

// The register tables of pow_reg, loaded once per search (AVX-512, BF16).
#if HWY_TARGET == HWY_AVX3
struct PowRegs {
  __m512 mant[8];
  __m512 frac[2];
  __m512i num, bias, lo, span;
};

HWY_INLINE void load_reg_tables(const PowRegTables& t, PowRegs& r) {
  for (int k = 0; k < 8; ++k) r.mant[k] = _mm512_load_ps(t.mant + 16 * k);
  for (int k = 0; k < 2; ++k) r.frac[k] = _mm512_load_ps(t.frac + 16 * k);
  r.num = _mm512_set1_epi32(t.num);
  r.bias = _mm512_set1_epi32(127 * t.num);
  r.lo = _mm512_set1_epi32(static_cast<int>(t.lo));
  r.span = _mm512_set1_epi32(static_cast<int>(t.span));
}

// pow_reg (PowRegTables) for 16 magnitudes ad; bad gets the lanes that take
// the table.
HWY_INLINE __m512 pow_reg(const PowRegs& t, __m512 ad, __mmask16& bad) {
  const __m512i bits = _mm512_castps_si512(ad);
  // num (E - 127): r in its low 5 bits (the index bits of a 32-entry
  // permute), I above them.
  const __m512i ne = _mm512_sub_epi32(_mm512_mullo_epi32(_mm512_srli_epi32(bits, 23), t.num),
                                      t.bias);
  // mant[j], j = bits 16-22: the permutes read index bits 0-4, bits 21 and
  // 22 choose among the four.
  const __m512i j = _mm512_srli_epi32(bits, 16);
  const __m512 a0 = _mm512_permutex2var_ps(t.mant[0], j, t.mant[1]);
  const __m512 a1 = _mm512_permutex2var_ps(t.mant[2], j, t.mant[3]);
  const __m512 a2 = _mm512_permutex2var_ps(t.mant[4], j, t.mant[5]);
  const __m512 a3 = _mm512_permutex2var_ps(t.mant[6], j, t.mant[7]);
  const __mmask16 b5 = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(1 << 21));
  const __mmask16 b6 = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(1 << 22));
  const __m512 m = _mm512_mask_blend_ps(b6, _mm512_mask_blend_ps(b5, a0, a1),
                                        _mm512_mask_blend_ps(b5, a2, a3));
  const __m512 f = _mm512_permutex2var_ps(t.frac[0], ne, t.frac[1]);
  const __m512i y = _mm512_add_epi32(_mm512_castps_si512(_mm512_mul_ps(m, f)),
                                     _mm512_slli_epi32(_mm512_srai_epi32(ne, 5), 23));
  // Rounded half up to BF16 with 8 added: lanes whose low half ends up in
  // 0 .. 15 were within 8 ulps of the midpoint and are flagged.
  const __m512i up = _mm512_add_epi32(y, _mm512_set1_epi32(0x8008));
  const __mmask16 in_range = _mm512_cmple_epu32_mask(_mm512_sub_epi32(bits, t.lo), t.span);
  const __mmask16 nonzero = _mm512_test_epi32_mask(bits, bits);
  bad = static_cast<__mmask16>(
      (nonzero & ~in_range) |
      _mm512_mask_testn_epi32_mask(in_range, up, _mm512_set1_epi32(0xFFF0)));
  return _mm512_castsi512_ps(
      _mm512_maskz_and_epi32(in_range, up, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
#endif

// Sets t.exact and t.flagged: pow_reg against pow_table on every finite
// BF16 magnitude (AVX-512 only; elsewhere t.exact stays false).
void pow_reg_check(PowRegTables& t, const PowTable& table) {
#if HWY_TARGET == HWY_AVX3
  PowRegs regs;
  load_reg_tables(t, regs);
  alignas(64) float in[16];
  alignas(64) float out[16];
  t.exact = true;
  t.flagged = 0;
  for (std::uint32_t b0 = 0; b0 < 0x7F80u; b0 += 16) {
    for (std::uint32_t l = 0; l < 16; ++l) in[l] = bf16_to_float(static_cast<std::uint16_t>(b0 + l));
    __mmask16 bad = 0;
    _mm512_store_ps(out, pow_reg(regs, _mm512_load_ps(in), bad));
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

// pow_table's value of |d| for one vector of magnitudes ad (a gather).
template <DType T, class DF>
HWY_INLINE hn::Vec<DF> pow_gather(DF df, const MseSearch& m, hn::Vec<DF> ad) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  hn::Vec<decltype(du)> index;
  if constexpr (T == DType::kBF16) {
    index = hn::ShiftRight<16>(hn::BitCast(du, ad));
  } else {
    const hn::Rebind<hwy::float16_t, DF> df16;
    const hn::Rebind<std::uint16_t, DF> du16;
    index = hn::PromoteTo(du, hn::BitCast(du16, hn::DemoteTo(df16, ad)));
  }
  return hn::GatherIndex(df, m.table->value.data(), hn::BitCast(di, index));
}

// Where the search has no register tables (other levels, F16, other norms).
struct NoPowRegs {};

// |d|^norm of one vector of magnitudes ad, as pow_table gives it: by
// pow_reg from the registers R (PowRegs, lanes it flags from the table),
// or (NoPowRegs) as m.pow says.
template <DType T, class R, class DF>
HWY_INLINE hn::Vec<DF> pow_one(DF df, const MseSearch& m, hn::Vec<DF> ad, const R& regs) {
#if HWY_TARGET == HWY_AVX3
  if constexpr (std::is_same_v<R, PowRegs>) {
    using V = hn::Vec<DF>;
    __mmask16 bad = 0;
    __m512 pw = pow_reg(regs, ad.raw, bad);
    if (HWY_UNLIKELY(!_kortestz_mask16_u8(bad, bad))) {
      pw = _mm512_mask_mov_ps(pw, bad, pow_gather<T>(df, m, ad).raw);
    }
    return V{pw};
  }
#endif
  (void)regs;
  switch (m.pow) {
    case MseSearch::Pow::kSquare:
      return ss::round_to_t<T>(df, hn::Mul(ad, ad));
    case MseSearch::Pow::kCube:
      return ss::round_to_t<T>(df, hn::Mul(ss::round_to_t<T>(df, hn::Mul(ad, ad)), ad));
    default:
      return pow_gather<T>(df, m, ad);
  }
}

// terms[j] = |d_j|^norm for the n vectors of |d| at terms, in place (the
// value pow_table gives), by pow_one.
template <DType T, class R, class DF>
HWY_INLINE void pow_terms(DF df, const MseSearch& m, float* terms, std::size_t n, const R& regs) {
  const std::size_t n_lanes = hn::Lanes(df);
  const R r = regs;  // in registers: the stores cannot alias a local copy
#pragma GCC unroll 4
  for (std::size_t j = 0; j < n; ++j) {
    hn::Store(pow_one<T>(df, m, hn::Load(df, terms + j * n_lanes), r), df, terms + j * n_lanes);
  }
}

// |Q - W| of one vector of elements x (one per lane, each lane its own
// candidate: scale s, its reciprocal inv, zero point z): the steps of
// fake_quantize() in observer_steps.hpp with the same IEEE operations.
template <DType T, Candidate::Kind K, bool kAsym, class DF>
HWY_INLINE hn::Vec<DF> abs_error(DF df, hn::Vec<DF> xv, hn::Vec<DF> s, hn::Vec<DF> inv,
                                 hn::Vec<DF> z, hn::Vec<DF> qmin, hn::Vec<DF> qmax,
                                 bool divide) {
  using V = hn::Vec<DF>;
  const hn::RebindToUnsigned<DF> du;
  V v = ss::round_to_t<T>(df, divide ? hn::Div(xv, s) : hn::Mul(xv, inv));
  if constexpr (kAsym) v = ss::round_to_t<T>(df, hn::Add(v, z));
  v = hn::Min(hn::Max(v, qmin), qmax);
  V q;
  if constexpr (K == Candidate::Kind::kInt) {
    q = hn::Round(v);
  } else if constexpr (K == Candidate::Kind::kFp8) {
    const V a = hn::Abs(v);
    const auto u = hn::BitCast(du, a);
    const auto lsb = hn::And(hn::ShiftRight<20>(u), hn::Set(du, 1u));
    const V normal = hn::BitCast(
        df, hn::And(hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7FFFFu))), hn::Set(du, 0xFFF00000u)));
    const V c = hn::Set(df, 0x1p14f);
    const V sub = hn::Sub(hn::Add(a, c), c);
    q = hn::CopySign(hn::IfThenElse(hn::Lt(a, hn::Set(df, 0x1p-6f)), sub, normal), v);
  } else {
    const V a = hn::Abs(v);
    const V c = hn::IfThenElse(
        hn::Lt(a, hn::Set(df, 2.0f)), hn::Set(df, 0x1p22f),
        hn::IfThenElse(hn::Lt(a, hn::Set(df, 4.0f)), hn::Set(df, 0x1p23f), hn::Set(df, 0x1p24f)));
    q = hn::CopySign(hn::Sub(hn::Add(a, c), c), v);
  }
  V dq;
  if constexpr (kAsym) {
    dq = ss::round_to_t<T>(df, hn::Mul(ss::round_to_t<T>(df, hn::Sub(q, z)), s));
  } else {
    dq = ss::round_to_t<T>(df, hn::Mul(q, s));
  }
  return hn::Abs(ss::round_to_t<T>(df, hn::Sub(dq, xv)));
}


// The sum of the terms in a set's n = 16 vec_size vectors of
// slots (vec_size < 64; slot j: element j of every group), not yet rounded
// to W, with the additions of torch_sum_order (observer_steps.hpp) in its
// order, which for such rows is: item i (i < vec_size) of lane l (l < 8) is
// element 16 i + l plus element 16 i + 8 + l; four accumulators a_k take
// items k, 4 + k, 8 + k, ... of the first 4 (vec_size / 4) items, a_0 then
// the rest; lane l's sum is ((a_0 + a_1) + a_2) + a_3; the row's is the
// lanes' sums added in order (multi_row_sum's level loop does not run
// below 16 items per accumulator). Adding a zero first is exact: every term
// is +0 or positive. The same sums as the steps of torch_sum_program, with
// the partial sums in registers.
template <class DF>
HWY_INLINE hn::Vec<DF> ordered_sum(DF df, const float* slots, std::size_t vec_size) {
  using V = hn::Vec<DF>;
  const std::size_t n_lanes = hn::Lanes(df);
  const auto item = [&](std::size_t i, std::size_t l) HWY_ATTR {
    return hn::Add(hn::Load(df, slots + (16 * i + l) * n_lanes),
                   hn::Load(df, slots + (16 * i + 8 + l) * n_lanes));
  };
  const std::size_t ilp = vec_size / 4;
  V acc = hn::Zero(df);
  for (std::size_t l = 0; l < kSumLanes; ++l) {
    V a0 = hn::Zero(df);
    V a1 = hn::Zero(df);
    V a2 = hn::Zero(df);
    V a3 = hn::Zero(df);
    for (std::size_t i = 0; i < ilp; ++i) {
      a0 = hn::Add(a0, item(4 * i, l));
      a1 = hn::Add(a1, item(4 * i + 1, l));
      a2 = hn::Add(a2, item(4 * i + 2, l));
      a3 = hn::Add(a3, item(4 * i + 3, l));
    }
    for (std::size_t i = 4 * ilp; i < vec_size; ++i) a0 = hn::Add(a0, item(i, l));
    acc = hn::Add(acc, hn::Add(hn::Add(hn::Add(a0, a1), a2), a3));
  }
  return acc;
}

// The errors of one set's candidates, not yet rounded to W: |Q - W| of
// every element into slots, raised to the norm in a loop of its own
// (pow_terms), then summed: by ordered_sum where the group is a multiple of
// 16 below 1024 elements, otherwise by the steps of torch_sum_program as
// vector additions of whole slots. Separate loops of independent
// iterations let the CPU overlap the lookups (about 25% less time than one
// loop that sums each term as it is computed).
template <DType T, Candidate::Kind K, bool kAsym, class R, class DF>
HWY_NOINLINE hn::Vec<DF> set_error(DF df, const MseSearch& m, const float* xt, float* slots,
                                   hn::Vec<DF> s, hn::Vec<DF> inv, hn::Vec<DF> z,
                                   hn::Vec<DF> qmin, hn::Vec<DF> qmax, bool divide,
                                   const R& regs) {
  const std::size_t n_lanes = hn::Lanes(df);
  const std::size_t g = m.layout->group;
  // The candidate by value, the division test outside the loop: the stores
  // to slots cannot alias them.
  const auto abs_errors = [&](auto divide_by_s) HWY_ATTR {
#pragma GCC unroll 4
    for (std::size_t j = 0; j < g; ++j) {
      hn::Store(abs_error<T, K, kAsym>(df, hn::Load(df, xt + j * n_lanes), s, inv, z, qmin, qmax,
                                       decltype(divide_by_s)::value),
                df, slots + j * n_lanes);
    }
  };
  if (divide) {
    abs_errors(std::true_type{});
  } else {
    abs_errors(std::false_type{});
  }
  pow_terms<T>(df, m, slots, g, regs);
  if (g % 16 == 0 && g / 16 < 64) return ordered_sum(df, slots, g / 16);
  const SumProgram& program = *m.program;
  for (const SumStep& step : program.steps) {
    hn::Store(hn::Add(hn::Load(df, slots + std::size_t{step.a} * n_lanes),
                      hn::Load(df, slots + std::size_t{step.b} * n_lanes)),
              df, slots + std::size_t{step.dst} * n_lanes);
  }
  return program.result < 0
             ? hn::Zero(df)
             : hn::Load(df, slots + static_cast<std::size_t>(program.result) * n_lanes);
}

// set_error for the candidate kind of the search (and, with pow_reg, its
// registers).
template <DType T, class R, class DF>
HWY_INLINE hn::Vec<DF> set_error_of(DF df, const MseSearch& m, Candidate::Kind kind, bool asym,
                                    const float* xt, float* slots, hn::Vec<DF> s,
                                    hn::Vec<DF> inv, hn::Vec<DF> z, hn::Vec<DF> qmin,
                                    hn::Vec<DF> qmax, bool divide, const R& regs) {
  switch (kind) {
    case Candidate::Kind::kInt:
      return asym ? set_error<T, Candidate::Kind::kInt, true>(df, m, xt, slots, s, inv, z, qmin, qmax, divide, regs)
                  : set_error<T, Candidate::Kind::kInt, false>(df, m, xt, slots, s, inv, z, qmin, qmax, divide, regs);
    case Candidate::Kind::kFp8:
      return set_error<T, Candidate::Kind::kFp8, false>(df, m, xt, slots, s, inv, z, qmin, qmax, divide, regs);
    case Candidate::Kind::kFp4:
      break;
  }
  return set_error<T, Candidate::Kind::kFp4, false>(df, m, xt, slots, s, inv, z, qmin, qmax, divide, regs);
}

template <DType T, class R>
void search_t(const MseSearch& m, const R& regs) {
  using DF = hn::ScalableTag<float>;
  const DF df;
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
    const auto group_at = [&](std::size_t lane) {
      const std::uint64_t group = set + lane;
      return m.weight +
             (group / layout.per_row * layout.n_cols + group % layout.per_row * g) * esize;
    };
#if HWY_TARGET == HWY_AVX3
    if (T == DType::kBF16 && valid == 16 && g % 16 == 0) {
      const std::byte* groups[16];
      for (std::size_t lane = 0; lane < 16; ++lane) groups[lane] = group_at(lane);
      ss::transpose_bf16_16(groups, g, xt.get());
    } else
#endif
    for (std::size_t lane = 0; lane < n_lanes; ++lane) {
      if (lane >= valid) {
        for (std::size_t j = 0; j < g; ++j) xt[j * n_lanes + lane] = 0.0f;
        continue;
      }
      const std::byte* p = group_at(lane);
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
      const V inv = hn::Div(hn::Set(df, 1.0f), s);
      const bool divide = !hn::AllTrue(df, hn::Ge(s, hn::Set(df, 0x1p-100f)));
      const V err = ss::round_to_t<T>(
          df, set_error_of<T>(df, m, proto.kind, asym, xt.get(), slots.get(), s, inv, z,
                                          qmin, qmax, divide, regs));
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
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint8_t, decltype(du)> du8;
  const hn::Repartition<std::uint64_t, decltype(du)> d64;
  const hn::Rebind<std::uint8_t, decltype(d64)> d64_8;
  const int bits = k.args->num_bits;
  const V round_bias = hn::Set(df, 12582912.0f + static_cast<float>(1 << (bits - 1)));
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
      std::int8_t* out = k.codes == nullptr ? nullptr : k.codes + r * k.n_cols + gi * k.group;
      std::uint8_t* packed =
          k.packed == nullptr ? nullptr : k.packed + (r * k.n_cols + gi * k.group) * bits / 8;
      for (std::uint64_t j = 0; j < k.group; j += n_lanes) {
        const V x = ss::load_as_float<T>(df, row + j * esize);
        V v = ss::round_to_t<T>(df, divide ? hn::Div(x, s) : hn::Mul(x, inv));
        if (c.asymmetric) v = ss::round_to_t<T>(df, hn::Add(v, z));
        v = hn::Min(hn::Max(v, qmin), qmax);
        if (packed != nullptr) {
          // As quantize_vector (kernel_simd.cpp): v + 1.5 * 2^23 + 2^(b-1)
          // rounds half to even and leaves the offset code in the low bits.
          const auto biased = hn::BitCast(du, hn::Add(v, round_bias));
          if (bits == 8) {
            hn::StoreU(hn::TruncateTo(du8, biased), du8, packed + j);
          } else {
            const auto pairs = hn::BitCast(d64, hn::And(biased, hn::Set(du, 0xFu)));
            const auto bytes = hn::Or(pairs, hn::ShiftRight<28>(pairs));
            hn::StoreU(hn::TruncateTo(d64_8, bytes), d64_8, packed + j / 2);
          }
          continue;
        }
        const auto q = hn::ConvertTo(di, hn::Round(v));
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
#if HWY_TARGET == HWY_AVX3
    if (m.pow == MseSearch::Pow::kRegister) {
      PowRegs regs;
      load_reg_tables(*m.reg, regs);
      search_t<DType::kBF16>(m, regs);
      return;
    }
#endif
    search_t<DType::kBF16>(m, NoPowRegs{});
  } else {
    search_t<DType::kF16>(m, NoPowRegs{});
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
    if (e > 0.0 && std::ldexp(e, 5) == std::floor(std::ldexp(e, 5)) && e < 64.0) {
      t.num = static_cast<std::int32_t>(std::ldexp(e, 5));
      for (int k = 0; k < 128; ++k) t.mant[k] = static_cast<float>(std::pow(1.0 + k / 128.0, e));
      for (int k = 0; k < 32; ++k) t.frac[k] = static_cast<float>(std::exp2(k / 32.0));
      // The normal magnitudes x whose power is a normal float below 2^127
      // (so that rounding it up stays finite): 2^-126 <= x, x^e >= 2^-125
      // and x^e < 2^126, with a power of two of margin on each side.
      const double lo = std::max(std::ldexp(1.0, -126), std::exp2(std::ceil(-124.0 / e)));
      const double hi = std::min(std::ldexp(1.0, 127), std::exp2(std::floor(125.0 / e)));
      t.lo = std::bit_cast<std::uint32_t>(static_cast<float>(lo));
      t.span = std::bit_cast<std::uint32_t>(static_cast<float>(hi)) - t.lo;
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
                              std::uint32_t* packed, std::byte* scale, std::int8_t* zero_point) {
  IntCodesFn* fn = simd_entry(kIntCodes, level);
  if (fn == nullptr || args.type != QuantArgs::Type::kInt || group == 0 ||
      group % 16 != 0 || n_cols % group != 0 ||
      (packed != nullptr && args.num_bits != 4 && args.num_bits != 8) ||
      (packed == nullptr) == (codes == nullptr)) {
    return false;
  }
  fn(IntCodes{&args, w, n_rows, n_cols, group, weight, ranges, codes,
              reinterpret_cast<std::uint8_t*>(packed), scale, zero_point});
  return true;
}

}  // namespace detail

void observe_ranges(const QuantArgs& args, const ObserverParams& params, std::uint32_t cutoff,
                    const ObserveIo& io, ImprovedSteps* improved) {
  if (params.refit) {
    observe_refit(args, params.refit_params, io);
    return;
  }
  if (!detail::observe_ranges_at(detail::simd_best_level(), args, params, cutoff, io, improved)) {
    observe_ranges_ref(args, params, cutoff, io, improved);
  }
}

}  // namespace ctquant
#endif  // HWY_ONCE
