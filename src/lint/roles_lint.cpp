#include "lint/roles_lint.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

namespace ctquant::detail {

namespace {

std::string join(const std::vector<std::string>& items, std::size_t max_items,
                 const char* separator = ", ") {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < max_items; ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  if (items.size() > max_items) out += fmt::format(" ... and {} more", items.size() - max_items);
  return out;
}

std::string plural(std::size_t n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

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
  for (const SchemeGroup& g : options.groups) {
    for (const std::string& t : g.targets) {
      if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
    }
  }
  return out;
}

std::string ignore_fix(const RoleAnalysis& roles, const std::vector<std::string>& modules) {
  std::string out;
  for (const std::string& e : narrow_ignore_entries(roles, modules)) {
    out += fmt::format("{}--ignore '{}'", out.empty() ? "" : " ", e);
  }
  return out;
}

RolesLint::RolesLint(const Checkpoint& checkpoint, const QuantizePlan& plan)
    : plan_(plan),
      rules_(plan.roles, plan.options.ignore, all_targets(plan.options)) {
  for (const TensorDecision& d : plan.decisions) {
    if (checkpoint.holds(d.source)) by_tensor_.emplace(d.name, &d);
  }
}

const TensorDecision* RolesLint::decision_of(const ModuleInfo& m) const {
  const auto it = by_tensor_.find(m.tensor);
  return it == by_tensor_.end() ? nullptr : it->second;
}

bool RolesLint::planned_packed(const ModuleInfo& m) const {
  const TensorDecision* d = decision_of(m);
  return d != nullptr && d->fate == Fate::kQuantize;
}

std::vector<RolesLint::Mismatch> RolesLint::mismatches() const {
  std::vector<Mismatch> out;
  for (const ModuleInfo& m : plan_.roles.modules) {
    if (m.build == VllmBuild::kPlain || m.role == ModuleRole::kParameter ||
        m.role == ModuleRole::kNorm || m.role == ModuleRole::kStackedExperts) {
      continue;
    }
    const bool packed = planned_packed(m);
    const VllmExpectation e = rules_.expect(m);
    const bool agree =
        (e.state == VllmExpectation::State::kPacked && packed) ||
        (e.state == VllmExpectation::State::kUnquantized && !packed && !e.unmatched);
    if (!agree) out.push_back(Mismatch{&m, e, packed});
  }
  return out;
}

std::vector<RolesLint::LiteralMiss> RolesLint::literal_misses(
    const std::vector<Mismatch>& mismatches) const {
  std::vector<LiteralMiss> out;
  const auto& entries = plan_.options.ignore;
  for (std::size_t i = plan_.n_default_ignore; i < entries.size(); ++i) {
    const std::string& entry = entries[i];
    if (regex_pattern(entry)) continue;
    const std::string mapped = vllm_entry(plan_.roles.family, entry);
    LiteralMiss miss{i, {}, false};
    for (const ModuleInfo& m : plan_.roles.modules) {
      if (m.module != entry || m.build == VllmBuild::kPlain) continue;
      // The names vLLM tests: the MoE probes, or the module's own.
      const std::vector<std::string> probes = VllmLoadRules::moe_probes(m.vllm_layer);
      const bool seen = m.role == ModuleRole::kExpert || m.role == ModuleRole::kStackedExperts
                            ? std::find(probes.begin(), probes.end(), mapped) != probes.end()
                            : mapped == m.vllm_name;
      if (seen) continue;
      miss.modules.push_back(&m);
      for (const Mismatch& mm : mismatches) {
        if (mm.module == &m && !mm.packed) miss.consequential = true;
      }
    }
    if (!miss.modules.empty()) out.push_back(std::move(miss));
  }
  return out;
}

// ---- L2 ----
void RolesLint::literal_entries(std::vector<Finding>& out) const {
  const std::vector<Mismatch> mm = mismatches();
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
      names.push_back(m->role == ModuleRole::kExpert
                          ? fmt::format("'{}' (probed as '{}.0.gate_proj')", m->vllm_layer,
                                        m->vllm_layer)
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
    f.fix = miss.consequential ? fmt::format("use {} instead", ignore_fix(plan_.roles, modules))
                               : "none needed; remove the entry to silence this";
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
      if (states.size() == 1 &&
          ((e.state == VllmExpectation::State::kPacked) == packed) &&
          e.state != VllmExpectation::State::kRefused) {
        continue;
      }
      unignored.push_back(m.tensor);
      unignored_modules.push_back(m.module);
      why.push_back(fmt::format("split into per-expert modules {} ; vLLM: {}",
                                states.size() > 1 ? "partly packed" : packed ? "packed" : "kept",
                                e.why));
      continue;
    }
    if (d->fate != Fate::kCopy) continue;
    const StackedExperts& s = plan_.roles.stacked[*m.stacked];
    if (!s.vllm_loads_stacked) {
      refused.push_back(m.tensor);
      refused_text.push_back(fmt::format(
          "{} {} (E={}, I={}, H={}, {} {}{})", m.tensor, shape_string(m.shape), s.experts,
          s.intermediate, s.hidden, orientation_name(s.orientation), proof_name(s.proof),
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
                        ignore_fix(plan_.roles, unignored_modules));
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
    f.fix = fmt::format("keep {} in 16 bits: {}{}", f.tensors.size() == 1 ? "it" : "them",
                        ignore_fix(plan_.roles, modules[role]),
                        plan_.options.default_ignore
                            ? ""
                            : " (the default ignore list has them; --no-default-ignore dropped it)");
    out.push_back(std::move(f));
  }
}

// ---- L13 ----
void RolesLint::vllm_expectations(std::vector<Finding>& out) const {
  const std::vector<Mismatch> all = mismatches();
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
  for (const Mismatch& mm : all) {
    if (mm.expectation.state == VllmExpectation::State::kRefused &&
        planned_states[mm.module->vllm_layer].size() > 1) {
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
        f.message = fmt::format(
            "vLLM would refuse to build {} from the written ignore list: {}",
            plural(layers.size(), "layer"), g.why);
        f.fix = fmt::format(
            "keep the whole fused layer or MoE layer in 16 bits, or none of it: {}",
            ignore_fix(plan_.roles, g.modules));
        break;
      case 1:
        f.message = fmt::format(
            "{} would be packed, but vLLM evaluates the written ignore list on its own names "
            "and leaves {} unquantized ({}), so it would look for a 16-bit .weight",
            modules, layers.size() == 1 ? "its layer" : "their layers", g.why);
        f.fix = "narrow the ignore entry that matches vLLM's name, or keep the module in 16 bits "
                "too: " + ignore_fix(plan_.roles, g.modules);
        break;
      case 2:
        f.message = fmt::format(
            "{} would be kept in 16 bits, but no ignore entry matches {} as vLLM names {} ({}), "
            "so vLLM would build it quantized and look for weight_packed",
            modules, layers.size() == 1 ? "it" : "them", join(layers, 3), g.why);
        f.fix = fmt::format("add an entry that matches both names: {}",
                            ignore_fix(plan_.roles, g.modules));
        break;
      default:
        f.message = fmt::format(
            "{} {} neither ignored nor matched by a target in vLLM: {}", modules,
            g.modules.size() == 1 ? "is" : "are", g.why);
        f.fix = fmt::format("name {} in the ignore list: {}",
                            g.modules.size() == 1 ? "it" : "them",
                            ignore_fix(plan_.roles, g.modules));
        break;
    }
    out.push_back(std::move(f));
  }
}

std::optional<std::pair<std::string, std::string>> entry_near_miss(
    const QuantizePlan& plan, const std::vector<std::string>& modules, const std::string& entry,
    const char* option) {
  if (regex_pattern(entry)) return std::nullopt;
  const std::set<std::string> known(modules.begin(), modules.end());
  // A tensor or wrapper name: drop trailing components until a module.
  std::string cut = entry;
  while (true) {
    const auto dot = cut.rfind('.');
    if (dot == std::string::npos) break;
    const std::string tail = entry.substr(dot + 1);
    cut = cut.substr(0, dot);
    if (known.contains(cut)) {
      const bool tensor = tail == "weight" || tail == "bias" || tail.starts_with("weight_");
      return std::make_pair(
          fmt::format("'{}' names {} of module '{}'; entries name modules", entry,
                      tensor ? "a tensor" : "something inside", cut),
          fmt::format("--{} '{}'{}", option, cut,
                      std::string(option) == "ignore"
                          ? fmt::format(" (as vLLM matches it: {})",
                                        ignore_fix(plan.roles, {cut}))
                          : ""));
    }
  }
  // The module's name without the prefix the checkpoint has.
  std::vector<std::string> suffixed;
  for (const std::string& m : modules) {
    if (m.ends_with("." + entry)) suffixed.push_back(m);
  }
  if (!suffixed.empty() && std::string(option) == "ignore") {
    return std::make_pair(
        fmt::format("this checkpoint's {} '{}'", suffixed.size() == 1 ? "module is" : "modules are",
                    join(suffixed, 4, "', '")),
        fmt::format("{} (matches the checkpoint's and vLLM's names)",
                    ignore_fix(plan.roles, suffixed)));
  }
  return std::nullopt;
}

}  // namespace ctquant::detail
