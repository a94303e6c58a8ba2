#include "plan/fates.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/format/targets.hpp"
#include "ctquant/model/fused_groups.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "plan/stacked_experts.hpp"

namespace ctquant::detail {

using nlohmann::json;

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

GroupTargets group_targets(const PlanOptions& options) {
  std::vector<std::vector<std::string>> targets;
  std::vector<std::string> names;
  for (const SchemeGroup& g : options.groups) {
    targets.push_back(g.targets);
    names.push_back(g.name);
  }
  return GroupTargets(targets, names);
}

// Section 2 rule 5 (ignore list and targets) and the group assignment of
// schemes.md 9.3, recording which modules each entry matched.
class SelectionRules {
 public:
  SelectionRules(const PlanOptions& options, QuantizePlan& plan)
      : options_(options),
        ignore_(options.ignore, ModuleMatcher::Role::kIgnore),
        targets_(group_targets(options)),
        plan_(plan) {
    plan_.ignore_matches.resize(options.ignore.size());
    plan_.target_matches.resize(options.groups.size());
    plan_.group_modules.assign(options.groups.size(), 0);
    for (std::size_t g = 0; g < options.groups.size(); ++g) {
      plan_.target_matches[g].resize(options.groups[g].targets.size());
    }
  }

  Outcome decide(const Candidate& c) {
    Outcome out;
    for (const std::size_t i : ignore_.matching_entries(c.module)) {
      plan_.ignore_matches[i].push_back(c.module);
      if (!out.ignore_entry) out.ignore_entry = i;
    }
    const std::vector<TargetHit> hits = targets_.matches(c.module);
    for (const TargetHit& h : hits) plan_.target_matches[h.group][h.entry].push_back(c.module);
    if (out.ignore_entry) {
      out.rule = fmt::format("ignored by '{}'", options_.ignore[*out.ignore_entry]);
      return out;
    }
    if (hits.empty()) {
      out.rule = "matches no target";
      return out;
    }
    // The group: model_free_ptq's (the first given), or, for a config read
    // back, the group the readers give it. Where the readers disagree with
    // it or each other, lint (L11) and verify say so.
    GroupResolution groups = targets_.resolve(c.module);
    // A shard vLLM fuses (q/k/v, gate/up) is read as its fused layer.
    if (const auto fused = vllm_fused_layer(c.module)) {
      groups.vllm = targets_.vllm_fused_group(fused->first, fused->second);
    }
    const bool as_read = options_.group_rule == PlanOptions::GroupRule::kAsRead;
    if (as_read ? groups.compressed_tensors != groups.vllm : !groups.agree()) {
      plan_.group_conflicts.push_back(GroupConflict{c.module, c.tensor, groups});
    }
    std::optional<TargetHit> target = hits.front();
    if (as_read) {
      target.reset();
      for (const TargetHit& h : hits) {
        if (h.group == groups.compressed_tensors) {
          target = h;
          break;
        }
      }
      if (!target) {
        out.rule = "no group as compressed-tensors reads the targets";
        return out;
      }
    }
    const auto [g, i] = *target;
    const SchemeGroup& group = options_.groups[g];
    const SchemeFamily* family = group.family();
    const std::string refusal = family->refuse(group.weights, c.rows, c.cols);
    if (!refusal.empty()) {
      const auto dot = c.module.rfind('.');
      refused_names_.insert(dot == std::string::npos ? c.module : c.module.substr(dot + 1));
      if (dot == std::string::npos) refused_top_level_ = true;
      refusals_.push_back(
          fmt::format("{}: tensor '{}' [{}, {}]{} {}{}", c.file, c.tensor, c.rows, c.cols,
                      c.tensor == c.module + ".weight" ? std::string()
                                                       : fmt::format(" (module '{}')", c.module),
                      refusal, group_label(options_, g)));
    }
    out.quantize = true;
    out.group = g;
    out.rule = fmt::format("2-D {} .weight matching target '{}'{}", c.dtype_text, group.targets[i],
                           group_label(options_, g));
    ++plan_.group_modules[g];
    return out;
  }

