// The vector code of weight_error_rows() (quant_error.hpp), written once with
// Google Highway and compiled for every level of simd_levels()
// (simd/simd_dispatch.hpp).
//
// It gives the bits of weight_error_rows_ref() at every level because the
// order of every addition is the one quant_error.hpp fixes, not one that
// follows the vector width: the kErrorLanes (16) lane sums of a row are held
// in 16 / N vectors of N double lanes (N = 2 on NEON, 4 on AVX2, 8 on
// AVX-512, up to 16 on wide SVE), vector k lane i being the lane sum of
// columns c = k * N + i (mod 16); every step is one IEEE operation (w - q in
// float, squares exact in double, one rounding per addition, so MulAdd is
// the reference's multiply then add); the columns after the last whole 16,
// the pairwise sum of the lanes and the max of the lanes are the scalar
// steps of quant_error_steps.hpp. The max is order-free: it is the largest
// of non-negative floats, NaN never chosen (IfThenElse on Gt, as
// max_abs_step).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "scheme/quant_error_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/simd_dispatch.hpp"
#include "simd/simd_steps-inl.h"

#ifndef CTQUANT_SCHEME_QUANT_ERROR_SIMD_ONCE
#define CTQUANT_SCHEME_QUANT_ERROR_SIMD_ONCE

#include "scheme/quant_error_simd.hpp"
#include "scheme/quant_error_steps.hpp"

#endif  // CTQUANT_SCHEME_QUANT_ERROR_SIMD_ONCE

