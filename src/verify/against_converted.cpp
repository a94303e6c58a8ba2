// verify --against-source on the output of a converted INPUT
// (verify/against_converted.hpp).
#include "verify/against_converted.hpp"

#include <cmath>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "ctquant/plan/plan.hpp"
#include "ctquant/plan/quant_config.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/source/checkpoint.hpp"
#include "ctquant/source/converter.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "ctquant/verify/loadability.hpp"

namespace ctquant::detail {

namespace {

using nlohmann::json;

// The converter's arguments as OUTPUT's config.json records them: its group
// is config_group_0 (create_config), its ignore list the written one.
ConvertOptions convert_options_of(const Side& out) {
  ConvertOptions o;
  if (!out.config || !out.config->contains("quantization_config")) return o;
  const json& qc = (*out.config)["quantization_config"];
  const json groups = qc.value("config_groups", json::object());
  if (groups.contains("config_group_0") && groups["config_group_0"].contains("targets")) {
    o.targets = groups["config_group_0"]["targets"].get<std::vector<std::string>>();
  }
  if (qc.contains("ignore") && qc["ignore"].is_array()) {
    o.ignore = qc["ignore"].get<std::vector<std::string>>();
  }
  return o;
}

// |a - b| within a few float roundings: NVFP4's global scale is stored as
// 1/x and divided back, so the two products may differ in the last bits.
bool close(float a, float b) {
  if (std::memcmp(&a, &b, sizeof a) == 0) return true;
  return std::fabs(a - b) <= 4e-7f * std::max(std::fabs(a), std::fabs(b));
}

class ConvertedCheck {
 public:
  ConvertedCheck(const Side& out, const Checkpoint& checkpoint, const QuantizePlan& plan,
                 Collector& c)
      : out_(out), ckpt_(checkpoint), plan_(plan), c_(c) {}

  void run() {
    const json& qc = (*out_.config)["quantization_config"];
    const json& weights = qc["config_groups"]["config_group_0"]["weights"];
    const QuantArgs args = quant_args_from_json(weights, "OUTPUT config.json config_group_0");
    const SchemeFamily* family = family_for(args, false);
    if (family == nullptr) {
      c_.diff("config", "config.json", "",
              "config_group_0 (the converter's group) has weights no family decodes");
      return;
    }
    for (const ConvertedModule& m : plan_.converted) check_module(m, *family, args);
    check_copies();
  }

 private:
  std::vector<std::byte> read_input(const TensorLocation& at) const {
    std::vector<std::byte> bytes(ckpt_.entry(at).byte_size());
    ckpt_.shards[at.shard].read(ckpt_.entry(at).begin, bytes);
    return bytes;
  }

  void check_module(const ConvertedModule& m, const SchemeFamily& family, const QuantArgs& args) {
    for (const ConvertedTensor& t : m.outputs) checked_.insert(t.name);
    std::vector<std::vector<std::byte>> inputs;
    for (const TensorLocation& at : m.consumed) inputs.push_back(read_input(at));
    std::vector<float> source;
    ModuleCheck check;
    check.module = m.name;
    if (!plan_.source_format->converter->dequantize_source(ckpt_, m, inputs, source, check.rows,
                                                           check.cols)) {
      c_.note("module", "", m.name, "the source's values cannot be decoded; not checked");
      return;
    }
    // The output's tensors in the family's order; the scale dtype is the
    // weight dtype of W-scaled formats.
    DType dtype = DType::kBF16;
    if (const Ref s = out_.find(m.name + ".weight_scale"); s && s.entry->dtype != DType::kF8_E4M3) {
      dtype = s.entry->dtype;
    }
    const auto specs = family.outputs(args, dtype, check.rows, check.cols);
    std::vector<std::vector<std::byte>> rows_in, whole_in;
    DequantIo io;
    io.dtype = dtype;
    io.n_rows = check.rows;
    io.n_cols = check.cols;
    for (const OutputTensorSpec& spec : specs) {
      const Ref r = out_.find(m.name + "." + spec.suffix);
      if (!r) {
        if (spec.kind == OutputTensorSpec::Kind::kZeroPoint && args.symmetric) continue;
        if (spec.kind == OutputTensorSpec::Kind::kShape) continue;
        c_.diff("missing", "", m.name + "." + spec.suffix,
                "converted module's output tensor is missing from OUTPUT");
        return;
      }
      (spec.fill == OutputTensorSpec::Fill::kRows ? rows_in : whole_in).push_back(read_whole(r));
    }
    for (std::size_t i = 0; i < rows_in.size() && i < io.in.size(); ++i)
      io.in[i] = rows_in[i].data();
    for (std::size_t i = 0; i < whole_in.size() && i < io.whole.size(); ++i) {
      io.whole[i] = whole_in[i].data();
    }
    std::vector<float> output(check.rows * check.cols);
    io.values = output.data();
    family.dequantize(args, io);
    double err2 = 0, norm2 = 0;
    std::optional<std::uint64_t> first;
    for (std::uint64_t i = 0; i < output.size(); ++i) {
      const double d = static_cast<double>(source[i]) - static_cast<double>(output[i]);
      err2 += d * d;
      norm2 += static_cast<double>(source[i]) * static_cast<double>(source[i]);
      check.max_abs_error = std::max(check.max_abs_error, std::fabs(d));
      if (!first && !close(source[i], output[i])) first = i;
    }
    check.rel_frobenius = norm2 > 0 ? std::sqrt(err2 / norm2) : 0.0;
    if (first) {
      const std::uint64_t r = *first / check.cols, col = *first % check.cols;
      check.groups_mismatched = 1;
      check.first_row = r;
      check.first_column = col;
      c_.diff("values", "", m.name,
              fmt::format("converted module: OUTPUT dequantizes to {} at [{}, {}], INPUT ({}) to "
                          "{}: the conversion is not lossless here",
                          output[*first], r, col, plan_.source_format->converter->name,
                          source[*first]));
    }
    c_.report().modules.push_back(std::move(check));
  }

