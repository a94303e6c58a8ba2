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
  const std::uint64_t n = (row_end - row_begin) * source_.cols;
  if (!source_.fp8) {
    const TensorEntry& w = checkpoint_.entry(source_.tensor);
    const std::uint64_t rb = row_bytes();
    checkpoint_.shards[source_.tensor.shard].read(w.begin + (source_.row_begin + row_begin) * rb,
                                                  out.first((row_end - row_begin) * rb));
    return std::nullopt;
  }
  // The codes go to the second half of out and are dequantized in place
  // (Fp8Rows allows exactly this overlap).
  read_fp8(row_begin, row_end, out.subspan(n, n), scales);
  return dequantize_fp8_band(row_begin, row_begin, row_end, out.data() + n, scales.data(), out);
}

void WeightRows::read_fp8(std::uint64_t row_begin, std::uint64_t row_end,
                          std::span<std::byte> codes, std::span<std::byte> scales) const {
  const TensorEntry& w = checkpoint_.entry(source_.tensor);
  const Fp8Source& f = *source_.fp8;
  const std::uint64_t first = source_.row_begin + row_begin;  // flattened input row
  checkpoint_.shards[source_.tensor.shard].read(w.begin + first * source_.cols,
                                                codes.first((row_end - row_begin) * source_.cols));
  const std::uint64_t local = first - f.view_first_row;  // row within the expert's view
  const TensorEntry& scale = checkpoint_.entry(f.scale);
  checkpoint_.shards[f.scale.shard].read(
      scale.begin + (f.grid_first_row + f.layout.grid_row_begin(local)) *
                        f.layout.scale_bytes_per_grid_row(),
      scales.first(scale_bytes(row_begin, row_end)));
}

std::optional<std::uint64_t> WeightRows::dequantize_fp8_band(
    std::uint64_t row_begin, std::uint64_t band_begin, std::uint64_t band_end,
    const std::byte* codes, const std::byte* scales, std::span<std::byte> out) const {
  const Fp8Source& f = *source_.fp8;
  const Fp8ScaleLayout& layout = f.layout;
  const std::uint64_t base = source_.row_begin - f.view_first_row;  // weight row 0 in the view
  // The band's scale grid rows start where its first row's grid row is
  // within those read for the chunk.
  const std::uint64_t grid_skip =
      layout.grid_row_begin(base + band_begin) - layout.grid_row_begin(base + row_begin);
  Fp8Rows rows;
  rows.code_dtype = checkpoint_.entry(source_.tensor).dtype;
  rows.row_begin = base + band_begin;
  rows.n_rows = band_end - band_begin;
  rows.n_cols = source_.cols;
  rows.codes = codes + (band_begin - row_begin) * source_.cols;
  rows.scales = scales + grid_skip * layout.scale_bytes_per_grid_row();
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
