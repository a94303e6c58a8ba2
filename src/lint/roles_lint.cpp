#include "lint/roles_lint.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

#include <fmt/format.h>

#include "ctquant/model/fused_groups.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant::detail {

using nlohmann::json;

namespace {

std::string template_of(const std::string& name) {
  std::string out;
  bool digits = false;
  for (char c : name) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      if (!digits) out += '#';
      digits = true;
    } else {
      out += c;
      digits = false;
    }
  }
  return out;
}

bool is_kept_role(ModuleRole role) {
  return role == ModuleRole::kHead || role == ModuleRole::kEmbedding ||
         role == ModuleRole::kRouter || role == ModuleRole::kSharedExpertGate ||
         role == ModuleRole::kPlainLinear;
}

}  // namespace

// Every targets entry of every scheme group, as vLLM sees them all.
std::vector<std::string> all_targets(const PlanOptions& options) {
  std::vector<std::string> out;
  std::unordered_set<std::string_view> seen;  // views of options' targets
  for (const SchemeGroup& g : options.groups) {
    for (const std::string& t : g.targets) {
      if (seen.insert(t).second) out.push_back(t);
    }
  }
  return out;
}

std::string option_list(const char* option, const std::vector<std::string>& entries) {
  std::string out;
  for (const std::string& e : entries) {
    out += fmt::format("{}--{} '{}'", out.empty() ? "" : " ", option, e);
  }
  return out;
}

std::vector<std::string> with_layer_members(const RoleAnalysis& roles,
                                            std::vector<std::string> modules) {
  // A vLLM layer built from several modules (a draft's fused layers too,
  // whose shards vLLM names by the fused name).
  std::map<std::string, std::size_t> members_of;
  for (const ModuleInfo& m : roles.modules) ++members_of[m.vllm_layer];
  const auto shares_a_layer = [&](const ModuleInfo& m) {
    return m.vllm_layer != m.vllm_name || members_of[m.vllm_layer] > 1 ||
           m.role == ModuleRole::kExpert || m.role == ModuleRole::kStackedExperts;
  };
  std::set<std::string> layers;
  for (const std::string& name : modules) {
    const ModuleInfo* m = roles.find(name);
    if (m != nullptr && shares_a_layer(*m)) layers.insert(m->vllm_layer);
  }
  if (layers.empty()) return modules;
  for (const ModuleInfo& m : roles.modules) {
    if (shares_a_layer(m) && layers.contains(m.vllm_layer) &&
        std::find(modules.begin(), modules.end(), m.module) == modules.end()) {
      modules.push_back(m.module);
    }
  }
  return modules;
}

// " (with the rest of ...)" when with_layer_members() adds modules.
std::string layer_note(const RoleAnalysis& roles, const std::vector<std::string>& modules) {
  return with_layer_members(roles, modules).size() == modules.size()
             ? std::string()
             : std::string(
                   " (with the rest of its fused or MoE layer: vLLM builds the layer "
                   "with one scheme)");
}

std::vector<std::string> keep_entries(const RoleAnalysis& roles,
                                      const std::vector<std::string>& modules) {
  return narrow_ignore_entries(roles, with_layer_members(roles, modules));
}

std::string ignore_fix(const RoleAnalysis& roles, const std::vector<std::string>& modules) {
  return option_list("ignore", keep_entries(roles, modules));
}

std::string set_ignore_fix(Finding& f, const RoleAnalysis& roles,
                           const std::vector<std::string>& modules) {
  f.fix_ignore = keep_entries(roles, modules);
  return option_list("ignore", f.fix_ignore);
}

RolesLint::RolesLint(const Checkpoint& checkpoint, const QuantizePlan& plan)
    : checkpoint_(checkpoint),
      plan_(plan),
      rules_(plan.roles, plan.options.ignore, all_targets(plan.options)) {
  for (const TensorDecision& d : plan.decisions) {
    poll_cancel();
    by_tensor_.emplace(d.name, &d);
  }
  mismatches_ = find_mismatches();
}

const TensorDecision* RolesLint::decision_of(const ModuleInfo& m) const {
  const auto it = by_tensor_.find(m.tensor);
  return it == by_tensor_.end() ? nullptr : it->second;
}

bool RolesLint::planned_packed(const ModuleInfo& m) const {
  const TensorDecision* d = decision_of(m);
  return d != nullptr && d->fate == Fate::kQuantize;
}

std::vector<RolesLint::Mismatch> RolesLint::find_mismatches() const {
  std::vector<Mismatch> out;
  for (const ModuleInfo& m : plan_.roles.modules) {
    poll_cancel();
    if (m.build == VllmBuild::kPlain || m.role == ModuleRole::kParameter ||
        m.role == ModuleRole::kNorm || m.role == ModuleRole::kStackedExperts) {
      continue;
    }
    const bool packed = planned_packed(m);
    const VllmExpectation e = rules_.expect(m);
    const bool agree = (e.state == VllmExpectation::State::kPacked && packed) ||
                       (e.state == VllmExpectation::State::kUnquantized && !packed && !e.unmatched);
    if (!agree) out.push_back(Mismatch{&m, e, packed});
  }
  return out;
}

