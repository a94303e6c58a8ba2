#include "ctquant/source/fp8.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/format/safetensors.hpp"
#include "simd/simd.hpp"
#include "source/fp8_simd.hpp"

namespace ctquant {

using nlohmann::json;

namespace {

constexpr const char* kConverts =
    "ctquant converts unquantized BF16/F16/F32 checkpoints, block FP8 (quant_method \"fp8\" "
    "with weight_block_size) and compressed-tensors float-quantized FP8";

std::string string_field(const json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_string()) return {};
  return object[key].get<std::string>();
}

// A JSON value that must be a positive integer (a block dimension).
std::optional<std::uint64_t> positive_integer(const json& value) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (v > 0) return v;
  } else if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    if (v > 0) return static_cast<std::uint64_t>(v);
  }
  return std::nullopt;
}

// [rows, cols] from a two-element array of positive integers.
std::optional<std::array<std::uint64_t, 2>> block_pair(const json& value) {
  if (!value.is_array() || value.size() != 2) return std::nullopt;
  const auto rows = positive_integer(value[0]);
  const auto cols = positive_integer(value[1]);
  if (!rows || !cols) return std::nullopt;
  return std::array<std::uint64_t, 2>{*rows, *cols};
}

[[noreturn]] void refuse(const std::string& method, const std::string& format,
                         const std::string& why) {
  throw bad_input(fmt::format(
      "{}: quantization_config has quant_method \"{}\"{}: {}; {}", kConfigFileName, method,
      format.empty() ? "" : fmt::format(" with format \"{}\"", format), why, kConverts));
}

InputQuantization classify_block_fp8(const json& qc) {
  InputQuantization q;
  q.kind = InputQuantKind::kBlockFp8;
  if (!qc.contains("weight_block_size") || qc["weight_block_size"].is_null()) {
    refuse("fp8", "",
           "it has no weight_block_size (per-tensor FP8 checkpoints are not supported, and the "
           "block size is never guessed)");
  }
  q.block_size = block_pair(qc["weight_block_size"]);
  if (!q.block_size) {
    refuse("fp8", "",
           fmt::format("weight_block_size is {}, expected two positive integers [rows, cols]",
                       qc["weight_block_size"].dump()));
  }
  return q;
}

