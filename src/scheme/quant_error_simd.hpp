// Private: the vector code of weight_error_rows() (quant_error.hpp), one
// Highway source (quant_error_simd.cpp) compiled for every level of
// simd_levels() (simd/simd_dispatch.hpp). It gives the same bits as
// weight_error_rows_ref() at every level: the sums follow the fixed lanes
// of quant_error.hpp, whatever the vector width.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/quant_error.hpp"
#include "simd/simd.hpp"

namespace ctquant::detail {

// weight_error_rows() without the span: out has n_rows entries.
using WeightErrorRowsKernel = void(DType dtype, const std::byte* weight, const float* values,
                                   std::uint64_t n_rows, std::uint64_t n_cols, RowError* out);

// The kernel compiled for level, or nullptr when this CPU does not run it
// (the caller then runs weight_error_rows_ref()).
WeightErrorRowsKernel* weight_error_rows_kernel(const SimdLevel& level);

}  // namespace ctquant::detail
