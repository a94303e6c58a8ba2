#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "ctquant/model/fused_groups.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/error.hpp"
#include "lint/lint_context.hpp"
#include "lint/roles_lint.hpp"

namespace ctquant::detail {

// ---- L3: fused layers split between quantized and not ----
namespace {

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

}  // namespace

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
    // Every member is quantized, by more than one scheme group: the "kept"
    // members are those of another group, named in `schemes`.
    bool by_scheme = false;
    std::set<std::string> schemes;
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
    const bool by_scheme = kept.empty();
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
    s.by_scheme = by_scheme;
    for (const SchemeGroup* scheme : schemes) {
      if (scheme != nullptr) s.schemes.insert(scheme->name);
    }
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
      const std::vector<std::string> scheme_names(s.schemes.begin(), s.schemes.end());
      f.fix =
          s.by_scheme
              ? fmt::format(
                    "give them one scheme (the targets of the groups {} take {} apart from {}: "
                    "make one group's targets take all of them) or keep them all in 16 bits ({})",
                    join(scheme_names, 4), join(kept, 8), join(quantized, 8),
                    detail::set_ignore_fix(f, ctx.plan.roles, members))
              : fmt::format(
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
namespace {

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

}  // namespace

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
    const std::vector<ShapeProblem> problems =
        kernel_problems(*d.group, d.module, d.rows, d.cols, row, tp);
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

// ---- L11: modules a reader gives another scheme group ----

// The groups the readers give a module, as text: "'A' (ctquant and
// model_free_ptq, compressed-tensors) but 'B' (vLLM)".
std::string resolution_text(const PlanOptions& o, const GroupResolution& r) {
  const auto name = [&](const std::optional<std::size_t>& g) {
    return g ? fmt::format("'{}'", o.groups[*g].name) : std::string("no group (unquantized)");
  };
  std::vector<std::pair<std::string, std::vector<std::string>>> by_group;
  const auto add = [&](const std::optional<std::size_t>& g, const char* reader) {
    const std::string n = name(g);
    for (auto& [text, readers] : by_group) {
      if (text == n) {
        readers.push_back(reader);
        return;
      }
    }
    by_group.push_back({n, {reader}});
  };
  add(r.model_free, "ctquant and model_free_ptq (which write it)");
  add(r.compressed_tensors, "compressed-tensors (transformers' loader)");
  add(r.vllm, "vLLM");
  std::vector<std::string> parts;
  for (const auto& [text, readers] : by_group) {
    parts.push_back(fmt::format("{} by {}", text, join(readers, 3, " and ")));
  }
  return join(parts, 3, ", but ");
}

void lint_group_assignment(const LintContext& ctx, std::vector<Finding>& out) {
  const PlanOptions& o = ctx.plan.options;
  // One finding per combination of groups, modules in input order.
  using Key = std::tuple<std::optional<std::size_t>, std::optional<std::size_t>,
                         std::optional<std::size_t>>;
  struct Conflicts {
    std::vector<std::string> tensors;
    std::vector<std::string> modules;
  };
  std::map<Key, Conflicts> by_key;
  std::vector<Key> order;
  for (const GroupConflict& c : ctx.plan.group_conflicts) {
    const Key key{c.groups.model_free, c.groups.compressed_tensors, c.groups.vllm};
    auto [it, inserted] = by_key.try_emplace(key);
    if (inserted) order.push_back(key);
    if (std::find(it->second.tensors.begin(), it->second.tensors.end(), c.tensor) ==
        it->second.tensors.end()) {
      it->second.tensors.push_back(c.tensor);
    }
    it->second.modules.push_back(c.module);
  }
  for (const Key& key : order) {
    const Conflicts& c = by_key.at(key);
    const GroupResolution r{std::get<0>(key), std::get<1>(key), std::get<2>(key)};
    Finding f;
    f.id = "L11";
    f.severity = Severity::kError;
    f.tensors = c.tensors;
    // A reader's group that quantizes nothing is not written (L1 says so):
    // the output would then be read consistently, but without the scheme
    // the config gives these modules.
    std::vector<std::string> unwritten;
    for (const auto& g : {r.compressed_tensors, r.vllm}) {
      if (!g || ctx.plan.group_modules[*g] != 0) continue;
      const std::string name = fmt::format("'{}'", o.groups[*g].name);
      if (std::find(unwritten.begin(), unwritten.end(), name) == unwritten.end()) {
        unwritten.push_back(name);
      }
    }
    const std::string outcome =
        unwritten.empty()
            ? std::string(
                  "so the output would be read with a scheme its tensors were not "
                  "written with")
            : fmt::format(
                  "so the config's groups do not say which scheme these modules get: "
                  "quantized with the first group given, they leave {} with no module, "
                  "and ctquant would not write {}",
                  join(unwritten, 2, " and "), unwritten.size() == 1 ? "it" : "them");
    f.message = fmt::format(
        "{} ({}) matched by the targets of more than one scheme group {} read as {}: the readers "
        "resolve overlapping targets differently (compressed-tensors takes an exact name before "
        "any re: pattern, vLLM the first target that names or re:-matches the module, in "
        "config.json's group order, before a class name such as Linear, model_free_ptq the "
        "first group given), {}",
        plural(c.modules.size(), "module"), join(c.modules, 4),
        c.modules.size() == 1 ? "is" : "are", resolution_text(o, r), outcome);
    f.fix =
        "make the groups' targets disjoint: take the modules out of one group's targets (narrow "
        "its patterns, or list exact names), so that every module is matched by one group only";
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
    const bool int_codes = group.weights.type == QuantArgs::Type::kInt;
    if (int_codes && group.weights.num_bits != 4 && group.weights.num_bits != 8) {
      // No group size helps: Marlin and the other wNa16 kernels take 4 and 8.
      f.fix = fmt::format(
          "use 4- or 8-bit codes (num_bits 4 or 8, e.g. --scheme W4A16 or W8A16); {}-bit codes "
          "load in transformers through compressed-tensors, not in vLLM: pass --allow L10 to "
          "write them anyway",
          group.weights.num_bits);
    } else if (int_codes && group.weights.strategy == QuantArgs::Strategy::kGroup) {
      f.fix = "pick a group size vLLM runs (--group-size 32, 64 or 128, or -1 for channel-wise)";
    } else {
      f.fix = "pick a scheme vLLM runs (see `ctquant quantize --help`)";
    }
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

// ---- L9: nothing to quantize ----
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

}  // namespace ctquant::detail
