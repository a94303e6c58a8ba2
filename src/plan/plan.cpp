#include "ctquant/plan/plan.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "ctquant/format/config.hpp"
#include "ctquant/format/matcher.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/model/fused_groups.hpp"
#include "ctquant/scheme/fused_sets.hpp"
#include "ctquant/scheme/refused_presets.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/checked.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "plan/fates.hpp"

namespace ctquant {

using nlohmann::json;

const char* fate_name(Fate fate) {
  switch (fate) {
    case Fate::kQuantize:
      return "quantize";
    case Fate::kCopy:
      return "copy";
    case Fate::kDequantize:
      return "dequantize";
    case Fate::kDrop:
      return "drop";
    case Fate::kSplit:
      return "split";
    case Fate::kConvert:
      return "convert";
  }
  return "?";
}

const SchemeFamily* SchemeGroup::family() const {
  return family_for(weights, !input_activations.is_null());
}

SchemeGroup preset_group(const std::string& preset) {
  const Preset* p = find_preset(preset);
  if (p == nullptr) {
    if (const RefusedPreset* refused = refused_preset(preset)) {
      throw usage_error(fmt::format("scheme '{}' is not written: {} (presets: {})", preset,
                                    refused->reason, preset_names()));
    }
    throw usage_error(
        fmt::format("unknown scheme '{}' (known presets: {})", preset, preset_names()));
  }
  if (!p->refused.empty()) {
    throw usage_error(fmt::format("scheme '{}' is not written: {} (presets: {})", preset,
                                  p->refused, preset_names()));
  }
  SchemeGroup g;
  g.name = p->name;  // canonical: --scheme w4a16 writes group W4A16
  g.weights = p->weights;
  g.input_activations =
      p->input_activations.empty() ? json(nullptr) : json::parse(p->input_activations);
  return g;
}

namespace {

std::uint64_t checked_bytes(std::uint64_t n, std::uint64_t element_bits, const std::string& name) {
  std::uint64_t bits = 0;
  if (!checked_mul(n, element_bits, bits)) {
    throw bad_input(fmt::format("tensor '{}': output size overflows 64 bits", name));
  }
  return bits / 8;
}

}  // namespace

IgnoreList effective_ignore(const RoleAnalysis& roles, const PlanOptions& options) {
  IgnoreList list;
  if (options.default_ignore) {
    for (DefaultIgnoreEntry& d : default_ignore_entries(roles)) {
      list.entries.push_back(std::move(d.entry));
      list.reasons.push_back(std::move(d.reason));
      list.keeps.push_back(std::move(d.modules));
    }
  }
  list.n_default = list.entries.size();
  // Each entry once (a set, not a search of the list: N entries cost O(N)).
  std::unordered_set<std::string> listed(list.entries.begin(), list.entries.end());
  for (const std::string& e : options.ignore) {
    if (!listed.insert(e).second) continue;
    list.entries.push_back(e);
    list.reasons.push_back("--ignore");
    list.keeps.emplace_back();
  }
  return list;
}

void check_plan_options(const PlanOptions& options) {
  std::string problems;
  const auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "\n") + p; };
  if (options.groups.empty()) add("no scheme group: nothing to quantize with");
  std::set<std::string> names;
  for (const SchemeGroup& g : options.groups) {
    if (!names.insert(g.name).second) add(fmt::format("scheme group '{}' is given twice", g.name));
    const SchemeFamily* family = g.family();
    if (family == nullptr) {
      add(fmt::format(
          "scheme group '{}': no output format ctquant writes fits its weights ({}-bit "
          "{} {}){}",
          g.name, g.weights.num_bits, g.weights.type == QuantArgs::Type::kInt ? "int" : "float",
          strategy_name(g.weights.strategy),
          g.input_activations.is_null() ? "" : " with input activations"));
      continue;
    }
    const std::string why = family->supports(g.weights);
    if (!why.empty()) add(fmt::format("scheme group '{}' ({}): {}", g.name, family->format, why));
    if (g.targets.empty()) add(fmt::format("scheme group '{}' has no targets", g.name));
  }
  const auto check_entries = [&](const std::vector<std::string>& entries,
                                 ModuleMatcher::Role role) {
    try {
      const ModuleMatcher matcher(entries, role);
    } catch (const Error& e) {
      add(e.what());
    }
  };
  check_entries(options.ignore, ModuleMatcher::Role::kIgnore);
  for (const SchemeGroup& g : options.groups)
    check_entries(g.targets, ModuleMatcher::Role::kTargets);
  if (!problems.empty()) throw usage_error(problems);
}

