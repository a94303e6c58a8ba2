#include "ctquant/job/lint_policy.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "ctquant/util/error.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

namespace {

std::string rule_ids() {
  std::vector<std::string> ids;
  for (const LintRule& rule : lint_rules()) ids.emplace_back(rule.id);
  std::sort(ids.begin(), ids.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return join(ids, ids.size());
}

// The ids of one option, split at commas, upper-cased and checked.
std::set<std::string> rule_set(const std::vector<std::string>& given, const char* option) {
  std::set<std::string> out;
  for (const std::string& item : given) {
    std::size_t start = 0;
    while (start <= item.size()) {
      const std::size_t comma = std::min(item.find(',', start), item.size());
      const std::string id = upper(item.substr(start, comma - start));
      start = comma + 1;
      const auto rules = lint_rules();
      if (std::none_of(rules.begin(), rules.end(), [&](const LintRule& r) { return r.id == id; })) {
        throw usage_error(fmt::format("{} '{}': not a lint rule (rules: {}; docs/cli.md, \"Lint\")",
                                      option, id, rule_ids()));
      }
      out.insert(id);
    }
  }
  return out;
}

// "L15, L16" of the findings' rules, each once, in order.
std::string ids_of(const std::vector<const Finding*>& findings) {
  std::vector<std::string> ids;
  for (const Finding* f : findings) {
    if (std::find(ids.begin(), ids.end(), f->id) == ids.end()) ids.push_back(f->id);
  }
  return join(ids, ids.size());
}

}  // namespace

LintPolicy make_lint_policy(bool strict, bool allow_unloadable,
                            const std::vector<std::string>& allow,
                            const std::vector<std::string>& error) {
  LintPolicy policy;
  policy.strict = strict;
  policy.allow_unloadable = allow_unloadable;
  policy.allow = rule_set(allow, "--allow");
  policy.error = rule_set(error, "--error");
  for (const std::string& id : policy.allow) {
    if (policy.error.contains(id)) {
      throw usage_error(fmt::format(
          "--allow {0} and --error {0}: a rule's findings either stop the run or do not; give "
          "one of them",
          id));
    }
  }
  return policy;
}

bool stops_run(const Finding& finding, const LintPolicy& policy) {
  if (policy.allow.contains(finding.id)) return false;
  if (policy.error.contains(finding.id)) return true;
  switch (finding.severity) {
    case Severity::kError:
      return !policy.allow_unloadable;
    case Severity::kWarning:
      return policy.strict;
    case Severity::kInfo:
      return false;
  }
  return false;
}

std::vector<const Finding*> blocking_findings(const std::vector<Finding>& findings,
                                              const LintPolicy& policy) {
  std::vector<const Finding*> out;
  for (const Finding& f : findings) {
    if (stops_run(f, policy)) out.push_back(&f);
  }
  return out;
}

std::string lint_stop_advice(const std::vector<const Finding*>& blocking,
                             const LintPolicy& policy) {
  std::vector<const Finding*> errors;    // by severity
  std::vector<const Finding*> warnings;  // by --strict
  std::vector<const Finding*> named;     // by --error ID
  for (const Finding* f : blocking) {
    if (policy.error.contains(f->id)) {
      named.push_back(f);
    } else if (f->severity == Severity::kError) {
      errors.push_back(f);
    } else {
      warnings.push_back(f);
    }
  }
  std::vector<std::string> ways;
  if (!errors.empty()) {
    const std::string ids = ids_of(errors);
    ways.push_back(fmt::format(
        "pass --allow-unloadable (or --allow {} for {} alone) to write a checkpoint vLLM may "
        "refuse",
        ids, ids.find(',') == std::string::npos ? "this rule" : "these rules"));
  }
  if (!warnings.empty()) {
    ways.push_back(fmt::format("let {} pass with --allow {} (or drop --strict)",
                               warnings.size() == 1 ? "this warning" : "these warnings",
                               ids_of(warnings)));
  }
  if (!named.empty()) ways.push_back(fmt::format("drop --error {}", ids_of(named)));
  std::string why;
  if (!warnings.empty()) why = " (--strict makes warnings stop it)";
  if (!named.empty()) {
    why += fmt::format(" ({} makes {} stop it)", fmt::format("--error {}", ids_of(named)),
                       named.size() == 1 ? "its finding" : "their findings");
  }
  std::string text = fmt::format(
      "{} the run{}. Apply the fixes above",
      blocking.size() == 1 ? "1 finding stops" : plural(blocking.size(), "finding") + " stop", why);
  for (std::size_t i = 0; i < ways.size(); ++i) {
    text += (i + 1 == ways.size() ? ", or " : ", ") + ways[i];
  }
  return text + ".";
}

}  // namespace ctquant