std::vector<RolesLint::LiteralMiss> RolesLint::literal_misses(
    const std::vector<Mismatch>& mismatches) const {
  std::vector<LiteralMiss> out;
  // Modules vLLM expects packed that OUTPUT keeps in 16 bits.
  std::set<const ModuleInfo*> kept_but_packed;
  for (const Mismatch& mm : mismatches) {
    if (!mm.packed) kept_but_packed.insert(mm.module);
  }
  const auto& entries = plan_.options.ignore;
  for (std::size_t i = plan_.n_default_ignore; i < entries.size(); ++i) {
    const std::string& entry = entries[i];
    if (regex_pattern(entry)) continue;
    // The module a literal entry names (one lookup, not a scan).
    const ModuleInfo* m = plan_.roles.find(entry);
    if (m == nullptr || m->build == VllmBuild::kPlain) continue;
    const std::string mapped = vllm_entry(plan_.roles.family, entry);
    // The names vLLM tests: the MoE probes, or the module's own.
    const std::vector<std::string> probes = VllmLoadRules::moe_probes(m->vllm_layer);
    const bool seen = m->role == ModuleRole::kExpert || m->role == ModuleRole::kStackedExperts
                          ? std::find(probes.begin(), probes.end(), mapped) != probes.end()
                          : mapped == m->vllm_name;
    if (seen) continue;
    out.push_back(LiteralMiss{i, {m}, kept_but_packed.contains(m)});
  }
  return out;
}

// ---- L2 ----
void RolesLint::literal_entries(std::vector<Finding>& out) const {
  const std::vector<Mismatch>& mm = mismatches();
  for (const LiteralMiss& miss : literal_misses(mm)) {
    const std::string& entry = plan_.options.ignore[miss.entry];
    const std::string mapped = vllm_entry(plan_.roles.family, entry);
    Finding f;
    f.id = "L2";
    f.severity = miss.consequential ? Severity::kError : Severity::kInfo;
    std::vector<std::string> names;
    std::vector<std::string> modules;
    for (const ModuleInfo* m : miss.modules) {
      f.tensors.push_back(m->tensor);
      modules.push_back(m->module);
      names.push_back(
          m->role == ModuleRole::kExpert
              ? fmt::format("'{}' (probed as '{}.0.gate_proj')", m->vllm_layer, m->vllm_layer)
              : fmt::format("'{}'", m->vllm_name));
    }
    f.message = fmt::format(
        "ignore entry '{}' is a literal name; vLLM matches {} against its own module names, "
        "where {} {} {}{}",
        entry, mapped == entry ? "it as is" : fmt::format("it as '{}'", mapped),
        miss.modules.size() == 1 ? "the module is" : "the modules are", join(names, 4),
        miss.consequential ? "so vLLM would expect the module packed while OUTPUT holds it in "
                             "16 bits"
                           : "(another entry keeps it in 16 bits in vLLM, so nothing breaks)",
        "");
    if (miss.consequential) {
      f.fix = fmt::format("use {} instead", set_ignore_fix(f, plan_.roles, modules));
    } else {
      f.fix = "none needed; remove the entry to silence this";
    }
    f.fix_removes = entry;
    out.push_back(std::move(f));
  }
}

