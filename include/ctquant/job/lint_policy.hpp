// Which lint findings stop `quantize`, rule by rule.
//
// By severity (lint.hpp): errors stop the run unless allow_unloadable,
// warnings only under strict, infos never. As compilers refine -Werror with
// -Wno-error=X and -Werror=X, a rule can be taken out of that or put into
// it: `--allow ID` (its findings never stop the run: under --strict, advice
// such as L16 can pass while every other warning stops it; an error rule so
// named is let through like --allow-unloadable, for that rule only) and
// `--error ID` (its findings always stop the run, warnings and infos too).
// Findings that do not stop the run are still logged at their severity.
// docs/cli.md ("Lint") documents the switches beside the rule table.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "ctquant/lint/lint.hpp"

namespace ctquant {

struct LintPolicy {
  bool strict = false;            // warnings stop the run
  bool allow_unloadable = false;  // errors do not stop the run
  std::set<std::string> allow;    // rule ids ("L16") whose findings never stop the run
  std::set<std::string> error;    // rule ids whose findings always stop the run
};

// The policy of the options: each id of allow and error (repeatable, or
// comma-separated "L15,L16"; "l16" is taken as "L16") must be a rule of
// lint_rules(), and none may be in both. Throws Error{kUsage} naming the
// option, the id and the rules there are.
LintPolicy make_lint_policy(bool strict, bool allow_unloadable,
                            const std::vector<std::string>& allow,
                            const std::vector<std::string>& error);

// Whether the finding stops the run under the policy.
bool stops_run(const Finding& finding, const LintPolicy& policy);

// The findings that stop the run, in order. Pointers into findings.
std::vector<const Finding*> blocking_findings(const std::vector<Finding>& findings,
                                              const LintPolicy& policy);

// The sentence that ends the message of a run lint stopped: how many
// findings stop it and what would let each kind pass (the fixes, and the
// switch that lets it through: --allow-unloadable, --allow ID, dropping
// --strict or --error ID).
std::string lint_stop_advice(const std::vector<const Finding*>& blocking, const LintPolicy& policy);

}  // namespace ctquant
