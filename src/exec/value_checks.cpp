#include "exec/value_checks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "ctquant/scheme/scale_check.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant::detail {

namespace {

std::uint64_t element_bytes(DType dtype) {
  return static_cast<std::uint64_t>(dtype_bits(dtype) / 8);
}

// The smallest and largest weight of a group, from the loaded rows that
// start at row_begin (the group's rows are among them).
std::pair<float, float> group_span(const WeightRows& rows, const ScaleGroup& g,
                                   std::uint64_t row_begin, const std::byte* weight) {
  const DType t = rows.dtype();
  const std::uint64_t esize = element_bytes(t);
  float lo = std::numeric_limits<float>::infinity();
  float hi = -std::numeric_limits<float>::infinity();
  for (std::uint64_t r = g.row_begin; r < g.row_end; ++r) {
    for (std::uint64_t c = g.col_begin; c < g.col_end; ++c) {
      const float w = load_as_float(t, weight + ((r - row_begin) * rows.cols() + c) * esize);
      lo = std::min(lo, w);
      hi = std::max(hi, w);
    }
  }
  return {lo, hi};
}

// "shard: tensor 'name'" for a group whose first element is [row, col] of
// the module: a 2-D weight's element is [row, col] itself, which the group's
// own words repeat; a split expert's stored element [e, i, j] is kept.
std::string group_source(const WeightRows& rows, const ScaleGroup& g) {
  std::string at = rows.element(g.row_begin, g.col_begin);
  const std::string same = fmt::format(": element [{}, {}]", g.row_begin, g.col_begin);
  if (at.ends_with(same)) at.resize(at.size() - same.size());
  return at;
}

// Element k of the scale tensor among those of rows [row_begin, ...): the
// chunk's scale groups follow the groups of the rows before it.
std::uint64_t first_element(const OutputTensorSpec& spec, std::uint64_t row_begin) {
  return spec.bytes_before(row_begin) / element_bytes(spec.dtype);
}

// What the user can change, after the rule.
std::string fix(const ScaleSubject& m) {
  std::string text = fmt::format("keep the module in 16 bits (--ignore '{}')", m.module);
  if (m.observer.mse && m.observer.expand > 1.0) {
    text += fmt::format(", or give the observer a smaller expand (now {})", m.observer.expand);
  }
  if (!m.args.symmetric) text += ", or use a symmetric scheme (its scale needs only max |w|)";
  return text;
}

constexpr const char* kRule =
    "every scale and global scale must be finite and non-zero: codes times an infinite scale, or "
    "divided by a global scale of 0, are not the weights (model_free_ptq writes them as they "
    "come; --allow-unloadable does not cover wrong data)";

}  // namespace

void throw_weight_not_finite(const WeightRows& rows, std::uint64_t row_begin, std::uint64_t bad,
                             const std::byte* data) {
  const std::uint64_t cols = rows.cols();
  const float value = load_as_float(rows.dtype(), data + bad * element_bytes(rows.dtype()));
  throw bad_input(
      fmt::format("{} is {} (a weight to be quantized must be finite; section 3 of the format "
                  "spec, docs/format.md)",
                  rows.element(row_begin + bad / cols, bad % cols), value));
}

void throw_fp8_not_finite(const WeightRows& rows, std::uint64_t row_begin, std::uint64_t bad) {
  const std::uint64_t row = row_begin + bad / rows.cols();
  const std::uint64_t col = bad % rows.cols();
  throw bad_input(fmt::format(
      "{} {} (a dequantized weight must be finite; section 6 of the format spec, docs/format.md)",
      rows.element(row, col), rows.describe_fp8(row, col)));
}