// ---- L7 ----
void RolesLint::stacked_experts(std::vector<Finding>& out) const {
  std::vector<std::string> refused;
  std::vector<std::string> refused_text;
  std::vector<std::string> unignored;
  std::vector<std::string> unignored_modules;
  std::vector<std::string> why;
  for (const ModuleInfo& m : plan_.roles.modules) {
    if (m.role != ModuleRole::kStackedExperts || !m.stacked) continue;
    const TensorDecision* d = decision_of(m);
    if (d == nullptr) continue;
    if (d->fate == Fate::kSplit) {
      // Split by the planner: vLLM's probes must read the layer as its
      // per-expert modules were written.
      std::set<bool> states;
      for (std::size_t i : d->modules) {
        states.insert(plan_.modules[i].kind == PlannedModule::Kind::kQuantize);
      }
      const VllmExpectation e = rules_.expect(m);
      const bool packed = states.contains(true);
      if (states.size() == 1 && ((e.state == VllmExpectation::State::kPacked) == packed) &&
          e.state != VllmExpectation::State::kRefused) {
        continue;
      }
      unignored.push_back(m.tensor);
      unignored_modules.push_back(m.module);
      why.push_back(fmt::format("split into per-expert modules {} ; vLLM: {}",
                                states.size() > 1 ? "partly packed"
                                : packed          ? "packed"
                                                  : "kept",
                                e.why));
      continue;
    }
    if (d->fate != Fate::kCopy) continue;
    const StackedExperts& s = plan_.roles.stacked[*m.stacked];
    if (!s.vllm_loads_stacked) {
      refused.push_back(m.tensor);
      refused_text.push_back(fmt::format("{} {} (E={}, I={}, H={}, {} {}{})", m.tensor,
                                         shape_string(m.shape), s.experts, s.intermediate, s.hidden,
                                         orientation_name(s.orientation), proof_name(s.proof),
                                         s.problem.empty() ? "" : "; " + s.problem));
      continue;
    }
    const VllmExpectation e = rules_.expect(m);
    if (e.state != VllmExpectation::State::kUnquantized) {
      unignored.push_back(m.tensor);
      unignored_modules.push_back(m.module);
      why.push_back(e.why);
    }
  }
  if (!refused.empty()) {
    Finding f;
    f.id = "L7";
    f.severity = Severity::kError;
    f.tensors = refused;
    f.message = fmt::format(
        "{} stacked-expert {} (3-D) that ctquant does not split into experts.{{e}}.gate_proj / "
        "up_proj / down_proj: {}'s vLLM loader reads the experts of a layer per expert, so "
        "copying the 3-D tensors under a pack-quantized config would not load: {}",
        refused.size(), refused.size() == 1 ? "tensor" : "tensors",
        plan_.roles.family != nullptr ? plan_.roles.family->name : "this architecture",
        join(refused_text, 3, "; "));
    f.fix =
        "no ignore entry makes this loadable: save the model with per-expert tensors "
        "(experts.{e}.gate_proj/up_proj/down_proj.weight) first, or pass --allow-unloadable";
    out.push_back(std::move(f));
  }
  if (!unignored.empty()) {
    Finding f;
    f.id = "L7";
    f.severity = Severity::kError;
    f.tensors = unignored;
    f.message = fmt::format(
        "{} stacked-expert {} whose MoE layers vLLM's experts.0.{{gate,up,down}}_proj probes "
        "read differently from how OUTPUT holds them (vLLM would look for weights that are not "
        "there): {}",
        unignored.size(), unignored.size() == 1 ? "tensor" : "tensors", join(why, 2, "; "));
    f.fix = fmt::format("keep the MoE layers unquantized in vLLM: {}",
                        set_ignore_fix(f, plan_.roles, unignored_modules));
    out.push_back(std::move(f));
  }
}

// ---- L12 ----
void RolesLint::unloadable_modules(std::vector<Finding>& out) const {
  // One finding per role.
  std::map<ModuleRole, Finding> by_role;
  std::map<ModuleRole, std::vector<std::string>> modules;
  std::map<ModuleRole, std::set<std::string>> reasons;
  std::vector<ModuleRole> order;
  for (const ModuleInfo& m : plan_.roles.modules) {
    if (!(is_kept_role(m.role) || m.build == VllmBuild::kPlain)) continue;
    if (m.role == ModuleRole::kParameter || m.role == ModuleRole::kNorm ||
        m.role == ModuleRole::kStackedExperts) {
      continue;
    }
    if (!planned_packed(m)) continue;
    // A tied lm_head is L6's.
    if (m.role == ModuleRole::kHead && plan_.roles.dims.tied && m.module.ends_with("lm_head")) {
      continue;
    }
    auto [it, inserted] = by_role.try_emplace(m.role);
    if (inserted) order.push_back(m.role);
    it->second.tensors.push_back(m.tensor);
    modules[m.role].push_back(m.module);
    reasons[m.role].insert(m.reason);
  }
  for (ModuleRole role : order) {
    Finding& f = by_role[role];
    f.id = "L12";
    f.severity = Severity::kError;
    const std::vector<std::string> why(reasons[role].begin(), reasons[role].end());
    f.message = fmt::format(
        "{} {} would be packed, but vLLM loads {} as a 16-bit .weight ({}): vLLM would not "
        "find the tensor it reads",
        plural(f.tensors.size(), role_name(role)), join(modules[role], 4),
        f.tensors.size() == 1 ? "it" : "them", join(why, 2, "; "));
    f.fix =
        fmt::format("keep {} in 16 bits: {}{}", f.tensors.size() == 1 ? "it" : "them",
                    set_ignore_fix(f, plan_.roles, modules[role]),
                    plan_.options.default_ignore
                        ? ""
                        : " (the default ignore list has them; --no-default-ignore dropped it)");
    out.push_back(std::move(f));
  }
}