InputQuantization classify_compressed_tensors(const json& qc) {
  const std::string method = "compressed-tensors";
  std::string format = string_field(qc, "format");
  const json groups = qc.contains("config_groups") ? qc["config_groups"] : json();
  // A top-level format of "mixed-precision" (or none) defers to the groups.
  if (format.empty() || format == "mixed-precision") {
    std::vector<std::string> formats;
    if (groups.is_object()) {
      for (const auto& [name, group] : groups.items()) {
        const std::string f = string_field(group, "format");
        if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
      }
    }
    if (formats.size() == 1 && formats[0] == "float-quantized") {
      format = formats[0];
    } else {
      std::string listed;
      for (const auto& f : formats)
        listed += (listed.empty() ? "" : ", ") + (f.empty() ? "none" : f);
      refuse(method, format,
             fmt::format("its config groups have format(s) [{}]; only \"float-quantized\" "
                         "(FP8 weights) can be dequantized",
                         listed));
    }
  }
  if (format == "pack-quantized") {
    refuse(method, format,
           "the checkpoint is already pack-quantized; quantizing it again is not supported");
  }
  if (format != "float-quantized") {
    refuse(method, format, "only \"float-quantized\" (FP8 weights) can be dequantized");
  }
  if (groups.is_object()) {
    for (const auto& [name, group] : groups.items()) {
      const std::string f = string_field(group, "format");
      if (!f.empty() && f != format) {
        refuse(method, format,
               fmt::format("config group \"{}\" has format \"{}\"; only \"float-quantized\" "
                           "(FP8 weights) can be dequantized",
                           name, f));
      }
    }
  }
  const std::string status = string_field(qc, "quantization_status");
  if (!status.empty() && status != "compressed") {
    refuse(method, format,
           fmt::format("quantization_status is \"{}\", expected \"compressed\" (F8 weights with "
                       "their weight_scale)",
                       status));
  }
  if (qc.contains("sparsity_config") && !qc["sparsity_config"].is_null()) {
    const std::string sparse = string_field(qc["sparsity_config"], "format");
    if (sparse != "dense") {
      refuse(
          method, format,
          fmt::format("it has a sparsity_config (format \"{}\"), which is not supported", sparse));
    }
  }
  if (qc.contains("transform_config") && !qc["transform_config"].is_null() &&
      !qc["transform_config"].empty()) {
    refuse(method, format,
           "it has a transform_config (rotated weights would need their transforms at inference)");
  }

  InputQuantization q;
  q.kind = InputQuantKind::kCompressedTensorsFp8;
  if (groups.is_object()) {
    for (const auto& [name, group] : groups.items()) {
      if (!group.is_object() || !group.contains("weights") || group["weights"].is_null()) continue;
      const json& w = group["weights"];
      const std::string where = fmt::format("config group \"{}\" weights", name);
      const std::string type = string_field(w, "type");
      const bool bits_ok = w.contains("num_bits") && w["num_bits"].is_number_integer() &&
                           w["num_bits"].get<std::int64_t>() == 8;
      if (type != "float" || !bits_ok) {
        refuse(method, format,
               fmt::format("{} have type \"{}\" and num_bits {}, expected 8-bit float (FP8)", where,
                           type, w.contains("num_bits") ? w["num_bits"].dump() : "none"));
      }
      if (w.contains("symmetric") && w["symmetric"].is_boolean() && !w["symmetric"].get<bool>()) {
        refuse(method, format, fmt::format("{} are asymmetric, which is not supported", where));
      }
      const std::string strategy = string_field(w, "strategy");
      if (strategy == "tensor") {
        q.per_tensor = true;
      } else if (strategy == "channel") {
        q.per_channel = true;
      } else if (strategy == "block") {
        const auto block =
            w.contains("block_structure") ? block_pair(w["block_structure"]) : std::nullopt;
        if (!block) {
          refuse(method, format,
                 fmt::format("{} have strategy \"block\" without a block_structure of two "
                             "positive integers",
                             where));
        }
        if (q.block_size && *q.block_size != *block) {
          refuse(method, format,
                 "its config groups use different block structures, which is not supported");
        }
        q.block_size = block;
      } else {
        refuse(method, format,
               fmt::format("{} have strategy \"{}\"; supported FP8 weight strategies are "
                           "tensor, channel and block",
                           where, strategy));
      }
    }
  }
  if (qc.contains("ignore") && !qc["ignore"].is_null()) {
    if (!qc["ignore"].is_array()) {
      refuse(method, format, fmt::format("ignore is {}, expected a list", qc["ignore"].dump()));
    }
    for (const json& entry : qc["ignore"]) {
      if (!entry.is_string()) {
        refuse(method, format, fmt::format("ignore entry {} is not a string", entry.dump()));
      }
      q.ignore.push_back(entry.get<std::string>());
    }
  }
  return q;
}

std::string block_string(const std::array<std::uint64_t, 2>& b) {
  return fmt::format("[{}, {}]", b[0], b[1]);
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Decoded value of every code, built once: the dequantizer's inner loop is a
// table lookup, a multiply and a rounding.
struct DecodeTables {
  std::array<float, 256> e4m3{};
  std::array<float, 256> e5m2{};
  DecodeTables() {
    for (unsigned c = 0; c < 256; ++c) {
      e4m3[c] = f8_e4m3_to_float(static_cast<std::uint8_t>(c));
      e5m2[c] = f8_e5m2_to_float(static_cast<std::uint8_t>(c));
    }
  }
};

const DecodeTables& decode_tables() {
  static const DecodeTables tables;
  return tables;
}

bool bf16_is_finite(std::uint16_t bits) { return (bits & 0x7F80u) != 0x7F80u; }

}  // namespace

