// verify_against_source: OUTPUT against the INPUT it was made from.
//
// The source is planned again with the scheme groups and ignore list of
// OUTPUT's config.json (plan_options_from_config, make_plan), which gives
// every tensor OUTPUT must hold: its name, dtype, shape and shard, and for
// each weight the module it belongs to. Copied tensors must be the source's
// bytes; 16-bit weights (FP8 weights written as BF16, split experts kept)
// the rows WeightRows loads, exactly as quantize read them; quantized
// modules are recomputed row chunk by row chunk with their family's
// reference kernel (quantize_ref) and compared code by code, scale by scale,
// and their dequantized values (the family's dequantize) are compared with
// the source rows for the error figures.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/kernel.hpp"
#include "ctquant/source/weight_rows.hpp"
#include "ctquant/verify/loadability.hpp"
#include "ctquant/util/error.hpp"
#include "verify/side.hpp"

namespace ctquant {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace detail;

namespace {

// The scheme groups and ignore list OUTPUT's config.json describes.
PlanOptions plan_options_of(const Side& output) {
  const auto fail = [&](const std::string& what) {
    return bad_input(
        fmt::format("{} config.json: {}; --against-source needs the quantization_config "
                    "quantize writes (section 5 of the format spec, docs/format.md)",
                    output.label, what));
  };
  if (!output.config_error.empty()) throw fail(output.config_error);
  if (!output.config || !output.config->is_object()) throw fail("missing");
  const auto qc = output.config->find("quantization_config");
  if (qc == output.config->end() || !qc->is_object()) throw fail("no quantization_config");
  try {
    return plan_options_from_config(*qc, "quantization_config");
  } catch (const Error& e) {
    throw fail(e.what());
  }
}

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

class AgainstSource {
 public:
  AgainstSource(const Side& out, const Checkpoint& checkpoint, const QuantizePlan& plan,
                const VerifyOptions& options, Collector& c)
      : out_(out), ckpt_(checkpoint), plan_(plan), options_(options), c_(c) {}

  void run() {
    for (const ShardPlan& s : plan_.shards) {
      for (const PlannedTensor& t : s.tensors) expected_[t.name] = {&s, &t};
    }
    check_fates();
    compute_amax();
    for (std::size_t mi = 0; mi < plan_.modules.size(); ++mi) {
      const PlannedModule& m = plan_.modules[mi];
      if (handled_modules_.contains(mi)) continue;
      if (m.kind == PlannedModule::Kind::kQuantize) check_quantized(mi);
    }
    check_tensors();
  }

 private:
  struct Expected {
    const ShardPlan* shard = nullptr;
    const PlannedTensor* tensor = nullptr;
  };

  // The quantized outputs OUTPUT holds for a module name (names with the
  // module's prefix that a family writes).
  bool holds_quantized(const std::string& module) const {
    for (const char* p : {"weight_packed", "weight_scale", "weight_global_scale",
                          "weight_zero_point", "weight_shape"}) {
      if (out_.find(module + "." + p)) return true;
    }
    return false;
  }

