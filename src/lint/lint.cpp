#include "ctquant/lint/lint.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "ctquant/util/error.hpp"
#include "ctquant/plan/matcher.hpp"
#include "lint/roles_lint.hpp"

namespace ctquant {

using nlohmann::json;

const char* severity_name(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kError:
      return "error";
  }
  return "?";
}

bool is_dflash_draft(const Checkpoint& checkpoint) {
  if (!checkpoint.config) return false;
  const json& config = *checkpoint.config;
  if (config.contains("dflash_config")) return true;
  const auto it = config.find("architectures");
  if (it == config.end() || !it->is_array()) return false;
  return std::any_of(it->begin(), it->end(), [](const json& a) {
    return a.is_string() && a.get_ref<const std::string&>().find("DFlash") != std::string::npos;
  });
}

bool names_prefixed_at_load(const Checkpoint& checkpoint) {
  if (is_dflash_draft(checkpoint)) return true;
  bool any_layers = false;
  for (const auto& [name, at] : checkpoint.tensors) {
    if (name.starts_with("model.")) return false;
    if (name.starts_with("layers.")) any_layers = true;
  }
  return any_layers;
}

namespace {

constexpr std::size_t kMaxNearMisses = 5;

std::string last_component(const std::string& module) {
  const auto dot = module.rfind('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

std::string parent_of(const std::string& module) {
  const auto dot = module.rfind('.');
  return dot == std::string::npos ? std::string() : module.substr(0, dot);
}

std::string param_of(const std::string& tensor) {
  const auto dot = tensor.rfind('.');
  return dot == std::string::npos ? tensor : tensor.substr(dot + 1);
}

std::string join(const std::vector<std::string>& items, std::size_t max_items,
                 std::string_view separator = ", ") {
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

// The last run of [A-Za-z0-9_] in an entry (its `re:` prefix stripped), the
// word near misses must contain; "" when there is none.
std::string last_word(const std::string& entry) {
  const auto pattern = regex_pattern(entry);
  const std::string text = pattern ? std::string(*pattern) : entry;
  std::size_t end = text.size();
  while (end > 0 &&
         !(std::isalnum(static_cast<unsigned char>(text[end - 1])) || text[end - 1] == '_')) {
    --end;
  }
  std::size_t begin = end;
  while (begin > 0 &&
         (std::isalnum(static_cast<unsigned char>(text[begin - 1])) || text[begin - 1] == '_')) {
    --begin;
  }
  // A regex escape such as \d or \Z is not part of a name.
  if (pattern && begin > 0 && text[begin - 1] == '\\') ++begin;
  return begin < end ? text.substr(begin, end - begin) : std::string();
}

// What the rules need about the checkpoint, computed once.
struct LintContext {
  const Checkpoint& checkpoint;
  const QuantizePlan& plan;
  std::vector<std::string> modules;  // every module with a tensor, in input order, unique
  std::map<std::string, std::vector<std::size_t>> decisions_of;  // module -> decision indices

  LintContext(const Checkpoint& c, const QuantizePlan& p) : checkpoint(c), plan(p) {
    for (std::size_t i = 0; i < plan.decisions.size(); ++i) {
      const TensorDecision& d = plan.decisions[i];
      if (d.module.empty()) continue;
      auto& list = decisions_of[d.module];
      if (list.empty()) modules.push_back(d.module);
      list.push_back(i);
    }
  }

  const TensorEntry& entry(const TensorDecision& d) const { return checkpoint.entry(d.source); }

  // The decision of module's .weight, or nullptr.
  const TensorDecision* weight_of(const std::string& module) const {
    const auto it = decisions_of.find(module);
    if (it == decisions_of.end()) return nullptr;
    for (std::size_t i : it->second) {
      if (param_of(plan.decisions[i].name) == "weight") return &plan.decisions[i];
    }
    return nullptr;
  }

  std::vector<std::string> modules_matching(const ModuleMatcher& matcher, std::size_t i) const {
    std::vector<std::string> out;
    for (const auto& m : modules) {
      if (matcher.entry_matches(i, m)) out.push_back(m);
    }
    return out;
  }
};

// ---- L1: entries that matched nothing ----
void lint_unmatched_entries(const LintContext& ctx, const std::vector<std::string>& entries,
                            const std::vector<std::vector<std::string>>& matches,
                            ModuleMatcher::Role role, std::vector<Finding>& out) {
  const char* what = role == ModuleMatcher::Role::kIgnore ? "ignore" : "targets";
  // The default entries were not written by the user (the default ignore
  // entries are made from the modules they keep; a file with nothing to
  // quantize is L9's).
  if (role == ModuleMatcher::Role::kTargets && entries == kDefaultTargets) return;
  const std::size_t first_given =
      role == ModuleMatcher::Role::kIgnore ? ctx.plan.n_default_ignore : 0;
  const ModuleMatcher matcher(entries, role);
  for (std::size_t i = first_given; i < entries.size(); ++i) {
    if (i < matches.size() && !matches[i].empty()) continue;
    const std::string& entry = entries[i];
    const std::vector<std::string> anywhere = ctx.modules_matching(matcher, i);
    Finding f;
    f.id = "L1";
    if (!anywhere.empty()) {
      // It names real modules, but none the quantizer could take.
      f.severity = Severity::kInfo;
      std::vector<std::string> described;
      for (const auto& m : anywhere) {
        const TensorDecision* w = ctx.weight_of(m);
        described.push_back(w == nullptr ? m : fmt::format("{} ({})", m, w->rule));
        if (w != nullptr) f.tensors.push_back(w->name);
      }
      f.message = fmt::format(
          "{} entry '{}' matched 0 modules that could be quantized; it matches only {}, which "
          "ctquant never quantizes, so the entry changes nothing",
          what, entry, join(described, kMaxNearMisses));
      f.fix = "none needed; remove the entry to silence this";
      out.push_back(std::move(f));
      continue;
    }
    f.severity = Severity::kWarning;
    const std::string word = last_word(entry);
    std::vector<std::string> near;
    if (!word.empty()) {
      for (const auto& m : ctx.modules) {
        if (m.find(word) != std::string::npos) near.push_back(m);
      }
    }
    for (const auto& m : near) {
      if (const TensorDecision* w = ctx.weight_of(m)) f.tensors.push_back(w->name);
    }
    if (const auto hint = detail::entry_near_miss(ctx.plan, ctx.modules, entry, what)) {
      f.message = fmt::format("{} entry '{}' matched 0 modules: {}", what, entry, hint->first);
      f.fix = hint->second;
    } else if (near.empty()) {
      f.message = word.empty()
                      ? fmt::format("{} entry '{}' matched 0 modules", what, entry)
                      : fmt::format("{} entry '{}' matched 0 modules; no module name contains '{}'",
                                    what, entry, word);
      f.fix = "check the spelling against `ctquant inspect`, or remove the entry";
    } else {
      f.message = fmt::format(
          "{} entry '{}' matched 0 modules; near misses (names containing "
          "'{}'): {}",
          what, entry, word, join(near, kMaxNearMisses));
      // A literal that differs from a stored name by a prefix (`model.` added
      // or missing) gets the re: entry that matches it both here and in vLLM.
      const auto prefixed = std::find_if(near.begin(), near.end(), [&](const std::string& m) {
        return !regex_pattern(entry) && (entry.ends_with("." + m) || m.ends_with("." + entry));
      });
      if (prefixed != near.end()) {
        f.fix = fmt::format("the names differ by a prefix: use --{} 're:.*{}$'", what,
                            regex_escape(prefixed->size() < entry.size() ? *prefixed : entry));
      } else {
        f.fix =
            "write the entry against the names as stored (see the near misses and `ctquant "
            "inspect`), or remove it";
      }
    }
    out.push_back(std::move(f));
  }
}

// ---- L3: fused layers split between quantized and not ----
struct FusedGroup {
  std::string kind;                  // "qkv_proj", "gate_up_proj" or "experts"
  std::string parent;                // the attention, MLP or MoE layer
  std::vector<std::size_t> members;  // decision indices of the members' .weight
};

std::optional<std::pair<std::string, std::string>> fused_group_of(const std::string& module) {
  // The experts of one MoE layer: <layer>.experts.<N>.<...>
  const auto at = module.find(".experts.");
  if (at != std::string::npos) {
    const std::size_t digits = at + 9;
    std::size_t end = digits;
    while (end < module.size() && std::isdigit(static_cast<unsigned char>(module[end]))) ++end;
    if (end > digits && end < module.size() && module[end] == '.') {
      return std::make_pair(std::string("experts"), module.substr(0, at + 8));
    }
  }
  const std::string last = last_component(module);
  if (last == "q_proj" || last == "k_proj" || last == "v_proj") {
    return std::make_pair(std::string("qkv_proj"), parent_of(module));
  }
  if (last == "gate_proj" || last == "up_proj") {
    return std::make_pair(std::string("gate_up_proj"), parent_of(module));
  }
  return std::nullopt;
}

// The members vLLM fuses into a group of kind "qkv_proj" or "gate_up_proj".
std::vector<const char*> fused_members(const std::string& kind) {
  if (kind == "qkv_proj") return {"q_proj", "k_proj", "v_proj"};
  if (kind == "gate_up_proj") return {"gate_proj", "up_proj"};
  return {};
}

void lint_fused_groups(const LintContext& ctx, std::vector<Finding>& out) {
  std::map<std::pair<std::string, std::string>, FusedGroup> groups;
  std::vector<std::pair<std::string, std::string>> order;
  for (std::size_t i = 0; i < ctx.plan.decisions.size(); ++i) {
    const TensorDecision& d = ctx.plan.decisions[i];
    if (param_of(d.name) != "weight" || ctx.entry(d).shape.size() != 2) continue;
    const auto key = fused_group_of(d.module);
    if (!key) continue;
    auto [it, inserted] = groups.try_emplace(*key, FusedGroup{key->first, key->second, {}});
    if (inserted) order.push_back(*key);
    it->second.members.push_back(i);
  }
  // Split groups with the same pattern (which members stay unquantized) make
  // one finding, so a rule applied to every layer is reported once.
  struct Split {
    std::vector<std::string> parents;
    std::vector<std::string> tensors;
    std::set<std::string> quantized_names;
    std::set<std::string> kept_names;
    std::set<std::string> reasons;
    std::set<std::string> member_names;
    std::size_t n_quantized = 0;
    std::size_t n_kept = 0;
    bool top_level = false;
  };
  std::map<std::string, Split> splits;
  std::vector<std::string> split_order;
  for (const auto& key : order) {
    const FusedGroup& g = groups.at(key);
    std::vector<std::size_t> quantized;
    std::vector<std::size_t> kept;
    for (std::size_t i : g.members) {
      (ctx.plan.decisions[i].fate == Fate::kQuantize ? quantized : kept).push_back(i);
    }
    if (quantized.empty() || kept.empty()) continue;
    const auto rel = [&](std::size_t i) {
      const std::string& m = ctx.plan.decisions[i].module;
      return m.substr(g.parent.empty() ? 0 : g.parent.size() + 1);
    };
    std::string pattern = g.kind + ":";
    if (g.kind != "experts") {
      for (std::size_t i : kept) pattern += rel(i) + ",";
    }
    auto [it, inserted] = splits.try_emplace(pattern);
    if (inserted) split_order.push_back(pattern);
    Split& s = it->second;
    s.parents.push_back(g.parent);
    for (std::size_t i : g.members) {
      s.tensors.push_back(ctx.plan.decisions[i].name);
      s.member_names.insert(last_component(ctx.plan.decisions[i].module));
      if (parent_of(ctx.plan.decisions[i].module).empty()) s.top_level = true;
    }
    s.n_quantized += quantized.size();
    s.n_kept += kept.size();
    for (std::size_t i : quantized) s.quantized_names.insert(rel(i));
    for (std::size_t i : kept) {
      s.kept_names.insert(rel(i));
      s.reasons.insert(ctx.plan.decisions[i].rule);
    }
  }
  for (const auto& pattern : split_order) {
    const Split& s = splits.at(pattern);
    const std::string kind = pattern.substr(0, pattern.find(':'));
    Finding f;
    f.id = "L3";
    f.severity = Severity::kError;
    f.tensors = s.tensors;
    const std::vector<std::string> quantized(s.quantized_names.begin(), s.quantized_names.end());
    const std::vector<std::string> kept(s.kept_names.begin(), s.kept_names.end());
    const std::vector<std::string> reasons(s.reasons.begin(), s.reasons.end());
    if (kind == "experts") {
      f.message = fmt::format(
          "the experts of {} ({}) are split: {} quantized, {} not ({}); vLLM loads the experts "
          "of a layer as one fused MoE layer with one scheme",
          plural(s.parents.size(), "MoE layer"), join(s.parents, 3),
          plural(s.n_quantized, "expert weight"), s.n_kept, join(reasons, 3, "; "));
      std::vector<std::string> members;
      for (const auto& t : s.tensors) members.push_back(parent_of(t));
      f.fix = fmt::format("quantize all experts of a layer or none: {}",
                          detail::ignore_fix(ctx.plan.roles, members));
    } else {
      f.message = fmt::format(
          "fused layer {} is split in {} ({}): {} quantized but {} not ({}); vLLM fuses them into "
          "one {} that needs one scheme",
          kind, plural(s.parents.size(), "block"), join(s.parents, 3), join(quantized, 8),
          join(kept, 8), join(reasons, 3, "; "), kind);
      std::vector<std::string> members;
      for (const auto& t : s.tensors) members.push_back(parent_of(t));
      f.fix = fmt::format(
          "quantize them all (narrow the ignore entry that takes {} out) or none ({})",
          join(kept, 8), detail::ignore_fix(ctx.plan.roles, members));
    }
    out.push_back(std::move(f));
  }
}

// ---- L4: DFlash draft with a quantized qkv_proj ----
void lint_dflash_qkv(const LintContext& ctx, std::vector<Finding>& out) {
  if (!is_dflash_draft(ctx.checkpoint)) return;
  Finding f;
  f.id = "L4";
  f.severity = Severity::kError;
  bool separate = false;
  for (const TensorDecision& d : ctx.plan.decisions) {
    if (d.fate != Fate::kQuantize) continue;
    const std::string last = last_component(d.module);
    if (last == "qkv_proj") {
      f.tensors.push_back(d.name);
    } else if (last == "q_proj" || last == "k_proj" || last == "v_proj") {
      f.tensors.push_back(d.name);
      separate = true;
    }
  }
  if (f.tensors.empty()) return;
  f.message = fmt::format(
      "DFlash draft: vLLM builds the draft's context-KV buffer by reading "
      "self_attn.qkv_proj.weight directly, with no dequantization path, so the draft only loads "
      "with it in 16 bits; {} would be quantized: {}",
      plural(f.tensors.size(), "tensor"), join(f.tensors, 4));
  // re:.*[qkv]_proj$ also takes qkv_proj.
  f.fix = separate ? "--ignore 're:.*[qkv]_proj$'" : "--ignore 're:.*qkv_proj$'";
  out.push_back(std::move(f));
}

// ---- L5: Marlin shapes per tensor-parallel shard ----
constexpr std::uint64_t kMarlinOutMultiple = 64;
constexpr std::uint64_t kMarlinInMultiple = 128;

bool is_row_parallel(const std::string& module) {
  const std::string last = last_component(module);
  return last == "o_proj" || last == "down_proj" || last == "fc" || last == "w2";
}

// Why Marlin cannot run a [out, in] weight split over tp shards, or "" if it can.
std::string marlin_problem(std::uint64_t out_features, std::uint64_t in_features, bool row,
                           std::uint64_t group_size, unsigned tp) {
  std::uint64_t out = out_features;
  std::uint64_t in = in_features;
  if (row) {
    if (in % tp != 0) return fmt::format("in_features {} does not split into {} shards", in, tp);
    in /= tp;
  } else {
    if (out % tp != 0) return fmt::format("out_features {} does not split into {} shards", out, tp);
    out /= tp;
  }
  if (out % kMarlinOutMultiple != 0) {
    return fmt::format("out_features per shard {} is not a multiple of {}", out,
                       kMarlinOutMultiple);
  }
  if (in % kMarlinInMultiple != 0) {
    return fmt::format("in_features per shard {} is not a multiple of {}", in, kMarlinInMultiple);
  }
  if (group_size != 0 && in % group_size != 0) {
    return fmt::format("in_features per shard {} is not a multiple of the group size {}", in,
                       group_size);
  }
  return {};
}

void lint_marlin_shapes(const LintContext& ctx, unsigned tp, std::vector<Finding>& out) {
  struct Shape {
    std::vector<std::string> tensors;
    std::set<std::string> names;
    bool top_level = false;
    std::string problem;
    std::vector<unsigned> working;
    std::uint64_t rows = 0, cols = 0;
    bool row = false;
    std::set<std::string> fused_siblings;  // the rest of their fused groups
  };
  std::map<std::string, Shape> shapes;
  std::vector<std::string> order;
  const std::uint64_t group_size = ctx.plan.options.scheme.group_size;
  for (const TensorDecision& d : ctx.plan.decisions) {
    if (d.fate != Fate::kQuantize) continue;
    const TensorEntry& t = ctx.entry(d);
    if (t.shape.size() != 2) continue;
    const bool row = is_row_parallel(d.module);
    const std::string problem = marlin_problem(t.shape[0], t.shape[1], row, group_size, tp);
    if (problem.empty()) continue;
    const std::string last = last_component(d.module);
    const std::string key = fmt::format("{} {} {}", last, shape_string(t.shape), row);
    auto [it, inserted] = shapes.try_emplace(key);
    Shape& s = it->second;
    if (inserted) {
      order.push_back(key);
      s.problem = problem;
      s.rows = t.shape[0];
      s.cols = t.shape[1];
      s.row = row;
      for (unsigned degree : kLintTpDegrees) {
        if (marlin_problem(t.shape[0], t.shape[1], row, group_size, degree).empty()) {
          s.working.push_back(degree);
        }
      }
    }
    s.tensors.push_back(d.name);
    s.names.insert(last);
    if (parent_of(d.module).empty()) s.top_level = true;
    // Keeping one member of a fused q/k/v or gate/up group in 16 bits splits
    // the group (L3), so the fix takes the whole group.
    if (const auto group = fused_group_of(d.module); group && group->first != "experts") {
      for (const char* member : fused_members(group->first)) {
        const std::string sibling =
            group->second.empty() ? std::string(member) : group->second + "." + member;
        if (member != last && ctx.weight_of(sibling) != nullptr) s.fused_siblings.insert(member);
      }
    }
  }
  for (const auto& key : order) {
    const Shape& s = shapes.at(key);
    std::vector<std::string> working;
    for (unsigned degree : s.working) working.push_back(std::to_string(degree));
    std::vector<std::string> tried;
    for (unsigned degree : kLintTpDegrees) tried.push_back(std::to_string(degree));
    Finding f;
    f.id = "L5";
    f.severity = Severity::kWarning;
    f.tensors = s.tensors;
    f.message = fmt::format(
        "Marlin W4A16 kernels need out_features % {} == 0 and in_features % {} == 0 per "
        "tensor-parallel shard; {} [{}, {}] ({}-parallel{}) at --tp {}: {}; TP degrees that "
        "work: {}",
        kMarlinOutMultiple, kMarlinInMultiple, plural(s.tensors.size(), "tensor"), s.rows, s.cols,
        s.row ? "row" : "column",
        s.row ? ", split along in_features" : ", split along out_features", tp, s.problem,
        working.empty() ? fmt::format("none of {}", join(tried, 8)) : join(working, 8));
    // Exactly these modules and the rest of their fused groups, no more.
    std::vector<std::string> keep;
    for (const auto& t : s.tensors) {
      const std::string module = parent_of(t);
      keep.push_back(module);
      for (const auto& sibling : s.fused_siblings) {
        const std::string other =
            parent_of(module).empty() ? sibling : parent_of(module) + "." + sibling;
        if (ctx.weight_of(other) != nullptr &&
            std::find(keep.begin(), keep.end(), other) == keep.end()) {
          keep.push_back(other);
        }
      }
    }
    const std::vector<std::string> siblings(s.fused_siblings.begin(), s.fused_siblings.end());
    f.fix = fmt::format(
        "keep {}{} in 16 bits: {}{}", s.tensors.size() == 1 ? "it" : "them",
        siblings.empty() ? std::string()
                         : fmt::format(" with the rest of the fused group ({})", join(siblings, 8)),
        detail::ignore_fix(ctx.plan.roles, keep),
        working.empty() ? std::string()
                        : fmt::format(", or serve with --tp {}", join(working, 8, " or ")));
    out.push_back(std::move(f));
  }
}

// ---- L6: tied embeddings with a quantized lm_head ----
bool ties_word_embeddings(const Checkpoint& checkpoint) {
  if (!checkpoint.config) return false;
  const auto tied = [](const json& c) {
    const auto it = c.find("tie_word_embeddings");
    return it != c.end() && it->is_boolean() && it->get<bool>();
  };
  const json& config = *checkpoint.config;
  if (tied(config)) return true;
  const auto text = config.find("text_config");
  return text != config.end() && text->is_object() && tied(*text);
}

void lint_tied_lm_head(const LintContext& ctx, std::vector<Finding>& out) {
  if (!ties_word_embeddings(ctx.checkpoint)) return;
  for (const TensorDecision& d : ctx.plan.decisions) {
    if (d.fate != Fate::kQuantize || last_component(d.module) != "lm_head") continue;
    Finding f;
    f.id = "L6";
    f.severity = Severity::kError;
    f.tensors = {d.name};
    f.message = fmt::format(
        "config.json has tie_word_embeddings: true, so vLLM shares lm_head with the embedding "
        "and never loads '{}'; quantizing it makes a layer that no loader reads",
        d.name);
    f.fix = d.module == "lm_head" ? "--ignore lm_head (the default ignore list has it)"
                                  : fmt::format("--ignore 're:.*\\.lm_head$'");
    out.push_back(std::move(f));
  }
}

// ---- L8: re: entries that take modules by a prefix of their names ----
void lint_prefix_matches(const std::vector<std::string>& entries,
                         const std::vector<std::vector<std::string>>& matches,
                         ModuleMatcher::Role role, std::vector<Finding>& out,
                         const LintContext& ctx) {
  const char* what = role == ModuleMatcher::Role::kIgnore ? "ignore" : "targets";
  for (std::size_t i = 0; i < entries.size() && i < matches.size(); ++i) {
    const auto pattern = regex_pattern(entries[i]);
    if (!pattern || matches[i].empty()) continue;
    const std::string p(*pattern);
    const std::string anchored =
        p.find('|') == std::string::npos ? p + "$" : fmt::format("(?:{})$", p);
    std::vector<std::string> prefix_only;
    try {
      const ModuleMatcher whole({"re:" + anchored}, role);
      for (const auto& m : matches[i]) {
        if (!whole.entry_matches(0, m)) prefix_only.push_back(m);
      }
    } catch (const Error&) {
      continue;  // a pattern that does not take a trailing $; nothing to suggest
    }
    if (prefix_only.empty()) continue;
    Finding f;
    f.id = "L8";
    f.severity = Severity::kInfo;
    for (const auto& m : prefix_only) {
      if (const TensorDecision* w = ctx.weight_of(m)) f.tensors.push_back(w->name);
    }
    f.message = fmt::format(
        "{} entry '{}' matches {} only by a prefix of the name (re: entries are anchored at the "
        "start, not the end): {}",
        what, entries[i], plural(prefix_only.size(), "module"), join(prefix_only, kMaxNearMisses));
    f.fix = fmt::format("if you meant whole names, write --{} 're:{}'", what, anchored);
    out.push_back(std::move(f));
  }
}

// ---- L9: nothing to quantize ----
void lint_nothing_quantized(const LintContext& ctx, std::vector<Finding>& out) {
  const bool any = std::any_of(ctx.plan.decisions.begin(), ctx.plan.decisions.end(),
                               [](const TensorDecision& d) { return d.fate == Fate::kQuantize; });
  if (any) return;
  Finding f;
  f.id = "L9";
  f.severity = Severity::kError;
  f.message = fmt::format(
      "no tensor would be quantized (of {}): OUTPUT would hold the input's tensors unchanged "
      "under a pack-quantized quantization_config",
      plural(ctx.plan.decisions.size(), "tensor"));
  f.fix =
      "check that INPUT is a model checkpoint with 2-D Linear weights and that --ignore / "
      "--targets leave some of them (`ctquant inspect INPUT --plan` shows each tensor's rule)";
  out.push_back(std::move(f));
}

}  // namespace

std::vector<Finding> run_lint(const Checkpoint& checkpoint, const QuantizePlan& plan,
                              const LintOptions& options) {
  if (options.tp == 0) throw usage_error("--tp must be at least 1");
  const LintContext ctx(checkpoint, plan);
  const detail::RolesLint roles(checkpoint, plan);
  std::vector<Finding> findings;
  lint_unmatched_entries(ctx, plan.options.ignore, plan.ignore_matches,
                         ModuleMatcher::Role::kIgnore, findings);
  lint_unmatched_entries(ctx, plan.options.targets, plan.target_matches,
                         ModuleMatcher::Role::kTargets, findings);
  roles.literal_entries(findings);
  lint_fused_groups(ctx, findings);
  lint_dflash_qkv(ctx, findings);
  lint_marlin_shapes(ctx, options.tp, findings);
  lint_tied_lm_head(ctx, findings);
  roles.stacked_experts(findings);
  lint_prefix_matches(plan.options.ignore, plan.ignore_matches, ModuleMatcher::Role::kIgnore,
                      findings, ctx);
  lint_prefix_matches(plan.options.targets, plan.target_matches, ModuleMatcher::Role::kTargets,
                      findings, ctx);
  lint_nothing_quantized(ctx, findings);
  roles.unloadable_modules(findings);
  roles.vllm_expectations(findings);
  return findings;
}

std::vector<const Finding*> blocking_findings(const std::vector<Finding>& findings, bool strict,
                                              bool allow_unloadable) {
  std::vector<const Finding*> out;
  for (const Finding& f : findings) {
    if ((f.severity == Severity::kError && !allow_unloadable) ||
        (f.severity == Severity::kWarning && strict)) {
      out.push_back(&f);
    }
  }
  return out;
}

std::string format_finding(const Finding& finding, std::size_t max_tensors, bool with_severity) {
  std::string text = with_severity ? fmt::format("{} {}: {}", finding.id,
                                                 severity_name(finding.severity), finding.message)
                                   : fmt::format("{}: {}", finding.id, finding.message);
  if (!finding.tensors.empty()) {
    text += fmt::format("\n  tensors: {}", join(finding.tensors, max_tensors));
  }
  if (!finding.fix.empty()) text += fmt::format("\n  fix: {}", finding.fix);
  return text;
}

std::string render_findings_text(const std::vector<Finding>& findings) {
  if (findings.empty()) return "lint: no findings\n";
  std::size_t counts[3] = {0, 0, 0};
  for (const Finding& f : findings) ++counts[static_cast<int>(f.severity)];
  std::string text = fmt::format("lint: {}, {}, {} info\n", plural(counts[2], "error"),
                                 plural(counts[1], "warning"), counts[0]);
  for (const Finding& f : findings) text += format_finding(f) + "\n";
  return text;
}

json findings_json(const std::vector<Finding>& findings) {
  json out = json::array();
  for (const Finding& f : findings) {
    out.push_back(json{{"id", f.id},
                       {"severity", severity_name(f.severity)},
                       {"tensors", f.tensors},
                       {"message", f.message},
                       {"fix", f.fix}});
  }
  return out;
}

}  // namespace ctquant