json plan_quantization_config(const PlanOptions& options,
                              const std::vector<std::size_t>& group_modules) {
  std::vector<ConfigGroup> groups;
  for (std::size_t g = 0; g < options.groups.size(); ++g) {
    const SchemeGroup& s = options.groups[g];
    ConfigGroup c;
    c.name = s.name;
    c.targets = s.targets;
    c.weights = quant_args_json(s.weights);
    c.input_activations = s.input_activations;
    // model_free fills a group's format when it compresses a module with it
    // (schemes.md 9.2) and writes a group that took no module with format
    // null; ctquant leaves such a group out.
    if (g >= group_modules.size() || group_modules[g] == 0) continue;
    c.format = std::string(s.family()->format);
    groups.push_back(std::move(c));
  }
  return quantization_config(groups, options.ignore);
}

namespace {

// The amax sets (QuantizePlan::amax_sets) of the modules whose family needs
// max |w| before quantizing. When a group is TENSOR_GROUP (NVFP4),
// model_free_ptq gives the members of a fused set that it quantizes with a
// TENSOR_GROUP group one global scale, the sets found per input-shard job
// with its partners fetched from other shards, on the names after the
// expert split (schemes.md 7; scheme/fused_sets.hpp); every other module
// is a set of its own. Throws Error{kBadInput} where model_free_ptq's
// grouping fails ("Matched a ... twice before completing set").
void assign_amax_sets(const Checkpoint& checkpoint, QuantizePlan& plan) {
  const auto needs_amax = [&](std::size_t i) {
    const PlannedModule& m = plan.modules[i];
    if (m.kind != PlannedModule::Kind::kQuantize) return false;
    const SchemeGroup& g = plan.group_of(m);
    return g.family()->needs_tensor_amax(g.weights);
  };
  const auto tensor_group = [&](std::size_t i) {
    return needs_amax(i) &&
           plan.group_of(plan.modules[i]).weights.strategy == QuantArgs::Strategy::kTensorGroup;
  };
  std::vector<bool> assigned(plan.modules.size(), false);
  const bool microscale = std::any_of(
      plan.options.groups.begin(), plan.options.groups.end(),
      [](const SchemeGroup& g) { return g.weights.strategy == QuantArgs::Strategy::kTensorGroup; });
  if (microscale) {
    std::vector<std::pair<std::string, std::string>> weight_map;
    std::unordered_map<std::string, std::size_t> decision_of;
    for (std::size_t i = 0; i < plan.decisions.size(); ++i) {
      const TensorDecision& d = plan.decisions[i];
      weight_map.emplace_back(d.name, checkpoint.shards[d.source.shard].label());
      decision_of.emplace(d.name, i);
    }
    std::unordered_map<std::string, std::size_t> module_of;  // "<module>.weight" -> index
    for (std::size_t i = 0; i < plan.modules.size(); ++i) {
      module_of.emplace(plan.modules[i].name + ".weight", i);
    }
    for (const auto& [shard, names] : microscale_job_names(weight_map)) {
      std::vector<std::string> job;
      for (const std::string& n : names) {
        const TensorDecision& d = plan.decisions[decision_of.at(n)];
        if (d.fate != Fate::kSplit) {
          job.push_back(n);
          continue;
        }
        for (const std::size_t mi : d.modules) job.push_back(plan.modules[mi].name + ".weight");
      }
      for (const std::vector<std::string>& set : fused_sets(job).sets) {
        std::vector<std::size_t> members;
        for (const std::string& n : set) {
          const auto it = module_of.find(n);
          if (it != module_of.end() && !assigned[it->second] && tensor_group(it->second)) {
            members.push_back(it->second);
          }
        }
        if (members.empty()) continue;
        for (const std::size_t mi : members) {
          assigned[mi] = true;
          plan.modules[mi].amax_set = plan.amax_sets.size();
        }
        plan.amax_sets.push_back(std::move(members));
      }
    }
  }
  for (std::size_t i = 0; i < plan.modules.size(); ++i) {
    if (assigned[i] || !needs_amax(i)) continue;
    plan.modules[i].amax_set = plan.amax_sets.size();
    plan.amax_sets.push_back({i});
  }
}

// QuantizePlan::linear_params and linear_params_quantized.
void count_linear_params(const Checkpoint& checkpoint, QuantizePlan& plan) {
  std::map<std::string, const ModuleInfo*> role_of;  // tensor -> its role
  for (const ModuleInfo& m : plan.roles.modules) role_of.emplace(m.tensor, &m);
  for (const TensorDecision& d : plan.decisions) {
    poll_cancel();
    if (d.fate == Fate::kConvert) {
      // A converted module counts once, as the weight it stands for.
      const ConvertedModule& m = plan.converted[*d.converted];
      if (m.primary.shard == d.source.shard && m.primary.entry == d.source.entry) {
        plan.linear_params += m.params;
        plan.linear_params_quantized += m.params;
      }
      continue;
    }
    const auto it = role_of.find(d.name);
    if (it == role_of.end() || !is_linear_weight_role(it->second->role)) continue;
    std::uint64_t params = 1;
    for (const std::uint64_t n : checkpoint.entry(d.source).shape) params *= n;
    plan.linear_params += params;
    for (const std::size_t mi : d.modules) {
      const PlannedModule& m = plan.modules[mi];
      if (m.kind == PlannedModule::Kind::kQuantize) {
        plan.linear_params_quantized += m.source.rows * m.source.cols;
      }
    }
  }
}

// ---- the stages of make_plan ----

// The module roles, the options with the effective ignore list
// (the roles' default entries and the given ones) and what it records.
QuantizePlan start_plan(const Checkpoint& checkpoint, const PlanOptions& given) {
  QuantizePlan plan;
  plan.roles = analyze_roles(checkpoint, RoleOptions{.quantize_vision = given.quantize_vision});
  plan.options = given;
  IgnoreList ignore = effective_ignore(plan.roles, given);
  plan.options.ignore = std::move(ignore.entries);
  plan.ignore_reasons = std::move(ignore.reasons);
  plan.ignore_keeps = std::move(ignore.keeps);
  plan.n_default_ignore = ignore.n_default;
  return plan;
}
// The executor holds whole rows of a weight in memory (at least
// one per thread): bound them, so that a header cannot make it allocate
// without limit (a sparse file can claim any size). FP8 rows are held as
// BF16.
void check_weight_row_sizes(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  std::vector<std::string> row_errors;
  for (const PlannedModule& m : plan.modules) {
    const TensorEntry& t = checkpoint.entry(m.source.tensor);
    const std::uint64_t element_bytes = static_cast<std::uint64_t>(dtype_bits(m.dtype) / 8);
    std::uint64_t row_bytes = 0;
    if (!checked_mul(m.source.cols, element_bytes, row_bytes) || row_bytes > kMaxWeightRowBytes) {
      row_errors.push_back(fmt::format(
          "{}: tensor '{}' {} has rows of {} bytes, more than the limit of {} bytes per row of a "
          "weight to quantize or dequantize; ignore it (--ignore) to copy it unchanged",
          checkpoint.shards[m.source.tensor.shard].label(), t.name, shape_string(t.shape),
          row_bytes, kMaxWeightRowBytes));
    }
  }
  if (!row_errors.empty()) {
    std::string message = row_errors.front();
    for (std::size_t i = 1; i < row_errors.size(); ++i) message += "\n" + row_errors[i];
    throw bad_input(message);
  }
}

// The output tensors of input shard s, in decision order, counted in the
// plan's n_copied, n_dropped, n_split, n_dequantized and n_quantized.
std::vector<PlannedTensor> output_tensors_of_shard(const Checkpoint& checkpoint, QuantizePlan& plan,
                                                   std::size_t s) {
  std::vector<PlannedTensor> tensors;
  for (std::size_t i = 0; i < plan.decisions.size(); ++i) {
    poll_cancel();
    const TensorDecision& d = plan.decisions[i];
    if (d.source.shard != s) continue;
    const TensorEntry& t = checkpoint.entry(d.source);
    switch (d.fate) {
      case Fate::kCopy: {
        PlannedTensor p;
        p.name = t.name;
        p.dtype = t.dtype;
        p.shape = t.shape;
        p.byte_size = t.byte_size();
        p.source = PlannedTensor::Source::kCopy;
        p.decision = i;
        tensors.push_back(std::move(p));
        ++plan.n_copied;
        break;
      }
      case Fate::kDrop:
        ++plan.n_dropped;
        break;
      case Fate::kConvert: {
        // The module's outputs go with its primary tensor (convert_file
        // writes what a shard's job converted into that shard).
        const ConvertedModule& m = plan.converted[*d.converted];
        if (m.primary.shard != d.source.shard || m.primary.entry != d.source.entry) break;
        for (std::size_t o = 0; o < m.outputs.size(); ++o) {
          PlannedTensor p;
          p.name = m.outputs[o].name;
          p.dtype = m.outputs[o].dtype;
          p.shape = m.outputs[o].shape;
          p.byte_size = m.outputs[o].byte_size;
          p.source = PlannedTensor::Source::kConvert;
          p.decision = i;
          p.converted = *d.converted;
          p.output = o;
          tensors.push_back(std::move(p));
        }
        ++plan.n_converted;
        break;
      }
      case Fate::kSplit:
        ++plan.n_split;
        [[fallthrough]];
      case Fate::kQuantize:
      case Fate::kDequantize:
        for (const std::size_t mi : d.modules) {
          const PlannedModule& m = plan.modules[mi];
          const std::vector<std::uint64_t> shape{m.source.rows, m.source.cols};
          if (m.kind != PlannedModule::Kind::kQuantize) {
            PlannedTensor p;
            p.name = m.name + ".weight";
            p.dtype = m.dtype;
            p.shape = shape;
            p.byte_size = checked_bytes(m.source.rows * m.source.cols,
                                        static_cast<std::uint64_t>(dtype_bits(m.dtype)), p.name);
            p.source = PlannedTensor::Source::kModule;
            p.decision = i;
            p.module = mi;
            tensors.push_back(std::move(p));
            if (m.kind == PlannedModule::Kind::kDequantize) ++plan.n_dequantized;
            continue;
          }
          const SchemeGroup& g = plan.group_of(m);
          const auto specs = g.family()->outputs(g.weights, m.dtype, m.source.rows, m.source.cols);
          for (std::size_t o = 0; o < specs.size(); ++o) {
            PlannedTensor p;
            p.name = m.name + "." + specs[o].suffix;
            p.dtype = specs[o].dtype;
            p.shape = specs[o].shape;
            p.byte_size = specs[o].byte_size();
            p.source = PlannedTensor::Source::kModule;
            p.decision = i;
            p.module = mi;
            p.output = o;
            tensors.push_back(std::move(p));
          }
          ++plan.n_quantized;
        }
        break;
    }
  }
  return tensors;
}

// Orders the tensors of one output shard: names first, to find a name
// written twice; then the data layout of the safetensors writer (section 5
// of the format spec): dtypes in the writer's order, largest first, then
// names, which puts every tensor at a multiple of its element size.
// Sorted as indices, each tensor moved once: a shard may hold 200,000.
void order_shard_tensors(ShardPlan& shard) {
  const std::vector<PlannedTensor>& t = shard.tensors;
  std::vector<std::size_t> order(t.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return t[a].name < t[b].name; });
  poll_cancel();
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (t[order[i]].name == t[order[i - 1]].name) {
      throw bad_input(
          fmt::format("{}: output tensor '{}' would be written twice (the input "
                      "already holds a tensor of that name)",
                      shard.file_name, t[order[i]].name));
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_writer_order(t[a].dtype) > dtype_writer_order(t[b].dtype);
  });
  std::vector<PlannedTensor> ordered;
  ordered.reserve(order.size());
  for (const std::size_t i : order) ordered.push_back(std::move(shard.tensors[i]));
  shard.tensors = std::move(ordered);
}