namespace {

bool float_dtype(DType d) { return is_quantizable_float(d) || is_fp8(d); }

// The first element of `bytes` (dtype d) that is not finite, or nullopt.
std::optional<std::uint64_t> first_not_finite(DType d, std::span<const std::byte> bytes) {
  const std::size_t size = dtype_bits(d) / 8;
  for (std::uint64_t k = 0; k * size < bytes.size(); ++k) {
    if (!std::isfinite(load_as_float(d, bytes.data() + k * size))) return k;
  }
  return std::nullopt;
}

// ", the first of N elements of M that are not" when more than the first
// element of `bytes` (dtype d) is not finite, else "".
std::string others_not_finite(DType d, std::span<const std::byte> bytes) {
  const std::size_t size = dtype_bits(d) / 8;
  std::uint64_t bad = 0;
  const std::uint64_t n = bytes.size() / size;
  for (std::uint64_t k = 0; k < n; ++k) {
    bad += std::isfinite(load_as_float(d, bytes.data() + k * size)) ? 0 : 1;
  }
  if (bad < 2) return "";
  return fmt::format(" (the first of {} elements of {} that are not finite)", bad, n);
}

std::string element_index(const std::vector<std::uint64_t>& shape, std::uint64_t k) {
  if (shape.size() != 2) return fmt::format("element {}", k);
  return fmt::format("element [{}, {}]", k / shape[1], k % shape[1]);
}

}  // namespace

void check_converted_values(const Checkpoint& checkpoint, const ConvertedModule& m,
                            const ConvertedTensor& t,
                            std::span<const std::span<const std::byte>> inputs,
                            std::span<const std::byte> out) {
  for (std::size_t i = 0; i < t.inputs.size(); ++i) {
    const TensorEntry& e = checkpoint.entry(t.inputs[i]);
    if (!float_dtype(e.dtype)) continue;
    if (const auto k = first_not_finite(e.dtype, inputs[i])) {
      throw bad_input(fmt::format(
          "{}: tensor '{}' ({}) {}: {} is not finite{}; module '{}' is converted as it is "
          "stored (no requantization), so vLLM would compute NaN from it. "
          "Nothing was written",
          checkpoint.shards[t.inputs[i].shard].label(), e.name, dtype_tag(e.dtype),
          element_index(e.shape, *k),
          load_as_float(e.dtype, inputs[i].data() + *k * (dtype_bits(e.dtype) / 8)),
          others_not_finite(e.dtype, inputs[i]), m.name));
    }
  }
  if (!float_dtype(t.dtype)) return;
  if (const auto k = first_not_finite(t.dtype, out)) {
    // Each input, with its stored value at the same element where it has
    // as many (weight_scale_2 = 0 makes weight_global_scale = 1/0).
    std::vector<std::string> from;
    for (std::size_t i = 0; i < t.inputs.size(); ++i) {
      const TensorEntry& e = checkpoint.entry(t.inputs[i]);
      const std::string where = checkpoint.shards[t.inputs[i].shard].label();
      if (float_dtype(e.dtype) && e.numel() * (dtype_bits(e.dtype) / 8) == inputs[i].size() &&
          e.numel() == t.byte_size / (dtype_bits(t.dtype) / 8)) {
        from.push_back(fmt::format(
            "{}'s {} in {}", e.name,
            load_as_float(e.dtype, inputs[i].data() + *k * (dtype_bits(e.dtype) / 8)), where));
      } else {
        from.push_back(fmt::format("{} in {}", e.name, where));
      }
    }
    throw bad_input(fmt::format(
        "converted tensor '{}' ({}) {}: {} is not finite{} (made from {}); vLLM would compute "
        "NaN from it. Nothing was written",
        t.name, dtype_tag(t.dtype), element_index(t.shape, *k),
        load_as_float(t.dtype, out.data() + *k * (dtype_bits(t.dtype) / 8)),
        others_not_finite(t.dtype, out), join(from, 10)));
  }
}

