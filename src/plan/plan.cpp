#include "ctquant/plan/plan.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "ctquant/format/config.hpp"
#include "ctquant/format/matcher.hpp"
#include "ctquant/format/safetensors_writer.hpp"
#include "ctquant/scheme/fused_sets.hpp"
#include "ctquant/scheme/refused_presets.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/checked.hpp"
#include "ctquant/util/error.hpp"
#include "plan/stacked_experts.hpp"

namespace ctquant {

using detail::stacked_key;
using detail::stacked_layout_problem;
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

// Section 2, rule 6: the last component contains "embed", or is wte / wpe.
bool is_embedding(const std::string& module) {
  const std::string last = last_component(module);
  return last.find("embed") != std::string::npos || last == "wte" || last == "wpe";
}

std::string group_label(const PlanOptions& o, std::size_t g) {
  return o.groups.size() == 1 ? std::string() : fmt::format(" (group '{}')", o.groups[g].name);
}

// One 2-D weight the ignore list and the groups decide: a whole .weight or
// an expert projection of a split stacked tensor.
struct Candidate {
  std::string module;
  std::string tensor;  // the input tensor it is read from, for messages
  std::string file;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::string dtype_text;  // the stored dtype, described
};

struct Outcome {
  bool quantize = false;
  std::string rule;
  std::optional<std::size_t> ignore_entry;
  std::size_t group = 0;
};

// Section 2 rule 5 (ignore list and targets) and the group assignment of
// schemes.md 9.3, recording which modules each entry matched.
class SelectionRules {
 public:
  SelectionRules(const PlanOptions& options, QuantizePlan& plan)
      : options_(options), ignore_(options.ignore, ModuleMatcher::Role::kIgnore), plan_(plan) {
    plan_.ignore_matches.resize(options.ignore.size());
    plan_.target_matches.resize(options.groups.size());
    plan_.group_modules.assign(options.groups.size(), 0);
    for (std::size_t g = 0; g < options.groups.size(); ++g) {
      targets_.emplace_back(options.groups[g].targets, ModuleMatcher::Role::kTargets);
      plan_.target_matches[g].resize(options.groups[g].targets.size());
    }
  }

  Outcome decide(const Candidate& c) {
    Outcome out;
    for (std::size_t i = 0; i < ignore_.entries().size(); ++i) {
      if (ignore_.entry_matches(i, c.module)) {
        plan_.ignore_matches[i].push_back(c.module);
        if (!out.ignore_entry) out.ignore_entry = i;
      }
    }
    std::optional<std::pair<std::size_t, std::size_t>> target;  // group, entry
    for (std::size_t g = 0; g < targets_.size(); ++g) {
      for (std::size_t i = 0; i < targets_[g].entries().size(); ++i) {
        if (targets_[g].entry_matches(i, c.module)) {
          plan_.target_matches[g][i].push_back(c.module);
          if (!target) target = {g, i};
        }
      }
    }
    if (out.ignore_entry) {
      out.rule = fmt::format("ignored by '{}'", options_.ignore[*out.ignore_entry]);
      return out;
    }
    if (!target) {
      out.rule = "matches no target";
      return out;
    }
    const auto [g, i] = *target;
    const SchemeGroup& group = options_.groups[g];
    const SchemeFamily* family = group.family();
    const std::string refusal = family->refuse(group.weights, c.rows, c.cols);
    if (!refusal.empty()) {
      const auto dot = c.module.rfind('.');
      refused_names_.insert(dot == std::string::npos ? c.module : c.module.substr(dot + 1));
      if (dot == std::string::npos) refused_top_level_ = true;
      refusals_.push_back(fmt::format("{}: tensor '{}' [{}, {}]{} {}{}", c.file, c.tensor, c.rows,
                                      c.cols, c.tensor == c.module + ".weight"
                                                  ? std::string()
                                                  : fmt::format(" (module '{}')", c.module),
                                      refusal, group_label(options_, g)));
    }
    out.quantize = true;
    out.group = g;
    out.rule = fmt::format("2-D {} .weight matching target '{}'{}", c.dtype_text,
                           group.targets[i], group_label(options_, g));
    ++plan_.group_modules[g];
    return out;
  }

