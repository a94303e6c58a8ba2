#include "verify/output_diff.hpp"

#include <algorithm>
#include <cstring>

#include "ctquant/scheme/scale_check.hpp"
#include "ctquant/verify/verify.hpp"
#include "verify/side.hpp"

namespace ctquant::detail {

namespace {

// Bits [bit, bit + width) of a little-endian byte stream (width <= 8).
unsigned bits_at(const std::byte* data, std::uint64_t bit, int width) {
  const std::uint64_t byte = bit / 8;
  unsigned v = std::to_integer<unsigned>(data[byte]);
  if ((bit % 8) + static_cast<std::uint64_t>(width) > 8) {
    v |= std::to_integer<unsigned>(data[byte + 1]) << 8;
  }
  return (v >> (bit % 8)) & ((1u << width) - 1u);
}

// A zero point of b bits of (row, column j) in columns packed along dim 0:
// column j's bit stream runs down the rows, one int32 word per word row.
unsigned zero_point_at(const std::byte* data, std::uint64_t row, std::uint64_t j,
                       std::uint64_t columns, int b) {
  const std::uint64_t bit = row * static_cast<std::uint64_t>(b);
  std::uint64_t value = 0;
  for (int k = 0; k < b; ++k) {
    const std::uint64_t at = bit + static_cast<std::uint64_t>(k);
    const std::uint64_t word = (at / 32) * columns + j;
    std::uint32_t w = 0;
    std::memcpy(&w, data + word * 4, 4);
    value |= static_cast<std::uint64_t>((w >> (at % 32)) & 1u) << k;
  }
  return static_cast<unsigned>(value);
}

}  // namespace

void diff_rows_output(const OutputTensorSpec& s, std::span<const std::byte> stored,
                      std::span<const std::byte> ref, std::uint64_t r0, std::uint64_t n,
                      std::uint64_t cols, std::uint64_t scale_rows, std::uint64_t scale_cols,
                      std::uint64_t scale_ulp, OutputDiff& diff) {
  if (std::memcmp(ref.data(), stored.data(), ref.size()) == 0) return;
  switch (s.kind) {
    case OutputTensorSpec::Kind::kCodes:
      for (std::uint64_t r = 0; r < n; ++r) {
        const std::byte* a = stored.data() + r * s.bytes_per_unit;
        const std::byte* b = ref.data() + r * s.bytes_per_unit;
        if (std::memcmp(a, b, s.bytes_per_unit) == 0) continue;
        // The first differing column of each group that differs.
        for (std::uint64_t col = 0; col < cols; ++col) {
          const std::uint64_t bit = col * static_cast<std::uint64_t>(s.element_bits);
          if (bits_at(a, bit, s.element_bits) == bits_at(b, bit, s.element_bits)) continue;
          diff.mismatches.push_back({r0 + r, col / scale_cols, col});
          col = (col / scale_cols + 1) * scale_cols - 1;  // on to the next group
        }
      }
      break;
    case OutputTensorSpec::Kind::kScale: {
      const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(s.dtype) / 8);
      const std::uint64_t first_unit = s.bytes_before(r0) / s.bytes_per_unit;
      const std::uint64_t n_elements = ref.size() / esize;
      for (std::uint64_t k = 0; k < n_elements; ++k) {
        const std::byte* a = stored.data() + k * esize;
        const std::byte* b = ref.data() + k * esize;
        if (std::memcmp(a, b, esize) == 0) continue;
        const std::uint64_t unit = first_unit + k / s.elements_per_unit;
        const std::uint64_t j = k % s.elements_per_unit;
        if (is_quantizable_float(s.dtype)) {
          const std::uint64_t d =
              ulp_distance(s.dtype, load_bits(s.dtype, a), load_bits(s.dtype, b));
          diff.max_scale_ulp = std::max(diff.max_scale_ulp, d);
          if (d <= scale_ulp) {
            ++diff.accepted_scales;
            continue;
          }
        }
        diff.mismatches.push_back({unit * scale_rows, j, std::nullopt});
      }
      break;
    }
    case OutputTensorSpec::Kind::kZeroPoint: {
      const std::uint64_t columns = s.bytes_per_unit / 4;
      for (std::uint64_t r = 0; r < n; ++r) {
        for (std::uint64_t j = 0; j < columns; ++j) {
          if (zero_point_at(stored.data(), r, j, columns, s.element_bits) !=
              zero_point_at(ref.data(), r, j, columns, s.element_bits)) {
            diff.mismatches.push_back({r0 + r, j, std::nullopt});
          }
        }
      }
      break;
    }
    default:
      break;
  }
}

void count_bad_scales(const OutputTensorSpec& spec, std::uint64_t first,
                      std::span<const std::byte> bytes, BadScales& bad) {
  if (!holds_scales(spec)) return;
  const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(spec.dtype) / 8);
  for (std::uint64_t from = 0;;) {
    const auto k = first_bad_scale(spec.dtype, bytes.subspan(from * esize));
    if (!k) return;
    if (bad.count++ == 0) {
      bad.spec = &spec;
      bad.element = first / esize + from + *k;
      bad.value = scale_value_text(spec.dtype, bytes.data() + (from + *k) * esize);
    }
    from += *k + 1;
  }
}

}  // namespace ctquant::detail
