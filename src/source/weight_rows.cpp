#include "ctquant/source/weight_rows.hpp"

#include <array>
#include <cmath>

#include <fmt/format.h>

#include "ctquant/util/error.hpp"

namespace ctquant {

WeightRows::WeightRows(const Checkpoint& checkpoint, const WeightSource& source)
    : checkpoint_(checkpoint), source_(source) {}

DType WeightRows::dtype() const {
  return source_.fp8 ? DType::kBF16 : checkpoint_.entry(source_.tensor).dtype;
}

std::uint64_t WeightRows::row_bytes() const {
  return source_.cols * static_cast<std::uint64_t>(dtype_bits(dtype()) / 8);
}

std::uint64_t WeightRows::scale_bytes(std::uint64_t row_begin, std::uint64_t row_end) const {
  if (!source_.fp8) return 0;
  const Fp8Source& f = *source_.fp8;
  const std::uint64_t local = source_.row_begin - f.view_first_row;
  return (f.layout.grid_row_end(local + row_end) - f.layout.grid_row_begin(local + row_begin)) *
         f.layout.scale_bytes_per_grid_row();
}

WeightRows::FileRange WeightRows::stored_range(std::uint64_t row_begin,
                                               std::uint64_t row_end) const {
  const TensorEntry& t = checkpoint_.entry(source_.tensor);
  const SafetensorsFile& in = checkpoint_.shards[source_.tensor.shard];
  const std::uint64_t stored_row = source_.cols * static_cast<std::uint64_t>(dtype_bits(t.dtype) / 8);
  return {&in, in.header().data_start + t.begin + (source_.row_begin + row_begin) * stored_row,
          (row_end - row_begin) * stored_row};
}

std::string WeightRows::element(std::uint64_t row, std::uint64_t col) const {
  const TensorEntry& t = checkpoint_.entry(source_.tensor);
  const std::string& file = checkpoint_.shards[source_.tensor.shard].label();
  const std::uint64_t flat = source_.row_begin + row;
  if (t.shape.size() == 3) {
    return fmt::format("{}: tensor '{}': element [{}, {}, {}]", file, t.name, flat / t.shape[1],
                       flat % t.shape[1], col);
  }
  return fmt::format("{}: tensor '{}': element [{}, {}]", file, t.name, flat, col);
}

std::optional<std::uint64_t> WeightRows::load(std::uint64_t row_begin, std::uint64_t row_end,
                                              std::span<std::byte> out,
                                              std::span<std::byte> scales) const {
  const TensorEntry& w = checkpoint_.entry(source_.tensor);
  const SafetensorsFile& in = checkpoint_.shards[source_.tensor.shard];
  const std::uint64_t n_rows = row_end - row_begin;
  const std::uint64_t n_cols = source_.cols;
  const std::uint64_t first = source_.row_begin + row_begin;  // flattened input row
  if (!source_.fp8) {
    const std::uint64_t rb = row_bytes();
    in.read(w.begin + first * rb, out.first(n_rows * rb));
    return std::nullopt;
  }
  const Fp8Source& f = *source_.fp8;
  const Fp8ScaleLayout& layout = f.layout;
  const std::uint64_t n = n_rows * n_cols;
  in.read(w.begin + first * n_cols, out.subspan(n, n));
  const std::uint64_t local = first - f.view_first_row;  // row within the expert's view
  const TensorEntry& scale = checkpoint_.entry(f.scale);
  const std::uint64_t grid_begin = layout.grid_row_begin(local);
  checkpoint_.shards[f.scale.shard].read(
      scale.begin + (f.grid_first_row + grid_begin) * layout.scale_bytes_per_grid_row(),
      scales.first(scale_bytes(row_begin, row_end)));
  Fp8Rows rows;
  rows.code_dtype = w.dtype;
  rows.row_begin = local;
  rows.n_rows = n_rows;
  rows.n_cols = n_cols;
  rows.codes = out.data() + n;
  rows.scales = scales.data();
  rows.out = out.data();
  return dequantize_fp8_rows(layout, rows);
}

std::string WeightRows::describe_fp8(std::uint64_t row, std::uint64_t col) const {
  if (!source_.fp8) return "is not finite";
  const TensorEntry& w = checkpoint_.entry(source_.tensor);
  const Fp8Source& f = *source_.fp8;
  const Fp8ScaleLayout& layout = f.layout;
  std::array<std::byte, 1> code_byte{};
  checkpoint_.shards[source_.tensor.shard].read(
      w.begin + (source_.row_begin + row) * source_.cols + col, code_byte);
  const auto code = std::to_integer<std::uint8_t>(code_byte[0]);
  const float value = load_as_float(w.dtype, code_byte.data());
  if (!std::isfinite(value)) {
    return fmt::format("is code 0x{:02X}, which is {} in {}", code, value, dtype_tag(w.dtype));
  }
  const TensorEntry& scale = checkpoint_.entry(f.scale);
  const std::uint64_t local = source_.row_begin + row - f.view_first_row;
  const std::uint64_t grid_row = f.grid_first_row + local / layout.block_rows;
  const std::uint64_t grid_col = col / layout.block_cols;
  const std::uint64_t scale_size = static_cast<std::uint64_t>(dtype_bits(layout.dtype) / 8);
  std::array<std::byte, 4> scale_bytes{};
  checkpoint_.shards[f.scale.shard].read(
      scale.begin + (grid_row * layout.grid_cols + grid_col) * scale_size,
      std::span<std::byte>(scale_bytes.data(), scale_size));
  const float s = load_as_float(layout.dtype, scale_bytes.data());
  return fmt::format("is code 0x{:02X} ({}) times scale {} ('{}' [{}, {}]), which is {} in BF16",
                     code, value, s, scale.name, grid_row, grid_col,
                     bf16_to_float(dequantize_fp8_value(w.dtype, code, s)));
}

}  // namespace ctquant
