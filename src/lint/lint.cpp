#include "ctquant/lint/lint.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "ctquant/format/matcher.hpp"
#include "ctquant/model/fused_groups.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/registry.hpp"
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

// A 2-D weight as vLLM will see it: a whole 2-D .weight, or one expert
// projection of a split stacked tensor.
struct LintWeight {
  std::string tensor;  // the output M.weight name it stands for
  std::string module;
  bool quantized = false;
  std::string rule;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  const SchemeGroup* group = nullptr;  // quantized: its scheme group
};

// What the rules need about the checkpoint, computed once.
struct LintContext {
  const Checkpoint& checkpoint;
  const QuantizePlan& plan;
  std::vector<std::string> modules;  // every module with a tensor, in input order, unique
  std::map<std::string, std::vector<std::size_t>> decisions_of;  // module -> decision indices
  std::vector<LintWeight> weights;  // every 2-D weight, split experts one by one, in input order

  LintContext(const Checkpoint& c, const QuantizePlan& p) : checkpoint(c), plan(p) {
    for (std::size_t i = 0; i < plan.decisions.size(); ++i) {
      poll_cancel();
      const TensorDecision& d = plan.decisions[i];
      if (d.module.empty()) continue;
      auto& list = decisions_of[d.module];
      if (list.empty()) modules.push_back(d.module);
      list.push_back(i);
      const TensorEntry& t = checkpoint.entry(d.source);
      if (d.fate == Fate::kSplit) {
        for (const std::size_t mi : d.modules) {
          const PlannedModule& m = plan.modules[mi];
          const bool q = m.kind == PlannedModule::Kind::kQuantize;
          weights.push_back(LintWeight{m.name + ".weight", m.name, q, m.rule, m.source.rows,
                                       m.source.cols, q ? &plan.group_of(m) : nullptr});
        }
      } else if (last_component(d.name) == "weight" && t.shape.size() == 2) {
        const bool q = d.fate == Fate::kQuantize;
        weights.push_back(LintWeight{d.name, d.module, q, d.rule, t.shape[0], t.shape[1],
                                     q ? &plan.group_of(plan.modules[d.modules.front()])
                                       : nullptr});
      }
    }
  }

  const TensorEntry& entry(const TensorDecision& d) const { return checkpoint.entry(d.source); }

