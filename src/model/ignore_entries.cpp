// Default and narrowed ignore entries of a role analysis (model/roles.hpp):
// the modules kept by default grouped and written as the fewest entries that
// match exactly them in the checkpoint and in vLLM.
#include "ctquant/model/roles.hpp"

#include <algorithm>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/model/vllm_match.hpp"
#include "ctquant/util/text.hpp"
#include "model/role_paths.hpp"

namespace ctquant {

using detail::component_of;
using detail::ComponentAt;
using detail::is_digits;
using detail::moe_layer_of;
using detail::numbered_template;
using detail::split_dots;

std::vector<std::string> name_forms(const ModuleInfo& m) {
  std::vector<std::string> forms{m.module};
  const auto add = [&](const std::string& f) {
    if (std::find(forms.begin(), forms.end(), f) == forms.end()) forms.push_back(f);
  };
  if (m.role == ModuleRole::kExpert || m.role == ModuleRole::kStackedExperts) {
    for (const std::string& probe : VllmLoadRules::moe_probes(m.vllm_layer)) add(probe);
  } else {
    add(m.vllm_name);
  }
  add(m.hf_name);
  return forms;
}

namespace {

// A name as a regex: dots escaped, the numeric components at positions in
// `vary` replaced by \d+.
std::string templated(const std::string& name, const std::set<std::size_t>& vary) {
  const std::vector<std::string> parts = split_dots(name);
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += "\\.";
    out += vary.contains(i) && is_digits(parts[i]) ? "\\d+" : regex_escape(parts[i]);
  }
  return out;
}

// Numeric component positions whose value differs among names of the same
// component count.
std::set<std::size_t> varying_digits(const std::vector<std::string>& names) {
  std::set<std::size_t> vary;
  if (names.empty()) return vary;
  const std::vector<std::string> first = split_dots(names[0]);
  for (const std::string& n : names) {
    const std::vector<std::string> parts = split_dots(n);
    if (parts.size() != first.size()) continue;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (is_digits(parts[i]) && parts[i] != first[i]) vary.insert(i);
    }
  }
  return vary;
}

// The regex entry matching every form: common suffix of templated forms
// (by components), alternatives for the prefixes. subtree: the forms are
// roots and the entry takes everything under them.
std::string entry_from_forms(const std::vector<std::string>& forms, bool subtree) {
  std::vector<std::vector<std::string>> split;  // templated forms split on "\."
  std::set<std::string> distinct(forms.begin(), forms.end());
  for (const std::string& f : distinct) {
    std::vector<std::string> parts;
    std::size_t begin = 0;
    while (true) {
      const auto at = f.find("\\.", begin);
      parts.push_back(f.substr(begin, at == std::string::npos ? at : at - begin));
      if (at == std::string::npos) break;
      begin = at + 2;
    }
    split.push_back(std::move(parts));
  }
  std::size_t common = 0;  // components shared at the end
  while (true) {
    bool same = true;
    for (const auto& parts : split) {
      if (parts.size() <= common ||
          parts[parts.size() - 1 - common] != split[0][split[0].size() - 1 - common]) {
        same = false;
        break;
      }
    }
    if (!same) break;
    ++common;
  }
  std::string suffix;
  for (std::size_t i = split[0].size() - common; i < split[0].size(); ++i) {
    suffix += (suffix.empty() ? "" : "\\.") + split[0][i];
  }
  std::set<std::string> prefixes;
  for (const auto& parts : split) {
    std::string p;
    for (std::size_t i = 0; i + common < parts.size(); ++i) p += parts[i] + "\\.";
    prefixes.insert(p);
  }
  std::string head;
  const bool optional = prefixes.contains("");
  std::vector<std::string> alternatives;
  for (const auto& p : prefixes) {
    if (p.empty()) continue;
    // No common end: the alternatives are whole names (no trailing dot).
    alternatives.push_back(suffix.empty() ? p.substr(0, p.size() - 2) : p);
  }
  if (alternatives.size() == 1 && !optional) {
    head = alternatives[0];
  } else if (!alternatives.empty()) {
    head = fmt::format("({}){}", fmt::join(alternatives, "|"), optional ? "?" : "");
  }
  return fmt::format("re:^{}{}{}", head, suffix, subtree ? "\\..*" : "$");
}