  // The layer vLLM fuses module into (the checkpoint's prefix and the fused
  // name, "model.layers.0.self_attn.qkv_proj") and its shards in vLLM's
  // order, when the role analysis says vLLM builds module as a shard of a
  // Llama-style fused layer (model/fused_groups.hpp); nullopt otherwise.
  std::optional<std::pair<std::string, std::vector<std::string>>> vllm_fused_layer(
      const std::string& module) const {
    const ModuleInfo* info = plan_.roles.find(module);
    if (info == nullptr || info->vllm_layer == info->vllm_name ||
        info->role == ModuleRole::kExpert || info->role == ModuleRole::kStackedExperts) {
      return std::nullopt;
    }
    const FusedSpec* spec = llama_fused_group_of(last_component(module));
    if (spec == nullptr || last_component(info->vllm_layer) != spec->fused) return std::nullopt;
    const std::string parent = module_of(module);
    const auto in_parent = [&](std::string_view name) {
      return parent.empty() ? std::string(name) : parent + "." + std::string(name);
    };
    std::vector<std::string> shards;
    for (const char* shard : spec->shards) shards.push_back(in_parent(shard));
    return std::make_pair(in_parent(spec->fused), std::move(shards));
  }

  const std::vector<std::string>& refusals() const { return refusals_; }
  // The ignore entry that keeps every weight of refusals() in 16 bits.
  std::string refusal_fix() const {
    return last_component_entry(refused_names_, refused_top_level_);
  }