// Lays out one output shard (its tensors ordered): header, offsets, size;
// records each tensor's file in weight_map and adds to the plan's byte
// counts.
void lay_out_shard(ShardPlan& shard, QuantizePlan& plan, json& weight_map) {
  std::vector<TensorSpec> specs;
  specs.reserve(shard.tensors.size());
  for (const PlannedTensor& t : shard.tensors) {
    poll_cancel();
    specs.push_back(TensorSpec{t.name, t.dtype, t.shape, t.byte_size});
    if (weight_map.contains(t.name)) {
      throw bad_input(fmt::format("output tensor '{}' would be written to {} and {}", t.name,
                                  weight_map[t.name].get<std::string>(), shard.file_name));
    }
    weight_map[t.name] = shard.file_name;
    if (!checked_add(plan.tensor_bytes_out, t.byte_size, plan.tensor_bytes_out)) {
      throw bad_input("output size overflows 64 bits");
    }
  }
  ShardLayout layout = layout_shard(specs, {{"format", "pt"}});
  if (layout.data_start - 8 > kMaxHeaderBytes) {
    throw bad_input(
        fmt::format("{}: the output header would be {} bytes, more than the limit of "
                    "{} that readers accept (section 1 of the format spec, docs/format.md)",
                    shard.file_name, layout.data_start - 8, kMaxHeaderBytes));
  }
  for (std::size_t i = 0; i < shard.tensors.size(); ++i)
    shard.tensors[i].offset = layout.offsets[i];
  shard.header = std::move(layout.header);
  shard.data_start = layout.data_start;
  shard.file_size = layout.file_size;
  if (!checked_add(plan.shard_bytes_out, shard.file_size, plan.shard_bytes_out)) {
    throw bad_input("output size overflows 64 bits");
  }
}

