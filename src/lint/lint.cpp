#include "ctquant/lint/lint.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/model/fused_groups.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/scheme/registry.hpp"
#include "ctquant/util/cancel.hpp"
#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"
#include "lint/lint_context.hpp"
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

// What every rule reads, made once per run.
struct detail::LintRun {
  const detail::LintContext& ctx;
  const RolesLint& roles;
  const LintOptions& options;
};

namespace {

using namespace detail;

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
// A group that quantizes no module is not written to config.json: the L1
// findings of its targets say so, and a group whose targets did match
// modules, all ignored or taken by another group, gets one of its own.
void unmatched_entries(const LintRun& run, std::vector<Finding>& out) {
  const QuantizePlan& plan = run.ctx.plan;
  lint_unmatched_entries(run.ctx, plan.options.ignore, plan.ignore_matches,
                         ModuleMatcher::Role::kIgnore, "", out);
  for (std::size_t g = 0; g < plan.options.groups.size(); ++g) {
    const SchemeGroup& group = plan.options.groups[g];
    // With nothing quantized at all L9 speaks, unless modules are converted
    // (source/converter.hpp): then the run writes them and this group adds
    // nothing.
    // A pure conversion (no scheme asked for) has only the default group,
    // which quantizes nothing by design.
    if (!plan.converted.empty() && !plan.options.scheme_given) continue;
    const bool converting = !plan.converted.empty();
    const bool empty = plan.group_modules[g] == 0 && (plan.n_quantized > 0 || converting);
    const std::string note =
        empty ? fmt::format(
                    "scheme group '{}' then quantizes no module and is not written to "
                    "config.json",
                    group.name)
              : std::string();
    const std::size_t before = out.size();
    lint_unmatched_entries(run.ctx, group.targets, plan.target_matches[g],
                           ModuleMatcher::Role::kTargets, note, out);
    if (!empty) continue;
    // On a converted input the entries' own findings name converted
    // tensors (dropped with drop_converted_findings): this one replaces them.
    if (converting) out.resize(before);
    if (out.size() != before) continue;
    bool regex_like = false;
    std::vector<std::string> matched;
    for (std::size_t i = 0; i < group.targets.size(); ++i) {
      const auto& m = plan.target_matches[g][i];
      regex_like = regex_like || (m.empty() && looks_like_regex(group.targets[i]));
      for (const std::string& module : m) {
        if (std::find(matched.begin(), matched.end(), module) == matched.end()) {
          matched.push_back(module);
        }
      }
    }
    if (!converting && (regex_like || matched.empty())) continue;  // L18 says it
    Finding f;
    f.id = "L1";
    f.severity = Severity::kWarning;
    // On a converted input the finding names no tensor: those of modules
    // the converter keeps would have it dropped (drop_converted_findings).
    for (const std::string& m : matched) {
      if (converting) break;
      if (const TensorDecision* w = run.ctx.weight_of(m)) f.tensors.push_back(w->name);
    }
    const char* const kConverted =
        "converted modules are not requantized, and the converter's ignore list keeps its "
        "modules 16-bit (docs/converters.md)";
    if (matched.empty()) {
      f.message = fmt::format(
          "scheme group '{}' quantizes no module: its targets match only modules the input's "
          "converter takes: {}; it is not written to config.json",
          group.name, kConverted);
    } else {
      f.message = fmt::format(
          "scheme group '{}' quantizes no module: every module its targets match ({}) is "
          "ignored or quantized by another group{}; it is not written to config.json",
          group.name, join(matched, 4), converting ? fmt::format(" ({})", kConverted) : "");
    }
    f.fix = matched.empty()
                ? "remove the group, or name the 16-bit modules in its targets (a name or re: "
                  "target takes a module the converter's ignore list keeps)"
                : "remove the group, or take its modules out of the ignore list and the other "
                  "groups' targets";
    out.push_back(std::move(f));
  }
}

// L18 looks at the same lists.
void regex_like_entries(const LintRun& run, std::vector<Finding>& out) {
  const QuantizePlan& plan = run.ctx.plan;
  lint_regex_like_entries(run.ctx, plan.options.ignore, plan.ignore_matches,
                          ModuleMatcher::Role::kIgnore, /*fixable=*/true, out);
  for (std::size_t g = 0; g < plan.options.groups.size(); ++g) {
    lint_regex_like_entries(run.ctx, plan.options.groups[g].targets, plan.target_matches[g],
                            ModuleMatcher::Role::kTargets, /*fixable=*/g == 0, out);
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
// are listed in (not quite the ids' order: L18 beside L1, which looks at
// the same entries; L10 and L11 before L9, L14 before L12). What each
// checks is docs/cli.md's lint table, the row at its anchor
// (tests/test_lint.cpp checks ids, severities and anchors against it).
constexpr LintRule kLintRules[] = {
    {"L1", kWarning, kInfo, "entry matched no module", "lint-l1", unmatched_entries},
    {"L18", kError, kOnly, "regular expression without re:", "lint-l18", regex_like_entries},
    {"L2", kError, kInfo, "literal ignore entry vLLM does not match", "lint-l2",
     on_roles<&RolesLint::literal_entries>},
    {"L3", kError, kOnly, "fused layer split", "lint-l3", on_context<lint_fused_groups>},
    {"L4", kError, kOnly, "DFlash qkv_proj quantized", "lint-l4", on_context<lint_dflash_qkv>},
    {"L5", kError, kWarning, "shard shape the vLLM kernel cannot run", "lint-l5", kernel_shapes},
    {"L6", kError, kWarning, "tied lm_head", "lint-l6", on_context<lint_tied_lm_head>},
    {"L7", kError, kOnly, "stacked experts vLLM would not load", "lint-l7",
     on_roles<&RolesLint::stacked_experts>},
    {"L8", kInfo, kOnly, "re: entry matching by a prefix", "lint-l8", prefix_matches},
    {"L10", kError, kOnly, "scheme no vLLM kernel runs", "lint-l10", on_context<lint_kernel_args>},
    {"L11", kError, kOnly, "module the readers give another scheme group", "lint-l11",
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
    {"L19", kError, kWarning, "no config.json, or one naming no architecture", "lint-l19",
     on_roles<&RolesLint::missing_config>},
    {"L20", kWarning, kOnly, "decoder layers config.json declares are missing", "lint-l20",
     on_roles<&RolesLint::missing_layers>},
};

std::vector<Finding> lint_all(const Checkpoint& checkpoint, const QuantizePlan& plan,
                              const LintOptions& options, bool check_fixes);

// The first error that planning and linting `changed` brings and the run
// did not have (a tensor of an error of the same rule), or "".
std::string new_error(const Checkpoint& checkpoint, const LintOptions& options,
                      const std::vector<Finding>& findings, const PlanOptions& changed) {
  std::map<std::string, std::set<std::string>> before;  // rule -> tensors of its errors
  for (const Finding& g : findings) {
    if (g.severity == Severity::kError) before[g.id].insert(g.tensors.begin(), g.tensors.end());
  }
  try {
    const QuantizePlan again = make_plan(checkpoint, changed);
    for (const Finding& g : lint_all(checkpoint, again, options, /*check_fixes=*/false)) {
      if (g.severity != Severity::kError) continue;
      const auto it = before.find(g.id);
      const bool known = it != before.end() &&
                         std::all_of(g.tensors.begin(), g.tensors.end(),
                                     [&](const std::string& t) { return it->second.contains(t); });
      if (!known) return fmt::format("{} error: {}", g.id, g.message);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// The options the user gave (without the default entries make_plan adds).
PlanOptions given_options(const QuantizePlan& plan) {
  PlanOptions given = plan.options;
  given.ignore.assign(
      plan.options.ignore.begin() + static_cast<std::ptrdiff_t>(plan.n_default_ignore),
      plan.options.ignore.end());
  return given;
}

// Whether taking all these entries out at once brings no new error.
bool check_removals_fix(const Checkpoint& checkpoint, const QuantizePlan& plan,
                        const LintOptions& options, const std::vector<Finding>& findings,
                        const std::vector<std::string>& ignore,
                        const std::vector<std::string>& targets) {
  PlanOptions changed = given_options(plan);
  const std::unordered_set<std::string> out_ignore(ignore.begin(), ignore.end());
  const std::unordered_set<std::string> out_targets(targets.begin(), targets.end());
  std::erase_if(changed.ignore, [&](const std::string& e) { return out_ignore.contains(e); });
  for (SchemeGroup& g : changed.groups) {
    std::erase_if(g.targets, [&](const std::string& e) { return out_targets.contains(e); });
  }
  return new_error(checkpoint, options, findings, changed).empty();
}

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
  PlanOptions given = given_options(plan);
  std::string stopped = new_error(checkpoint, options, findings, apply_fix(std::move(given), f));
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

// The rules read the plan's own groups; a converted module
// (source/converter.hpp) is written with its converter's group, which the
// rules do not see: their findings on its consumed tensors alone, and L9
// when modules are converted, do not apply. (A fused layer split between a
// converted and a newly quantized scheme is refused by make_plan.)
void drop_converted_findings(const Checkpoint& checkpoint, const QuantizePlan& plan,
                             std::vector<Finding>& findings) {
  if (!plan.source_format) return;
  std::unordered_set<std::string> consumed;
  for (const ConvertedModule& m : plan.converted) {
    for (const TensorLocation& at : m.consumed) consumed.insert(checkpoint.entry(at).name);
  }
  // A module the converter's ignore list keeps is written ignored.
  const ModuleMatcher converter_ignore(plan.source_format->ignore, ModuleMatcher::Role::kIgnore);
  const auto settled = [&](const std::string& tensor) {
    return consumed.contains(tensor) || converter_ignore.first_match(module_of(tensor));
  };
  std::erase_if(findings, [&](const Finding& f) {
    if (f.id == "L9") return plan.n_converted > 0;
    return !f.tensors.empty() && std::all_of(f.tensors.begin(), f.tensors.end(), settled);
  });
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
  drop_converted_findings(checkpoint, plan, findings);
  if (check_fixes) {
    const std::vector<Finding> as_found = findings;
    // Fixes that only take an entry out are checked together first, with
    // one plan and lint (a list of N unmatched entries would otherwise be
    // planned N times): when all of them out bring no new error, each is
    // kept; otherwise each is checked alone.
    std::size_t n_removals = 0;
    const auto removal_only = [](const Finding& f) {
      return !f.fix_removes.empty() && f.fix_ignore.empty() && f.fix_targets.empty() &&
             f.fix_options.empty();
    };
    std::vector<std::string> removed_ignore;
    std::vector<std::string> removed_targets;
    for (const Finding& f : findings) {
      if (!removal_only(f)) continue;
      ++n_removals;
      (f.fix_removes_target ? removed_targets : removed_ignore).push_back(f.fix_removes);
    }
    bool removals_pass = false;
    if (n_removals > 1) {
      removals_pass =
          check_removals_fix(checkpoint, plan, options, as_found, removed_ignore, removed_targets);
    }
    for (Finding& f : findings) {
      if (removals_pass && removal_only(f)) continue;
      check_option_fix(checkpoint, plan, options, as_found, f);
    }
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