// ---- L13 ----
void RolesLint::vllm_expectations(std::vector<Finding>& out) const {
  const std::vector<Mismatch>& all = mismatches();
  std::set<const ModuleInfo*> explained;  // by an L2 error
  for (const LiteralMiss& miss : literal_misses(all)) {
    if (!miss.consequential) continue;
    explained.insert(miss.modules.begin(), miss.modules.end());
  }
  // A fused or MoE layer whose parts the plan itself splits is L3's: vLLM
  // refusing it follows from the same ignore entry.
  std::map<std::string, std::set<bool>> planned_states;  // vLLM layer -> packed states
  for (const ModuleInfo& m : plan_.roles.modules) {
    if (m.vllm_layer != m.vllm_name || m.role == ModuleRole::kExpert) {
      planned_states[m.vllm_layer].insert(planned_packed(m));
    }
  }
  // Every mismatch of a layer L3 reports (the experts of a MoE layer, q/k/v,
  // gate/up): its fix, keeping all or none, is the one that resolves vLLM's
  // reading too; an entry for vLLM's probes alone would move the mismatch
  // to the other members.
  const auto l3_reports = [](const ModuleInfo& m) {
    // The shards L3 groups (model/fused_groups.hpp).
    return m.role == ModuleRole::kExpert ||
           llama_fused_group_of(last_component(m.module)) != nullptr;
  };
  for (const Mismatch& mm : all) {
    if (planned_states[mm.module->vllm_layer].size() > 1 &&
        (mm.expectation.state == VllmExpectation::State::kRefused || l3_reports(*mm.module))) {
      explained.insert(mm.module);
    }
  }
  struct Group {
    Finding finding;
    std::vector<std::string> modules;
    std::set<std::string> layers;
    std::string why;
    int kind = 0;
  };
  std::map<std::string, Group> groups;
  std::vector<std::string> order;
  for (const Mismatch& mm : all) {
    if (explained.contains(mm.module)) continue;
    if (mm.packed && is_kept_role(mm.module->role)) continue;  // L12's
    int kind = 0;  // 0 refused, 1 packed but vLLM unquantized, 2 kept but vLLM packed, 3 unmatched
    if (mm.expectation.state == VllmExpectation::State::kRefused) {
      kind = 0;
    } else if (mm.expectation.unmatched) {
      kind = 3;
    } else if (mm.packed) {
      kind = 1;
    } else {
      kind = 2;
    }
    const std::string key = fmt::format("{}:{}", kind, template_of(mm.module->module));
    auto [it, inserted] = groups.try_emplace(key);
    if (inserted) order.push_back(key);
    Group& g = it->second;
    g.kind = kind;
    g.finding.tensors.push_back(mm.module->tensor);
    g.modules.push_back(mm.module->module);
    g.layers.insert(mm.expectation.layer);
    if (g.why.empty()) g.why = mm.expectation.why;
  }
  for (const std::string& key : order) {
    Group& g = groups[key];
    Finding& f = g.finding;
    f.id = "L13";
    f.severity = g.kind == 3 ? Severity::kWarning : Severity::kError;
    const std::vector<std::string> layers(g.layers.begin(), g.layers.end());
    const std::string modules = join(g.modules, 4);
    switch (g.kind) {
      case 0:
        f.message = fmt::format("vLLM would refuse to build {} from the written ignore list: {}",
                                plural(layers.size(), "layer"), g.why);
        f.fix = fmt::format("keep the whole fused layer or MoE layer in 16 bits, or none of it: {}",
                            set_ignore_fix(f, plan_.roles, g.modules));
        break;
      case 1:
        f.message = fmt::format(
            "{} would be packed, but vLLM evaluates the written ignore list on its own names "
            "and leaves {} unquantized ({}), so it would look for a 16-bit .weight",
            modules, layers.size() == 1 ? "its layer" : "their layers", g.why);
        f.fix =
            "narrow the ignore entry that matches vLLM's name, or keep the module in 16 bits "
            "too: " +
            set_ignore_fix(f, plan_.roles, g.modules);
        break;
      case 2:
        f.message = fmt::format(
            "{} would be kept in 16 bits, but no ignore entry matches {} as vLLM names {} ({}), "
            "so vLLM would build it quantized and look for weight_packed",
            modules, layers.size() == 1 ? "it" : "them", join(layers, 3), g.why);
        f.fix = fmt::format("add an entry that matches both names: {}",
                            set_ignore_fix(f, plan_.roles, g.modules));
        break;
      default:
        f.message = fmt::format("{} {} neither ignored nor matched by a target in vLLM: {}",
                                modules, g.modules.size() == 1 ? "is" : "are", g.why);
        f.fix = fmt::format("name {} in the ignore list: {}", g.modules.size() == 1 ? "it" : "them",
                            set_ignore_fix(f, plan_.roles, g.modules));
        break;
    }
    out.push_back(std::move(f));
  }
}