std::string_view InputQuantization::scale_param() const {
  switch (kind) {
    case InputQuantKind::kBlockFp8:
      return "weight_scale_inv";
    case InputQuantKind::kCompressedTensorsFp8:
      return "weight_scale";
    case InputQuantKind::kNone:
      break;
  }
  return {};
}

std::string InputQuantization::describe() const {
  switch (kind) {
    case InputQuantKind::kBlockFp8:
      return fmt::format("block FP8, weight_block_size {}", block_string(*block_size));
    case InputQuantKind::kCompressedTensorsFp8: {
      std::string strategies;
      if (per_tensor) strategies += "tensor";
      if (per_channel) strategies += std::string(strategies.empty() ? "" : ", ") + "channel";
      if (block_size) {
        strategies +=
            fmt::format("{}block {}", strategies.empty() ? "" : ", ", block_string(*block_size));
      }
      return fmt::format("compressed-tensors float-quantized FP8 (strategy {})",
                         strategies.empty() ? "none" : strategies);
    }
    case InputQuantKind::kNone:
      break;
  }
  return "unquantized";
}

InputQuantization classify_input_quantization(const std::optional<json>& config) {
  if (!config || !config->is_object() || !config->contains("quantization_config") ||
      (*config)["quantization_config"].is_null()) {
    return {};
  }
  const json& qc = (*config)["quantization_config"];
  if (!qc.is_object()) {
    throw bad_input(fmt::format("{}: quantization_config is a JSON {}, expected an object",
                                kConfigFileName, qc.type_name()));
  }
  const std::string method = string_field(qc, "quant_method");
  if (method == "fp8") return classify_block_fp8(qc);
  if (method == "compressed-tensors") return classify_compressed_tensors(qc);
  refuse(method.empty() ? "(none)" : method, string_field(qc, "format"),
         "this kind of checkpoint is not converted");
}

bool is_activation_param(std::string_view param) {
  return std::find(kActivationParams.begin(), kActivationParams.end(), param) !=
         kActivationParams.end();
}

Fp8ScaleLayout fp8_scale_layout(const InputQuantization& q, std::uint64_t rows, std::uint64_t cols,
                                DType scale_dtype, const std::vector<std::uint64_t>& scale_shape) {
  if (scale_dtype != DType::kF32 && scale_dtype != DType::kBF16) {
    throw bad_input(
        fmt::format("scale dtype is {}, expected F32 or BF16 (section 6 of the format "
                    "spec)",
                    dtype_tag(scale_dtype)));
  }
  Fp8ScaleLayout layout;
  layout.dtype = scale_dtype;
  std::vector<std::string> expected;
  if (q.block_size) {
    const std::uint64_t bh = (*q.block_size)[0];
    const std::uint64_t bw = (*q.block_size)[1];
    const std::vector<std::uint64_t> grid{ceil_div(rows, bh), ceil_div(cols, bw)};
    if (scale_shape == grid) {
      layout.block_rows = bh;
      layout.block_cols = bw;
      layout.grid_rows = grid[0];
      layout.grid_cols = grid[1];
      return layout;
    }
    expected.push_back(
        fmt::format("{} (blocks of {} x {} over [{}, {}], edge blocks partial, "
                    "from {} in {})",
                    shape_string(grid), bh, bw, rows, cols,
                    q.kind == InputQuantKind::kBlockFp8 ? "weight_block_size" : "block_structure",
                    kConfigFileName));
  }
  if (q.per_channel) {
    if (scale_shape == std::vector<std::uint64_t>{rows} ||
        scale_shape == std::vector<std::uint64_t>{rows, 1}) {
      layout.block_rows = 1;
      layout.block_cols = std::max<std::uint64_t>(cols, 1);
      layout.grid_rows = rows;
      layout.grid_cols = 1;
      return layout;
    }
    expected.push_back(
        fmt::format("[{}, 1] or [{}] (strategy \"channel\": one scale per row)", rows, rows));
  }
  if (q.per_tensor) {
    if (scale_shape.empty() || scale_shape == std::vector<std::uint64_t>{1}) {
      layout.block_rows = std::max<std::uint64_t>(rows, 1);
      layout.block_cols = std::max<std::uint64_t>(cols, 1);
      layout.grid_rows = 1;
      layout.grid_cols = 1;
      return layout;
    }
    expected.push_back("[1] or [] (strategy \"tensor\": one scale)");
  }
  std::string listed;
  for (const auto& e : expected) listed += (listed.empty() ? "" : ", or ") + e;
  if (listed.empty())
    listed = fmt::format("no scale ({} configures no FP8 weights)", kConfigFileName);
  throw bad_input(
      fmt::format("scale has shape {}, expected {}", shape_string(scale_shape), listed));
}