// The output shards, one per input shard with its file name; the
// weight map of the index (output tensor -> file).
json plan_output_shards(const Checkpoint& checkpoint, QuantizePlan& plan) {
  json weight_map = json::object();
  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) {
    ShardPlan shard;
    shard.file_name = checkpoint.shards[s].label();
    shard.input_shard = s;
    shard.tensors = output_tensors_of_shard(checkpoint, plan, s);
    order_shard_tensors(shard);
    lay_out_shard(shard, plan, weight_map);
    plan.shards.push_back(std::move(shard));
  }
  return weight_map;
}

// The config of a converted input: the converter's, merged with the groups
// this run quantizes with (converted_quantization_config). The run's ignore
// entries that matter are added back: those that keep a module a new
// group's targets match (the library drops the run's ignore list, and
// vLLM would then read such a module as quantized).
json converted_config(const QuantizePlan& plan, const json& block) {
  std::vector<std::string> keep;
  // The converter's own targets ("Linear" for AutoAWQ) would take a module
  // the run's ignore list keeps 16-bit, as a new group's would.
  const ModuleMatcher converter_targets(plan.source_format->targets, ModuleMatcher::Role::kTargets);
  for (std::size_t i = 0; i < plan.options.ignore.size(); ++i) {
    bool matters = false;
    for (const std::string& module : plan.ignore_matches[i]) {
      if (converter_targets.first_match(module)) matters = true;
      for (std::size_t g = 0; g < plan.target_matches.size() && !matters; ++g) {
        if (g >= plan.group_modules.size() || plan.group_modules[g] == 0) continue;
        for (const auto& entry_matches : plan.target_matches[g]) {
          if (std::find(entry_matches.begin(), entry_matches.end(), module) !=
              entry_matches.end()) {
            matters = true;
            break;
          }
        }
      }
    }
    if (matters) keep.push_back(plan.options.ignore[i]);
  }
  // Without a scheme the ignore list decides nothing (ignore_matches stay
  // empty): an entry that keeps a 16-bit candidate the converter's targets
  // match is written as well.
  if (!plan.options.scheme_given && !plan.options.ignore.empty()) {
    const ModuleMatcher run_ignore(plan.options.ignore, ModuleMatcher::Role::kIgnore);
    for (const TensorDecision& d : plan.decisions) {
      if (!d.selectable || d.fate != Fate::kCopy || !converter_targets.first_match(d.module)) {
        continue;
      }
      for (const std::size_t i : run_ignore.matching_entries(d.module)) {
        const std::string& e = plan.options.ignore[i];
        if (std::find(keep.begin(), keep.end(), e) == keep.end()) keep.push_back(e);
      }
    }
  }
  // A lifted converter entry: the modules it kept stay ignored by name.
  if (!plan.lifted_convert_ignore.empty()) {
    const ModuleMatcher lifted(plan.lifted_convert_ignore, ModuleMatcher::Role::kIgnore);
    for (const std::string& module : plan.converter_kept_modules) {
      if (lifted.first_match(module) && std::find(keep.begin(), keep.end(), module) == keep.end()) {
        keep.push_back(module);
      }
    }
  }
  return converted_quantization_config(*plan.source_format, block, keep,
                                       plan.lifted_convert_ignore);
}

