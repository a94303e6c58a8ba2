// The checks of verify_against_source for every tensor of OUTPUT that is
// not a quantized module's output (src/verify/tensor_checks.hpp).
#include "verify/tensor_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "ctquant/format/dtype.hpp"
#include "ctquant/source/fp8.hpp"
#include "util/ordered_parallel.hpp"

namespace ctquant::detail {

using nlohmann::json;

std::uint64_t TensorChecks::step_rows(const WeightRows& source, std::uint64_t align) const {
  const std::uint64_t n = std::max<std::uint64_t>(
      1, options_.chunk_bytes / std::max<std::uint64_t>(1, source.row_bytes()));
  return std::max(align, n / align * align);
}

void TensorChecks::rewrite_rows(const PlannedModule& m, DType dtype, std::uint64_t r0,
                                std::uint64_t r1, std::byte* rows) const {
  if (!plan_.rewrite) return;
  if (const TensorRewrite* r = plan_.rewrite->find(plan_.decisions[m.decision].name)) {
    apply_rewrite(*plan_.rewrite, *r, dtype, r0 * m.source.cols, (r1 - r0) * m.source.cols, rows);
  }
}

// Loads source rows; the message of a value that cannot have been `what`
// (an FP8 value that is not finite once dequantized). Thread-safe.
std::optional<std::string> TensorChecks::source_problem(const WeightRows& source, std::uint64_t r0,
                                                        std::uint64_t r1,
                                                        std::vector<std::byte>& rows,
                                                        std::vector<std::byte>& scales,
                                                        const std::string& what) const {
  rows.resize((r1 - r0) * source.row_bytes());
  scales.resize(source.scale_bytes(r0, r1));
  const auto bad = source.load(r0, r1, rows, scales);
  if (!bad) return std::nullopt;
  const std::uint64_t row = r0 + *bad / source.cols();
  const std::uint64_t col = *bad % source.cols();
  return fmt::format("source element [{}, {}] {}; it cannot have been {}", row, col,
                     source.describe_fp8(row, col), what);
}

// A 16-bit weight written from source rows (an FP8 weight dequantized to
// BF16, or a split expert projection kept): its bytes must be the rows
// quantize loaded. Returns whether they are.
bool TensorChecks::compare_rows(const Ref& o, const PlannedModule& m, Collector& c) const {
  const WeightRows source(ckpt_, m.source);
  const std::uint64_t rows = m.source.rows;
  const std::uint64_t cols = m.source.cols;
  const std::uint64_t row_bytes = source.row_bytes();
  if (rows == 0 || cols == 0) return true;
  const std::uint64_t step = step_rows(source, 1);
  const DType dtype = source.dtype();
  const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(dtype) / 8);
  std::vector<std::byte> expected;
  std::vector<std::byte> scales;
  std::vector<std::byte> actual;
  std::uint64_t n_diff = 0;
  std::optional<std::uint64_t> first;
  float first_a = 0;
  float first_b = 0;
  double max_abs = 0;
  for (std::uint64_t r0 = 0; r0 < rows; r0 += step) {
    const std::uint64_t r1 = std::min(rows, r0 + step);
    if (auto problem =
            source_problem(source, r0, r1, expected, scales, "dequantized (section 6)")) {
      c.diff("source", ckpt_.shards[m.source.tensor.shard].label(),
             ckpt_.entry(m.source.tensor).name, *problem);
      return false;
    }
    actual.resize(expected.size());
    read_part(o, r0 * row_bytes, actual);
    if (std::memcmp(actual.data(), expected.data(), actual.size()) == 0) continue;
    for (std::uint64_t i = 0; i < (r1 - r0) * cols; ++i) {
      if (std::memcmp(actual.data() + esize * i, expected.data() + esize * i, esize) == 0) {
        continue;
      }
      const float a = load_as_float(dtype, actual.data() + esize * i);
      const float b = load_as_float(dtype, expected.data() + esize * i);
      ++n_diff;
      if (!first) {
        first = r0 * cols + i;
        first_a = a;
        first_b = b;
      }
      const double d = std::fabs(static_cast<double>(a) - static_cast<double>(b));
      max_abs = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(max_abs, d);
    }
  }
  if (n_diff == 0) return true;
  c.diff("bytes", o.file->label(), o.entry->name,
         fmt::format("{} of {} elements differ from the {}, first at [{}, {}] (OUTPUT {:.9g}, "
                     "INPUT {:.9g}); largest absolute difference {:.6g}",
                     n_diff, rows * cols,
                     source.is_fp8() ? "BF16 dequantization of the FP8 source (section 6)"
                                     : fmt::format("rows of the stacked source tensor '{}'",
                                                   ckpt_.entry(m.source.tensor).name),
                     *first / cols, *first % cols, first_a, first_b, max_abs),
         json{{"elements_differ", n_diff},
              {"elements", rows * cols},
              {"first_index", *first},
              {"first_row", *first / cols},
              {"first_column", *first % cols},
              {"max_abs_difference", max_abs}});
  return false;
}

