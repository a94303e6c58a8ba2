// What the lint rules of the plan's fates and groups read (LintContext)
// and those rules: L1, L8 and L18 (src/lint/entry_rules.cpp: ignore and
// targets entries) and L3, L4, L5, L6, L9, L10, L11 and L14
// (src/lint/layer_rules.cpp: fused layers, kernels, scheme groups). Private
// to the lint module; each function is the run function (or part of it) of
// its row of lint_rules() (src/lint/lint.cpp), and what it checks is its row
// of docs/cli.md's lint table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ctquant/format/matcher.hpp"
#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant::detail {

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
        weights.push_back(
            LintWeight{d.name, d.module, q, d.rule, t.shape[0], t.shape[1],
                       q ? &plan.group_of(plan.modules[d.modules.front()]) : nullptr});
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

  // The modules entry i of matcher matches, in input order: a literal
  // entry is looked up (decisions_of), so a list of exact names costs
  // linear time.
  std::vector<std::string> modules_matching(const ModuleMatcher& matcher, std::size_t i) const {
    std::vector<std::string> out;
    // Only the targets' "Linear" is a literal that matches "" (every name).
    if (!matcher.is_regex(i) && !matcher.entry_matches(i, "")) {
      if (decisions_of.contains(matcher.entries()[i])) out.push_back(matcher.entries()[i]);
      return out;
    }
    for (const auto& m : modules) {
      if (matcher.entry_matches(i, m)) out.push_back(m);
    }
    return out;
  }
};

// ---- entry_rules.cpp ----

// Whether an entry without `re:` has characters of a regular expression
// ('.' aside, which every dotted name has).
bool looks_like_regex(const std::string& entry);
// L1: the entries of one list (the ignore list, or one group's targets)
// that matched no module the plan could quantize (those that look like a
// regular expression are L18's); group_note, when not empty, is added to
// each message (a group that then quantizes nothing).
void lint_unmatched_entries(const LintContext& ctx, const std::vector<std::string>& entries,
                            const std::vector<std::vector<std::string>>& matches,
                            ModuleMatcher::Role role, const std::string& group_note,
                            std::vector<Finding>& out);
// L18: the entries of one list that look like a regular expression, lack
// `re:` and matched nothing; fixable: the fix may rewrite the entry
// (apply_fix appends targets to the first group only).
void lint_regex_like_entries(const LintContext& ctx, const std::vector<std::string>& entries,
                             const std::vector<std::vector<std::string>>& matches,
                             ModuleMatcher::Role role, bool fixable, std::vector<Finding>& out);
// L8: re: entries of one list that take modules by a prefix of their names.
void lint_prefix_matches(const std::vector<std::string>& entries,
                         const std::vector<std::vector<std::string>>& matches,
                         ModuleMatcher::Role role, std::vector<Finding>& out,
                         const LintContext& ctx);

// ---- layer_rules.cpp ----

void lint_fused_groups(const LintContext& ctx, std::vector<Finding>& out);                // L3
void lint_dflash_qkv(const LintContext& ctx, std::vector<Finding>& out);                  // L4
void lint_kernel_shapes(const LintContext& ctx, unsigned tp, std::vector<Finding>& out);  // L5
void lint_tied_lm_head(const LintContext& ctx, std::vector<Finding>& out);                // L6
void lint_nothing_quantized(const LintContext& ctx, std::vector<Finding>& out);           // L9
void lint_kernel_args(const LintContext& ctx, std::vector<Finding>& out);                 // L10
void lint_group_assignment(const LintContext& ctx, std::vector<Finding>& out);            // L11
void lint_unshared_global_scales(const LintContext& ctx, std::vector<Finding>& out);      // L14

}  // namespace ctquant::detail
