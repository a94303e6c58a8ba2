#include "ctquant/scheme/quant_error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "scheme/quant_error_simd.hpp"
#include "scheme/quant_error_steps.hpp"

namespace ctquant {

namespace {

// Floats of Q decoded per band by quant_error_rows(): 64 KiB, which stays
// in the core's cache with the band's weight rows.
constexpr std::uint64_t kBandValues = 16384;

}  // namespace

void QuantError::add(const RowError& row) {
  err2 += row.err2;
  w2 += row.w2;
  max_abs = detail::max_abs_step(max_abs, row.max_abs);
  ++rows;
}

void QuantError::add(const QuantError& next) {
  err2 += next.err2;
  w2 += next.w2;
  max_abs = detail::max_abs_step(max_abs, next.max_abs);
  rows += next.rows;
}

double QuantError::rel_frobenius() const {
  if (w2 > 0.0 || std::isnan(err2)) return std::sqrt(err2 / w2);
  return err2 == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
}

void RowOrderedError::add(std::uint64_t row_begin, std::span<const RowError> rows) {
  if (row_begin < total_.rows) {
    throw std::logic_error("RowOrderedError: rows added twice");
  }
  if (row_begin > total_.rows) {
    if (!pending_.emplace(row_begin, std::vector<RowError>(rows.begin(), rows.end())).second) {
      throw std::logic_error("RowOrderedError: rows added twice");
    }
    return;
  }
  for (const RowError& r : rows) total_.add(r);
  while (!pending_.empty() && pending_.begin()->first <= total_.rows) {
    if (pending_.begin()->first < total_.rows) {
      throw std::logic_error("RowOrderedError: rows added twice");
    }
    for (const RowError& r : pending_.begin()->second) total_.add(r);
    pending_.erase(pending_.begin());
  }
}

void weight_error_rows_ref(DType dtype, const std::byte* weight, const float* values,
                           std::uint64_t n_rows, std::uint64_t n_cols, std::span<RowError> out) {
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(dtype) / 8);
  for (std::uint64_t r = 0; r < n_rows; ++r) {
    double e[kErrorLanes] = {};
    double n[kErrorLanes] = {};
    float m = 0.0f;
    for (std::uint64_t c = 0; c < n_cols; ++c) {
      const float w = load_as_float(dtype, weight + (r * n_cols + c) * esize);
      detail::error_element(w, values[r * n_cols + c], c % kErrorLanes, e, n, m);
    }
    out[r] = RowError{detail::pairwise_sum(e, kErrorLanes), detail::pairwise_sum(n, kErrorLanes),
                      m};
  }
}

void weight_error_rows(DType dtype, const std::byte* weight, const float* values,
                       std::uint64_t n_rows, std::uint64_t n_cols, std::span<RowError> out) {
  static detail::WeightErrorRowsKernel* const kernel =
      detail::weight_error_rows_kernel(detail::simd_best_level());
  if (kernel == nullptr) return weight_error_rows_ref(dtype, weight, values, n_rows, n_cols, out);
  kernel(dtype, weight, values, n_rows, n_cols, out.data());
}

void quant_error_rows(const SchemeFamily& family, const QuantArgs& args, const QuantErrorIo& io,
                      std::span<RowError> out, std::vector<float>& scratch) {
  if (io.n_rows == 0) return;
  const std::size_t esize = static_cast<std::size_t>(dtype_bits(io.dtype) / 8);
  DequantIo dq;
  dq.dtype = io.dtype;
  dq.n_rows = io.n_rows;
  dq.n_cols = io.n_cols;
  dq.row_begin = io.row_begin;
  dq.in = io.outputs;
  dq.whole = io.whole;
  if (family.dequantize_rows == nullptr) {
    // No vector decoder: the whole chunk at once (dequantize's contract).
    scratch.resize(std::max<std::size_t>(scratch.size(), io.n_rows * io.n_cols));
    dq.values = scratch.data();
    family.dequantize(args, dq);
    weight_error_rows(io.dtype, io.weight, scratch.data(), io.n_rows, io.n_cols, out);
    return;
  }
  const std::uint64_t band = std::max<std::uint64_t>(1, kBandValues / std::max<std::uint64_t>(1, io.n_cols));
  scratch.resize(std::max<std::size_t>(scratch.size(), std::min(band, io.n_rows) * io.n_cols));
  for (std::uint64_t r0 = 0; r0 < io.n_rows; r0 += band) {
    const std::uint64_t r1 = std::min(io.n_rows, r0 + band);
    family.dequantize_rows(args, dq, r0, r1, scratch.data());
    weight_error_rows(io.dtype, io.weight + r0 * io.n_cols * esize, scratch.data(), r1 - r0,
                      io.n_cols, out.subspan(r0));
  }
}

}  // namespace ctquant