// Whether entry matches every name of `members` and none of `others`.
bool entry_is_exact(const std::string& entry, const std::vector<std::string>& members,
                    const std::vector<std::string>& others) {
  try {
    const ModuleMatcher m({entry}, ModuleMatcher::Role::kIgnore);
    for (const std::string& n : members) {
      if (!m.entry_matches(0, n)) return false;
    }
    for (const std::string& n : others) {
      if (m.entry_matches(0, n)) return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

struct Group {
  std::vector<const ModuleInfo*> members;
  bool subtree = false;
  std::vector<std::string> roots;  // subtree: the root in every form
  std::string reason;
};

// Every name of every module outside `members`, and the forms of members.
void collect_names(const RoleAnalysis& roles, const std::vector<const ModuleInfo*>& members,
                   std::vector<std::string>& member_names, std::vector<std::string>& other_names) {
  std::set<const ModuleInfo*> in(members.begin(), members.end());
  for (const ModuleInfo& m : roles.modules) {
    // Raw parameters and norms are no layers: ignore entries do nothing to them.
    const bool layer = m.role != ModuleRole::kParameter && m.role != ModuleRole::kNorm;
    if (!in.contains(&m) && !layer) continue;
    for (const std::string& f : name_forms(m)) {
      (in.contains(&m) ? member_names : other_names).push_back(f);
    }
  }
  // A name can be a member's and another module's form at once (a shard
  // and its MoE probe never are); such names are not "others".
  std::set<std::string> mine(member_names.begin(), member_names.end());
  other_names.erase(std::remove_if(other_names.begin(), other_names.end(),
                                   [&](const std::string& n) { return mine.contains(n); }),
                    other_names.end());
}

// A name as an entry that matches exactly it in vLLM too: the literal name,
// unless vLLM's mapper would rewrite the literal (gpt-oss maps a trailing
// ".down_proj" to ".w2_weight"), then an anchored re: entry.
std::string exact_entry(const RoleAnalysis& roles, const std::string& name) {
  return vllm_entry(roles.family, name) == name ? name : fmt::format("re:^{}$", regex_escape(name));
}

std::vector<std::string> literal_entries(const RoleAnalysis& roles,
                                         const std::vector<std::string>& member_names) {
  std::vector<std::string> out;
  for (const std::string& n : member_names) {
    const std::string e = exact_entry(roles, n);
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
  }
  return out;
}

// Entries for one group: the family's spelling, a generated regex, or the
// literal names.
std::vector<std::string> group_entries(const RoleAnalysis& roles, const Group& g) {
  std::vector<std::string> member_names;
  std::vector<std::string> other_names;
  collect_names(roles, g.members, member_names, other_names);
  const ModuleInfo& first = *g.members.front();
  if (first.entry != nullptr && !g.subtree &&
      entry_is_exact(first.entry, member_names, other_names)) {
    return {first.entry};
  }
  std::vector<std::string> forms;
  if (g.subtree) {
    const std::set<std::size_t> vary = varying_digits(g.roots);
    for (const std::string& r : g.roots) forms.push_back(templated(r, vary));
  } else {
    std::vector<std::string> by_form;  // all names, to find the varying positions
    for (const ModuleInfo* m : g.members) {
      for (const std::string& f : name_forms(*m)) by_form.push_back(f);
    }
    const std::set<std::size_t> vary =
        g.members.size() > 1 ? varying_digits(by_form) : std::set<std::size_t>{};
    // Single module whose names agree: the literal name.
    if (g.members.size() == 1) {
      const auto names = name_forms(first);
      if (names.size() == 1 && entry_is_exact(names[0], member_names, other_names)) {
        return {exact_entry(roles, names[0])};
      }
    }
    // MoE layers: their entry covers the layer subtree (the probes).
    for (const ModuleInfo* m : g.members) {
      for (const std::string& f : name_forms(*m)) forms.push_back(templated(f, vary));
    }
  }
  const std::string generated = entry_from_forms(forms, g.subtree);
  if (entry_is_exact(generated, member_names, other_names)) return {generated};
  return literal_entries(roles, member_names);
}

int role_order(const ModuleInfo& m) {
  switch (m.role) {
    case ModuleRole::kHead:
      return 0;
    case ModuleRole::kEmbedding:
      return 1;
    case ModuleRole::kRouter:
      return 2;
    case ModuleRole::kSharedExpertGate:
      return 3;
    case ModuleRole::kPlainLinear:
      return 4;
    case ModuleRole::kDraftKeep:
      return 5;
    case ModuleRole::kStackedExperts:
      return 6;
    default:
      return 7;
  }
}

std::string role_reason(const ModuleInfo& m) {
  std::string text = m.reason;
  if (!m.source.empty() && text.find(".py@") == std::string::npos) {
    text += fmt::format(" [{}]", m.source);
  }
  return text;
}

}  // namespace

std::optional<std::string> absent_head_entry(const RoleAnalysis& roles, bool drafts) {
  const bool draft = roles.family != nullptr && !roles.family->top_level_quant_config;
  if (draft ? !drafts : !roles.dims.tied) return std::nullopt;
  for (const ModuleInfo& m : roles.modules) {
    if (m.role == ModuleRole::kHead && last_component(m.module) == "lm_head") return std::nullopt;
  }
  return std::string("lm_head");
}

std::vector<DefaultIgnoreEntry> default_ignore_entries(const RoleAnalysis& roles) {
  // Group the kept modules: towers by root, MoE layers of stacked experts by
  // layer template, the rest by role and name template.
  std::vector<Group> groups;
  std::map<std::string, std::size_t> by_key;
  // Towers whose Linear layers are kept because they are towers: one entry
  // takes the whole tower.
  std::set<std::string> kept_towers;
  for (const ModuleInfo& m : roles.modules) {
    if (m.action == DefaultAction::kKeep && m.build != VllmBuild::kPlain &&
        (m.role == ModuleRole::kLinear || m.role == ModuleRole::kExpert)) {
      const ComponentAt at = component_of(m.module, roles.dims, roles.family);
      if (!at.root.empty()) kept_towers.insert(at.root);
    }
  }
  for (const ModuleInfo& m : roles.modules) {
    if (m.action != DefaultAction::kKeep || m.role == ModuleRole::kParameter ||
        m.role == ModuleRole::kNorm) {
      continue;
    }
    const ComponentAt at = component_of(m.module, roles.dims, roles.family);
    const bool tower_kept = !at.root.empty() && kept_towers.contains(at.root);
    std::string key;
    Group proto;
    if (tower_kept) {
      key = "tower:" + at.root;
      proto.subtree = true;
      // A root maps like the modules under it ("vision_tower." rules).
      const std::string vroot = module_of(vllm_module_name(roles.family, at.root + ".x"));
      const std::string hroot = module_of(hf_module_name(roles.family, at.root + ".x"));
      proto.roots = {at.root};
      for (const std::string& r : {vroot, hroot}) {
        if (std::find(proto.roots.begin(), proto.roots.end(), r) == proto.roots.end()) {
          proto.roots.push_back(r);
        }
      }
      proto.reason = fmt::format(
          "{} '{}': vLLM builds its Linear layers with the quantization config; kept in 16 "
          "bits by default (--quantize-vision quantizes it)",
          component_name(m.component), at.root);
    } else if (m.role == ModuleRole::kStackedExperts) {
      const std::string layer = moe_layer_of(m.tensor);
      // Group every MoE layer of the same template (layer numbers vary).
      key = "moe:" + numbered_template(layer);
      proto.subtree = true;
      proto.reason = role_reason(m);
    } else {
      key = fmt::format("{}:{}", role_order(m), numbered_template(m.module));
      proto.reason = role_reason(m);
    }
    auto [it, inserted] = by_key.try_emplace(key, groups.size());
    if (inserted) groups.push_back(std::move(proto));
    Group& g = groups[it->second];
    g.members.push_back(&m);
    if (m.role == ModuleRole::kStackedExperts && !tower_kept) {
      const std::string layer = moe_layer_of(m.tensor);
      for (const std::string& r : {layer, vllm_module_name(roles.family, layer)}) {
        if (std::find(g.roots.begin(), g.roots.end(), r) == g.roots.end()) g.roots.push_back(r);
      }
    }
  }
  // Role order first, then towers, each by first appearance.
  std::vector<std::size_t> order(groups.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto rank = [&](const Group& g) {
      return g.subtree && g.members.front()->role != ModuleRole::kStackedExperts
                 ? 8
                 : role_order(*g.members.front());
    };
    // Same role: generic rules first, then the row's in its order, then by
    // name (towers by root).
    const auto rule = [](const Group& g) {
      const std::size_t r = g.members.front()->rule;
      return g.subtree || r == SIZE_MAX ? 0 : r + 1;
    };
    const auto name = [](const Group& g) {
      return g.roots.empty() ? g.members.front()->module : g.roots.front();
    };
    return std::make_tuple(rank(groups[a]), rule(groups[a]), name(groups[a])) <
           std::make_tuple(rank(groups[b]), rule(groups[b]), name(groups[b]));
  });
  std::vector<DefaultIgnoreEntry> out;
  // A tied model without an lm_head tensor: transformers still builds
  // lm_head as a Linear and ties its weight to the embedding after
  // compressed-tensors has replaced the Linear layers the targets match, so
  // without an entry for it the tie fails (transformers 5.12 with
  // compressed-tensors 0.18: "AttributeError: Linear has no attribute
  // 'weight'"). vLLM builds no head layer of its own for a tied model
  // (qwen3.py: lm_head = model.embed_tokens) or one that shares the
  // embedding's weight (llama.py), so the entry changes nothing there.
  if (const std::optional<std::string> entry = absent_head_entry(roles, /*drafts=*/false)) {
    out.push_back(DefaultIgnoreEntry{
        *entry,
        "tied output head: config.json says tie_word_embeddings and the checkpoint has no "
        "lm_head tensor; transformers builds lm_head as a Linear and ties it to the embedding "
        "after compressed-tensors has replaced the Linear layers its targets match, so without "
        "this entry it fails to load (AttributeError: Linear has no attribute 'weight'); vLLM "
        "shares the embedding and builds no quantized layer for it",
        {}});
  }
  for (std::size_t i : order) {
    const Group& g = groups[i];
    std::vector<std::string> modules;
    for (const ModuleInfo* m : g.members) modules.push_back(m->module);
    for (const std::string& e : group_entries(roles, g)) {
      if (std::any_of(out.begin(), out.end(),
                      [&](const DefaultIgnoreEntry& d) { return d.entry == e; })) {
        continue;
      }
      out.push_back(DefaultIgnoreEntry{e, g.reason, modules});
    }
  }
  return out;
}

std::vector<std::string> narrow_ignore_entries(const RoleAnalysis& roles,
                                               const std::vector<std::string>& modules) {
  const std::set<std::string> wanted(modules.begin(), modules.end());
  // MoE layers every expert of which is wanted: one entry for the layer
  // (vLLM decides it by its experts.0 probes).
  std::map<std::string, std::vector<const ModuleInfo*>> experts_of;
  for (const ModuleInfo& m : roles.modules) {
    if (m.role == ModuleRole::kExpert || m.role == ModuleRole::kStackedExperts) {
      experts_of[moe_layer_of(m.role == ModuleRole::kExpert ? module_of(m.module) : m.tensor)]
          .push_back(&m);
    }
  }
  std::set<std::string> whole_layers;
  for (const auto& [layer, members] : experts_of) {
    if (std::all_of(members.begin(), members.end(),
                    [&](const ModuleInfo* m) { return wanted.contains(m->module); })) {
      whole_layers.insert(layer);
    }
  }
  std::vector<Group> groups;
  std::map<std::string, std::size_t> by_key;
  std::vector<std::string> unknown;  // modules without a role: their names as given
  for (const std::string& name : modules) {
    const ModuleInfo* m = roles.find(name);
    if (m == nullptr) {
      unknown.push_back(name);
      continue;
    }
    const bool expert = m->role == ModuleRole::kExpert || m->role == ModuleRole::kStackedExperts;
    const std::string layer =
        expert ? moe_layer_of(m->role == ModuleRole::kExpert ? module_of(m->module) : m->tensor)
               : std::string();
    if (expert && whole_layers.contains(layer)) {
      auto [it, inserted] = by_key.try_emplace("moe:" + numbered_template(layer), groups.size());
      if (inserted) {
        groups.emplace_back();
        groups.back().subtree = true;
      }
      Group& g = groups[it->second];
      g.members.push_back(m);
      for (const std::string& r : {layer, m->vllm_layer}) {
        if (std::find(g.roots.begin(), g.roots.end(), r) == g.roots.end()) g.roots.push_back(r);
      }
      continue;
    }
    auto [it, inserted] = by_key.try_emplace(numbered_template(name), groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].members.push_back(m);
  }
  // Groups that differ only in the last component (q_proj, k_proj, v_proj
  // of the same layers) become one entry with an alternation, when it is
  // exact.
  std::vector<std::vector<std::size_t>> merged;
  std::map<std::string, std::size_t> by_parent;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    bool mergeable = !g.subtree;
    for (const ModuleInfo* m : g.members) {
      const std::string last = last_component(m->module);
      for (const std::string& f : name_forms(*m)) {
        if (last_component(f) != last || module_of(f).empty()) mergeable = false;
      }
    }
    if (!mergeable) {
      merged.push_back({i});
      continue;
    }
    const std::string parent = numbered_template(module_of(g.members.front()->module));
    auto [it, inserted] = by_parent.try_emplace(parent, merged.size());
    if (inserted) merged.emplace_back();
    merged[it->second].push_back(i);
  }
  std::vector<std::string> out;
  const auto add = [&](const std::string& e) {
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
  };
  for (const auto& set : merged) {
    if (set.size() > 1) {
      std::vector<const ModuleInfo*> members;
      std::vector<std::string> parents;
      std::set<std::string> lasts;
      for (std::size_t i : set) {
        for (const ModuleInfo* m : groups[i].members) {
          members.push_back(m);
          lasts.insert(regex_escape(last_component(m->module)));
          for (const std::string& f : name_forms(*m)) parents.push_back(module_of(f));
        }
      }
      const std::set<std::size_t> vary = varying_digits(parents);
      std::vector<std::string> forms;
      for (const std::string& p : parents) forms.push_back(templated(p, vary));
      std::string entry = entry_from_forms(forms, /*subtree=*/false);
      entry = entry.substr(0, entry.size() - 1) + fmt::format("\\.({})$", fmt::join(lasts, "|"));
      std::vector<std::string> member_names;
      std::vector<std::string> other_names;
      collect_names(roles, members, member_names, other_names);
      if (entry_is_exact(entry, member_names, other_names)) {
        add(entry);
        continue;
      }
    }
    for (std::size_t i : set) {
      for (const std::string& e : group_entries(roles, groups[i])) add(e);
    }
  }
  for (const std::string& n : unknown) add(n);
  return out;
}

std::vector<std::string> exact_target_entries(const RoleAnalysis& roles,
                                              const std::vector<std::string>& modules) {
  std::vector<std::string> out;
  const auto add = [&](const std::string& e) {
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
  };
  for (const std::string& name : modules) {
    const ModuleInfo* m = roles.find(name);
    if (m == nullptr) {
      add(name);  // no role (a split expert projection): its name as given
      continue;
    }
    const std::vector<std::string> forms = name_forms(*m);
    // A name every engine shares, and an expert of a MoE layer (vLLM
    // decides the layer by its experts.0 probes, which are names of the
    // same group: the layer's experts form one unit): each form literally.
    if (forms.size() == 1 || m->role == ModuleRole::kExpert ||
        m->role == ModuleRole::kStackedExperts) {
      for (const std::string& f : forms) add(exact_entry(roles, f));
      continue;
    }
    // Names that differ (a DFlash draft's fc is vLLM's model.fc): one
    // anchored entry for every form, when it matches no other module.
    Group one;
    one.members = {m};
    for (const std::string& e : group_entries(roles, one)) add(e);
  }
  return out;
}

}  // namespace ctquant