// --convert-ignore and --convert-targets choose the converter's arguments;
// they cannot leave out a module that holds the format's quantized tensors
// (ctquant converts them as stored and never dequantizes them, so such a
// module has no 16-bit weight to keep or requantize). The modules the
// converter takes by its own arguments, against those it takes with the
// options': any left out is refused here, naming the option, rather than
// later as tensors the converter or the planner cannot place.
void refuse_unconverted_modules(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  const auto defaults = detect_source_format(checkpoint, ConvertOptions{});
  if (!defaults) return;
  std::vector<std::string> problems;
  const auto all = defaults->converter->plan(checkpoint, *defaults, problems);
  if (!problems.empty()) return;  // the input's own problems: said by the run with the options
  std::vector<std::string> ignored;
  const auto taken = plan.source_format->converter->plan(checkpoint, *plan.source_format, ignored);
  std::set<std::string> names;
  for (const ConvertedModule& m : taken) names.insert(m.name);
  std::vector<std::string> left;
  for (const ConvertedModule& m : all) {
    if (!names.contains(m.name)) left.push_back(m.name);
  }
  if (left.empty()) return;
  const ConvertOptions& given = plan.options.convert;
  const auto words = [](const std::vector<std::string>& entries) {
    std::vector<std::string> out;
    for (const std::string& e : entries) out.push_back(shell_word(e));
    return join(out, 8, " ");
  };
  std::vector<std::string> options;
  if (given.ignore) options.push_back("--convert-ignore " + words(*given.ignore));
  if (given.targets) options.push_back("--convert-targets " + words(*given.targets));
  std::vector<std::string> fixes;
  if (given.ignore) fixes.emplace_back("take them out of --convert-ignore");
  if (given.targets) fixes.emplace_back("make --convert-targets match them");
  throw usage_error(fmt::format(
      "{} leave{} {} module(s) out of the conversion that hold {} tensors: {}. ctquant converts "
      "such modules as stored and does not dequantize them, so each must be converted. Nothing "
      "was written. Fix: {}; --ignore and --targets choose what the scheme quantizes among the "
      "16-bit modules",
      join(options, 2, " with "), options.size() == 1 ? "s" : "", left.size(),
      plan.source_format->converter->name, join(left, 4), join(fixes, 2, ", and ")));
}