// ---- L15 ----
namespace {

bool is_tower(Component c) {
  return c == Component::kVision || c == Component::kAudio || c == Component::kProjector;
}

std::string percent(std::uint64_t part, std::uint64_t whole) {
  return fmt::format(
      "{:.1f}%", whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

}  // namespace

namespace {

// A draft or MTP module that engines build differently: what it is and what
// each engine does with it packed.
struct EngineModuleKind {
  const char* what;
  const char* engines;
};

// What each engine builds for the module (the files read, at their commits).
const EngineModuleKind kEagleFc{
    "EAGLE-3 fc",
    "vLLM builds fc as ReplicatedLinear with the draft's quantization config and loads it "
    "packed (vllm/model_executor/models/llama_eagle3.py@00bd1493); SGLang builds a plain "
    "torch.nn.Linear (python/sglang/srt/models/llama_eagle3.py@03d5a777) and its loader skips "
    "tensors it has no parameter for, so fc.weight_packed is dropped and fc keeps its random "
    "initial values"};
const EngineModuleKind kDflashFc{
    "DFlash fc",
    "vLLM builds fc as ReplicatedLinear with the draft's quantization config and loads it "
    "packed (vllm/model_executor/models/qwen3_dflash.py@036a00d1); SGLang's DFlash draft "
    "builds it as a plain torch.nn.Linear in older releases "
    "(python/sglang/srt/models/dflash.py@7f151c5e, which cannot load it packed) and as "
    "ReplicatedLinear with the quantization config in current ones (dflash.py@003b23d7)"};
const EngineModuleKind kMtpFc{
    "MTP fc",
    "vLLM builds mtp.fc as ColumnParallelLinear with the model's quantization config and "
    "loads it packed (vllm/model_executor/models/qwen3_next_mtp.py@055e47c2); SGLang builds "
    "a plain torch.nn.Linear (python/sglang/srt/models/qwen3_next_mtp.py@00534216), which "
    "cannot load it packed"};
const EngineModuleKind kSelector{
    "DFlash2 candidate selector and convolution projections",
    "vLLM's DFlash drafts build no candidate selector or convolutions "
    "(vllm/model_executor/models/qwen3_dflash.py@036a00d1); xLLM's DFlash2 copies "
    "hidden_projection.weight and kernel_projection.weight as 16-bit tensors "
    "(xllm/python/models/qwen3_dflash2.py@b09b5ac6), so packed they load nowhere"};

// The kind of module m is (nullptr for a module every engine builds alike).
// L16 warns when one is packed; L15 does not count one kept in 16 bits
// against the quantized share, so following L16's fix passes L15.
const EngineModuleKind* engine_module_kind(const RoleAnalysis& roles, const ModuleInfo& m) {
  const std::string family = roles.family != nullptr ? roles.family->name : "";
  const std::string last = last_component(m.module);
  const std::string parent = last_component(module_of(m.module));
  if (family == "EAGLE-3 draft" && last == "fc") return &kEagleFc;
  if (family == "DFlash draft" && last == "fc") return &kDflashFc;
  if ((last == "hidden_projection" && parent == "candidate_selector") ||
      (last == "kernel_projection" && parent.ends_with("_conv"))) {
    return &kSelector;
  }
  if (m.component == Component::kMtp && last == "fc") return &kMtpFc;
  return nullptr;
}

}  // namespace

void RolesLint::sixteen_bit_share(std::vector<Finding>& out) const {
  const std::uint64_t total = plan_.linear_params;
  if (total == 0 || plan_.n_quantized == 0) return;  // nothing quantized is L9's
  // Parameters kept in 16 bits, by why.
  struct Kept {
    std::uint64_t params = 0;
    std::vector<std::string> modules;
    std::string option;   // what changes it ("" none)
    std::string removes;  // a user ignore entry whose removal changes it
    bool vision = false;  // --quantize-vision changes it
    // Some of its modules are ones the default list keeps (vLLM needs them
    // in 16 bits): no option changes that.
    std::string needed;
  };
  std::map<std::string, Kept> kept;
  std::vector<std::string> order;
  std::vector<std::string> tensors;
  const auto add = [&](const ModuleInfo& m, const std::string& module, std::uint64_t params,
                       const std::optional<std::size_t>& ignore_entry, const std::string& rule) {
    std::string key;
    Kept proto;
    if (ignore_entry && *ignore_entry >= plan_.n_default_ignore) {
      const std::string& entry = plan_.options.ignore[*ignore_entry];
      key = fmt::format("your ignore entry '{}'", entry);
      proto.option = fmt::format("remove the ignore entry '{}'", entry);
      proto.removes = entry;
    } else if (ignore_entry) {
      key = fmt::format("the default ignore list ({})", *ignore_entry < plan_.ignore_reasons.size()
                                                            ? plan_.ignore_reasons[*ignore_entry]
                                                            : plan_.options.ignore[*ignore_entry]);
      if (is_tower(m.component)) {
        proto.option = "--quantize-vision quantizes vision and audio towers and projectors";
        proto.vision = true;
      }
    } else {
      key = rule;
    }
    auto [it, inserted] = kept.try_emplace(key, std::move(proto));
    if (inserted) order.push_back(key);
    it->second.params += params;
    it->second.modules.push_back(module);
    if (m.action == DefaultAction::kKeep && !is_tower(m.component) && it->second.needed.empty()) {
      it->second.needed = m.reason;
    }
    if (std::find(tensors.begin(), tensors.end(), m.tensor) == tensors.end()) {
      tensors.push_back(m.tensor);
    }
  };
  // Draft and MTP modules kept in 16 bits so that every engine loads them,
  // as L16 advises: not counted against the share.
  std::uint64_t engine_kept = 0;
  // MoE layers whose experts all stay in 16 bits: (packed seen, kept seen).
  std::map<std::string, std::pair<bool, bool>> moe;
  for (const ModuleInfo& m : plan_.roles.modules) {
    if (!is_linear_weight_role(m.role)) continue;
    const TensorDecision* d = decision_of(m);
    if (d == nullptr) continue;
    const bool expert = m.role == ModuleRole::kExpert || m.role == ModuleRole::kStackedExperts;
    const std::string layer = m.role == ModuleRole::kStackedExperts && m.stacked
                                  ? plan_.roles.stacked[*m.stacked].moe_layer
                                  : m.vllm_layer;
    if (d->modules.empty()) {  // copied whole
      std::uint64_t params = 1;
      for (const std::uint64_t n : m.shape) params *= n;
      if (engine_module_kind(plan_.roles, m) != nullptr) {  // kept for the engines (L16)
        engine_kept += params;
        continue;
      }
      add(m, m.module, params, d->ignore_entry, d->rule);
      if (expert) moe[layer].second = true;
      continue;
    }
    for (const std::size_t mi : d->modules) {
      const PlannedModule& pm = plan_.modules[mi];
      const bool packed = pm.kind == PlannedModule::Kind::kQuantize;
      if (expert) (packed ? moe[layer].first : moe[layer].second) = true;
      if (packed) continue;
      if (engine_module_kind(plan_.roles, m) != nullptr) {  // kept for the engines (L16)
        engine_kept += pm.source.rows * pm.source.cols;
        continue;
      }
      add(m, pm.name, pm.source.rows * pm.source.cols, pm.ignore_entry, pm.rule);
    }
  }
  std::size_t whole_layers = 0;
  for (const auto& [layer, state] : moe) {
    if (!state.first && state.second) ++whole_layers;
  }
  const std::uint64_t quantized = plan_.linear_params_quantized;
  const bool low = static_cast<double>(quantized) <
                   kMinQuantizedShare * static_cast<double>(total - engine_kept);
  if (!low && whole_layers == 0) return;
  std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    return kept.at(a).params > kept.at(b).params;
  });
  std::vector<std::string> reasons;
  std::vector<std::string> options;
  Finding f;
  f.id = "L15";
  f.severity = Severity::kWarning;
  f.tensors = tensors;
  for (const std::string& key : order) {
    Kept& k = kept.at(key);
    if (!k.needed.empty()) {  // what the default list would keep too
      k.option.clear();
      k.removes.clear();
      k.vision = false;
    }
    reasons.push_back(fmt::format(
        "{} in {} ({}, e.g. {}): {}{}", percent(k.params, total),
        plural(k.modules.size(), "weight"), k.option.empty() ? "no option changes it" : k.option,
        k.modules.front(), key,
        k.needed.empty() || key.find(k.needed) != std::string::npos
            ? std::string()
            : fmt::format(", which also keeps what vLLM needs in 16 bits ({})", k.needed)));
    if (!k.option.empty() && std::find(options.begin(), options.end(), k.option) == options.end()) {
      options.push_back(k.option);
      // The machine-applicable fix: the first (largest) reason an option
      // changes.
      if (f.fix_removes.empty() && f.fix_options.empty()) {
        if (!k.removes.empty()) f.fix_removes = k.removes;
        if (k.vision) f.fix_options = {"--quantize-vision"};
      }
    }
  }
  f.message = fmt::format(
      "{} of the linear layers' weight parameters would be quantized ({} of {}; embeddings and "
      "output heads not counted){}{}; in 16 bits: {}",
      percent(quantized, total), quantized, total,
      low ? fmt::format(", below {:.0f}%", 100.0 * kMinQuantizedShare) : "",
      whole_layers == 0 ? std::string()
                        : fmt::format(", and the experts of {} stay in 16 bits as a whole",
                                      plural(whole_layers, "MoE layer")),
      join(reasons, 4, "; "));
  // The option for the largest share an option changes (run_lint keeps it
  // only if the changed run passes lint).
  f.fix = options.empty()
              ? "no option of ctquant quantizes these weights loadably (see why above); the output "
                "keeps them in 16 bits, which is what vLLM loads"
              : options.front();
  out.push_back(std::move(f));
}