// Why an input tensor is not written, for an extra tensor's message.
std::string TensorChecks::dropped_reason(const TensorDecision& d) const {
  const std::string param = d.name.substr(d.module.empty() ? 0 : d.module.size() + 1);
  if (is_activation_param(param)) {
    return fmt::format("an activation or KV-cache parameter ('{}') of the FP8 INPUT", param);
  }
  if (d.module.empty() || param != plan_.input_quantization.scale_param()) {
    return "a scale consumed by the dequantization of its FP8 weight";
  }
  return fmt::format("the scale of FP8 weight '{}.weight', consumed by its dequantization",
                     d.module);
}

// One tensor OUTPUT holds that is not a quantized module's output: where
// it is, its dtype and shape, its bytes. Thread-safe: reads files, writes
// only c.
void TensorChecks::check_tensor(const std::string& name, const Expected& e, Collector& c) const {
  VerifyReport& report = c.report();
  const PlannedTensor& t = *e.tensor;
  const Ref o = out_.find(name);
  if (o.file->label() != e.shard->file_name) {
    c.diff("misplaced_tensor", o.file->label(), name,
           fmt::format("held by '{}' in OUTPUT; its source is in '{}'", o.file->label(),
                       e.shard->file_name));
  }
  if (t.source == PlannedTensor::Source::kModule) {
    const PlannedModule& m = plan_.modules[t.module];
    const TensorEntry& s = ckpt_.entry(m.source.tensor);
    if (o.entry->dtype != t.dtype || o.entry->shape != t.shape) {
      c.diff(
          o.entry->dtype != t.dtype ? "dtype" : "shape", o.file->label(), name,
          fmt::format("{} {} in OUTPUT; the {} source {} {} is written as {}, {} {}",
                      dtype_tag(o.entry->dtype), shape_string(o.entry->shape),
                      m.source.fp8 ? "FP8" : "stacked", dtype_tag(s.dtype), shape_string(s.shape),
                      m.source.fp8 ? "its BF16 dequantization (section 6)"
                                   : "one 2-D weight per expert (schemes.md 8)",
                      dtype_tag(t.dtype), shape_string(t.shape)));
      return;
    }
    ++report.tensors_compared;
    if (compare_rows(o, m, c)) ++report.tensors_identical;
    return;
  }
  const TensorDecision& d = plan_.decisions[t.decision];
  const SafetensorsFile& in_file = ckpt_.shards[d.source.shard];
  const TensorEntry& s = ckpt_.entry(d.source);
  if (o.entry->dtype != s.dtype || o.entry->shape != s.shape) {
    c.diff(o.entry->dtype != s.dtype ? "dtype" : "shape", o.file->label(), name,
           fmt::format("{} {} in OUTPUT, {} {} in INPUT", dtype_tag(o.entry->dtype),
                       shape_string(o.entry->shape), dtype_tag(s.dtype), shape_string(s.shape)));
    return;
  }
  ++report.tensors_compared;
  if (const TensorRewrite* r = plan_.rewrite ? plan_.rewrite->find(d.name) : nullptr) {
    // --transform: the source as rewritten (a norm, a Linear kept in 16 bits).
    std::vector<std::byte> expected(s.byte_size());
    in_file.read(s.begin, expected);
    const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(s.dtype) / 8);
    apply_rewrite(*plan_.rewrite, *r, s.dtype, 0, s.byte_size() / esize, expected.data());
    std::vector<std::byte> actual(o.entry->byte_size());
    o.file->read(o.entry->begin, actual);
    if (actual == expected) {
      ++report.tensors_identical;
    } else {
      c.diff("tensor_data", o.file->label(), name,
             fmt::format("differs from the source rewritten by --transform {}",
                         plan_.rewrite->transform));
    }
    return;
  }
  const Ref src{&in_file, &s};
  if (compare_elements(o, src, options_.chunk_bytes, c)) ++report.tensors_identical;
}