// The converted modules of an input a converter takes (source/converter.hpp):
// every problem of its tensors refused at once, as an unsupported input.
void plan_conversion(const Checkpoint& checkpoint, QuantizePlan& plan) {
  plan.source_format = detect_source_format(checkpoint, plan.options.convert);
  if (!plan.source_format) return;
  // The groups as config.json names them beside the converter's
  // (merged_group_names): a group given as "config_group_0" is written as
  // "config_group_1", and every message and the report say so.
  std::vector<std::string> names;
  for (const SchemeGroup& g : plan.options.groups) names.push_back(g.name);
  const auto merged = merged_group_names(names);
  for (SchemeGroup& g : plan.options.groups) g.name = merged.at(g.name);
  const ConvertOptions& given = plan.options.convert;
  if (given.ignore || given.targets) refuse_unconverted_modules(checkpoint, plan);
  std::vector<std::string> problems;
  plan.converted = plan.source_format->converter->plan(checkpoint, *plan.source_format, problems);
  if (!problems.empty()) {
    std::string message;
    for (const std::string& p : problems) message += p + "\n";
    message += fmt::format(
        "{} problem(s): the input is not the {} checkpoint its config says ({}); nothing was "
        "written",
        problems.size(), plan.source_format->converter->name, plan.source_format->description);
    throw unsupported_input(message);
  }
}

// vLLM reads one scheme per fused layer (compressed_tensors.py: get_scheme
// finds the scheme of a fused layer's shards and refuses shards whose
// schemes differ): a converted module whose fused partner (q/k/v,
// gate/up) this run quantizes with a new group would be such a split.
// Throws Error{kUsage} naming every split layer.
void check_converted_fused_layers(const QuantizePlan& plan) {
  if (plan.converted.empty()) return;
  std::unordered_map<std::string, const TensorDecision*> by_name;
  for (const TensorDecision& d : plan.decisions) by_name.emplace(d.name, &d);
  std::vector<std::string> problems;
  for (const ConvertedModule& m : plan.converted) {
    const FusedSpec* spec = llama_fused_group_of(last_component(m.name));
    if (spec == nullptr) continue;
    const std::string parent = module_of(m.name);
    for (const char* shard : spec->shards) {
      const std::string partner = parent.empty() ? shard : parent + "." + shard;
      const auto it = by_name.find(partner + ".weight");
      if (it == by_name.end() || it->second->fate != Fate::kQuantize) continue;
      const PlannedModule& q = plan.modules[it->second->modules.front()];
      problems.push_back(fmt::format(
          "fused layer '{}.{}': '{}' is converted ({}) but '{}' would be quantized with group "
          "'{}'",
          parent, spec->fused, m.name, plan.source_format->converter->name, partner,
          plan.group_of(q).name));
    }
  }
  if (problems.empty()) return;
  std::string message;
  for (const std::string& p : problems) message += p + "\n";
  message +=
      "vLLM loads one scheme per fused layer (vllm/model_executor/layers/quantization/"
      "compressed_tensors/compressed_tensors.py refuses shards of one layer with different "
      "schemes); keep the partners in 16 bits (--ignore) or leave them out of the scheme's "
      "targets; nothing was written";
  throw usage_error(message);
}