std::uint16_t dequantize_fp8_value(DType code_dtype, std::uint8_t code, float scale) {
  const float value =
      code_dtype == DType::kF8_E5M2 ? f8_e5m2_to_float(code) : f8_e4m3_to_float(code);
  const float product = value * scale;  // float32, round to nearest even
  return float_to_bf16(product);
}

namespace {

// Blocks with at least this many elements in a call get a table of their
// 256 dequantized values (one product and rounding per code instead of per
// element); smaller ones are computed element by element. The values are the
// same either way: the table holds exactly what the element loop computes.
constexpr std::uint64_t kTableMinBlockElements = 2048;

// The element loop: code -> float (exact) -> times the block's scale ->
// rounded to BF16, written at out[2i] (rows.codes may be rows.out + n).
std::optional<std::uint64_t> dequantize_rows_direct(const Fp8ScaleLayout& layout,
                                                    const Fp8Rows& rows,
                                                    const std::array<float, 256>& table) {
  const std::uint64_t scale_size = static_cast<std::uint64_t>(dtype_bits(layout.dtype) / 8);
  const std::uint64_t first_grid_row = layout.grid_row_begin(rows.row_begin);
  for (std::uint64_t r = 0; r < rows.n_rows; ++r) {
    const std::uint64_t grid_row = (rows.row_begin + r) / layout.block_rows - first_grid_row;
    const std::byte* scale_row = rows.scales + grid_row * layout.grid_cols * scale_size;
    const std::uint64_t row_start = r * rows.n_cols;
    for (std::uint64_t c0 = 0; c0 < rows.n_cols; c0 += layout.block_cols) {
      const float scale =
          load_as_float(layout.dtype, scale_row + (c0 / layout.block_cols) * scale_size);
      const std::uint64_t c1 = std::min(rows.n_cols, c0 + layout.block_cols);
      for (std::uint64_t c = c0; c < c1; ++c) {
        const std::uint64_t i = row_start + c;
        // Read the code before writing: with the in-place layout the code of
        // element i sits at byte n + i, past the BF16 bytes 2i, 2i + 1.
        const auto code = std::to_integer<std::uint8_t>(rows.codes[i]);
        const std::uint16_t bits = float_to_bf16(table[code] * scale);
        if (!bf16_is_finite(bits)) return i;
        std::memcpy(rows.out + 2 * i, &bits, 2);
      }
    }
  }
  return std::nullopt;
}

// The same results through one 256-entry BF16 table per block of the current
// scale-grid row, rebuilt when the grid row changes.
std::optional<std::uint64_t> dequantize_rows_tabled(const Fp8ScaleLayout& layout,
                                                    const Fp8Rows& rows,
                                                    const std::array<float, 256>& table) {
  const std::uint64_t scale_size = static_cast<std::uint64_t>(dtype_bits(layout.dtype) / 8);
  const std::uint64_t first_grid_row = layout.grid_row_begin(rows.row_begin);
  const std::uint64_t blocks_per_row =
      rows.n_cols / layout.block_cols + (rows.n_cols % layout.block_cols != 0 ? 1 : 0);
  std::vector<std::array<std::uint16_t, 256>> block_tables(blocks_per_row);
  std::uint64_t tables_grid_row = std::numeric_limits<std::uint64_t>::max();
  for (std::uint64_t r = 0; r < rows.n_rows; ++r) {
    const std::uint64_t grid_row = (rows.row_begin + r) / layout.block_rows - first_grid_row;
    if (grid_row != tables_grid_row) {
      const std::byte* scale_row = rows.scales + grid_row * layout.grid_cols * scale_size;
      for (std::uint64_t b = 0; b < blocks_per_row; ++b) {
        const float scale = load_as_float(layout.dtype, scale_row + b * scale_size);
        for (unsigned code = 0; code < 256; ++code) {
          block_tables[b][code] = float_to_bf16(table[code] * scale);
        }
      }
      tables_grid_row = grid_row;
    }
    const std::uint64_t row_start = r * rows.n_cols;
    for (std::uint64_t b = 0; b < blocks_per_row; ++b) {
      const std::array<std::uint16_t, 256>& values = block_tables[b];
      const std::uint64_t c0 = b * layout.block_cols;
      const std::uint64_t c1 = std::min(rows.n_cols, c0 + layout.block_cols);
      for (std::uint64_t c = c0; c < c1; ++c) {
        const std::uint64_t i = row_start + c;
        const std::uint16_t bits = values[std::to_integer<std::uint8_t>(rows.codes[i])];
        if (!bf16_is_finite(bits)) return i;
        std::memcpy(rows.out + 2 * i, &bits, 2);
      }
    }
  }
  return std::nullopt;
}

// E4M3 codes through the vector kernel (source/fp8_simd.hpp), a row segment
// of one scale block at a time; the same values as the loops above.
std::optional<std::uint64_t> dequantize_rows_vector(const Fp8ScaleLayout& layout,
                                                    const Fp8Rows& rows,
                                                    detail::Fp8DecodeKernel* kernel) {
  const std::uint64_t scale_size = static_cast<std::uint64_t>(dtype_bits(layout.dtype) / 8);
  const std::uint64_t first_grid_row = layout.grid_row_begin(rows.row_begin);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(rows.codes);
  auto* out = reinterpret_cast<std::uint16_t*>(rows.out);
  for (std::uint64_t r = 0; r < rows.n_rows; ++r) {
    const std::uint64_t grid_row = (rows.row_begin + r) / layout.block_rows - first_grid_row;
    const std::byte* scale_row = rows.scales + grid_row * layout.grid_cols * scale_size;
    const std::uint64_t row_start = r * rows.n_cols;
    for (std::uint64_t c0 = 0; c0 < rows.n_cols; c0 += layout.block_cols) {
      const float scale =
          load_as_float(layout.dtype, scale_row + (c0 / layout.block_cols) * scale_size);
      const std::uint64_t c1 = std::min(rows.n_cols, c0 + layout.block_cols);
      const std::uint64_t i = row_start + c0;
      if (const auto bad = kernel(codes + i, c1 - c0, scale, out + i)) return i + *bad;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> dequantize_fp8_rows(const Fp8ScaleLayout& layout,
                                                 const Fp8Rows& rows) {
  if (rows.code_dtype == DType::kF8_E4M3) {
    static detail::Fp8DecodeKernel* const kernel =
        detail::fp8_decode_kernel(detail::simd_best_level());
    if (kernel != nullptr) return dequantize_rows_vector(layout, rows, kernel);
  }
  return dequantize_fp8_rows_scalar(layout, rows);
}

std::optional<std::uint64_t> dequantize_fp8_rows_scalar(const Fp8ScaleLayout& layout,
                                                        const Fp8Rows& rows) {
  const std::array<float, 256>& table =
      rows.code_dtype == DType::kF8_E5M2 ? decode_tables().e5m2 : decode_tables().e4m3;
  // Both factors are at most n_rows and n_cols, whose product is a buffer size.
  const std::uint64_t block_elements =
      std::min(layout.block_rows, rows.n_rows) * std::min(layout.block_cols, rows.n_cols);
  return block_elements >= kTableMinBlockElements ? dequantize_rows_tabled(layout, rows, table)
                                                  : dequantize_rows_direct(layout, rows, table);
}

}  // namespace ctquant