// ---- L16 ----
void RolesLint::engine_modules(std::vector<Finding>& out) const {
  std::map<const EngineModuleKind*, std::vector<const ModuleInfo*>> found;
  std::vector<const EngineModuleKind*> order;
  for (const ModuleInfo& m : plan_.roles.modules) {
    if (!planned_packed(m)) continue;
    const EngineModuleKind* kind = engine_module_kind(plan_.roles, m);
    if (kind == nullptr) continue;
    auto [it, inserted] = found.try_emplace(kind);
    if (inserted) order.push_back(kind);
    it->second.push_back(&m);
  }
  for (const EngineModuleKind* kind : order) {
    Finding f;
    f.id = "L16";
    f.severity = Severity::kWarning;
    std::vector<std::string> modules;
    for (const ModuleInfo* m : found.at(kind)) {
      f.tensors.push_back(m->tensor);
      modules.push_back(m->module);
    }
    f.message =
        fmt::format("{} would be packed ({}): {}", kind->what, join(modules, 4), kind->engines);
    f.fix =
        fmt::format("to serve the output with every engine, keep {} in 16 bits: {}",
                    modules.size() == 1 ? "it" : "them", set_ignore_fix(f, plan_.roles, modules));
    out.push_back(std::move(f));
  }
}

// ---- L17 ----
void RolesLint::missing_head(std::vector<Finding>& out) const {
  if (!checkpoint_.config || plan_.roles.dims.tied) return;
  // Said explicitly: transformers' default differs between releases.
  const json& config = *checkpoint_.config;
  const auto untied = [](const json& c) {
    const auto it = c.find("tie_word_embeddings");
    return it != c.end() && it->is_boolean() && !it->get<bool>();
  };
  const auto text = config.find("text_config");
  if (!untied(config) && !(text != config.end() && text->is_object() && untied(*text))) return;
  // Drafts are served with their target's head; only generative models
  // have one.
  if (plan_.roles.family != nullptr && !plan_.roles.family->top_level_quant_config) return;
  const std::string& arch = plan_.roles.architecture;
  if (!(arch.ends_with("ForCausalLM") || arch.ends_with("ForConditionalGeneration"))) return;
  // A model with its embedding (a sample of some layers has neither).
  bool embedding = false;
  for (const ModuleInfo& m : plan_.roles.modules) {
    if (m.role == ModuleRole::kHead) return;
    embedding = embedding || m.role == ModuleRole::kEmbedding;
  }
  if (!embedding) return;
  Finding f;
  f.id = "L17";
  f.severity = Severity::kWarning;
  f.message = fmt::format(
      "config.json says tie_word_embeddings: false, so {} has an output head of its own, but "
      "the checkpoint holds no lm_head tensor (nor a [vocab_size, hidden_size] head): vLLM "
      "builds ParallelLMHead and checks that every weight was loaded only for unquantized "
      "models (default_loader.py@00b5ad07), so the quantized OUTPUT would load with an "
      "uninitialised head; transformers would initialise it randomly",
      arch);
  f.fix =
      "add the head's tensor to INPUT (a partial download or a --only-layers sample lacks it), "
      "or set tie_word_embeddings: true if the model shares the embedding";
  out.push_back(std::move(f));
}