// Every tensor but the quantized modules' outputs: present where planned,
// of its dtype and shape, with its bytes (check_tensor, on threads_
// threads, merged in name order); nothing else in OUTPUT.
void TensorChecks::check_tensors() {
  std::map<std::string, const TensorDecision*> input_tensors;
  for (const TensorDecision& d : plan_.decisions) input_tensors[d.name] = &d;
  std::vector<std::pair<const std::string*, const Expected*>> held;
  for (const auto& [name, e] : expected_) {
    if (!handled_.contains(name) && out_.find(name)) held.emplace_back(&name, &e);
  }
  ordered_parallel<VerifyReport>(
      held.size(), threads_,
      [&](std::size_t i, unsigned) {
        VerifyReport part;
        Collector pc(part);
        check_tensor(*held[i].first, *held[i].second, pc);
        return part;
      },
      [&](std::size_t, VerifyReport&& part) { merge_findings(c_.report(), std::move(part)); });
  for (const auto& [name, shards] : out_.where) {
    if (expected_.contains(name) || handled_.contains(name)) continue;
    const Ref o = out_.find(name);
    const auto in = input_tensors.find(name);
    if (in == input_tensors.end()) {
      c_.diff("extra_tensor", o.file->label(), name,
              "in OUTPUT only; the source has no such tensor");
    } else if (in->second->fate == Fate::kDrop) {
      c_.diff("extra_tensor", o.file->label(), name,
              fmt::format("in OUTPUT, but it is {}; section 6: it is not written",
                          dropped_reason(*in->second)));
    } else if (in->second->fate == Fate::kSplit) {
      c_.diff("extra_tensor", o.file->label(), name,
              "in OUTPUT, but the stacked expert tensor is written as one 2-D weight per "
              "expert and projection (schemes.md 8)");
    } else {
      c_.diff("extra_tensor", o.file->label(), name,
              fmt::format("in OUTPUT, but quantize replaces it ({})", in->second->rule));
    }
  }
  for (const auto& [name, e] : expected_) {
    if (handled_.contains(name) || out_.find(name)) continue;
    const PlannedTensor& t = *e.tensor;
    if (t.source == PlannedTensor::Source::kCopy) {
      const TensorDecision& d = plan_.decisions[t.decision];
      const TensorEntry& s = ckpt_.entry(d.source);
      c_.diff("missing_tensor", ckpt_.shards[d.source.shard].label(), name,
              fmt::format("in INPUT only ({} {}): OUTPUT neither copies nor quantizes it",
                          dtype_tag(s.dtype), shape_string(s.shape)));
    } else {
      c_.diff("missing_tensor", e.shard->file_name, name,
              fmt::format("missing: quantize writes it as {} {} from '{}'", dtype_tag(t.dtype),
                          shape_string(t.shape),
                          ckpt_.entry(plan_.modules[t.module].source.tensor).name));
    }
  }
}

}  // namespace ctquant::detail
