// Lint: checks of a quantization plan against what vLLM can load, run before
// anything is written.
//
// run_lint() looks at the checkpoint's headers and config.json and at the
// plan (each tensor's fate, the modules each ignore and targets entry
// matched) and returns findings. Each finding has an id (L1..L19), a
// severity, the tensors concerned, what was found and the fix. The rules are
// the rows of lint_rules(); what each one checks, its severities and its
// usual fix are written once, in docs/cli.md's lint table (each row's
// anchor is LintRule::anchor). The reasons behind them are section 7 of the
// format spec.
//
// Whether findings stop `quantize` is decided by blocking_findings(): errors
// unless allow_unloadable, warnings under strict; infos never.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/source/checkpoint.hpp"
#include "ctquant/format/matcher.hpp"
#include "ctquant/plan/plan.hpp"

namespace ctquant {

enum class Severity { kInfo, kWarning, kError };

// "info", "warning", "error".
const char* severity_name(Severity severity);

struct Finding {
  std::string id;  // "L1" .. "L20"
  Severity severity = Severity::kWarning;
  std::vector<std::string> tensors;  // input tensors concerned (may be empty for L1)
  std::string message;               // what was found, naming entries, tensors and shapes
  std::string fix;                   // what to change, usually an --ignore entry to add
  // The fix as a change of the command line, when `fix` is one (it names
  // the same entries): --ignore entries to add, and an entry of the ignore
  // list (or, with fix_removes_target, of the targets) to take out; a fix
  // that rewrites an entry does both. Applied, it passes lint: no error
  // remains of this finding, and none of another (tests/test_lint.cpp).
  std::vector<std::string> fix_ignore;
  std::string fix_removes;
  bool fix_removes_target = false;
  std::vector<std::string> fix_targets;  // --targets entries that replace fix_removes
  std::vector<std::string> fix_options;  // options without a value to add ("--quantize-vision")
};

struct LintOptions {
  unsigned tp = 1;  // tensor-parallel degree the checkpoint will be served with (L5)
};

// L15 warns when less than this share of the linear layers' weight
// parameters (QuantizePlan::linear_params) would be quantized. Default runs
// of dense and MoE models quantize nearly all of them (routers are tiny),
// DFlash drafts, whose qkv_proj stays in 16 bits, 81% (Laguna's layout) to
// 88% (Qwen3-8B's); a model whose vision tower, experts or ignore entries
// keep a fifth or more in 16 bits is told why.
inline constexpr double kMinQuantizedShare = 0.80;

// Tensor-parallel degrees L5 tries when it lists the ones that work.
inline constexpr unsigned kLintTpDegrees[] = {1, 2, 4, 8};

namespace detail {
struct LintRun;  // what the rules read, made once per run (src/lint/lint.cpp)
}

// One lint rule, a row of lint_rules(), in the manner of clang-tidy's
// registerCheck: its id, its severities, a title, where docs/cli.md
// describes it, and the function that checks it.
struct LintRule {
  std::string_view id;             // "L1" .. "L20"
  Severity severity;               // of its findings
  std::optional<Severity> also;    // a second severity some of its findings have, or none
  std::string_view title;          // what it finds, in a few words
  std::string_view anchor;         // docs/cli.md#<anchor>: its row of the lint table
  void (*run)(const detail::LintRun& run, std::vector<Finding>& out);  // appends its findings
};

// Every rule, in the order run_lint runs them (the order findings come in).
// Static storage; never throws.
std::span<const LintRule> lint_rules();

// Runs every rule of lint_rules() on a plan made from checkpoint. Pure:
// reads headers and config.json only, writes nothing. Findings come rule by
// rule, in the table's order, each listing its tensors in input order. Throws Error{kUsage} only if
// options.tp is 0.
std::vector<Finding> run_lint(const Checkpoint& checkpoint, const QuantizePlan& plan,
                              const LintOptions& options);

// Whether the finding's fix has a machine form (any fix_* field set).
bool has_fix(const Finding& f);

// The options the finding's fix gives, applied as the command line would
// apply it to `given` (the options as given, without the default entries
// make_plan adds): fix_removes taken out of the ignore list (with
// fix_removes_target, out of every group's targets), each fix_ignore entry
// appended to the ignore list unless there, fix_targets appended to the
// first group's targets, fix_options set. Throws std::logic_error for a
// fix option it does not know (only "--quantize-vision" exists).
PlanOptions apply_fix(PlanOptions given, const Finding& f);

// The findings that stop quantize: severity error unless allow_unloadable,
// severity warning when strict. Pointers into findings.
std::vector<const Finding*> blocking_findings(const std::vector<Finding>& findings, bool strict,
                                              bool allow_unloadable);

// One finding as text: "L5 warning: <message>\n  tensors: a, b\n  fix: <fix>"
// (tensor lists longer than max_tensors are cut with "... and N more"; without
// the severity word when with_severity is false, for log lines that carry it).
std::string format_finding(const Finding& finding, std::size_t max_tensors = 8,
                           bool with_severity = true);

// All findings as text, one block per finding, or "lint: no findings\n".
std::string render_findings_text(const std::vector<Finding>& findings);

// Their count by severity, as the first line of render_findings_text says
// it without "lint: ": "no findings" or "1 error, 2 warnings, 0 info".
std::string findings_summary(const std::vector<Finding>& findings);

// [{"id", "severity", "tensors", "message", "fix"}, ...]
nlohmann::json findings_json(const std::vector<Finding>& findings);

// Whether vLLM prefixes this checkpoint's module names at load time: a DFlash
// draft (architectures containing "DFlash", or a dflash_config), or a
// checkpoint with `layers.` tensors and no `model.` prefix on any tensor
// (section 7 of the format spec).
bool names_prefixed_at_load(const Checkpoint& checkpoint);

// Whether config.json describes a DFlash draft.
bool is_dflash_draft(const Checkpoint& checkpoint);

}  // namespace ctquant
