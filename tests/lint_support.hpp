// What the lint tests share: the contract every finding keeps (its rule's
// row and severity, rule order) and every fix keeps (applied, it passes
// lint), checked on each case a lint test builds.
#pragma once

#include <vector>

#include "ctquant/lint/lint.hpp"
#include "ctquant/plan/plan.hpp"
#include "ctquant/source/checkpoint.hpp"

namespace ctquant::test {

// Each finding comes from a rule of lint_rules(), with a severity the rule
// declares, and findings come rule by rule in the table's order.
void expect_findings_follow_the_rule_table(const std::vector<Finding>& findings);

// Every fix lint prints passes ctquant's own lint (see lint_support.cpp).
void expect_fixes_pass_lint(const Checkpoint& checkpoint, const PlanOptions& options,
                            const std::vector<Finding>& findings, unsigned tp);

}  // namespace ctquant::test