void check_observer_ranges(const ScaleSubject& m, std::uint64_t row_begin, std::uint64_t n_rows,
                           const std::byte* weight, const float* ranges) {
  const std::uint64_t n = 2 * observed_groups(m.args, n_rows, m.rows.cols());
  bool finite = true;
  for (std::uint64_t i = 0; i < n; ++i) finite &= std::isfinite(ranges[i]);
  if (finite) return;
  std::uint64_t k = 0;
  while (std::isfinite(ranges[2 * k]) && std::isfinite(ranges[2 * k + 1])) ++k;
  if (m.scale == nullptr) {  // no row scales (per-tensor, which refuses MSE observers)
    throw bad_input(fmt::format("module '{}': the observer's range [{}, {}] is not finite; {}",
                                m.module, ranges[2 * k], ranges[2 * k + 1], kRule));
  }
  const ScaleGroup g = scale_group(m.args, *m.scale, m.rows.rows(), m.rows.cols(),
                                   first_element(*m.scale, row_begin) + k);
  const auto [lo, hi] = group_span(m.rows, g, row_begin, weight);
  throw bad_input(fmt::format(
      "{}: {}: the observer's range [{}, {}] is not finite ({} searches from the group's range "
      "[{}, {}] times expand {}, in {}), so its scale in '{}.{}' would be {}; {}; {}",
      group_source(m.rows, g), describe_scale_group(m.args, g), ranges[2 * k], ranges[2 * k + 1],
      m.args.observer, lo, hi, m.observer.expand, dtype_tag(m.rows.dtype()), m.module,
      m.scale->suffix,
      m.args.strategy == QuantArgs::Strategy::kTensorGroup ? "nan and the module's global scale 0"
                                                           : "inf",
      kRule, fix(m)));
}

void check_row_scales(const ScaleSubject& m, const OutputTensorSpec& spec, std::uint64_t row_begin,
                      std::uint64_t n_rows, const std::byte* out, const std::byte* weight,
                      const float* ranges) {
  if (!holds_scales(spec)) return;
  const std::uint64_t first = spec.bytes_before(row_begin);
  const std::uint64_t bytes = spec.bytes_before(row_begin + n_rows) - first;
  const auto bad = first_bad_scale(spec.dtype, std::span<const std::byte>(out, bytes));
  if (!bad) return;
  const std::uint64_t esize = element_bytes(spec.dtype);
  const std::uint64_t element = first / esize + *bad;
  const ScaleGroup g = scale_group(m.args, spec, m.rows.rows(), m.rows.cols(), element);
  const auto [lo, hi] = group_span(m.rows, g, row_begin, weight);
  std::string from = fmt::format("its weights span [{}, {}]", lo, hi);
  if (ranges != nullptr) {
    from += fmt::format(", the observer chose the range [{}, {}]", ranges[2 * *bad],
                        ranges[2 * *bad + 1]);
  }
  throw bad_input(fmt::format("{}: {}: scale is {} in '{}.{}' [{}, {}] ({}); {}; {}",
                              group_source(m.rows, g), describe_scale_group(m.args, g),
                              scale_value_text(spec.dtype, out + *bad * esize), m.module,
                              spec.suffix, g.unit, g.group, from, kRule, fix(m)));
}

void check_whole_scale(const ScaleSubject& m, const OutputTensorSpec& spec,
                       std::span<const std::byte> bytes, float set_amax, bool shared) {
  if (!holds_scales(spec)) return;
  const auto bad = first_bad_scale(spec.dtype, bytes);
  if (!bad) return;
  const bool global = spec.kind == OutputTensorSpec::Kind::kGlobalScale;
  throw bad_input(fmt::format(
      "module '{}': {} '{}.{}' is {} (from max |w| {} of the module{}); {}; {}", m.module,
      global ? "global scale" : "scale", m.module, spec.suffix,
      scale_value_text(spec.dtype, bytes.data() + *bad * element_bytes(spec.dtype)), set_amax,
      shared ? " and the fused layers it shares it with" : "", kRule, fix(m)));
}

}  // namespace ctquant::detail
