#include "lint_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "ctquant/util/error.hpp"

namespace ctquant::test {

// Every fix lint prints passes ctquant's own lint. The machine form of each
// fix names what the printed fix says (each entry as `--ignore 'E'`, each
// option), and every printed `--ignore '...'` or `--targets '...'` has a
// machine form. Applied alone to the options that printed it, a fix leads
// into no error-level finding the first run did not have: every tensor of
// an error after the fix was in an error of the same rule before (rules
// regroup tensors), and the fix's own finding, when an error, is gone.
// Each finding comes from a rule of lint_rules(), with a severity the rule
// declares, and findings come rule by rule in the table's order.
void expect_findings_follow_the_rule_table(const std::vector<Finding>& findings) {
  std::size_t last = 0;
  for (const Finding& f : findings) {
    const auto rules = lint_rules();
    const auto rule =
        std::find_if(rules.begin(), rules.end(), [&](const LintRule& r) { return r.id == f.id; });
    ASSERT_NE(rule, rules.end()) << f.id;
    EXPECT_TRUE(f.severity == rule->severity || (rule->also && f.severity == *rule->also))
        << format_finding(f);
    const std::size_t at = static_cast<std::size_t>(rule - rules.begin());
    EXPECT_GE(at, last) << f.id << " after a finding of a later rule";
    last = at;
  }
}

void expect_fixes_pass_lint(const Checkpoint& checkpoint, const PlanOptions& options,
                            const std::vector<Finding>& findings, unsigned tp) {
  expect_findings_follow_the_rule_table(findings);
  std::map<std::string, std::set<std::string>> errors_before;  // rule -> tensors
  for (const Finding& f : findings) {
    if (f.severity != Severity::kError) continue;
    errors_before[f.id].insert(f.tensors.begin(), f.tensors.end());
  }
  const auto is_new = [&](const Finding& g) {
    const auto it = errors_before.find(g.id);
    if (it == errors_before.end()) return true;
    return std::any_of(g.tensors.begin(), g.tensors.end(),
                       [&](const std::string& t) { return !it->second.contains(t); });
  };
  for (const Finding& f : findings) {
    SCOPED_TRACE(format_finding(f));
    for (const std::string& e : f.fix_ignore) {
      EXPECT_NE(f.fix.find("--ignore '" + e + "'"), std::string::npos);
    }
    for (const std::string& e : f.fix_targets) {
      EXPECT_NE(f.fix.find("--targets '" + e + "'"), std::string::npos);
    }
    for (const std::string& o : f.fix_options) EXPECT_NE(f.fix.find(o), std::string::npos);
    if (!has_fix(f)) {
      // A fix lint found would lead into an error says so, and has no
      // machine form; any other printed entry has one.
      if (f.fix.find("; but lint would then stop the run (") == std::string::npos) {
        EXPECT_EQ(f.fix.find("--ignore '"), std::string::npos)
            << "a printed entry, no machine form";
        EXPECT_EQ(f.fix.find("--targets '"), std::string::npos)
            << "a printed entry, no machine form";
      }
      continue;
    }
    const PlanOptions fixed = apply_fix(options, f);
    QuantizePlan plan;
    try {
      plan = make_plan(checkpoint, fixed);
    } catch (const Error& e) {
      ADD_FAILURE() << "after the fix, the plan is refused: " << e.what();
      continue;
    }
    for (const Finding& g : run_lint(checkpoint, plan, LintOptions{tp})) {
      // L9 (nothing left to quantize) only says that the layout has no
      // other module than the ones a "keep them in 16 bits" fix keeps.
      if (g.severity != Severity::kError || g.id == "L9") continue;
      EXPECT_FALSE(is_new(g)) << "after the fix, " << format_finding(g);
      if (f.severity == Severity::kError && g.id == f.id) {
        EXPECT_FALSE(g.tensors == f.tensors)
            << "the fix leaves its own error: " << format_finding(g);
      }
    }
  }
}

}  // namespace ctquant::test
