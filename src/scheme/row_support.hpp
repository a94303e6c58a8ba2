// Private: small pieces shared by the scheme rows that store a code per
// weight and scales in the weight's dtype (fp8.cpp, int8.cpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ctquant/format/dtype.hpp"
#include "ctquant/scheme/scheme.hpp"

namespace ctquant::detail {

inline std::size_t element_bytes(DType dtype) {
  return static_cast<std::size_t>(dtype_bits(dtype) / 8);
}

// Stores a float that is exactly representable in dtype (BF16, F16 or F32)
// as that dtype's little-endian bytes.
inline void store_as_dtype(DType dtype, float value, std::byte* out) {
  switch (dtype) {
    case DType::kBF16: {
      const std::uint16_t b = float_to_bf16(value);
      std::memcpy(out, &b, 2);
      break;
    }
    case DType::kF16: {
      const std::uint16_t b = float_to_f16(value);
      std::memcpy(out, &b, 2);
      break;
    }
    default:
      std::memcpy(out, &value, 4);
  }
}

// The row-major index of the first NaN or infinity among the chunk's
// n_rows * n_cols weights, or nullopt (the KernelFn contract).
inline std::optional<std::uint64_t> first_non_finite(const KernelIo& io) {
  const std::size_t esize = element_bytes(io.dtype);
  const std::uint64_t n = io.n_rows * io.n_cols;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (!std::isfinite(load_as_float(io.dtype, io.weight + i * esize))) return i;
  }
  return std::nullopt;
}

// One kRows output tensor of shape [n_units, unit elements] whose unit (a
// row of it) covers `rows_per_unit` weight rows.
inline OutputTensorSpec rows_tensor(std::string suffix, DType dtype, std::uint64_t n_units,
                                    std::uint64_t unit_elements, std::uint64_t rows_per_unit,
                                    OutputTensorSpec::Kind kind) {
  OutputTensorSpec t;
  t.suffix = std::move(suffix);
  t.dtype = dtype;
  t.shape = {n_units, unit_elements};
  t.fill = OutputTensorSpec::Fill::kRows;
  t.kind = kind;
  t.units_num = 1;
  t.units_den = rows_per_unit;
  t.element_bits = dtype_bits(dtype);
  t.elements_per_unit = unit_elements;
  t.bytes_per_unit = unit_elements * static_cast<std::uint64_t>(dtype_bits(dtype)) / 8;
  return t;
}

// A kWhole tensor of `shape` (written once from SchemeFamily::whole_tensor).
inline OutputTensorSpec whole_tensor_spec(std::string suffix, DType dtype,
                                          std::vector<std::uint64_t> shape,
                                          OutputTensorSpec::Kind kind) {
  OutputTensorSpec t;
  t.suffix = std::move(suffix);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.fill = OutputTensorSpec::Fill::kWhole;
  t.kind = kind;
  std::uint64_t n = 1;
  for (const std::uint64_t d : t.shape) n *= d;
  t.element_bits = dtype_bits(dtype);
  t.elements_per_unit = n;
  t.bytes_per_unit = n * static_cast<std::uint64_t>(dtype_bits(dtype)) / 8;
  return t;
}

}  // namespace ctquant::detail
