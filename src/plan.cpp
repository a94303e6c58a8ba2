#include "ctquant/plan.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "ctquant/checked.hpp"
#include "ctquant/config.hpp"
#include "ctquant/error.hpp"
#include "ctquant/matcher.hpp"
#include "ctquant/safetensors_writer.hpp"

namespace ctquant {

using nlohmann::json;

const char* fate_name(Fate fate) {
  switch (fate) {
    case Fate::kQuantize:
      return "quantize";
    case Fate::kCopy:
      return "copy";
  }
  return "?";
}

std::string module_of(const std::string& tensor_name) {
  const auto dot = tensor_name.rfind('.');
  return dot == std::string::npos ? std::string() : tensor_name.substr(0, dot);
}

namespace {

std::string param_of(const std::string& tensor_name) {
  const auto dot = tensor_name.rfind('.');
  return dot == std::string::npos ? tensor_name : tensor_name.substr(dot + 1);
}

// Section 2, rule 6: the last component contains "embed", or is wte / wpe.
bool is_embedding(const std::string& module) {
  const auto dot = module.rfind('.');
  const std::string last = dot == std::string::npos ? module : module.substr(dot + 1);
  return last.find("embed") != std::string::npos || last == "wte" || last == "wpe";
}

void check_scheme(const QuantScheme& scheme) {
  if (scheme.num_bits < 2 || scheme.num_bits > 8) {
    throw usage_error(fmt::format("scheme {}: num_bits {} is outside 2..8", scheme.name,
                                  scheme.num_bits));
  }
}

// Refuses input configs that already describe a quantized checkpoint.
void check_input_config(const Checkpoint& checkpoint) {
  if (!checkpoint.config || !checkpoint.config->contains("quantization_config")) return;
  const json& qc = (*checkpoint.config)["quantization_config"];
  if (qc.is_null()) return;  // written by some tools for "not quantized"; replaced below
  std::string method = "unknown";
  std::string format;
  if (qc.is_object()) {
    if (qc.contains("quant_method") && qc["quant_method"].is_string()) method = qc["quant_method"];
    if (qc.contains("format") && qc["format"].is_string()) format = qc["format"];
  }
  throw bad_input(fmt::format(
      "{}: quantization_config has quant_method \"{}\"{}; ctquant converts unquantized BF16, "
      "F16 and F32 checkpoints and does not convert this kind",
      kConfigFileName, method, format.empty() ? "" : fmt::format(" with format \"{}\"", format)));
}

// Output tensors of a quantized module, section 4 of the format spec.
void add_quantized_outputs(const TensorDecision& d, const TensorEntry& w, const QuantScheme& scheme,
                           std::size_t decision_index, std::vector<PlannedTensor>& out) {
  const std::uint64_t rows = w.shape[0];
  const std::uint64_t cols = w.shape[1];
  const std::uint64_t n_groups = cols / scheme.effective_group_size(cols);
  const std::uint64_t words = packed_words_per_row(cols, scheme.num_bits);
  const std::uint64_t esize = static_cast<std::uint64_t>(dtype_bits(w.dtype) / 8);
  const auto add = [&](const std::string& suffix, DType dtype, std::vector<std::uint64_t> shape,
                       std::uint64_t bytes, OutputRole role) {
    out.push_back(PlannedTensor{d.module + "." + suffix, dtype, std::move(shape), bytes, 0, role,
                                decision_index});
  };
  add("weight_packed", DType::kI32, {rows, words}, rows * words * 4, OutputRole::kPacked);
  add("weight_scale", w.dtype, {rows, n_groups}, rows * n_groups * esize, OutputRole::kScale);
  add("weight_shape", DType::kI64, {2}, 16, OutputRole::kShape);
  if (!scheme.symmetric) {
    const std::uint64_t zp_rows = packed_words_per_row(rows, scheme.num_bits);
    add("weight_zero_point", DType::kI32, {zp_rows, n_groups}, zp_rows * n_groups * 4,
        OutputRole::kZeroPoint);
  }
}

}  // namespace

void check_plan_options(const PlanOptions& options) {
  check_scheme(options.scheme);
  std::string problems;
  for (const auto& [entries, role] : {std::pair{&options.ignore, ModuleMatcher::Role::kIgnore},
                                      std::pair{&options.targets, ModuleMatcher::Role::kTargets}}) {
    try {
      const ModuleMatcher matcher(*entries, role);
    } catch (const Error& e) {
      problems += (problems.empty() ? "" : "\n") + std::string(e.what());
    }
  }
  if (!problems.empty()) throw usage_error(problems);
}

QuantizePlan make_plan(const Checkpoint& checkpoint, const PlanOptions& options) {
  check_plan_options(options);
  const ModuleMatcher ignore(options.ignore, ModuleMatcher::Role::kIgnore);
  const ModuleMatcher targets(options.targets, ModuleMatcher::Role::kTargets);
  check_input_config(checkpoint);

  QuantizePlan plan;
  plan.options = options;
  plan.ignore_matches.resize(options.ignore.size());
  std::vector<std::string> group_size_errors;

  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) {
    const auto& tensors = checkpoint.shards[s].header().tensors;
    for (std::size_t e = 0; e < tensors.size(); ++e) {
      const TensorEntry& t = tensors[e];
      TensorDecision d;
      d.name = t.name;
      d.module = module_of(t.name);
      d.source = TensorLocation{s, e};
      d.fate = Fate::kCopy;
      // Section 2, rules 1-6, in order; the first that fails decides.
      if (param_of(t.name) != "weight" || d.module.empty()) {
        d.rule = "not a .weight tensor";
      } else if (t.shape.size() != 2) {
        d.rule = fmt::format("{}-D, not a 2-D linear weight", t.shape.size());
      } else if (d.module.ends_with("norm")) {
        d.rule = "module ends with 'norm'";
      } else if (!is_quantizable_float(t.dtype)) {
        d.rule = fmt::format("dtype {} is not BF16, F16 or F32", dtype_tag(t.dtype));
      } else if (is_embedding(d.module)) {
        d.rule = "embedding (target Linear never covers it)";
      } else if (t.shape[0] == 0 || t.shape[1] == 0) {
        d.rule = "empty tensor";
      } else {
        for (std::size_t i = 0; i < ignore.entries().size(); ++i) {
          if (ignore.entry_matches(i, d.module)) {
            plan.ignore_matches[i].push_back(d.module);
            if (!d.ignore_entry) d.ignore_entry = i;
          }
        }
        const auto target = targets.first_match(d.module);
        if (d.ignore_entry) {
          d.rule = fmt::format("ignored by '{}'", options.ignore[*d.ignore_entry]);
        } else if (!target) {
          d.rule = "matches no target";
        } else {
          const std::uint64_t g = options.scheme.effective_group_size(t.shape[1]);
          if (t.shape[1] % g != 0) {
            group_size_errors.push_back(fmt::format(
                "{}: tensor '{}' {} has in_features {}, not a multiple of the group size {}",
                checkpoint.shards[s].label(), t.name, shape_string(t.shape), t.shape[1], g));
          }
          d.fate = Fate::kQuantize;
          d.rule = fmt::format("2-D {} .weight matching target '{}'", dtype_tag(t.dtype),
                               options.targets[*target]);
        }
      }
      plan.decisions.push_back(std::move(d));
    }
  }
  if (!group_size_errors.empty()) {
    std::string message;
    for (const auto& m : group_size_errors) message += m + "\n";
    message += fmt::format(
        "{} tensor(s) cannot be quantized with group size {}: ignore them (--ignore 're:...$') or "
        "pick another --group-size",
        group_size_errors.size(), options.scheme.group_size);
    throw bad_input(message);
  }