// ---- L20 ----
void RolesLint::missing_layers(std::vector<Finding>& out) const {
  const std::optional<std::uint64_t> declared = plan_.roles.dims.layers;
  if (!declared || *declared == 0) return;
  // Drafts number their layers after their target's (and are served with
  // it); a sample of some layers has no embedding, and is not a model.
  if (plan_.roles.family != nullptr && !plan_.roles.family->top_level_quant_config) return;
  std::set<std::uint64_t> present;
  bool embedding = false;
  for (const ModuleInfo& m : plan_.roles.modules) {
    embedding = embedding || m.role == ModuleRole::kEmbedding;
    if (m.component != Component::kLanguage) continue;
    // The number after the first "layers" component.
    const std::string name = "." + m.module;
    const auto at = name.find(".layers.");
    if (at == std::string::npos) continue;
    const std::size_t from = at + 8;
    std::size_t to = from;
    while (to < name.size() && to - from < 9 && name[to] >= '0' && name[to] <= '9') ++to;
    if (to == from || (to < name.size() && name[to] != '.')) continue;
    present.insert(std::stoull(name.substr(from, to - from)));
  }
  if (!embedding || present.empty()) return;
  std::vector<std::string> missing;
  std::uint64_t n_missing = 0;
  for (std::uint64_t l = 0; l < *declared; ++l) {
    if (present.contains(l)) continue;
    ++n_missing;
    if (missing.size() < 8) missing.push_back(std::to_string(l));
  }
  if (n_missing == 0) return;
  Finding f;
  f.id = "L20";
  f.severity = Severity::kWarning;
  f.message = fmt::format(
      "config.json says num_hidden_layers {}, but the checkpoint holds no tensor of {} of them "
      "(layers {}{}): vLLM builds every layer config.json declares and checks that every weight "
      "was loaded only for unquantized models (default_loader.py@00b5ad07), so the quantized "
      "OUTPUT would load with those layers uninitialised; transformers would initialise them "
      "randomly",
      *declared, n_missing, join(missing, 8), n_missing > missing.size() ? ", ..." : "");
  f.fix =
      "quantize the whole model (a partial download lacks them), or set num_hidden_layers to "
      "the layers the checkpoint holds";
  out.push_back(std::move(f));
}