// The group vLLM reads a module with (compressed_tensors.py
// _quantization_scheme_map_from_config: one map entry per target string,
// a later group's target replacing an earlier one's in place, groups in
// the file's key order; utils.py find_matched_target: the first target
// equal to or `re:`-matching the name, else a class-name target such as
// "Linear"), or nullptr when none takes it.
const json* group_read_by_vllm(const json& block, const std::string& module) {
  std::vector<std::pair<std::string, const json*>> by_target;
  for (const auto& [name, group] : block["config_groups"].items()) {
    for (const auto& t : group["targets"]) {
      const std::string target = t.get<std::string>();
      auto it = std::find_if(by_target.begin(), by_target.end(),
                             [&](const auto& e) { return e.first == target; });
      if (it == by_target.end()) {
        by_target.emplace_back(target, &group);
      } else {
        it->second = &group;
      }
    }
  }
  std::vector<std::string> targets;
  for (const auto& e : by_target) targets.push_back(e.first);
  const ModuleMatcher by_name(targets, ModuleMatcher::Role::kIgnore);
  if (const auto i = by_name.first_match(module)) return by_target[*i].second;
  for (const auto& e : by_target) {
    if (e.first == "Linear") return e.second;
  }
  return nullptr;
}

// The merged config of a converted input must make vLLM read every module
// as this run writes it: a converted or quantized module that the written
// ignore list matches is loaded as a 16-bit .weight (utils.py
// should_ignore_layer), and one whose target vLLM resolves to another
// group's scheme (two groups targeting "Linear": the later one replaces
// the converter's) is read with the wrong scheme. Throws Error{kUsage}
// naming every such module; nothing is written.
void check_converted_groups_as_read(const QuantizePlan& plan, const json& new_block,
                                    const json& block) {
  std::vector<std::string> ignore;
  for (const auto& e : block["ignore"]) ignore.push_back(e.get<std::string>());
  const ModuleMatcher ignored(ignore, ModuleMatcher::Role::kIgnore);
  std::vector<std::string> problems;
  auto check = [&](const std::string& module, const json& group, const std::string& how) {
    if (const auto i = ignored.first_match(module)) {
      problems.push_back(fmt::format(
          "module '{}' is {} but config.json's ignore entry '{}' matches it: vLLM would build it "
          "unquantized and look for a 16-bit .weight",
          module, how, ignore[*i]));
      return;
    }
    const json* read = group_read_by_vllm(block, module);
    if (read == nullptr || *read != group) {
      std::string read_name = "none";
      for (const auto& [name, g] : block["config_groups"].items()) {
        if (read != nullptr && &g == read) read_name = name;
      }
      problems.push_back(fmt::format(
          "module '{}' is {} but vLLM's find_matched_target would read it with group '{}' "
          "(another group's target takes it first, or replaces its group's target)",
          module, how, read_name));
    }
  };
  const std::string converted = fmt::format("converted ({})", plan.source_format->converter->name);
  for (const ConvertedModule& m : plan.converted)
    check(m.name, plan.source_format->group, converted);
  for (const PlannedModule& m : plan.modules) {
    if (m.kind != PlannedModule::Kind::kQuantize) continue;
    const std::string& g = plan.group_of(m).name;
    check(m.name, new_block["config_groups"][g], fmt::format("quantized with group '{}'", g));
  }
  // The shards of a layer vLLM fuses (q/k/v, gate/up) must share one
  // scheme, 16-bit included: vLLM's should_ignore_layer raises "Found a
  // different quantization schemes" when the ignore list keeps some shards
  // and not others (vllm/model_executor/layers/quantization/
  // compressed_tensors/utils.py), and compressed_tensors.py reads one scheme
  // per fused layer.
  struct FusedLayer {
    std::string name;
    std::vector<std::string> shards;  // "module (how)", for the message
    std::set<std::string> hows;
  };
  std::vector<FusedLayer> layers;
  auto note_shard = [&](const std::string& module, const std::string& how) {
    const ModuleInfo* info = plan.roles.find(module);
    if (info == nullptr || info->vllm_layer.empty() || info->vllm_layer == info->vllm_name ||
        info->role == ModuleRole::kExpert || info->role == ModuleRole::kStackedExperts) {
      return;
    }
    auto it = std::find_if(layers.begin(), layers.end(),
                           [&](const FusedLayer& l) { return l.name == info->vllm_layer; });
    if (it == layers.end()) it = layers.insert(layers.end(), FusedLayer{info->vllm_layer, {}, {}});
    it->shards.push_back(fmt::format("{} ({})", module, how));
    it->hows.insert(how);
  };
  for (const ConvertedModule& m : plan.converted) note_shard(m.name, converted);
  for (const PlannedModule& m : plan.modules) {
    if (m.kind == PlannedModule::Kind::kQuantize) {
      note_shard(m.name, fmt::format("quantized with group '{}'", plan.group_of(m).name));
    }
  }
  for (const TensorDecision& d : plan.decisions) {
    if (d.selectable && d.fate == Fate::kCopy) note_shard(d.module, "16-bit");
  }
  for (const FusedLayer& l : layers) {
    if (l.hows.size() > 1) {
      problems.push_back(fmt::format(
          "vLLM builds '{}' as one layer, and its shards differ: {} (compressed_tensors/utils.py "
          "should_ignore_layer: \"Found a different quantization schemes ... vLLM requires all "
          "to use the same scheme\"; compressed_tensors.py reads one scheme per fused layer); "
          "give its shards one scheme",
          l.name, join(l.shards, 4)));
    }
  }
  if (problems.empty()) return;
  constexpr std::size_t kShown = 8;
  std::string message;
  for (std::size_t i = 0; i < problems.size() && i < kShown; ++i) message += problems[i] + "\n";
  if (problems.size() > kShown) {
    message += fmt::format("... and {} more\n", problems.size() - kShown);
  }
  message += fmt::format(
      "{} module(s) or fused layer(s) vLLM would read wrong "
      "(vllm/model_executor/layers/quantization/"
      "compressed_tensors/utils.py find_matched_target: a name or `re:` target wins over the "
      "class name \"Linear\", and two groups targeting the same string keep the later): give the "
      "new scheme name or `re:` targets (--targets) that leave the converted modules alone, or "
      "the converter `re:` targets (--convert-targets); nothing was written",
      problems.size());
  throw usage_error(message);
}