  // Output tensors, shard by shard.
  json weight_map = json::object();
  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) {
    ShardPlan shard;
    shard.file_name = checkpoint.shards[s].label();
    shard.input_shard = s;
    for (std::size_t i = 0; i < plan.decisions.size(); ++i) {
      const TensorDecision& d = plan.decisions[i];
      if (d.source.shard != s) continue;
      const TensorEntry& t = checkpoint.entry(d.source);
      if (d.fate == Fate::kQuantize) {
        add_quantized_outputs(d, t, options.scheme, i, shard.tensors);
        ++plan.n_quantized;
      } else {
        shard.tensors.push_back(
            PlannedTensor{t.name, t.dtype, t.shape, t.byte_size(), 0, OutputRole::kCopy, i});
        ++plan.n_copied;
      }
    }
    std::sort(shard.tensors.begin(), shard.tensors.end(),
              [](const PlannedTensor& a, const PlannedTensor& b) { return a.name < b.name; });
    for (std::size_t i = 1; i < shard.tensors.size(); ++i) {
      if (shard.tensors[i].name == shard.tensors[i - 1].name) {
        throw bad_input(fmt::format("{}: output tensor '{}' would be written twice (the input "
                                    "already holds a tensor of that name)",
                                    shard.file_name, shard.tensors[i].name));
      }
    }
    std::vector<TensorSpec> specs;
    specs.reserve(shard.tensors.size());
    for (const PlannedTensor& t : shard.tensors) {
      specs.push_back(TensorSpec{t.name, t.dtype, t.shape, t.byte_size});
      weight_map[t.name] = shard.file_name;
      if (!checked_add(plan.tensor_bytes_out, t.byte_size, plan.tensor_bytes_out)) {
        throw bad_input("output size overflows 64 bits");
      }
    }
    ShardLayout layout = layout_shard(specs, {{"format", "pt"}});
    for (std::size_t i = 0; i < shard.tensors.size(); ++i) shard.tensors[i].offset = layout.offsets[i];
    shard.header = std::move(layout.header);
    shard.data_start = layout.data_start;
    shard.file_size = layout.file_size;
    plan.shard_bytes_out += shard.file_size;
    plan.shards.push_back(std::move(shard));
  }

  if (checkpoint.has_index) {
    plan.index = json{{"metadata", {{"total_size", plan.tensor_bytes_out}}},
                      {"weight_map", weight_map}};
  }
  plan.config = output_config(checkpoint.config,
                              quantization_config(options.scheme, options.ignore, options.targets));
  plan.copied_files = checkpoint.other_files;
  return plan;
}

}  // namespace ctquant
