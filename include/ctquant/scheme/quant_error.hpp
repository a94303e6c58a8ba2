// The weight error of a quantized module: how far the values its stored
// outputs stand for are from the weight they were made from. One home for
// the arithmetic, shared by the executor (the run report and summary of
// `quantize`), `verify --against-source` and `inspect --errors`, so all
// three give the same numbers.
//
// For a weight W [R, C] and Q, the floats the family's `dequantize` gives
// for its stored outputs (SchemeFamily::dequantize, scheme.hpp: what the
// reference's decompressor computes):
//
//   rel_frobenius = ||W - Q||_F / ||W||_F   (0 when both are 0, +inf when
//                                            W is all zeros and Q is not)
//   max_abs_error = max |W - Q|
//
// The arithmetic is fixed, so that the figures are the same bits for every
// thread count, chunk size and vector level (each step one IEEE operation,
// rounded to nearest even, in the default floating-point environment):
//   1. w is the weight element widened to float (exact for BF16, F16, F32);
//      q is the float dequantize gives.
//   2. d = w - q in float.
//   3. Within a row, column c goes to lane c mod kErrorLanes (16), and each
//      lane sums, in column order from +0.0, double(d)^2 into E and
//      double(w)^2 into N. A float's square is exact in double, so a fused
//      multiply-add and a multiply then add give the same sum.
//   4. The row's E and N are the lanes' sums added pairwise:
//      S(lanes a..b) = S(first half) + S(second half), down to single lanes.
//   5. The row's max is the largest |d| (float); a NaN d is never the
//      largest (it makes E NaN instead).
//   6. A module's E and N are its rows', added in row order from +0.0; its
//      max is the largest of its rows'. The figures above are sqrt(E / N)
//      (in double) and that max.
// weight_error_rows() is written with Highway for every level of the
// build's architecture and checked against weight_error_rows_ref() bit for
// bit at each (tests/test_quant_error.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/scheme.hpp"

namespace ctquant {

// Lanes of step 3: each row's columns are summed in this many interleaved
// sums (enough independent additions to keep a vector unit busy).
inline constexpr std::uint64_t kErrorLanes = 16;

// Steps 3-5 for one row.
struct RowError {
  double err2 = 0;     // E: sum of (w - q)^2
  double w2 = 0;       // N: sum of w^2
  float max_abs = 0;   // max |w - q|

  bool operator==(const RowError&) const = default;
};

// Step 6: the sums of a run of rows (a module), added in row order.
struct QuantError {
  double err2 = 0;
  double w2 = 0;
  float max_abs = 0;
  std::uint64_t rows = 0;  // rows added

  // Adds the next row.
  void add(const RowError& row);
  // Adds the next run of rows (the next module, for a figure over several
  // modules summed in plan order).
  void add(const QuantError& rows);
  // ||W - Q||_F / ||W||_F: sqrt(err2 / w2); 0 when both are 0, +inf when
  // only w2 is, NaN when err2 is.
  double rel_frobenius() const;
  double max_abs_error() const { return max_abs; }

  bool operator==(const QuantError&) const = default;
};

// A module's rows arriving chunk by chunk in any order (the executor's
// workers finish chunks out of order), summed in row order: a chunk that
// follows the rows already summed is added at once, any other is kept until
// the rows before it have arrived. Holds at most the rows of the chunks
// that arrived early. Not thread-safe: callers serialise add().
class RowOrderedError {
 public:
  // The rows of chunk [row_begin, row_begin + rows.size()); each row is
  // given once. Rows given twice or beyond an earlier gap are a caller bug
  // (std::logic_error).
  void add(std::uint64_t row_begin, std::span<const RowError> rows);
  // The rows summed so far: rows [0, total().rows), in order.
  const QuantError& total() const { return total_; }

 private:
  QuantError total_;
  std::map<std::uint64_t, std::vector<RowError>> pending_;
};

// Steps 1-5 for n_rows rows of n_cols columns: weight holds n_rows * n_cols
// elements of dtype (BF16, F16 or F32; anything else is a caller bug),
// values as many floats (Q), both row-major; out gets one RowError per
// row (out.size() >= n_rows). At the best vector level this CPU runs.
void weight_error_rows(DType dtype, const std::byte* weight, const float* values,
                       std::uint64_t n_rows, std::uint64_t n_cols, std::span<RowError> out);
// The scalar reference of the same: a plain loop that reads like steps 1-5.
void weight_error_rows_ref(DType dtype, const std::byte* weight, const float* values,
                           std::uint64_t n_rows, std::uint64_t n_cols, std::span<RowError> out);

// Rows of a module quantized by a family, as its kernel wrote them (or as
// a checkpoint stores them): the same layout as KernelIo and DequantIo.
struct QuantErrorIo {
  DType dtype = DType::kBF16;  // of the weight: BF16, F16 or F32
  std::uint64_t n_rows = 0;
  std::uint64_t n_cols = 0;     // columns of the weight (whole rows)
  std::uint64_t row_begin = 0;  // a multiple of the family's row_alignment
  const std::byte* weight = nullptr;  // W: n_rows * n_cols elements of dtype, row-major
  // The bytes of rows [row_begin, row_begin + n_rows) of each kRows output,
  // in the order outputs() lists them (KernelIo::out).
  std::array<const std::byte*, 4> outputs{};
  // The kWhole outputs (weight_shape, a global or per-tensor scale), in
  // the order outputs() lists them among the kWhole ones (DequantIo::whole).
  std::array<const std::byte*, 2> whole{};
};

// Steps 1-5 for the rows of io: Q from the family's dequantize_rows (its
// vector decoder, the same floats as dequantize) or, for a family without
// one, dequantize, a band of rows at a time into scratch (grown as needed,
// about 64 KiB; reuse it across calls), each band compared with its weight
// rows while both are in cache. out gets one RowError per row
// (out.size() >= io.n_rows). Does not throw beyond std::bad_alloc.
void quant_error_rows(const SchemeFamily& family, const QuantArgs& args, const QuantErrorIo& io,
                      std::span<RowError> out, std::vector<float>& scratch);

}  // namespace ctquant