// The index (model_free_ptq writes one for every checkpoint, a
// single file too: schemes.md 1, step 8), config.json with its
// quantization_config, and the files copied as they are.
void plan_index_and_config(const Checkpoint& checkpoint, QuantizePlan& plan, json weight_map) {
  plan.index = json::object();
  plan.index["metadata"] = {{"total_size", plan.tensor_bytes_out}};
  plan.index["weight_map"] = std::move(weight_map);
  json block = plan_quantization_config(plan.options, plan.group_modules);
  if (plan.source_format) {
    const json new_block = block;
    block = converted_config(plan, block);
    check_converted_groups_as_read(plan, new_block, block);
  }
  plan.config = output_config(checkpoint.config, block);
  plan.copied_files = checkpoint.other_files;
}

}  // namespace

QuantizePlan make_plan(const Checkpoint& checkpoint, const PlanOptions& given) {
  // A signal stops a long plan (poll_cancel, util/cancel.hpp): between the
  // stages and inside their loops over tensors.
  check_plan_options(given);
  QuantizePlan plan = start_plan(checkpoint, given);
  poll_cancel();
  // A transform that refuses INPUT says so before any rule of the plan
  // (cli.md: exit 2, with every reason).
  if (!given.transform.empty()) plan.rewrite = plan_transform(checkpoint, given.transform);
  plan_conversion(checkpoint, plan);
  detail::decide_fates(checkpoint, plan);
  check_converted_fused_layers(plan);
  check_weight_row_sizes(checkpoint, plan);
  assign_amax_sets(checkpoint, plan);
  poll_cancel();
  json weight_map = plan_output_shards(checkpoint, plan);
  poll_cancel();
  plan_index_and_config(checkpoint, plan, std::move(weight_map));
  count_linear_params(checkpoint, plan);
  if (plan.rewrite && plan.config.is_object()) {
    plan.config["ctquant_transform"] = plan.rewrite->record();
  }
  return plan;
}

}  // namespace ctquant
