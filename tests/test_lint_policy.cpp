// Which lint findings stop quantize, rule by rule (job/lint_policy.hpp):
// --allow RULE and --error RULE beside --strict and --allow-unloadable, as
// compilers refine -Werror with -Wno-error=X and -Werror=X; on the README's
// DFlash sample, whose L16 advice made --strict unusable; the switches'
// place in docs/cli.md.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ctquant/job/lint_policy.hpp"
#include "ctquant/util/error.hpp"
#include "test_support.hpp"

namespace ctquant::test {
namespace {

namespace fs = std::filesystem;

Finding finding(const char* id, Severity severity) {
  Finding f;
  f.id = id;
  f.severity = severity;
  f.message = std::string(id) + " found";
  return f;
}

std::vector<std::string> blocking_ids(const std::vector<Finding>& findings,
                                      const LintPolicy& policy) {
  std::vector<std::string> ids;
  for (const Finding* f : blocking_findings(findings, policy)) ids.push_back(f->id);
  return ids;
}

TEST(LintRuleSwitches, AllowAndErrorRefineTheSeverityRulesRuleByRule) {
  const std::vector<Finding> findings = {
      finding("L4", Severity::kError), finding("L5", Severity::kError),
      finding("L15", Severity::kWarning), finding("L16", Severity::kWarning),
      finding("L8", Severity::kInfo)};
  using V = std::vector<std::string>;
  EXPECT_EQ(blocking_ids(findings, make_lint_policy(false, false, {}, {})), (V{"L4", "L5"}));
  EXPECT_EQ(blocking_ids(findings, make_lint_policy(true, false, {}, {})),
            (V{"L4", "L5", "L15", "L16"}));
  // -Wno-error=L16: advice passes, every other warning still stops the run.
  EXPECT_EQ(blocking_ids(findings, make_lint_policy(true, false, {"L16"}, {})),
            (V{"L4", "L5", "L15"}));
  // An error rule allowed alone: --allow-unloadable for that rule only.
  EXPECT_EQ(blocking_ids(findings, make_lint_policy(false, false, {"L5"}, {})), (V{"L4"}));
  // -Werror=L15, -Werror=L8: those stop the run without --strict, infos too.
  EXPECT_EQ(blocking_ids(findings, make_lint_policy(false, false, {}, {"L15", "L8"})),
            (V{"L4", "L5", "L15", "L8"}));
  // --error overrides --allow-unloadable for its rule.
  EXPECT_EQ(blocking_ids(findings, make_lint_policy(false, true, {}, {"L4"})), (V{"L4"}));
}

TEST(LintRuleSwitches, RulesAreTakenCommaSeparatedAndInAnyCase) {
  const LintPolicy p = make_lint_policy(true, false, {"l16,L15", "L1"}, {"l8"});
  EXPECT_EQ(p.allow, (std::set<std::string>{"L1", "L15", "L16"}));
  EXPECT_EQ(p.error, (std::set<std::string>{"L8"}));
}

TEST(LintRuleSwitches, UnknownRuleIsAUsageErrorListingTheRules) {
  try {
    make_lint_policy(false, false, {"L99"}, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    expect_message(e.what(), {"--allow 'L99': not a lint rule", "L1, L2, L3", "L17, L18, L19"});
  }
  try {
    make_lint_policy(false, false, {}, {"W16"});
    FAIL() << "no error";
  } catch (const Error& e) {
    expect_message(e.what(), {"--error 'W16': not a lint rule"});
  }
}

TEST(LintRuleSwitches, RuleBothAllowedAndErrorIsAUsageError) {
  try {
    make_lint_policy(true, false, {"L16"}, {"l16"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    expect_message(e.what(), {"--allow L16 and --error L16"});
  }
}

// The README's sample: a default run warns L16 (the draft's fc, which
// SGLang reads unpacked); --strict used to fail on it every time.
TEST(LintRuleSwitches, StrictAllowL16WritesTheDFlashSample) {
  const fs::path input = golden_dir() / "dflash-bf16-sharded" / "input";
  TempDir tmp;
  const CommandResult strict =
      run_ctquant({"quantize", input.string(), (tmp / "strict").string(), "--strict"});
  EXPECT_EQ(strict.exit_code, 1) << strict.err;
  expect_message(strict.err, {"lint stopped quantize; nothing was written", "L16 warning",
                              "1 finding stops the run (--strict makes warnings stop it)",
                              "let this warning pass with --allow L16 (or drop --strict)"});
  EXPECT_FALSE(fs::exists(tmp / "strict"));

  const CommandResult allowed = run_ctquant(
      {"quantize", input.string(), (tmp / "allowed").string(), "--strict", "--allow", "L16"});
  EXPECT_EQ(allowed.exit_code, 0) << allowed.err;
  expect_message(allowed.err, {"ctquant: warning: L16: ", "ctquant: done: 9 tensors quantized"});
  EXPECT_TRUE(fs::exists(tmp / "allowed" / "config.json"));
}

TEST(LintRuleSwitches, ErrorL1StopsAMistypedIgnoreEntryWithoutStrict) {
  const fs::path input = golden_dir() / "dflash-bf16-sharded" / "input";
  TempDir tmp;
  const std::vector<std::string> args = {"quantize", input.string(), (tmp / "out").string(),
                                         "--ignore", "layers.0.mlp.up_prj"};
  const CommandResult plain = run_ctquant(args);
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  fs::remove_all(tmp / "out");
  std::vector<std::string> with_error = args;
  with_error.insert(with_error.end(), {"--error", "L1", "--allow", "L16"});
  const CommandResult r = run_ctquant(with_error);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_message(r.err,
                 {"L1 warning", "layers.0.mlp.up_prj", "(--error L1 makes its finding stop it)",
                  "drop --error L1"},
                 {"L16 warning"});
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(LintRuleSwitches, BadRuleOnTheCommandLineExitsTwo) {
  TempDir tmp;
  const CommandResult r =
      run_ctquant({"quantize", (golden_dir() / "dflash-bf16-sharded" / "input").string(),
                   (tmp / "out").string(), "--allow", "L16,L42"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  expect_message(r.err, {"--allow 'L42': not a lint rule"});
}

// docs/cli.md documents the switches in its lint section, beside the rule
// table, and in the options table.
TEST(LintRuleSwitches, SwitchesAreDocumentedBesideTheRuleTable) {
  const std::string doc = read_file(fs::path(CTQUANT_DOCS_DIR) / "cli.md");
  const std::size_t lint = doc.find("### Lint");
  ASSERT_NE(lint, std::string::npos);
  const std::size_t table = doc.find("| id | severity |", lint);
  ASSERT_NE(table, std::string::npos);
  const std::string section = doc.substr(lint, table - lint);
  expect_message(
      section, {"`--allow ID`", "`--error ID`", "-Wno-error=", "-Werror=", "--strict --allow L16"});
  expect_message(doc, {"| `--allow ID` |", "| `--error ID` |"});
}

}  // namespace
}  // namespace ctquant::test