  // The decision of module's .weight, or nullptr.
  const TensorDecision* weight_of(const std::string& module) const {
    const auto it = decisions_of.find(module);
    if (it == decisions_of.end()) return nullptr;
    for (std::size_t i : it->second) {
      if (last_component(plan.decisions[i].name) == "weight") return &plan.decisions[i];
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
  // A group's only targets entry cannot simply go: its fix is to correct it.
  const bool removable = role == ModuleMatcher::Role::kIgnore || entries.size() > 1;
  for (std::size_t i = first_given; i < entries.size(); ++i) {
    if (i < matches.size() && !matches[i].empty()) continue;
    const std::string& entry = entries[i];
    const std::vector<std::string> anywhere = ctx.modules_matching(matcher, i);
    Finding f;
    f.id = "L1";
    if (!anywhere.empty()) {
      // It names real modules, but none the quantizer could take. Where
      // vLLM would build one of them quantized, the entry is what keeps
      // vLLM from looking for weight_packed (an empty weight is written as
      // it is): not pointless, so nothing to say.
      if (std::any_of(anywhere.begin(), anywhere.end(), [&](const std::string& m) {
            const ModuleInfo* info = ctx.plan.roles.find(m);
            return role == ModuleMatcher::Role::kIgnore && info != nullptr &&
                   info->build == VllmBuild::kQuantizable;
          })) {
        continue;
      }
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
      if (removable) {
        f.fix_removes = entry;
        f.fix_removes_target = role == ModuleMatcher::Role::kTargets;
      }
      out.push_back(std::move(f));
      continue;
    }
    // An ignore entry for the head transformers builds although the
    // checkpoint has none (a tied model or a draft; absent_head_entry())
    // keeps transformers able to load.
    if (role == ModuleMatcher::Role::kIgnore) {
      if (const auto head = absent_head_entry(ctx.plan.roles, /*drafts=*/true);
          head && matcher.entry_matches(i, *head)) {
        continue;
      }
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
    if (removable) {
      f.fix_removes = entry;
      f.fix_removes_target = role == ModuleMatcher::Role::kTargets;
    }
    if (const auto hint = detail::entry_near_miss(ctx.plan, ctx.modules, entry, what)) {
      f.message = fmt::format("{} entry '{}' matched 0 modules: {}", what, entry, hint->found);
      f.fix = hint->fix;
      (f.fix_removes_target ? f.fix_targets : f.fix_ignore) = hint->entries;
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
        const std::string both =
            "re:.*" + regex_escape(prefixed->size() < entry.size() ? *prefixed : entry) + "$";
        f.fix = fmt::format("the names differ by a prefix: use --{} '{}' instead", what, both);
        (f.fix_removes_target ? f.fix_targets : f.fix_ignore) = {both};
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
  std::vector<std::size_t> members;  // indices into LintContext::weights
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
  // The q/k/v and gate/up shards vLLM fuses (model/fused_groups.hpp).
  if (const FusedSpec* group = llama_fused_group_of(last_component(module))) {
    return std::make_pair(std::string(group->fused), module_of(module));
  }
  return std::nullopt;
}

// The members vLLM fuses into a group of kind "qkv_proj" or "gate_up_proj".
std::vector<const char*> fused_members(const std::string& kind) {
  for (const FusedSpec& group : llama_fused_groups()) {
    if (kind == group.fused) return group.shards;
  }
  return {};
}

void lint_fused_groups(const LintContext& ctx, std::vector<Finding>& out) {
  std::map<std::pair<std::string, std::string>, FusedGroup> groups;
  std::vector<std::pair<std::string, std::string>> order;
  for (std::size_t i = 0; i < ctx.weights.size(); ++i) {
    const LintWeight& d = ctx.weights[i];
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
    // Members quantized with different schemes are split too.
    std::set<const SchemeGroup*> schemes;
    for (std::size_t i : g.members) {
      (ctx.weights[i].quantized ? quantized : kept).push_back(i);
      if (ctx.weights[i].quantized) schemes.insert(ctx.weights[i].group);
    }
    if ((quantized.empty() || kept.empty()) && schemes.size() <= 1) continue;
    if (kept.empty()) {
      // Two schemes: the members of the smaller part count as "kept" apart.
      for (std::size_t i : g.members) {
        if (ctx.weights[i].group != ctx.weights[g.members.front()].group) kept.push_back(i);
      }
      std::erase_if(quantized, [&](std::size_t i) {
        return std::find(kept.begin(), kept.end(), i) != kept.end();
      });
    }
    const auto rel = [&](std::size_t i) {
      const std::string& m = ctx.weights[i].module;
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
      s.tensors.push_back(ctx.weights[i].tensor);
      s.member_names.insert(last_component(ctx.weights[i].module));
      if (module_of(ctx.weights[i].module).empty()) s.top_level = true;
    }
    s.n_quantized += quantized.size();
    s.n_kept += kept.size();
    for (std::size_t i : quantized) s.quantized_names.insert(rel(i));
    for (std::size_t i : kept) {
      s.kept_names.insert(rel(i));
      s.reasons.insert(ctx.weights[i].rule);
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
          "the experts of {} ({}) are split: {} quantized one way, {} not ({}); vLLM loads the "
          "experts of a layer as one fused MoE layer with one scheme",
          plural(s.parents.size(), "MoE layer"), join(s.parents, 3),
          plural(s.n_quantized, "expert weight"), s.n_kept, join(reasons, 3, "; "));
      std::vector<std::string> members;
      for (const auto& t : s.tensors) members.push_back(module_of(t));
      f.fix = fmt::format("quantize all experts of a layer or none: {}",
                          detail::set_ignore_fix(f, ctx.plan.roles, members));
    } else {
      f.message = fmt::format(
          "fused layer {} is split in {} ({}): {} quantized but {} not, or not the same way ({}); "
          "vLLM fuses them into one {} that needs one scheme",
          kind, plural(s.parents.size(), "block"), join(s.parents, 3), join(quantized, 8),
          join(kept, 8), join(reasons, 3, "; "), kind);
      std::vector<std::string> members;
      for (const auto& t : s.tensors) members.push_back(module_of(t));
      f.fix = fmt::format(
          "quantize them all (narrow the ignore entry that takes {} out) or none ({})",
          join(kept, 8), detail::set_ignore_fix(f, ctx.plan.roles, members));
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
  for (const LintWeight& d : ctx.weights) {
    if (!d.quantized) continue;
    const std::string last = last_component(d.module);
    if (last == "qkv_proj") {
      f.tensors.push_back(d.tensor);
    } else if (last == "q_proj" || last == "k_proj" || last == "v_proj") {
      f.tensors.push_back(d.tensor);
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
  f.fix_ignore = {separate ? "re:.*[qkv]_proj$" : "re:.*qkv_proj$"};
  f.fix = detail::option_list("ignore", f.fix_ignore);
  out.push_back(std::move(f));
}

// ---- L5: vLLM kernel shapes per tensor-parallel shard ----
bool is_row_parallel(const std::string& module) {
  const std::string last = last_component(module);
  return last == "o_proj" || last == "down_proj" || last == "fc" || last == "w2";
}

// How vLLM's checks see the output side of a column layer (fp8_utils.py
// validate_fp8_block_shape): the output partitions are checked when the
// layer is split over tp > 1 ranks, and, at any tp, those of a merged layer
// except its last (q and k of qkv_proj, gate of gate_up_proj, w1 of w1/w3;
// DeepSeek's q_a_proj of fused_qkv_a_proj, a merged layer that is never
// split: models/deepseek_v2.py builds it with disable_tp=True, so its last
// partition kv_a_proj_with_mqa is never checked).
Parallel column_parallel(const std::string& last, unsigned tp) {
  if (last == "kv_a_proj_with_mqa") return Parallel::kReplicated;
  const bool merged_not_last = last == "q_proj" || last == "k_proj" || last == "gate_proj" ||
                               last == "w1" || last == "q_a_proj";
  return tp > 1 || merged_not_last ? Parallel::kColumn : Parallel::kReplicated;
}

// The problems of the family's vLLM kernel with a [out, in] weight split over
// tp shards; a shape that does not split is unloadable.
std::vector<ShapeProblem> kernel_problems(const SchemeGroup& g, const std::string& module,
                                          std::uint64_t out_features, std::uint64_t in_features,
                                          bool row, unsigned tp) {
  std::uint64_t out = out_features;
  std::uint64_t in = in_features;
  if (row) {
    if (in % tp != 0) {
      return {{true, fmt::format("in_features {} does not split into {} shards", in, tp)}};
    }
    in /= tp;
  } else {
    if (out % tp != 0) {
      return {{true, fmt::format("out_features {} does not split into {} shards", out, tp)}};
    }
    out /= tp;
  }
  return g.family()->vllm_shape_rule(
      g.weights, out, in, row ? Parallel::kRow : column_parallel(last_component(module), tp));
}

std::string problems_text(const std::vector<ShapeProblem>& problems) {
  std::string text;
  for (const ShapeProblem& p : problems) text += (text.empty() ? "" : "; ") + p.what;
  return text;
}

void lint_kernel_shapes(const LintContext& ctx, unsigned tp, std::vector<Finding>& out) {
  struct Shape {
    std::vector<std::string> tensors;
    std::set<std::string> names;
    bool top_level = false;
    std::vector<ShapeProblem> problems;
    std::vector<unsigned> working;
    std::uint64_t rows = 0, cols = 0;
    bool row = false;
    const SchemeGroup* group = nullptr;
    std::set<std::string> fused_siblings;  // the rest of their fused groups
  };
  std::map<std::string, Shape> shapes;
  std::vector<std::string> order;
  for (const LintWeight& d : ctx.weights) {
    if (!d.quantized) continue;
    const bool row = is_row_parallel(d.module);
    const std::vector<ShapeProblem> problems = kernel_problems(*d.group, d.module, d.rows, d.cols, row, tp);
    if (problems.empty()) continue;
    const std::string last = last_component(d.module);
    const std::string key =
        fmt::format("{} [{}, {}] {} {}", last, d.rows, d.cols, row, d.group->name);
    auto [it, inserted] = shapes.try_emplace(key);
    Shape& s = it->second;
    if (inserted) {
      order.push_back(key);
      s.problems = problems;
      s.rows = d.rows;
      s.cols = d.cols;
      s.row = row;
      s.group = d.group;
      for (unsigned degree : kLintTpDegrees) {
        if (kernel_problems(*d.group, d.module, d.rows, d.cols, row, degree).empty()) {
          s.working.push_back(degree);
        }
      }
    }
    s.tensors.push_back(d.tensor);
    s.names.insert(last);
    if (module_of(d.module).empty()) s.top_level = true;
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
    const bool unloadable = std::any_of(s.problems.begin(), s.problems.end(),
                                        [](const ShapeProblem& p) { return p.unloadable; });
    const SchemeFamily* family = s.group->family();
    Finding f;
    f.id = "L5";
    f.severity = unloadable ? Severity::kError : Severity::kWarning;
    f.tensors = s.tensors;
    // An error: current vLLM refuses the shard. A warning: current vLLM pads
    // the shape and runs it, releases before it refuse it.
    f.message = fmt::format(
        "{} {} kernels ({}) cannot run {} [{}, {}] ({}-parallel{}) at --tp {}: {}{}; TP "
        "degrees {} run: {}",
        unloadable ? "vLLM's" : "older vLLM releases'", family->format, family->vllm_source,
        plural(s.tensors.size(), "tensor"), s.rows, s.cols, s.row ? "row" : "column",
        s.row ? ", split along in_features" : ", split along out_features", tp,
        problems_text(s.problems),
        unloadable ? "" : " (current vLLM pads these shapes and runs them)",
        unloadable ? "that" : "these releases",
        working.empty() ? fmt::format("none of {}", join(tried, 8)) : join(working, 8));
    // Exactly these modules and the rest of their fused groups, no more:
    // an expert takes every expert of its MoE layer with it (vLLM loads the
    // layer's experts as one fused layer with one scheme: L3, and decides
    // the layer by its experts.0 probes: L13).
    std::vector<std::string> keep;
    std::set<std::string> moe_layers;
    for (const auto& t : s.tensors) {
      const std::string module = module_of(t);
      if (const auto group = fused_group_of(module); group && group->first == "experts") {
        moe_layers.insert(group->second);
      }
    }
    for (const LintWeight& w : ctx.weights) {
      const auto group = fused_group_of(w.module);
      if (group && group->first == "experts" && moe_layers.contains(group->second) &&
          std::find(keep.begin(), keep.end(), w.module) == keep.end()) {
        keep.push_back(w.module);
      }
    }
    for (const auto& t : s.tensors) {
      const std::string module = module_of(t);
      if (std::find(keep.begin(), keep.end(), module) != keep.end()) continue;
      keep.push_back(module);
      for (const auto& sibling : s.fused_siblings) {
        const std::string other =
            module_of(module).empty() ? sibling : module_of(module) + "." + sibling;
        if (ctx.weight_of(other) != nullptr &&
            std::find(keep.begin(), keep.end(), other) == keep.end()) {
          keep.push_back(other);
        }
      }
    }
    const std::vector<std::string> siblings(s.fused_siblings.begin(), s.fused_siblings.end());
    f.fix = fmt::format(
        "keep {}{} in 16 bits: {}{}", s.tensors.size() == 1 ? "it" : "them",
        !moe_layers.empty()
            ? fmt::format(" with every expert of {}", plural(moe_layers.size(), "MoE layer"))
        : siblings.empty()
            ? std::string()
            : fmt::format(" with the rest of the fused group ({})", join(siblings, 8)),
        detail::set_ignore_fix(f, ctx.plan.roles, keep),
        working.empty() ? std::string()
                        : fmt::format(", or serve with --tp {}", join(working, 8, " or ")));
    out.push_back(std::move(f));
  }
}

// ---- L11: modules vLLM would give to another scheme group ----

// The group vLLM gives a module (compressed_tensors.py find_matched_target,
// vllm/model_executor/layers/quantization/compressed_tensors/utils.py):
// targets are keyed by their text across the groups in config.json's order
// (sorted by name; a target repeated in a later group is that group's), and
// a module takes the first target that names it or whose `re:` pattern
// matches it, else the first class-name target ("Linear" takes every
// linear layer).
std::optional<std::size_t> vllm_group_of(const PlanOptions& options, const std::string& module) {
  std::vector<std::size_t> by_name(options.groups.size());
  for (std::size_t g = 0; g < by_name.size(); ++g) by_name[g] = g;
  std::sort(by_name.begin(), by_name.end(), [&](std::size_t a, std::size_t b) {
    return options.groups[a].name < options.groups[b].name;
  });
  std::vector<std::string> order;  // target texts, first seen first
  std::map<std::string, std::size_t> group_of_target;
  for (const std::size_t g : by_name) {
    for (const std::string& t : options.groups[g].targets) {
      if (!group_of_target.contains(t)) order.push_back(t);
      group_of_target[t] = g;
    }
  }
  for (const std::string& t : order) {
    if (t == "Linear") continue;
    const ModuleMatcher m({t}, ModuleMatcher::Role::kTargets);
    if (m.entry_matches(0, module)) return group_of_target.at(t);
  }
  if (group_of_target.contains("Linear")) return group_of_target.at("Linear");
  return std::nullopt;
}

void lint_group_assignment(const LintContext& ctx, std::vector<Finding>& out) {
  const PlanOptions& o = ctx.plan.options;
  if (o.groups.size() < 2) return;
  std::map<std::pair<std::size_t, std::optional<std::size_t>>, Finding> by_pair;
  std::vector<std::pair<std::size_t, std::optional<std::size_t>>> order;
  for (const LintWeight& w : ctx.weights) {
    if (!w.quantized) continue;
    const std::size_t used = static_cast<std::size_t>(w.group - o.groups.data());
    const std::optional<std::size_t> vllm = vllm_group_of(o, w.module);
    if (vllm == used) continue;
    const auto key = std::make_pair(used, vllm);
    auto [it, inserted] = by_pair.try_emplace(key);
    if (inserted) order.push_back(key);
    it->second.tensors.push_back(w.tensor);
  }
  for (const auto& key : order) {
    Finding& f = by_pair.at(key);
    f.id = "L11";
    f.severity = Severity::kError;
    f.message = fmt::format(
        "{} quantized with group '{}' would be read by vLLM as {}: vLLM takes the first target "
        "that names or matches a module (groups in name order) before a class name such as "
        "Linear, so overlapping targets resolve differently",
        plural(f.tensors.size(), "module"), o.groups[key.first].name,
        key.second ? fmt::format("group '{}'", o.groups[*key.second].name)
                   : std::string("no group (unquantized)"));
    f.fix = "make the groups' targets disjoint: narrow the patterns, or give the group that "
            "takes the rest explicit targets instead of Linear";
    out.push_back(std::move(f));
  }
}

// ---- L10: a scheme no vLLM kernel runs ----
void lint_kernel_args(const LintContext& ctx, std::vector<Finding>& out) {
  for (std::size_t g = 0; g < ctx.plan.options.groups.size(); ++g) {
    if (ctx.plan.group_modules[g] == 0) continue;
    const SchemeGroup& group = ctx.plan.options.groups[g];
    const SchemeFamily* family = group.family();
    const std::string why = family->vllm_args_rule(group.weights);
    if (why.empty()) continue;
    Finding f;
    f.id = "L10";
    f.severity = Severity::kError;
    for (const LintWeight& w : ctx.weights) {
      if (w.group == &group) f.tensors.push_back(w.tensor);
    }
    f.message = fmt::format("scheme group '{}' ({}): {} ({})", group.name, family->format, why,
                            family->vllm_source);
    f.fix = group.weights.type == QuantArgs::Type::kInt && group.weights.strategy ==
                                                               QuantArgs::Strategy::kGroup
                ? "pick a group size vLLM runs (--group-size 32, 64 or 128, or -1 for channel-wise)"
                : "pick a scheme vLLM runs (see `ctquant quantize --help`)";
    out.push_back(std::move(f));
  }
}

// ---- L6: tied embeddings with a quantized lm_head ----
// config.json's flag as vLLM and transformers read it (a flag that is not a
// JSON boolean is refused before: check_tie_flag in roles.hpp).
void lint_tied_lm_head(const LintContext& ctx, std::vector<Finding>& out) {
  if (!ctx.plan.roles.dims.tied) return;
  for (const LintWeight& d : ctx.weights) {
    if (!d.quantized || last_component(d.module) != "lm_head") continue;
    Finding f;
    f.id = "L6";
    f.severity = Severity::kError;
    f.tensors = {d.tensor};
    f.message = fmt::format(
        "config.json has tie_word_embeddings: true, so vLLM shares lm_head with the embedding "
        "and never loads '{}'; quantizing it makes a layer that no loader reads",
        d.tensor);
    f.fix = fmt::format("{} (the default ignore list has it)",
                        detail::set_ignore_fix(f, ctx.plan.roles, {d.module}));
    out.push_back(std::move(f));
  }
  // No lm_head tensor: transformers still builds the head as a Linear and
  // ties it after compressed-tensors has converted the targeted Linear
  // layers, so the ignore list must name it (absent_head_entry()).
  const std::optional<std::string> head = absent_head_entry(ctx.plan.roles, /*drafts=*/false);
  if (!head) return;
  const ModuleMatcher ignore(ctx.plan.options.ignore, ModuleMatcher::Role::kIgnore);
  for (std::size_t i = 0; i < ctx.plan.options.ignore.size(); ++i) {
    if (ignore.entry_matches(i, *head)) return;
  }
  Finding f;
  f.id = "L6";
  f.severity = Severity::kWarning;
  f.message = fmt::format(
      "config.json has tie_word_embeddings: true and the checkpoint has no lm_head tensor, but "
      "no ignore entry names '{}': transformers builds the head as a Linear, compressed-tensors "
      "converts it with the other targeted layers, and tying it to the embedding then fails "
      "(transformers 5.12, compressed-tensors 0.18: AttributeError: Linear has no attribute "
      "'weight'); vLLM loads the model either way",
      *head);
  f.fix_ignore = {*head};
  f.fix = fmt::format("{} (the default ignore list has it)",
                      detail::option_list("ignore", f.fix_ignore));
  out.push_back(std::move(f));
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
    f.fix = fmt::format("if you meant whole names, write --{} 're:{}' instead", what, anchored);
    f.fix_removes = entries[i];
    f.fix_removes_target = role == ModuleMatcher::Role::kTargets;
    (f.fix_removes_target ? f.fix_targets : f.fix_ignore) = {"re:" + anchored};
    out.push_back(std::move(f));
  }
}

// ---- L9: nothing to quantize ----
// ---- L14: NVFP4 partners vLLM fuses, written with their own global scales ----
//
// vLLM serves a fused layer with one global scale. Dense layers
// (compressed_tensors_w4a4_nvfp4.py) take one for every partition and warn
// that "the global scale for input or weight are different for parallel
// layers"; MoE experts (compressed_tensors_moe.py, the NVFP4 method) take the
// gate's, w13_weight_global_scale[:, 0], for gate and up alike and warn that
// "w1_weight_global_scale must match w3_weight_global_scale" (vLLM issue
// 54150). model_free_ptq shares a global scale over q/k/v and gate/up of one
// MLP (docs/schemes.md section 7) but not over an expert's gate/up, a
// shared expert's, or MLA's q_a_proj / kv_a_proj_with_mqa; ctquant writes
// what it writes, and this rule says where vLLM will read a scale that is
// not the one the codes were made with.
void lint_unshared_global_scales(const LintContext& ctx, std::vector<Finding>& out) {
  const QuantizePlan& plan = ctx.plan;
  if (plan.amax_sets.empty()) return;
  std::map<std::string, std::size_t> set_of;  // module name -> its amax set
  for (std::size_t s = 0; s < plan.amax_sets.size(); ++s) {
    for (const std::size_t mi : plan.amax_sets[s]) set_of[plan.modules[mi].name] = s;
  }
  const auto nvfp4_set = [&](const std::string& module) -> std::optional<std::size_t> {
    const auto it = set_of.find(module);
    if (it == set_of.end()) return std::nullopt;
    const PlannedModule& m = plan.modules[plan.amax_sets[it->second].front()];
    const SchemeFamily* family = plan.group_of(m).family();
    if (family == nullptr || !family->vllm_one_global_scale) return std::nullopt;
    return it->second;
  };
  // The pairs vLLM fuses into one layer under one parent
  // (model/fused_groups.hpp): gate_up_proj, an expert's w13 and MLA's
  // fused_qkv_a_proj.
  static constexpr FusedKind kPairs[] = {FusedKind::kGateUpProj, FusedKind::kExpertW13,
                                         FusedKind::kFusedQkvAProj};
  std::vector<std::string> tensors;
  std::set<std::string> kinds;
  std::size_t pairs = 0;
  for (const LintWeight& w : ctx.weights) {
    if (!w.quantized) continue;
    for (const FusedKind kind : kPairs) {
      const FusedSpec& group = vllm_fused_group(kind);
      const char* first = group.shards[0];
      const char* second = group.shards[1];
      if (last_component(w.module) != first) continue;
      const std::string partner = module_of(w.module) + "." + second;
      const auto a = nvfp4_set(w.module);
      const auto b = nvfp4_set(partner);
      if (!a || !b || *a == *b) continue;
      ++pairs;
      tensors.push_back(w.module + ".weight");
      tensors.push_back(partner + ".weight");
      kinds.insert(w.module.find(".experts.") != std::string::npos ? "MoE experts"
                                                                    : "dense layers");
    }
  }
  if (pairs == 0) return;
  Finding f;
  f.id = "L14";
  f.severity = Severity::kWarning;
  f.tensors = std::move(tensors);
  std::vector<std::string> kind_list(kinds.begin(), kinds.end());
  std::vector<std::string> sources;
  if (kinds.count("MoE experts") != 0) {
    sources.push_back(
        "MoE experts: the gate's, w13_weight_global_scale[:, 0] in compressed_tensors_moe.py, "
        "vLLM issue 54150");
  }
  if (kinds.count("dense layers") != 0) {
    sources.push_back("dense layers: compressed_tensors_w4a4_nvfp4.py");
  }
  f.message = fmt::format(
      "{} that vLLM fuses into one layer ({}) get their own NVFP4 global scales, as "
      "model_free_ptq writes them; vLLM serves a fused layer with one global scale ({}), so "
      "one partner's weights are dequantized with a scale they were not quantized with, and "
      "vLLM warns that accuracy may be affected",
      fmt::format("{} {}", pairs, pairs == 1 ? "pair of modules" : "pairs of modules"),
      join(kind_list, 2, " and "), join(sources, 2, "; "));
  f.fix =
      "check the accuracy in vLLM, or use a scheme without a global scale (MXFP4A16, W4A16), "
      "or keep these modules in 16 bits with --ignore";
  out.push_back(std::move(f));
}

void lint_nothing_quantized(const LintContext& ctx, std::vector<Finding>& out) {
  const bool any = ctx.plan.n_quantized > 0;
  if (any) return;
  Finding f;
  f.id = "L9";
  f.severity = Severity::kError;
  f.message = fmt::format(
      "no tensor would be quantized (of {}): OUTPUT would hold the input's tensors unchanged "
      "under a quantization_config that says they are quantized",
      plural(ctx.plan.decisions.size(), "tensor"));
  f.fix =
      "check that INPUT is a model checkpoint with 2-D Linear weights and that --ignore / "
      "--targets leave some of them (`ctquant inspect INPUT --plan` shows each tensor's rule)";
  out.push_back(std::move(f));
}

}  // namespace

// What every rule reads, made once per run.
struct detail::LintRun {
  const LintContext& ctx;
  const RolesLint& roles;
  const LintOptions& options;
};

namespace {

using detail::LintRun;
using detail::RolesLint;

// The table's run functions: a rule of the plan's fates, a rule of the
// module roles, and the rules that take more than the context.
template <void (*Rule)(const LintContext&, std::vector<Finding>&)>
void on_context(const LintRun& run, std::vector<Finding>& out) {
  Rule(run.ctx, out);
}

template <void (RolesLint::*Rule)(std::vector<Finding>&) const>
void on_roles(const LintRun& run, std::vector<Finding>& out) {
  (run.roles.*Rule)(out);
}

// L1 and L8 look at the ignore list, then at each scheme group's targets.
void unmatched_entries(const LintRun& run, std::vector<Finding>& out) {
  const QuantizePlan& plan = run.ctx.plan;
  lint_unmatched_entries(run.ctx, plan.options.ignore, plan.ignore_matches,
                         ModuleMatcher::Role::kIgnore, out);
  for (std::size_t g = 0; g < plan.options.groups.size(); ++g) {
    lint_unmatched_entries(run.ctx, plan.options.groups[g].targets, plan.target_matches[g],
                           ModuleMatcher::Role::kTargets, out);
  }
}

void prefix_matches(const LintRun& run, std::vector<Finding>& out) {
  const QuantizePlan& plan = run.ctx.plan;
  lint_prefix_matches(plan.options.ignore, plan.ignore_matches, ModuleMatcher::Role::kIgnore, out,
                      run.ctx);
  for (std::size_t g = 0; g < plan.options.groups.size(); ++g) {
    lint_prefix_matches(plan.options.groups[g].targets, plan.target_matches[g],
                        ModuleMatcher::Role::kTargets, out, run.ctx);
  }
}

void kernel_shapes(const LintRun& run, std::vector<Finding>& out) {
  lint_kernel_shapes(run.ctx, run.options.tp, out);
}

constexpr Severity kError = Severity::kError;
constexpr Severity kWarning = Severity::kWarning;
constexpr Severity kInfo = Severity::kInfo;
constexpr std::nullopt_t kOnly = std::nullopt;

// The rules in the order run_lint runs them, which is the order findings
// are listed in (not quite the ids' order: L10 and L11 before L9, L14
// before L12). What each checks is docs/cli.md's lint table, the row at its
// anchor (tests/test_lint.cpp checks ids, severities and anchors against it).
constexpr LintRule kLintRules[] = {
    {"L1", kWarning, kInfo, "entry matched no module", "lint-l1", unmatched_entries},
    {"L2", kError, kInfo, "literal ignore entry vLLM does not match", "lint-l2",
     on_roles<&RolesLint::literal_entries>},
    {"L3", kError, kOnly, "fused layer split", "lint-l3", on_context<lint_fused_groups>},
    {"L4", kError, kOnly, "DFlash qkv_proj quantized", "lint-l4", on_context<lint_dflash_qkv>},
    {"L5", kError, kWarning, "shard shape the vLLM kernel cannot run", "lint-l5", kernel_shapes},
    {"L6", kError, kWarning, "tied lm_head", "lint-l6", on_context<lint_tied_lm_head>},
    {"L7", kError, kOnly, "stacked experts vLLM would not load", "lint-l7",
     on_roles<&RolesLint::stacked_experts>},
    {"L8", kInfo, kOnly, "re: entry matching by a prefix", "lint-l8", prefix_matches},
    {"L10", kError, kOnly, "scheme no vLLM kernel runs", "lint-l10",
     on_context<lint_kernel_args>},
    {"L11", kError, kOnly, "module vLLM gives another scheme group", "lint-l11",
     on_context<lint_group_assignment>},
    {"L9", kError, kOnly, "nothing quantized", "lint-l9", on_context<lint_nothing_quantized>},
    {"L14", kWarning, kOnly, "fused NVFP4 partners with their own global scales", "lint-l14",
     on_context<lint_unshared_global_scales>},
    {"L12", kError, kOnly, "module vLLM loads unquantized would be packed", "lint-l12",
     on_roles<&RolesLint::unloadable_modules>},
    {"L13", kError, kWarning, "ignore list and targets as vLLM reads them", "lint-l13",
     on_roles<&RolesLint::vllm_expectations>},
    {"L15", kWarning, kOnly, "most weights kept in 16 bits", "lint-l15",
     on_roles<&RolesLint::sixteen_bit_share>},
    {"L16", kWarning, kOnly, "draft module another engine reads unpacked", "lint-l16",
     on_roles<&RolesLint::engine_modules>},
    {"L17", kWarning, kOnly, "untied model without an output head", "lint-l17",
     on_roles<&RolesLint::missing_head>},
    {"L18", kError, kOnly, "no config.json", "lint-l18", on_roles<&RolesLint::missing_config>},
};

std::vector<Finding> lint_all(const Checkpoint& checkpoint, const QuantizePlan& plan,
                              const LintOptions& options, bool check_fixes);

// A fix that takes an entry out (or rewrites it) or sets an option can
// quantize modules the run keeps, and so lead into an error of its own (an
// unanchored pattern anchored, an ignore entry removed, --quantize-vision):
// the changed options are planned and linted once, and the fix is kept only
// when no error appears that the run did not have (a tensor of an error of
// the same rule). Fixes that only add ignore entries keep whole fused and
// MoE layers (keep_entries) and are checked by the tests.
void check_option_fix(const Checkpoint& checkpoint, const QuantizePlan& plan,
                      const LintOptions& options, const std::vector<Finding>& findings,
                      Finding& f) {
  if (f.fix_removes.empty() && f.fix_options.empty()) return;
  PlanOptions given = plan.options;  // without the default entries make_plan adds
  given.ignore.assign(plan.options.ignore.begin() +
                          static_cast<std::ptrdiff_t>(plan.n_default_ignore),
                      plan.options.ignore.end());
  const PlanOptions changed = apply_fix(std::move(given), f);
  std::map<std::string, std::set<std::string>> before;  // rule -> tensors of its errors
  for (const Finding& g : findings) {
    if (g.severity == Severity::kError) before[g.id].insert(g.tensors.begin(), g.tensors.end());
  }
  std::string stopped;
  try {
    const QuantizePlan again = make_plan(checkpoint, changed);
    for (const Finding& g : lint_all(checkpoint, again, options, /*check_fixes=*/false)) {
      if (g.severity != Severity::kError) continue;
      const auto it = before.find(g.id);
      const bool known =
          it != before.end() && std::all_of(g.tensors.begin(), g.tensors.end(),
                                            [&](const std::string& t) { return it->second.contains(t); });
      if (!known) {
        stopped = fmt::format("{} error: {}", g.id, g.message);
        break;
      }
    }
  } catch (const Error& e) {
    stopped = e.what();
  }
  if (stopped.empty()) return;
  constexpr std::size_t kShown = 200;
  if (stopped.size() > kShown) stopped = stopped.substr(0, kShown) + " ...";
  f.fix = fmt::format("{}; but lint would then stop the run ({})", f.fix, stopped);
  f.fix_removes.clear();
  f.fix_removes_target = false;
  f.fix_ignore.clear();
  f.fix_targets.clear();
  f.fix_options.clear();
}

std::vector<Finding> lint_all(const Checkpoint& checkpoint, const QuantizePlan& plan,
                              const LintOptions& options, bool check_fixes) {
  const LintContext ctx(checkpoint, plan);
  const detail::RolesLint roles(checkpoint, plan);
  const detail::LintRun run{ctx, roles, options};
  std::vector<Finding> findings;
  for (const LintRule& rule : kLintRules) {
    poll_cancel();  // a signal stops a long lint between rules (util/cancel.hpp)
    rule.run(run, findings);
  }
  if (check_fixes) {
    const std::vector<Finding> as_found = findings;
    for (Finding& f : findings) check_option_fix(checkpoint, plan, options, as_found, f);
  }
  return findings;
}

}  // namespace

std::span<const LintRule> lint_rules() { return kLintRules; }

std::vector<Finding> run_lint(const Checkpoint& checkpoint, const QuantizePlan& plan,
                              const LintOptions& options) {
  if (options.tp == 0) throw usage_error("--tp must be at least 1");
  return lint_all(checkpoint, plan, options, /*check_fixes=*/true);
}

bool has_fix(const Finding& f) {
  return !f.fix_removes.empty() || !f.fix_ignore.empty() || !f.fix_targets.empty() ||
         !f.fix_options.empty();
}

PlanOptions apply_fix(PlanOptions given, const Finding& f) {
  if (!f.fix_removes.empty()) {
    if (f.fix_removes_target) {
      for (SchemeGroup& g : given.groups) std::erase(g.targets, f.fix_removes);
    } else {
      std::erase(given.ignore, f.fix_removes);
    }
  }
  for (const std::string& e : f.fix_ignore) {
    if (std::find(given.ignore.begin(), given.ignore.end(), e) == given.ignore.end()) {
      given.ignore.push_back(e);
    }
  }
  if (!f.fix_targets.empty() && !given.groups.empty()) {
    for (const std::string& t : f.fix_targets) given.groups.front().targets.push_back(t);
  }
  for (const std::string& o : f.fix_options) {
    if (o != "--quantize-vision") {
      throw std::logic_error(fmt::format("{}: fix option {} is not one apply_fix knows", f.id, o));
    }
    given.quantize_vision = true;
  }
  return given;
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

std::string findings_summary(const std::vector<Finding>& findings) {
  if (findings.empty()) return "no findings";
  std::size_t counts[3] = {0, 0, 0};
  for (const Finding& f : findings) ++counts[static_cast<int>(f.severity)];
  return fmt::format("{}, {}, {} info", plural(counts[2], "error"), plural(counts[1], "warning"),
                     counts[0]);
}

std::string render_findings_text(const std::vector<Finding>& findings) {
  std::string text = fmt::format("lint: {}\n", findings_summary(findings));
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