void RolesLint::missing_config(std::vector<Finding>& out) const {
  if (checkpoint_.config) {
    // A config.json that names no architecture: vLLM picks the model class
    // from `architectures` alone and raises "No model architectures are
    // specified" without one (inspect_model_cls in
    // vllm/model_executor/models/registry.py; ModelConfig.architectures in
    // vllm/config/model.py reads hf_config.architectures).
    const auto it = checkpoint_.config->find("architectures");
    const bool named = it != checkpoint_.config->end() && it->is_array() && !it->empty() &&
                       std::all_of(it->begin(), it->end(), [](const nlohmann::json& a) {
                         return a.is_string() && !a.get_ref<const std::string&>().empty();
                       });
    if (named) return;
    // Without model_type either, transformers' AutoConfig refuses it too:
    // nothing could load the output. With one, transformers' Auto classes
    // still map it to a class, and only vLLM refuses: a warning.
    const auto type = checkpoint_.config->find("model_type");
    const bool typed = type != checkpoint_.config->end() && type->is_string() &&
                       !type->get_ref<const std::string&>().empty();
    Finding f;
    f.id = "L19";
    f.severity = typed ? Severity::kWarning : Severity::kError;
    f.message = fmt::format(
        "config.json names no model architecture ({}): vLLM picks the model class from "
        "`architectures` and refuses a config without one (\"No model architectures are "
        "specified\", inspect_model_cls in vllm/model_executor/models/registry.py){}",
        it == checkpoint_.config->end() ? "no `architectures` key"
                                        : "`architectures` is " + it->dump(),
        typed ? "; a warning, not an error, because transformers maps its model_type to a class "
                "(--error L19 makes it stop the run)"
              : ", and with no model_type either transformers' AutoConfig refuses it: the "
                "output could not be loaded");
    f.fix = fmt::format(
        "copy the model's own config.json into INPUT (it lists the class, e.g. "
        "\"architectures\": [\"LlamaForCausalLM\"]){}",
        typed ? "" : ", or pass --allow-unloadable to write the tensors anyway");
    out.push_back(std::move(f));
    return;
  }
  Finding f;
  f.id = "L19";
  f.severity = Severity::kError;
  f.message = checkpoint_.single_file
                  ? fmt::format(
                        "no config.json beside the .safetensors file (in {}): OUTPUT's "
                        "config.json would hold only quantization_config",
                        checkpoint_.root.string())
                  : "INPUT has no config.json: OUTPUT's config.json would hold only "
                    "quantization_config";
  f.message +=
      ", and vLLM reads the model's architecture and sizes from config.json (AutoConfig, "
      "vllm/transformers_utils/config.py: a config without model_type or architectures is "
      "refused), as transformers does: the output could not be loaded";
  f.fix =
      "copy the model's config.json into INPUT (beside the .safetensors file), or pass "
      "--allow-unloadable to write the tensors anyway";
  out.push_back(std::move(f));
}

std::optional<NearMiss> entry_near_miss(const QuantizePlan& plan, const ModuleNameIndex& index,
                                        const std::string& entry, const char* option) {
  if (regex_pattern(entry)) return std::nullopt;
  const bool ignore = std::string(option) == "ignore";

  // A tensor or wrapper name: drop trailing components until a module.
  std::string cut = entry;
  while (true) {
    const auto dot = cut.rfind('.');
    if (dot == std::string::npos) break;
    const std::string tail = entry.substr(dot + 1);
    cut = cut.substr(0, dot);
    if (index.position.contains(cut)) {
      const bool tensor = tail == "weight" || tail == "bias" || tail.starts_with("weight_");
      NearMiss miss;
      miss.found = fmt::format("'{}' names {} of module '{}'; entries name modules", entry,
                               tensor ? "a tensor" : "something inside", cut);
      // An ignore entry is written as vLLM matches it too (a plain name
      // may not be vLLM's name of the module: L2).
      miss.entries = ignore ? keep_entries(plan.roles, {cut}) : std::vector<std::string>{cut};
      miss.fix = fmt::format("use {} instead{}", option_list(option, miss.entries),
                             ignore ? layer_note(plan.roles, {cut}) : "");
      return miss;
    }
  }
  // The module's name without the prefix the checkpoint has.
  const auto found = index.by_suffix.find(entry);
  const std::vector<std::string> suffixed =
      found == index.by_suffix.end() ? std::vector<std::string>{} : found->second;
  if (!suffixed.empty() && ignore) {
    NearMiss miss;
    miss.found =
        fmt::format("this checkpoint's {} '{}'", suffixed.size() == 1 ? "module is" : "modules are",
                    join(suffixed, 4, "', '"));
    miss.entries = keep_entries(plan.roles, suffixed);
    miss.fix = fmt::format("use {} instead (matches the checkpoint's and vLLM's names){}",
                           option_list(option, miss.entries), layer_note(plan.roles, suffixed));
    return miss;
  }
  return std::nullopt;
}

}  // namespace ctquant::detail