  // Section 2: the fate OUTPUT's ignore list and targets give each weight
  // must be the one OUTPUT holds.
  void check_fates() {
    for (std::size_t mi = 0; mi < plan_.modules.size(); ++mi) {
      const PlannedModule& m = plan_.modules[mi];
      if (m.kind != PlannedModule::Kind::kQuantize) continue;
      const SchemeGroup& g = plan_.group_of(m);
      const auto specs = g.family()->outputs(g.weights, m.dtype, m.source.rows, m.source.cols);
      bool all = true;
      for (const auto& s : specs) all = all && out_.find(m.name + "." + s.suffix);
      const Ref w = out_.find(m.name + ".weight");
      const bool plain = w && is_quantizable_float(w.entry->dtype);
      if (all || !plain) continue;
      c_.diff("fate", ckpt_.shards[m.source.tensor.shard].label(), m.name + ".weight",
              fmt::format("config.json's ignore list and targets select '{}' ({}), so vLLM will "
                          "expect '{}.{}', but OUTPUT does not hold it quantized",
                          m.name, m.rule, m.name, specs.front().suffix));
      handled_modules_.insert(mi);
      for (const auto& s : specs) handled_.insert(m.name + "." + s.suffix);
      handled_.insert(m.name + ".weight");
    }
    for (const auto& [name, e] : expected_) {
      const PlannedTensor& t = *e.tensor;
      if (!name.ends_with(".weight")) continue;
      const bool is_module = t.source == PlannedTensor::Source::kModule && !t.output;
      const bool is_weight_copy = t.source == PlannedTensor::Source::kCopy &&
                                  plan_.decisions[t.decision].selectable;
      if (!is_module && !is_weight_copy) continue;
      const std::string module = module_of(name);
      if (!holds_quantized(module)) continue;
      const std::string rule = is_module ? plan_.modules[t.module].rule
                                         : plan_.decisions[t.decision].rule;
      c_.diff("fate", e.shard->file_name, name,
              fmt::format("OUTPUT holds '{}' quantized, but config.json's ignore list and "
                          "targets leave it unquantized ({}), so vLLM will look for '{}'",
                          module, rule, name));
      handled_.insert(name);
      for (const auto& [n, shards] : out_.where) {
        if (module_of(n) == module) handled_.insert(n);
      }
    }
  }

  // max |w| of every module that needs it, then of its set (schemes.md 7).
  void compute_amax() {
    set_amax_.assign(plan_.modules.size(), 0.0f);
    std::vector<std::byte> rows;
    std::vector<std::byte> scales;
    for (const std::vector<std::size_t>& set : plan_.amax_sets) {
      float amax = 0.0f;
      bool ok = true;
      for (const std::size_t mi : set) {
        const WeightRows source(ckpt_, plan_.modules[mi].source);
        const std::uint64_t step = step_rows(source, 1);
        for (std::uint64_t r0 = 0; r0 < source.rows() && ok; r0 += step) {
          const std::uint64_t r1 = std::min(source.rows(), r0 + step);
          rows.resize((r1 - r0) * source.row_bytes());
          scales.resize(source.scale_bytes(r0, r1));
          float chunk = 0.0f;
          if (source.load(r0, r1, rows, scales) ||
              max_abs(source.dtype(), rows.data(), (r1 - r0) * source.cols(), chunk)) {
            ok = false;  // reported when the module itself is checked
          }
          amax = std::max(amax, chunk);
        }
      }
      for (const std::size_t mi : set) set_amax_[mi] = amax;
    }
  }

  std::uint64_t step_rows(const WeightRows& source, std::uint64_t align) const {
    const std::uint64_t n =
        std::max<std::uint64_t>(1, options_.chunk_bytes / std::max<std::uint64_t>(1, source.row_bytes()));
    return std::max(align, n / align * align);
  }

  // Loads source rows, reporting a value that cannot have been quantized.
  bool load_source(const WeightRows& source, const TensorLocation& tensor, std::uint64_t r0,
                   std::uint64_t r1, std::vector<std::byte>& rows, std::vector<std::byte>& scales,
                   const std::string& what) {
    rows.resize((r1 - r0) * source.row_bytes());
    scales.resize(source.scale_bytes(r0, r1));
    if (const auto bad = source.load(r0, r1, rows, scales)) {
      const std::uint64_t row = r0 + *bad / source.cols();
      const std::uint64_t col = *bad % source.cols();
      c_.diff("source", ckpt_.shards[tensor.shard].label(), ckpt_.entry(tensor).name,
              fmt::format("source element [{}, {}] {}; it cannot have been {}", row, col,
                          source.describe_fp8(row, col), what));
      return false;
    }
    return true;
  }