HWY_BEFORE_NAMESPACE();
namespace ctquant::detail::HWY_NAMESPACE {
#if CTQUANT_SIMD_KERNEL_TARGET
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using simd_steps::HWY_NAMESPACE::load_as_float;

template <DType T>
constexpr std::size_t kEsize = T == DType::kF32 ? 4 : 2;

// One vector of columns: d = w - q, d^2 into e, w^2 into n, |d| into m.
template <DType T, class DD, class DF>
HWY_INLINE void error_step(DD dd, DF df, const std::byte* w, const float* q, hn::Vec<DD>& e,
                           hn::Vec<DD>& n, hn::Vec<DF>& m) {
  const auto wv = load_as_float<T>(df, w);
  const auto d = hn::Sub(wv, hn::LoadU(df, q));
  const auto a = hn::Abs(d);
  m = hn::IfThenElse(hn::Gt(a, m), a, m);
  const auto dw = hn::PromoteTo(dd, d);
  e = hn::MulAdd(dw, dw, e);
  const auto ww = hn::PromoteTo(dd, wv);
  n = hn::MulAdd(ww, ww, n);
}

// Rows with the 16 lane sums in kV vectors of 16 / kV doubles.
template <DType T, int kV>
void error_rows(const std::byte* weight, const float* values, std::uint64_t n_rows,
                std::uint64_t n_cols, RowError* out) {
  const hn::CappedTag<double, kErrorLanes> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const std::size_t lanes = hn::Lanes(dd);
  HWY_ALIGN double e_lanes[kErrorLanes];
  HWY_ALIGN double n_lanes[kErrorLanes];
  HWY_ALIGN float m_lanes[kErrorLanes];
  for (std::uint64_t r = 0; r < n_rows; ++r) {
    const std::byte* w = weight + r * n_cols * kEsize<T>;
    const float* q = values + r * n_cols;
    auto e0 = hn::Zero(dd), e1 = hn::Zero(dd), e2 = hn::Zero(dd), e3 = hn::Zero(dd);
    auto e4 = hn::Zero(dd), e5 = hn::Zero(dd), e6 = hn::Zero(dd), e7 = hn::Zero(dd);
    auto n0 = hn::Zero(dd), n1 = hn::Zero(dd), n2 = hn::Zero(dd), n3 = hn::Zero(dd);
    auto n4 = hn::Zero(dd), n5 = hn::Zero(dd), n6 = hn::Zero(dd), n7 = hn::Zero(dd);
    auto m = hn::Zero(df);
    std::uint64_t c = 0;
    for (; c + kErrorLanes <= n_cols; c += kErrorLanes) {
      const auto at = [&](std::size_t k) { return w + (c + k * lanes) * kEsize<T>; };
      const auto qt = [&](std::size_t k) { return q + c + k * lanes; };
      error_step<T>(dd, df, at(0), qt(0), e0, n0, m);
      if constexpr (kV > 1) error_step<T>(dd, df, at(1), qt(1), e1, n1, m);
      if constexpr (kV > 2) {
        error_step<T>(dd, df, at(2), qt(2), e2, n2, m);
        error_step<T>(dd, df, at(3), qt(3), e3, n3, m);
      }
      if constexpr (kV > 4) {
        error_step<T>(dd, df, at(4), qt(4), e4, n4, m);
        error_step<T>(dd, df, at(5), qt(5), e5, n5, m);
        error_step<T>(dd, df, at(6), qt(6), e6, n6, m);
        error_step<T>(dd, df, at(7), qt(7), e7, n7, m);
      }
    }
    hn::Store(e0, dd, e_lanes);
    hn::Store(n0, dd, n_lanes);
    if constexpr (kV > 1) {
      hn::Store(e1, dd, e_lanes + lanes);
      hn::Store(n1, dd, n_lanes + lanes);
    }
    if constexpr (kV > 2) {
      hn::Store(e2, dd, e_lanes + 2 * lanes);
      hn::Store(n2, dd, n_lanes + 2 * lanes);
      hn::Store(e3, dd, e_lanes + 3 * lanes);
      hn::Store(n3, dd, n_lanes + 3 * lanes);
    }
    if constexpr (kV > 4) {
      hn::Store(e4, dd, e_lanes + 4 * lanes);
      hn::Store(n4, dd, n_lanes + 4 * lanes);
      hn::Store(e5, dd, e_lanes + 5 * lanes);
      hn::Store(n5, dd, n_lanes + 5 * lanes);
      hn::Store(e6, dd, e_lanes + 6 * lanes);
      hn::Store(n6, dd, n_lanes + 6 * lanes);
      hn::Store(e7, dd, e_lanes + 7 * lanes);
      hn::Store(n7, dd, n_lanes + 7 * lanes);
    }
    hn::Store(m, df, m_lanes);
    float max_abs = 0.0f;
    for (std::size_t i = 0; i < lanes; ++i) max_abs = max_abs_step(max_abs, m_lanes[i]);
    for (; c < n_cols; ++c) {
      error_element(load_as_float(T, w + c * kEsize<T>), q[c], c % kErrorLanes, e_lanes, n_lanes,
                    max_abs);
    }
    out[r] = RowError{pairwise_sum(e_lanes, kErrorLanes), pairwise_sum(n_lanes, kErrorLanes),
                      max_abs};
  }
}

template <DType T>
void error_rows_of(const std::byte* weight, const float* values, std::uint64_t n_rows,
                   std::uint64_t n_cols, RowError* out) {
  const hn::CappedTag<double, kErrorLanes> dd;
  switch (kErrorLanes / hn::Lanes(dd)) {
    case 1:
      return error_rows<T, 1>(weight, values, n_rows, n_cols, out);
    case 2:
      return error_rows<T, 2>(weight, values, n_rows, n_cols, out);
    case 4:
      return error_rows<T, 4>(weight, values, n_rows, n_cols, out);
    default:
      return error_rows<T, 8>(weight, values, n_rows, n_cols, out);
  }
}

}  // namespace

// The per-level entry point (see simd_dispatch.hpp).
void weight_error_rows_simd(DType dtype, const std::byte* weight, const float* values,
                            std::uint64_t n_rows, std::uint64_t n_cols, RowError* out) {
  switch (dtype) {
    case DType::kBF16:
      return error_rows_of<DType::kBF16>(weight, values, n_rows, n_cols, out);
    case DType::kF16:
      return error_rows_of<DType::kF16>(weight, values, n_rows, n_cols, out);
    default:
      return error_rows_of<DType::kF32>(weight, values, n_rows, n_cols, out);
  }
}

#endif  // CTQUANT_SIMD_KERNEL_TARGET
}  // namespace ctquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ctquant::detail {
namespace {

constexpr SimdEntry<WeightErrorRowsKernel> kWeightErrorRows[] =
    CTQUANT_SIMD_TABLE(weight_error_rows_simd);

}  // namespace

WeightErrorRowsKernel* weight_error_rows_kernel(const SimdLevel& level) {
  return simd_entry(kWeightErrorRows, level);
}

}  // namespace ctquant::detail
#endif  // HWY_ONCE