 private:
  const PlanOptions& options_;
  const ModuleMatcher ignore_;
  const GroupTargets targets_;
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
  if (!is_quantizable_float(dtype))
    return fmt::format("dtype {} is not BF16, F16 or F32", dtype_text);
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

// The converter's ignore entries that stay in the merged config.json
// (converted_quantization_config: the literal ones a new group's name
// target matches are pruned), or nullopt when there are none.
std::optional<ModuleMatcher> converter_kept_entries(const QuantizePlan& plan) {
  if (!plan.source_format || plan.source_format->ignore.empty()) return std::nullopt;
  std::vector<std::string> targets;
  for (const SchemeGroup& g : plan.options.groups) {
    for (const std::string& t : g.targets) {
      if (t != "Linear") targets.push_back(t);
    }
  }
  std::vector<std::string> kept;
  const ModuleMatcher new_targets(targets, ModuleMatcher::Role::kTargets);
  for (const std::string& entry : plan.source_format->ignore) {
    if (!entry.starts_with("re:") && new_targets.first_match(entry)) continue;
    kept.push_back(entry);
  }
  if (kept.empty()) return std::nullopt;
  return ModuleMatcher(kept, ModuleMatcher::Role::kIgnore);
}

// The groups' name and `re:` targets (every entry but "Linear"), matched
// as names, or nullopt when there are none.
std::optional<ModuleMatcher> named_targets(const PlanOptions& options) {
  std::vector<std::string> targets;
  for (const SchemeGroup& g : options.groups) {
    for (const std::string& t : g.targets) {
      if (t != "Linear") targets.push_back(t);
    }
  }
  if (targets.empty()) return std::nullopt;
  return ModuleMatcher(targets, ModuleMatcher::Role::kIgnore);
}

// Records the classification of the input's quantization_config in plan.
const InputQuantization& classify_input(const Checkpoint& checkpoint, QuantizePlan& plan) {
  // A converted input's quantization_config is its converter's
  // (source/converter.hpp); its 16-bit tensors are plain ones.
  plan.input_quantization =
      plan.source_format ? InputQuantization{} : classify_input_quantization(checkpoint.config);
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
        input_ignore_(input_ignore_matcher(q_)),
        converter_keeps_(converter_kept_entries(plan)),
        named_targets_(named_targets(plan.options)) {
    for (std::size_t i = 0; i < plan.converted.size(); ++i) {
      for (const TensorLocation& at : plan.converted[i].consumed) {
        converted_of_.emplace(std::pair{at.shard, at.entry}, i);
      }
    }
  }

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
    if (const auto c = converted_of_.find(std::pair{s, e}); c != converted_of_.end()) {
      d.fate = Fate::kConvert;
      d.converted = c->second;
      d.rule = fmt::format("convert ({})", plan_.source_format->converter->name);
    } else if (role != nullptr && role->action == DefaultAction::kKeep) {
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
      d.rule =
          fmt::format("scale of FP8 weight '{}.weight' (consumed by its dequantization)", d.module);
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
      found.push_back(
          "its name holds both 'gate_up_proj' and 'down_proj'; it cannot be "
          "split into one projection");
      return;
    }
    if (const std::string why = stacked_layout_problem(checkpoint_, key, t.shape); !why.empty()) {
      found.push_back(
          fmt::format("stacked expert tensor {} cannot be split: {}", shape_string(t.shape), why));
      return;
    }
    std::optional<Fp8Source> fp8;
    if (is_fp8(t.dtype)) {
      fp8 = fp8_weight_source(checkpoint_, q_, input_ignore_, d, t, /*stacked=*/true, found);
      if (!fp8) return;
    } else if (!is_quantizable_float(t.dtype)) {
      found.push_back(
          fmt::format("stacked expert tensor of dtype {} (BF16, F16, F32 or "
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
      outcome =
          rules_.decide(Candidate{d.module, t.name, file, t.shape[0], t.shape[1], dtype_text});
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
    if (plan_.source_format && !plan_.options.scheme_given) {
      d.rule = fmt::format(
          "kept: the input is converted ({}) and no scheme was given for its 16-bit modules",
          plan_.source_format->converter->name);
      return;
    }
    // The converter's ignore list is written into config.json (merged,
    // converter.hpp): a module it keeps stays 16-bit under a new "Linear"
    // target (vLLM would skip it and look for its .weight). A new name or
    // `re:` target that matches the module takes it, and the entries that
    // match it are left out of config.json (lifted).
    if (converter_keeps_) {
      const std::vector<std::size_t> entries = converter_keeps_->matching_entries(d.module);
      if (!entries.empty()) {
        if (!named_targets_ || !named_targets_->first_match(d.module)) {
          plan_.converter_kept_modules.push_back(d.module);
          d.rule = fmt::format(
              "kept: the converter's ignore entry '{}' (written to config.json) keeps it 16-bit "
              "(a scheme's name or re: target, or --convert-ignore, would take it)",
              converter_keeps_->entries()[entries.front()]);
          return;
        }
        for (const std::size_t i : entries) {
          const std::string& e = converter_keeps_->entries()[i];
          auto& lifted = plan_.lifted_convert_ignore;
          if (std::find(lifted.begin(), lifted.end(), e) == lifted.end()) lifted.push_back(e);
        }
      }
    }
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
  void add_module(TensorDecision& d, std::string name, std::uint64_t row_begin, std::uint64_t rows,
                  std::uint64_t cols, std::optional<Fp8Source> fp8, const Outcome& outcome,
                  DType loaded) {
    PlannedModule m;
    m.name = std::move(name);
    m.decision = plan_.decisions.size();
    m.source = WeightSource{d.source, row_begin, rows, cols, std::move(fp8)};
    m.group = outcome.group;
    m.rule = outcome.rule;
    m.ignore_entry = outcome.ignore_entry;
    m.shard = d.source.shard;
    m.dtype = loaded;
    m.kind = outcome.quantize           ? PlannedModule::Kind::kQuantize
             : m.source.fp8.has_value() ? PlannedModule::Kind::kDequantize
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
  const std::optional<ModuleMatcher> converter_keeps_;
  const std::optional<ModuleMatcher> named_targets_;  // the groups' targets but "Linear"
  // Tensors a converter consumes: (shard, entry) -> index into plan_.converted.
  std::map<std::pair<std::size_t, std::size_t>, std::size_t> converted_of_;
  std::vector<std::string> problems_;  // every input problem of this stage, reported at once
  std::size_t n_bad_tensors_ = 0;
};

}  // namespace

void decide_fates(const Checkpoint& checkpoint, QuantizePlan& plan) {
  FateDecider decider(checkpoint, plan);
  for (std::size_t s = 0; s < checkpoint.shards.size(); ++s) decider.decide_shard(s);
  decider.throw_problems();
}

}  // namespace ctquant::detail