  void check_quantized(std::size_t mi) {
    const PlannedModule& m = plan_.modules[mi];
    const SchemeGroup& g = plan_.group_of(m);
    const SchemeFamily& family = *g.family();
    const QuantArgs& args = g.weights;
    const auto specs = family.outputs(args, m.dtype, m.source.rows, m.source.cols);
    const std::string first_name = m.name + "." + specs.front().suffix;
    const std::string file = [&] {
      const Ref r = out_.find(first_name);
      return r ? r.file->label() : plan_.shards[m.shard].file_name;
    }();
    // Section 4: every output tensor present, of its dtype and shape.
    std::vector<std::string> layout;
    std::vector<Ref> refs;
    for (const OutputTensorSpec& s : specs) {
      const std::string name = m.name + "." + s.suffix;
      handled_.insert(name);
      const Ref r = out_.find(name);
      refs.push_back(r);
      if (!r) {
        layout.push_back(fmt::format("'{}' is missing", name));
      } else if (r.entry->dtype != s.dtype || r.entry->shape != s.shape) {
        layout.push_back(fmt::format("'{}' is {} {}, expected {} {}", name,
                                     dtype_tag(r.entry->dtype), shape_string(r.entry->shape),
                                     dtype_tag(s.dtype), shape_string(s.shape)));
      }
    }
    if (!layout.empty()) {
      std::string message;
      for (const auto& l : layout) message += (message.empty() ? "" : "; ") + l;
      c_.diff("layout", file, first_name,
              fmt::format("{} ({}, section 4 of the format spec, docs/format.md)", message,
                          family.format));
      return;
    }
    const WeightRows source(ckpt_, m.source);
    const std::uint64_t rows = m.source.rows;
    const std::uint64_t cols = m.source.cols;
    const float amax = set_amax_[mi];

    // Whole tensors (weight_shape, a global scale): exactly what the family writes.
    std::vector<std::vector<std::byte>> whole_stored;
    std::size_t whole_index = 0;
    for (std::size_t o = 0; o < specs.size(); ++o) {
      if (specs[o].fill != OutputTensorSpec::Fill::kWhole) continue;
      std::vector<std::byte> stored = read_whole(refs[o]);
      const std::vector<std::byte> want =
          family.whole_tensor(args, m.dtype, rows, cols, amax, whole_index++);
      if (stored != want) {
        c_.diff(specs[o].kind == OutputTensorSpec::Kind::kShape ? "layout" : "scale",
                refs[o].file->label(), refs[o].entry->name,
                specs[o].kind == OutputTensorSpec::Kind::kShape
                    ? fmt::format("'{}' does not hold [{}, {}]", refs[o].entry->name, rows, cols)
                    : fmt::format("'{}' is not the value the source gives (from max |w| {} of "
                                  "the module{})",
                                  refs[o].entry->name, amax,
                                  m.amax_set && plan_.amax_sets[*m.amax_set].size() > 1
                                      ? " and the fused layers it shares it with"
                                      : ""));
      }
      whole_stored.push_back(std::move(stored));
    }

    ModuleCheck check;
    check.module = m.name;
    check.rows = rows;
    check.cols = cols;
    check.fp8_source = source.is_fp8();
    const std::uint64_t scale_rows = std::max<std::uint64_t>(1, args.scale_rows(rows));
    const std::uint64_t scale_cols = std::max<std::uint64_t>(1, args.scale_cols(cols));
    const std::uint64_t groups_per_row = (cols + scale_cols - 1) / scale_cols;
    check.groups = (rows + scale_rows - 1) / scale_rows * groups_per_row;
    std::set<std::uint64_t> mismatched;  // group indices
    const auto mark = [&](std::uint64_t row, std::uint64_t group_col,
                          std::optional<std::uint64_t> col) {
      const std::uint64_t gi = row / scale_rows * groups_per_row + group_col;
      mismatched.insert(gi);
      if (!check.first_row || row < *check.first_row ||
          (row == *check.first_row && group_col < *check.first_group)) {
        check.first_row = row;
        check.first_group = group_col;
        check.first_column = col;
      } else if (row == *check.first_row && group_col == *check.first_group && col &&
                 (!check.first_column || *col < *check.first_column)) {
        check.first_column = col;
      }
    };

    std::vector<std::size_t> row_outputs;
    for (std::size_t o = 0; o < specs.size(); ++o) {
      if (specs[o].fill == OutputTensorSpec::Fill::kRows) row_outputs.push_back(o);
    }
    const std::uint64_t align = std::max<std::uint64_t>(1, family.row_alignment(args));
    const std::uint64_t step = step_rows(source, align);
    std::vector<std::byte> src_rows;
    std::vector<std::byte> fp8_scales;
    std::vector<std::vector<std::byte>> ref(row_outputs.size());
    std::vector<std::vector<std::byte>> stored(row_outputs.size());
    std::vector<std::byte> scratch;
    std::vector<float> values;
    double sum_err2 = 0;
    double sum_w2 = 0;
    std::uint64_t accepted_scales = 0;
    std::uint64_t max_scale_ulp = 0;
    for (std::uint64_t r0 = 0; r0 < rows; r0 += step) {
      const std::uint64_t r1 = std::min(rows, r0 + step);
      const std::uint64_t n = r1 - r0;
      if (!load_source(source, m.source.tensor, r0, r1, src_rows, fp8_scales, "quantized")) return;
      KernelIo io;
      io.dtype = source.dtype();
      io.n_rows = n;
      io.n_cols = cols;
      io.row_begin = r0;
      io.weight = src_rows.data();
      io.tensor_amax = amax;
      DequantIo dq;
      dq.dtype = source.dtype();
      dq.n_rows = n;
      dq.n_cols = cols;
      dq.row_begin = r0;
      for (std::size_t i = 0; i < row_outputs.size(); ++i) {
        const OutputTensorSpec& s = specs[row_outputs[i]];
        const std::uint64_t first = s.bytes_before(r0);
        const std::uint64_t bytes = s.bytes_before(r1) - first;
        ref[i].assign(bytes, std::byte{0});
        stored[i].resize(bytes);
        read_part(refs[row_outputs[i]], first, stored[i]);
        io.out[i] = ref[i].data();
        dq.in[i] = stored[i].data();
      }
      for (std::size_t k = 0; k < whole_stored.size() && k < dq.whole.size(); ++k) {
        dq.whole[k] = whole_stored[k].data();
      }
      scratch.resize(family.scratch_bytes(args, n, cols));
      io.scratch = scratch;
      if (const auto bad = family.quantize_ref(args, io)) {
        c_.diff("source", ckpt_.shards[m.source.tensor.shard].label(),
                ckpt_.entry(m.source.tensor).name,
                fmt::format("source value at row {}, column {} is not finite; it cannot have "
                            "been quantized",
                            r0 + *bad / cols, *bad % cols));
        return;
      }
      for (std::size_t i = 0; i < row_outputs.size(); ++i) {
        const OutputTensorSpec& s = specs[row_outputs[i]];
        if (std::memcmp(ref[i].data(), stored[i].data(), ref[i].size()) == 0) continue;
        switch (s.kind) {
          case OutputTensorSpec::Kind::kCodes:
            for (std::uint64_t r = 0; r < n; ++r) {
              const std::byte* a = stored[i].data() + r * s.bytes_per_unit;
              const std::byte* b = ref[i].data() + r * s.bytes_per_unit;
              if (std::memcmp(a, b, s.bytes_per_unit) == 0) continue;
              for (std::uint64_t col = 0; col < cols; ++col) {
                const std::uint64_t bit = col * static_cast<std::uint64_t>(s.element_bits);
                if (bits_at(a, bit, s.element_bits) != bits_at(b, bit, s.element_bits)) {
                  mark(r0 + r, col / scale_cols, col);
                }
              }
            }
            break;
          case OutputTensorSpec::Kind::kScale: {
            const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(s.dtype) / 8);
            const std::uint64_t first_unit = s.bytes_before(r0) / s.bytes_per_unit;
            const std::uint64_t n_elements = ref[i].size() / esize;
            for (std::uint64_t e = 0; e < n_elements; ++e) {
              const std::byte* a = stored[i].data() + e * esize;
              const std::byte* b = ref[i].data() + e * esize;
              if (std::memcmp(a, b, esize) == 0) continue;
              const std::uint64_t unit = first_unit + e / s.elements_per_unit;
              const std::uint64_t j = e % s.elements_per_unit;
              if (is_quantizable_float(s.dtype)) {
                const std::uint64_t d = ulp_distance(s.dtype, load_bits(s.dtype, a),
                                                     load_bits(s.dtype, b));
                max_scale_ulp = std::max(max_scale_ulp, d);
                if (d <= options_.scale_ulp) {
                  ++accepted_scales;
                  continue;
                }
              }
              mark(unit * scale_rows, j, std::nullopt);
            }
            break;
          }
          case OutputTensorSpec::Kind::kZeroPoint: {
            const std::uint64_t columns = s.bytes_per_unit / 4;
            for (std::uint64_t r = 0; r < n; ++r) {
              for (std::uint64_t j = 0; j < columns; ++j) {
                if (zero_point_at(stored[i].data(), r, j, columns, s.element_bits) !=
                    zero_point_at(ref[i].data(), r, j, columns, s.element_bits)) {
                  mark(r0 + r, j, std::nullopt);
                }
              }
            }
            break;
          }
          default:
            break;
        }
      }
      // The error of the stored values against the source rows.
      values.resize(n * cols);
      dq.values = values.data();
      family.dequantize(args, dq);
      const std::size_t esize = static_cast<std::size_t>(dtype_bits(source.dtype()) / 8);
      for (std::uint64_t k = 0; k < n * cols; ++k) {
        const double w = load_as_float(source.dtype(), src_rows.data() + k * esize);
        const double err = w - static_cast<double>(values[k]);
        sum_err2 += err * err;
        sum_w2 += w * w;
        check.max_abs_error = std::max(check.max_abs_error, std::fabs(err));
      }
    }
    check.groups_mismatched = mismatched.size();
    check.rel_frobenius = sum_w2 > 0 ? std::sqrt(sum_err2 / sum_w2)
                                     : (sum_err2 > 0 ? std::numeric_limits<double>::infinity()
                                                     : 0.0);
    if (check.groups_mismatched > 0) {
      json details = {{"groups_mismatched", check.groups_mismatched},
                      {"groups", check.groups},
                      {"first_row", *check.first_row},
                      {"first_group", *check.first_group},
                      {"first_column", check.first_column ? json(*check.first_column)
                                                          : json(nullptr)}};
      if (source.is_fp8()) details["source"] = "dequantized FP8";
      c_.diff("codes", file, first_name,
              fmt::format("{} of {} groups are not the RTN codes of the {}source (codes, scale "
                          "or zero point differ), first at row {}, {}",
                          check.groups_mismatched, check.groups,
                          source.is_fp8() ? "dequantized FP8 " : "", *check.first_row,
                          check.first_column
                              ? fmt::format("column {} (group {})", *check.first_column,
                                            *check.first_group)
                              : fmt::format("group {} (its scale or zero point)",
                                            *check.first_group)),
              std::move(details));
    }
    if (accepted_scales > 0) {
      c_.note("scale", file, m.name + ".weight_scale",
              fmt::format("{} scale values differ from RTN by at most {} ulp; accepted by "
                          "--scale-ulp {}",
                          accepted_scales, max_scale_ulp, options_.scale_ulp));
    }
    c_.report().modules.push_back(check);
  }