  // Tensors the plan copies: byte for byte. Output tensors neither
  // converted, copied nor planned as a quantized module's: noted.
  void check_copies() {
    std::set<std::string> planned;
    for (const ShardPlan& shard : plan_.shards) {
      for (const PlannedTensor& t : shard.tensors) {
        planned.insert(t.name);
        if (t.source != PlannedTensor::Source::kCopy) continue;
        const Ref o = out_.find(t.name);
        // A 16-bit module a scheme quantized in the same run (its weight
        // replaced, or FP8 codes under the same name beside a scale).
        if (last_component(t.name) == "weight" && out_.find(module_of(t.name) + ".weight_scale")) {
          planned.erase(t.name);
          continue;
        }
        if (!o) {
          c_.diff("missing", shard.file_name, t.name, "copied tensor missing from OUTPUT");
          continue;
        }
        ++c_.report().tensors_compared;
        std::vector<std::byte> in(t.byte_size);
        const TensorDecision& d = plan_.decisions[t.decision];
        ckpt_.shards[d.source.shard].read(ckpt_.entry(d.source).begin, in);
        if (o.entry->dtype == t.dtype && o.entry->shape == t.shape && read_whole(o) == in) {
          ++c_.report().tensors_identical;
        } else {
          c_.diff("values", shard.file_name, t.name, "differs from the INPUT tensor it copies");
        }
      }
    }
    std::size_t unchecked = 0;
    for (const auto& [name, where] : out_.where) {
      if (!planned.contains(name) && !checked_.contains(name)) ++unchecked;
    }
    if (unchecked > 0) {
      c_.note("tensors", "", "",
              fmt::format("{} output tensor(s) no planned module or copy accounts for are not "
                          "checked against INPUT",
                          unchecked));
    }
  }

  const Side& out_;
  const Checkpoint& ckpt_;
  const QuantizePlan& plan_;
  Collector& c_;
  std::set<std::string> checked_;
};

}  // namespace

bool verify_converted_source(const Side& out, const Side& src, const std::filesystem::path& input,
                             const VerifyOptions& verify_options, VerifyReport& report) {
  const Checkpoint checkpoint = open_checkpoint(input, OpenOptions{.follow_links_outside = true});
  const ConvertOptions convert = convert_options_of(out);
  const std::optional<SourceFormat> format = detect_source_format(checkpoint, convert);
  if (!format) return false;
  report.input_quantization = format->description;
  report.tensors_output = out.n_tensors();
  report.tensors_reference = src.n_tensors();
  Collector c(report);
  const Labels labels{"OUTPUT", "INPUT"};
  check_alignment(out, c);
  check_index(out, c);
  compare_configs(out, src, labels, /*compare_qc=*/false, c);
  compare_other_files(out, src, labels, c);
  check_loadability(out.config, out.shards, report);
  // The scheme groups of the same run (every group but config_group_0, the
  // converter's): the modules they quantized are planned and checked as
  // verify checks any quantized module (check_quantized_modules). Read as
  // plan_options_from_config reads a QuantizationConfig, without the keys
  // the converter carries (its group, kv_cache_scheme).
  PlanOptions options;
  options.scheme_given = false;
  const json no_config = json::object();
  const json& qc = out.config && out.config->is_object() &&
                           out.config->contains("quantization_config") &&
                           (*out.config)["quantization_config"].is_object()
                       ? (*out.config)["quantization_config"]
                       : no_config;
  json scheme_groups = qc.value("config_groups", json::object());
  if (scheme_groups.is_object()) scheme_groups.erase("config_group_0");
  if (scheme_groups.is_object() && !scheme_groups.empty()) {
    const json config = {{"config_groups", scheme_groups},
                         {"ignore", qc.value("ignore", json::array())}};
    try {
      options = plan_options_from_config(config, "OUTPUT config.json quantization_config");
    } catch (const Error& e) {
      c.diff("config", "config.json", "", e.what());
      return true;
    }
    options.default_ignore = false;  // the written list is the whole list
    options.group_rule = PlanOptions::GroupRule::kAsRead;
  }
  options.convert = convert;
  QuantizePlan plan;
  try {
    plan = make_plan(checkpoint, options);
  } catch (const Error& e) {
    c.diff("fate", "", "", fmt::format("cannot plan the conversion of INPUT: {}", e.what()));
    return true;
  }
  ConvertedCheck(out, checkpoint, plan, c).run();
  check_quantized_modules(out, checkpoint, plan, verify_options, c);
  return true;
}

}  // namespace ctquant::detail