  const std::vector<std::string>& refusals() const { return refusals_; }
  // The ignore entry that keeps every weight of refusals() in 16 bits.
  std::string refusal_fix() const {
    return last_component_entry(refused_names_, refused_top_level_);
  }

 private:
  const PlanOptions& options_;
  const ModuleMatcher ignore_;
  std::vector<ModuleMatcher> targets_;
  QuantizePlan& plan_;
  std::vector<std::string> refusals_;
  std::set<std::string> refused_names_;  // last components of their modules
  bool refused_top_level_ = false;
};

// Rules 1-4 and 6 of section 2 for a whole tensor: why it is not a
// quantization candidate, or "" when it is. dtype stands for the tensor's
// dtype as loaded (BF16 for an FP8 weight).
std::string not_a_candidate(const std::string& name, const std::string& module,
                            const std::vector<std::uint64_t>& shape, DType dtype,
                            const std::string& dtype_text) {
  if (last_component(name) != "weight" || module.empty()) return "not a .weight tensor";
  if (shape.size() != 2) return fmt::format("{}-D, not a 2-D linear weight", shape.size());
  if (module.ends_with("norm")) return "module ends with 'norm'";
  if (!is_quantizable_float(dtype)) return fmt::format("dtype {} is not BF16, F16 or F32", dtype_text);
  if (is_embedding(module)) return "embedding (target Linear never covers it)";
  if (shape[0] == 0 || shape[1] == 0) return "empty tensor";
  return {};
}

// The input's own ignore list (compressed-tensors), matched with the same
// semantics as --ignore (section 2). A pattern that does not compile is bad
// input here, not a usage error.
std::optional<ModuleMatcher> input_ignore_matcher(const InputQuantization& q) {
  if (q.ignore.empty()) return std::nullopt;
  try {
    return ModuleMatcher(q.ignore, ModuleMatcher::Role::kIgnore);
  } catch (const Error& e) {
    throw bad_input(fmt::format("{}: quantization_config.ignore: {}", kConfigFileName, e.what()));
  }
}

// Checks an F8 tensor against section 6 and returns its scale when it is an
// FP8 weight ctquant dequantizes; otherwise adds the reasons to problems.
// A stacked 3-D FP8 expert tensor (split_experts > 0 experts) has a 3-D
// scale whose dim 0 is the expert: the layout returned is one expert's.
std::optional<Fp8Source> fp8_weight_source(const Checkpoint& checkpoint, const InputQuantization& q,
                                           const std::optional<ModuleMatcher>& input_ignore,
                                           const TensorDecision& d, const TensorEntry& t,
                                           bool stacked, std::vector<std::string>& problems) {
  const std::size_t n_problems = problems.size();
  const auto problem = [&](const std::string& what) { problems.push_back(what); };
  const std::string dtype = std::string(dtype_tag(t.dtype));
  if (!is_dequantizable_fp8(t.dtype)) {
    problem(
        fmt::format("dtype {} is not dequantized (ctquant dequantizes F8_E4M3 and F8_E5M2 "
                    "weights), and the output must not carry F8 tensors it did not write",
                    dtype));
    return std::nullopt;
  }
  if (!stacked && (last_component(t.name) != "weight" || d.module.empty())) {
    problem(
        fmt::format("{} tensor that is not a module's .weight: ctquant dequantizes FP8 weights "
                    "only, and the output must not carry F8 tensors it did not write",
                    dtype));
    return std::nullopt;
  }
  if (!q.is_fp8()) {
    problem(
        fmt::format("{} weight, but {} has no FP8 quantization_config (quant_method \"fp8\" "
                    "with weight_block_size, or compressed-tensors \"float-quantized\") to "
                    "say how it is scaled",
                    dtype, kConfigFileName));
    return std::nullopt;
  }
  if (!stacked && t.shape.size() == 3) {
    problem(fmt::format(
        "3-D FP8 expert tensor {} that is not a stacked gate_up_proj / down_proj tensor: "
        "ctquant dequantizes 2-D FP8 weights and splits stacked experts only (schemes.md 8)",
        shape_string(t.shape)));
  } else if (!stacked && t.shape.size() != 2) {
    problem(fmt::format("{}-D FP8 weight {}, expected 2-D [out_features, in_features]",
                        t.shape.size(), shape_string(t.shape)));
  }
  if (input_ignore) {
    if (const auto entry = input_ignore->first_match(d.module)) {
      problem(
          fmt::format("{} quantization_config.ignore entry '{}' says module '{}' was never "
                      "quantized, but its weight is {}",
                      kConfigFileName, q.ignore[*entry], d.module, dtype));
    }
  }
  // A stacked tensor without a .weight suffix (`experts.gate_up_proj`) has
  // its scale beside it as `experts.gate_up_proj_<scale param>`.
  const std::string scale_name = stacked && last_component(t.name) != "weight"
                                     ? t.name + "_" + std::string(q.scale_param())
                                     : d.module + "." + std::string(q.scale_param());
  const auto scale = checkpoint.tensors.find(scale_name);
  if (scale == checkpoint.tensors.end()) {
    const std::string other =
        q.kind == InputQuantKind::kBlockFp8 ? "weight_scale" : "weight_scale_inv";
    const bool has_other = checkpoint.tensors.contains(d.module + "." + other);
    problem(fmt::format(
        "FP8 weight {} {} has no scale '{}' ({}){}", dtype, shape_string(t.shape), scale_name,
        q.describe(),
        has_other ? fmt::format("; found '{}.{}', which this kind does not use", d.module, other)
                  : ""));
  }
  if (problems.size() != n_problems) return std::nullopt;

  const TensorEntry& s = checkpoint.entry(scale->second);
  try {
    if (!stacked) {
      return Fp8Source{scale->second,
                       fp8_scale_layout(q, t.shape[0], t.shape[1], s.dtype, s.shape)};
    }
    // One expert [R, C] of [E, R, C]: the scale is [E, ...] of one grid per expert.
    if (s.shape.empty() || s.shape[0] != t.shape[0]) {
      throw bad_input(fmt::format("expected one scale grid per expert, [{}, ...]", t.shape[0]));
    }
    const std::vector<std::uint64_t> per_expert(s.shape.begin() + 1, s.shape.end());
    return Fp8Source{scale->second,
                     fp8_scale_layout(q, t.shape[1], t.shape[2], s.dtype, per_expert)};
  } catch (const Error& e) {
    problem(fmt::format("its scale '{}' ({} {}, in {}): {}", scale_name, dtype_tag(s.dtype),
                        shape_string(s.shape), checkpoint.shards[scale->second.shard].label(),
                        e.what()));
    return std::nullopt;
  }
}

// Where the scale of a stacked FP8 tensor lives, for the drop rule: the
// tensor named by fp8_weight_source for a stacked weight.
bool is_stacked_fp8_scale(const Checkpoint& checkpoint, const InputQuantization& q,
                          const std::string& name) {
  const std::string suffix = "_" + std::string(q.scale_param());
  if (!name.ends_with(suffix)) return false;
  const TensorEntry* w = checkpoint.find(name.substr(0, name.size() - suffix.size()));
  return w != nullptr && is_fp8(w->dtype) && w->shape.size() == 3;
}

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
  for (const std::string& e : options.ignore) {
    if (std::find(list.entries.begin(), list.entries.end(), e) != list.entries.end()) continue;
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
      add(fmt::format("scheme group '{}': no output format ctquant writes fits its weights ({}-bit "
                      "{} {}){}",
                      g.name, g.weights.num_bits,
                      g.weights.type == QuantArgs::Type::kInt ? "int" : "float",
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
  for (const SchemeGroup& g : options.groups) check_entries(g.targets, ModuleMatcher::Role::kTargets);
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
    // (schemes.md 9.2); a group that took no module keeps null.
    if (g < group_modules.size() && group_modules[g] > 0) c.format = std::string(s.family()->format);
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

// Records the classification of the input's quantization_config in plan.
const InputQuantization& classify_input(const Checkpoint& checkpoint, QuantizePlan& plan) {
  plan.input_quantization = classify_input_quantization(checkpoint.config);
  return plan.input_quantization;
}

// The fate of every input tensor (sections 2 and 6 of the spec,
// schemes.md 8) and the modules it yields, shard by shard in file order.
// Every problem of the input is collected; throw_problems() reports them at
// once.
class FateDecider {
 public:
  FateDecider(const Checkpoint& checkpoint, QuantizePlan& plan)
      : checkpoint_(checkpoint),
        plan_(plan),
        rules_(plan.options, plan),
        q_(classify_input(checkpoint, plan)),
        input_ignore_(input_ignore_matcher(q_)) {}

  // Decides every tensor of input shard s.
  void decide_shard(std::size_t s) {
    const std::string& file = checkpoint_.shards[s].label();
    const auto& tensors = checkpoint_.shards[s].header().tensors;
    std::vector<std::string> colon_names;  // tensors of this shard with ':' in their names
    for (std::size_t e = 0; e < tensors.size(); ++e) {
      poll_cancel();
      const TensorEntry& t = tensors[e];
      std::vector<std::string> found;  // this tensor's problems
      plan_.decisions.push_back(decide_tensor(s, e, file, colon_names, found));
      for (const std::string& f : found) {
        problems_.push_back(fmt::format("{}: tensor '{}': {}", file, t.name, f));
      }
      if (!found.empty()) ++n_bad_tensors_;
    }
    if (!colon_names.empty()) refuse_colon_names(file, colon_names);
  }

  // Throws Error{kBadInput} with every problem found and every refusal of
  // the groups' schemes, and the fix of the latter.
  void throw_problems() const {
    const PlanOptions& options = plan_.options;
    const auto& refusals = rules_.refusals();
    if (problems_.empty() && refusals.empty()) return;
    std::string message;
    for (const auto& m : problems_) message += m + "\n";
    for (const auto& m : refusals) message += m + "\n";
    if (!problems_.empty()) {
      message += fmt::format("{} tensor(s) cannot be converted", n_bad_tensors_);
      if (!refusals.empty()) message += "; ";
    }
    if (!refusals.empty()) {
      const bool one_int_group = options.groups.size() == 1 &&
                                 options.groups[0].weights.type == QuantArgs::Type::kInt &&
                                 options.groups[0].weights.strategy == QuantArgs::Strategy::kGroup;
      message += fmt::format(
          "{} tensor(s) cannot be quantized with {}: keep them in 16 bits (--ignore '{}') or "
          "pick another {}",
          refusals.size(),
          one_int_group ? fmt::format("group size {}", options.groups[0].weights.group_size)
                        : std::string("their scheme"),
          rules_.refusal_fix(), one_int_group ? "--group-size" : "scheme");
    }
    throw bad_input(message);
  }

 private:
  // The decision of tensor e of shard s (to be plan_.decisions[its index]);
  // its problems go to found.
  TensorDecision decide_tensor(std::size_t s, std::size_t e, const std::string& file,
                               std::vector<std::string>& colon_names,
                               std::vector<std::string>& found) {
    const TensorEntry& t = checkpoint_.shards[s].header().tensors[e];
    TensorDecision d;
    d.name = t.name;
    d.module = module_of(t.name);
    d.source = TensorLocation{s, e};
    d.fate = Fate::kCopy;
    const std::string param = last_component(t.name);
    bool both_keys = false;
    const auto key = stacked_key(t.name, both_keys);
    // Stacked experts vLLM reads only stacked (roles.hpp): kept whole.
    const ModuleInfo* role = key && t.shape.size() == 3 ? plan_.roles.find(t.name) : nullptr;
    if (role != nullptr && role->action == DefaultAction::kKeep) {
      d.rule = role->reason;
    } else if (t.name.find(':') != std::string::npos) {
      d.rule = "unknown layout (':' in the name)";
      colon_names.push_back(t.name);
    } else if (q_.is_fp8() && !d.module.empty() && param == q_.scale_param()) {
      decide_fp8_scale(d, param, found);
    } else if (q_.is_fp8() && is_stacked_fp8_scale(checkpoint_, q_, t.name)) {
      d.fate = Fate::kDrop;
      d.rule = "scale of a stacked FP8 expert tensor (consumed by its dequantization)";
    } else if (q_.is_fp8() && !d.module.empty() && is_activation_param(param)) {
      d.fate = Fate::kDrop;
      d.rule = fmt::format(
          "activation or KV-cache parameter '{}' of an FP8 input (dropped: the "
          "output quantizes weights only)",
          param);
    } else if (key && t.shape.size() == 3) {
      split_stacked_experts(d, t, *key, both_keys, file, found);
    } else if (is_fp8(t.dtype)) {
      decide_fp8_weight(d, t, file, found);
    } else {
      decide_weight(d, t, file);
    }
    return d;
  }

  // The scale of an FP8 weight: consumed by its dequantization; a scale
  // without an F8 weight is a problem.
  void decide_fp8_scale(TensorDecision& d, const std::string& param,
                        std::vector<std::string>& found) const {
    const TensorEntry* w = checkpoint_.find(d.module + ".weight");
    if (w != nullptr && is_fp8(w->dtype)) {
      d.fate = Fate::kDrop;
      d.rule = fmt::format("scale of FP8 weight '{}.weight' (consumed by its dequantization)",
                           d.module);
    } else if (w == nullptr) {
      found.push_back(
          fmt::format("{} without its weight: the checkpoint has no tensor "
                      "'{}.weight'",
                      param, d.module));
    } else {
      found.push_back(
          fmt::format("{} beside a {} weight '{}.weight'; in a {} checkpoint only "
                      "F8 weights have one",
                      param, dtype_tag(w->dtype), d.module, q_.describe()));
    }
  }

  // Stacked experts: one 2-D weight per expert and projection (schemes.md 8).
  void split_stacked_experts(TensorDecision& d, const TensorEntry& t, std::string_view key,
                             bool both_keys, const std::string& file,
                             std::vector<std::string>& found) {
    if (both_keys) {
      found.push_back("its name holds both 'gate_up_proj' and 'down_proj'; it cannot be "
                      "split into one projection");
      return;
    }
    if (const std::string why = stacked_layout_problem(checkpoint_, key, t.shape); !why.empty()) {
      found.push_back(fmt::format("stacked expert tensor {} cannot be split: {}",
                                  shape_string(t.shape), why));
      return;
    }
    std::optional<Fp8Source> fp8;
    if (is_fp8(t.dtype)) {
      fp8 = fp8_weight_source(checkpoint_, q_, input_ignore_, d, t, /*stacked=*/true, found);
      if (!fp8) return;
    } else if (!is_quantizable_float(t.dtype)) {
      found.push_back(fmt::format("stacked expert tensor of dtype {} (BF16, F16, F32 or "
                                  "FP8 can be split)",
                                  dtype_tag(t.dtype)));
      return;
    }
    d.fate = Fate::kSplit;
    d.fp8 = fp8;
    const bool gate_up = key == "gate_up_proj";
    const std::uint64_t n_experts = t.shape[0];
    const std::uint64_t rows_per_expert = t.shape[1];
    const std::uint64_t part_rows = gate_up ? rows_per_expert / 2 : rows_per_expert;
    const std::uint64_t cols = t.shape[2];
    d.rule = fmt::format("stacked experts [E, out, in] split into {} x {}", n_experts,
                         gate_up ? "gate_proj, up_proj" : "down_proj");
    const DType loaded = fp8 ? DType::kBF16 : t.dtype;
    const std::string dtype_text = fp8 ? fmt::format("{} (dequantized to BF16)", dtype_tag(t.dtype))
                                       : std::string(dtype_tag(t.dtype));
    const auto pos = t.name.find(key);
    for (std::uint64_t x = 0; x < n_experts; ++x) {
      const std::vector<std::string_view> parts =
          gate_up ? std::vector<std::string_view>{"gate_proj", "up_proj"}
                  : std::vector<std::string_view>{"down_proj"};
      for (std::size_t p = 0; p < parts.size(); ++p) {
        std::string name = t.name;
        name.replace(pos, key.size(), fmt::format("{}.{}", x, parts[p]));
        if (!name.ends_with(".weight")) name += ".weight";
        std::optional<Fp8Source> expert_fp8 = fp8;
        if (expert_fp8) {
          expert_fp8->view_first_row = x * rows_per_expert;
          expert_fp8->grid_first_row = x * expert_fp8->layout.grid_rows;
        }
        const std::string module = module_of(name);
        Outcome outcome;
        if (module.ends_with("norm") || is_embedding(module)) {
          outcome.rule = "module name excluded by section 2";
        } else {
          outcome = rules_.decide(Candidate{module, t.name, file, part_rows, cols, dtype_text});
        }
        add_module(d, module, x * rows_per_expert + p * part_rows, part_rows, cols,
                   std::move(expert_fp8), outcome, loaded);
      }
    }
  }

  // An F8 weight: dequantized to BF16, then quantized or written as BF16.
  void decide_fp8_weight(TensorDecision& d, const TensorEntry& t, const std::string& file,
                         std::vector<std::string>& found) {
    d.fp8 = fp8_weight_source(checkpoint_, q_, input_ignore_, d, t, /*stacked=*/false, found);
    if (!d.fp8) return;
    const std::string dtype_text = fmt::format("{} (dequantized to BF16)", dtype_tag(t.dtype));
    const std::string why = not_a_candidate(t.name, d.module, t.shape, DType::kBF16, dtype_text);
    Outcome outcome;
    if (why.empty()) {
      d.selectable = true;
      outcome = rules_.decide(Candidate{d.module, t.name, file, t.shape[0], t.shape[1],
                                        dtype_text});
    } else {
      outcome.rule = why;
    }
    d.fate = outcome.quantize ? Fate::kQuantize : Fate::kDequantize;
    d.rule = outcome.quantize ? outcome.rule : outcome.rule + "; written as a BF16 .weight";
    d.ignore_entry = outcome.ignore_entry;
    Outcome module_outcome = outcome;
    module_outcome.rule = d.rule;
    add_module(d, d.module, 0, t.shape[0], t.shape[1], d.fp8, module_outcome, DType::kBF16);
  }

  // A BF16, F16 or F32 tensor (or any other dtype, copied): quantized when
  // it is a candidate (rules 1-4 and 6) the ignore list and targets select.
  void decide_weight(TensorDecision& d, const TensorEntry& t, const std::string& file) {
    const std::string dtype_text(dtype_tag(t.dtype));
    const std::string why = not_a_candidate(t.name, d.module, t.shape, t.dtype, dtype_text);
    if (!why.empty()) {
      d.rule = why;
      return;
    }
    d.selectable = true;
    const Outcome outcome =
        rules_.decide(Candidate{d.module, t.name, file, t.shape[0], t.shape[1], dtype_text});
    d.rule = outcome.rule;
    d.ignore_entry = outcome.ignore_entry;
    if (outcome.quantize) {
      d.fate = Fate::kQuantize;
      add_module(d, d.module, 0, t.shape[0], t.shape[1], std::nullopt, outcome, t.dtype);
    }
  }

  // Adds a module for rows [row_begin, row_begin + rows) of decision d's
  // tensor; d is the next entry of plan_.decisions.
  void add_module(TensorDecision& d, std::string name, std::uint64_t row_begin,
                  std::uint64_t rows, std::uint64_t cols, std::optional<Fp8Source> fp8,
                  const Outcome& outcome, DType loaded) {
    PlannedModule m;
    m.name = std::move(name);
    m.decision = plan_.decisions.size();
    m.source = WeightSource{d.source, row_begin, rows, cols, std::move(fp8)};
    m.group = outcome.group;
    m.rule = outcome.rule;
    m.ignore_entry = outcome.ignore_entry;
    m.shard = d.source.shard;
    m.dtype = loaded;
    m.kind = outcome.quantize              ? PlannedModule::Kind::kQuantize
             : m.source.fp8.has_value()    ? PlannedModule::Kind::kDequantize
                                           : PlannedModule::Kind::kSlice;
    d.modules.push_back(plan_.modules.size());
    plan_.modules.push_back(std::move(m));
  }

  // torchao writes tensor subclasses as '<param>:<component>' keys
  // described in __metadata__: copying them would drop that metadata (and
  // could carry F8 codes into the output), and reading them needs torchao's
  // own rules. ctquant refuses the format, first of all problems.
  void refuse_colon_names(const std::string& file, const std::vector<std::string>& colon_names) {
    constexpr std::size_t kNamesShown = 8;
    std::string names;
    for (std::size_t i = 0; i < colon_names.size() && i < kNamesShown; ++i) {
      names += fmt::format("{}'{}'", i == 0 ? "" : ", ", colon_names[i]);
    }
    if (colon_names.size() > kNamesShown) {
      names += fmt::format(" and {} more", colon_names.size() - kNamesShown);
    }
    problems_.insert(
        problems_.begin(),
        fmt::format("{}: {} {}: a name with a ':' component is torchao's tensor-subclass "
                    "layout ('<param>:<component>', described in __metadata__), not a module "
                    "parameter; ctquant does not convert this format (load the model with "
                    "torchao and save plain BF16 weights first)",
                    file, colon_names.size() == 1 ? "tensor" : "tensors", names));
    n_bad_tensors_ += colon_names.size();
  }

  const Checkpoint& checkpoint_;
  QuantizePlan& plan_;
  SelectionRules rules_;
  const InputQuantization& q_;
  const std::optional<ModuleMatcher> input_ignore_;
  std::vector<std::string> problems_;  // every input problem of this stage, reported at once
  std::size_t n_bad_tensors_ = 0;
};

void decide_fates(const Checkpoint& checkpoint, QuantizePlan& plan) {
  FateDecider decider(checkpoint, plan);
  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) decider.decide_shard(s);
  decider.throw_problems();
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
std::vector<PlannedTensor> output_tensors_of_shard(const Checkpoint& checkpoint,
                                                   QuantizePlan& plan, std::size_t s) {
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
  for (std::size_t i = 0; i < shard.tensors.size(); ++i) shard.tensors[i].offset = layout.offsets[i];
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

// The index (model_free_ptq writes one for every checkpoint, a
// single file too: schemes.md 1, step 8), config.json with its
// quantization_config, and the files copied as they are.
void plan_index_and_config(const Checkpoint& checkpoint, QuantizePlan& plan, json weight_map) {
  plan.index = json::object();
  plan.index["metadata"] = {{"total_size", plan.tensor_bytes_out}};
  plan.index["weight_map"] = std::move(weight_map);
  plan.config = output_config(checkpoint.config,
                              plan_quantization_config(plan.options, plan.group_modules));
  plan.copied_files = checkpoint.other_files;
}

}  // namespace

QuantizePlan make_plan(const Checkpoint& checkpoint, const PlanOptions& given) {
  // A signal stops a long plan (poll_cancel, util/cancel.hpp): between the
  // stages and inside their loops over tensors.
  check_plan_options(given);
  QuantizePlan plan = start_plan(checkpoint, given);
  poll_cancel();
  decide_fates(checkpoint, plan);
  check_weight_row_sizes(checkpoint, plan);
  assign_amax_sets(checkpoint, plan);
  poll_cancel();
  json weight_map = plan_output_shards(checkpoint, plan);
  poll_cancel();
  plan_index_and_config(checkpoint, plan, std::move(weight_map));
  count_linear_params(checkpoint, plan);
  return plan;
}

}  // namespace ctquant