  // A 16-bit weight written from source rows (an FP8 weight dequantized to
  // BF16, or a split expert projection kept): its bytes must be the rows
  // quantize loaded. Returns whether they are.
  bool compare_rows(const Ref& o, const PlannedModule& m) {
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
      if (!load_source(source, m.source.tensor, r0, r1, expected, scales,
                       "dequantized (section 6)")) return false;
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
    c_.diff("bytes", o.file->label(), o.entry->name,
            fmt::format("{} of {} elements differ from the {}, first at [{}, {}] (OUTPUT {:.9g}, "
                        "INPUT {:.9g}); largest absolute difference {:.6g}",
                        n_diff, rows * cols,
                        source.is_fp8()
                            ? "BF16 dequantization of the FP8 source (section 6)"
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
  std::string dropped_reason(const TensorDecision& d) const {
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

  // Every tensor but the quantized modules' outputs: present where planned,
  // of its dtype and shape, with its bytes; nothing else in OUTPUT.
  void check_tensors() {
    std::map<std::string, const TensorDecision*> input_tensors;
    for (const TensorDecision& d : plan_.decisions) input_tensors[d.name] = &d;
    VerifyReport& report = c_.report();
    for (const auto& [name, e] : expected_) {
      if (handled_.contains(name)) continue;
      const PlannedTensor& t = *e.tensor;
      const Ref o = out_.find(name);
      if (!o) continue;  // reported below
      if (o.file->label() != e.shard->file_name) {
        c_.diff("misplaced_tensor", o.file->label(), name,
                fmt::format("held by '{}' in OUTPUT; its source is in '{}'", o.file->label(),
                            e.shard->file_name));
      }
      if (t.source == PlannedTensor::Source::kModule) {
        const PlannedModule& m = plan_.modules[t.module];
        const TensorEntry& s = ckpt_.entry(m.source.tensor);
        if (o.entry->dtype != t.dtype || o.entry->shape != t.shape) {
          c_.diff(o.entry->dtype != t.dtype ? "dtype" : "shape", o.file->label(), name,
                  fmt::format("{} {} in OUTPUT; the {} source {} {} is written as {}, {} {}",
                              dtype_tag(o.entry->dtype), shape_string(o.entry->shape),
                              m.source.fp8 ? "FP8" : "stacked", dtype_tag(s.dtype),
                              shape_string(s.shape),
                              m.source.fp8 ? "its BF16 dequantization (section 6)"
                                           : "one 2-D weight per expert (schemes.md 8)",
                              dtype_tag(t.dtype), shape_string(t.shape)));
          continue;
        }
        ++report.tensors_compared;
        if (compare_rows(o, m)) ++report.tensors_identical;
        continue;
      }
      const TensorDecision& d = plan_.decisions[t.decision];
      const SafetensorsFile& in_file = ckpt_.shards[d.source.shard];
      const TensorEntry& s = ckpt_.entry(d.source);
      if (o.entry->dtype != s.dtype || o.entry->shape != s.shape) {
        c_.diff(o.entry->dtype != s.dtype ? "dtype" : "shape", o.file->label(), name,
                fmt::format("{} {} in OUTPUT, {} {} in INPUT", dtype_tag(o.entry->dtype),
                            shape_string(o.entry->shape), dtype_tag(s.dtype),
                            shape_string(s.shape)));
        continue;
      }
      ++report.tensors_compared;
      const Ref src{&in_file, &s};
      if (compare_elements(o, src, options_.chunk_bytes, c_)) ++report.tensors_identical;
    }
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

  const Side& out_;
  const Checkpoint& ckpt_;
  const QuantizePlan& plan_;
  const VerifyOptions& options_;
  Collector& c_;
  std::map<std::string, Expected> expected_;
  std::set<std::string> handled_;         // tensors already reported or checked as a module's
  std::set<std::size_t> handled_modules_;  // modules with a fate difference
  std::vector<float> set_amax_;
};

}  // namespace

VerifyReport verify_against_source(const fs::path& output, const fs::path& input,
                                   const VerifyOptions& options) {
  VerifyReport report;
  report.mode = VerifyMode::kAgainstSource;
  report.output = output.string();
  report.reference = input.string();
  const Side out = open_side(output, "OUTPUT");
  Side src = open_side(input, "INPUT");
  restrict_to_index(src);
  // Section 6: the kinds of input quantize converts, and only those.
  InputQuantization q;
  try {
    q = classify_input_quantization(src.config);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("--against-source: INPUT {}", e.what()));
  }
  report.input_quantization = q.describe();
  PlanOptions plan_options = plan_options_of(out);
  plan_options.default_ignore = false;  // the written list is the whole list
  report.tensors_output = out.n_tensors();
  report.tensors_reference = src.n_tensors();
  Collector c(report);
  const Labels labels{"OUTPUT", "INPUT"};
  compare_shard_files(out, src, labels, c);
  check_alignment(out, c);
  check_index(out, c);
  compare_configs(out, src, labels, /*compare_qc=*/false, c);
  compare_other_files(out, src, labels, c);
  check_loadability(out.config, out.shards, report);

  // Read-only: links out of the directory (a cache snapshot) are followed.
  const Checkpoint checkpoint = open_checkpoint(input, OpenOptions{.follow_links_outside = true});
  QuantizePlan plan;
  try {
    plan = make_plan(checkpoint, plan_options);
  } catch (const Error& e) {
    c.diff("fate", "", "",
           fmt::format("cannot plan INPUT with config.json's scheme groups, ignore list and "
                       "targets: {}",
                       e.what()));
    return report;
  }
  AgainstSource(out, checkpoint, plan, options, c).run();
  return report;
}

}  // namespace ctquant
