#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "ctquant/model/vllm_match.hpp"
#include "ctquant/util/error.hpp"
#include "lint/lint_context.hpp"
#include "lint/roles_lint.hpp"

namespace ctquant::detail {

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

// The modules whose names contain a word, found through the distinct
// [A-Za-z0-9_] runs of the names (few: the layer numbers and the
// components), each word's answer kept: a list of N entries costs O(N)
// lookups, not O(N x modules) substring searches.
class WordIndex {
 public:
  explicit WordIndex(const std::vector<std::string>& modules) : modules_(modules) {
    for (std::size_t m = 0; m < modules.size(); ++m) {
      const std::string& name = modules[m];
      std::size_t i = 0;
      while (i < name.size()) {
        if (!is_word(name[i])) {
          ++i;
          continue;
        }
        std::size_t j = i;
        while (j < name.size() && is_word(name[j])) ++j;
        auto& list = runs_[name.substr(i, j - i)];
        if (list.empty() || list.back() != m) list.push_back(m);
        i = j;
      }
    }
  }
  // The modules whose names contain word (made of [A-Za-z0-9_]), in input
  // order.
  const std::vector<std::string>& containing(const std::string& word) {
    const auto cached = cache_.find(word);
    if (cached != cache_.end()) return cached->second;
    std::vector<std::size_t> hits;
    for (const auto& [run, list] : runs_) {
      if (run.find(word) != std::string::npos) hits.insert(hits.end(), list.begin(), list.end());
    }
    std::sort(hits.begin(), hits.end());
    hits.erase(std::unique(hits.begin(), hits.end()), hits.end());
    std::vector<std::string> out;
    out.reserve(hits.size());
    for (const std::size_t m : hits) out.push_back(modules_[m]);
    return cache_.emplace(word, std::move(out)).first->second;
  }

 private:
  static bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
  const std::vector<std::string>& modules_;
  std::unordered_map<std::string, std::vector<std::size_t>> runs_;
  std::unordered_map<std::string, std::vector<std::string>> cache_;
};

}  // namespace

ModuleNameIndex::ModuleNameIndex(const std::vector<std::string>& modules) {
  for (std::size_t i = 0; i < modules.size(); ++i) position.try_emplace(modules[i], i);
  for (const std::string& m : modules) {
    for (std::size_t dot = m.find('.'); dot != std::string::npos; dot = m.find('.', dot + 1)) {
      by_suffix[m.substr(dot + 1)].push_back(m);
    }
  }
}

bool looks_like_regex(const std::string& entry) {
  // '.' aside: every dotted module name has one.
  return !regex_pattern(entry) && entry.find_first_of("*+?[](){}|^$\\") != std::string::npos;
}

bool regex_like_unmatched(const std::string& entry, const std::vector<std::string>& matches) {
  return matches.empty() && looks_like_regex(entry);
}

// A targets entry's finding when its group then quantizes nothing: the
// group is not written (plan_quantization_config), which a warning says.
void with_group_note(Finding& f, const std::string& group_note) {
  if (group_note.empty()) return;
  f.message += "; " + group_note;
  if (f.severity == Severity::kInfo) f.severity = Severity::kWarning;
}

// The names vLLM probes to decide each MoE layer's scheme.
std::set<std::string> moe_probe_names(const RoleAnalysis& roles) {
  std::set<std::string> out;
  for (const ModuleInfo& m : roles.modules) {
    if (m.role != ModuleRole::kExpert && m.role != ModuleRole::kStackedExperts) continue;
    for (std::string& probe : VllmLoadRules::moe_probes(m.vllm_layer)) out.insert(std::move(probe));
  }
  return out;
}

// ---- L1: entries that matched nothing ----
void lint_unmatched_entries(const LintContext& ctx, const std::vector<std::string>& entries,
                            const std::vector<std::vector<std::string>>& matches,
                            ModuleMatcher::Role role, const std::string& group_note,
                            std::vector<Finding>& out) {
  const char* what = role == ModuleMatcher::Role::kIgnore ? "ignore" : "targets";
  // The default entries were not written by the user (the default ignore
  // entries are made from the modules they keep; a file with nothing to
  // quantize is L9's).
  if (role == ModuleMatcher::Role::kTargets && entries == kDefaultTargets) return;
  const std::size_t first_given =
      role == ModuleMatcher::Role::kIgnore ? ctx.plan.n_default_ignore : 0;
  const auto unmatched = [&](std::size_t i) { return i >= matches.size() || matches[i].empty(); };
  bool any = false;
  for (std::size_t i = first_given; i < entries.size() && !any; ++i) any = unmatched(i);
  if (!any) return;
  const ModuleMatcher matcher(entries, role);
  const ModuleNameIndex names(ctx.modules);
  WordIndex words(ctx.modules);
  // A group's only targets entry cannot simply go: its fix is to correct it.
  const bool removable = role == ModuleMatcher::Role::kIgnore || entries.size() > 1;
  std::optional<std::set<std::string>> probes;  // moe_probe_names, when first needed
  for (std::size_t i = first_given; i < entries.size(); ++i) {
    if (!unmatched(i)) continue;
    const std::string& entry = entries[i];
    if (looks_like_regex(entry)) continue;  // L18's
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
      with_group_note(f, group_note);
      out.push_back(std::move(f));
      continue;
    }
    // A name vLLM probes to decide a MoE layer's scheme
    // (VllmLoadRules::moe_probes: <layer>.0.gate_proj / up_proj / down_proj,
    // vLLM's names of experts the checkpoint calls w1 / w3 / w2) matches no
    // module of the checkpoint, but vLLM reads it: the entry is needed.
    if (!probes) probes = moe_probe_names(ctx.plan.roles);
    if (!matcher.is_regex(i) && probes->contains(entry)) continue;
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
    static const std::vector<std::string> kNone;
    const std::vector<std::string>& near = word.empty() ? kNone : words.containing(word);
    // The tensors of the near misses the message shows (not of every module
    // containing the word: N entries x every layer would be quadratic).
    for (std::size_t k = 0; k < near.size() && k < kMaxNearMisses; ++k) {
      if (const TensorDecision* w = ctx.weight_of(near[k])) f.tensors.push_back(w->name);
    }
    if (removable) {
      f.fix_removes = entry;
      f.fix_removes_target = role == ModuleMatcher::Role::kTargets;
    }
    if (const auto hint = detail::entry_near_miss(ctx.plan, names, entry, what)) {
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
      // The first such module in input order, found through the index (a
      // module that is a dotted suffix of the entry, or has the entry as
      // one), not by a search of every near miss.
      const std::string* prefixed = nullptr;
      std::size_t at = 0;
      const auto consider = [&](const std::string& m) {
        const auto it = names.position.find(m);
        if (it == names.position.end() || m.find(word) == std::string::npos) return;
        if (prefixed == nullptr || it->second < at) {
          prefixed = &it->first;
          at = it->second;
        }
      };
      if (!regex_pattern(entry)) {
        for (std::size_t dot = entry.find('.'); dot != std::string::npos;
             dot = entry.find('.', dot + 1)) {
          consider(entry.substr(dot + 1));
        }
        if (const auto it = names.by_suffix.find(entry); it != names.by_suffix.end()) {
          for (const std::string& m : it->second) consider(m);
        }
      }
      if (prefixed != nullptr) {
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
    with_group_note(f, group_note);
    out.push_back(std::move(f));
  }
}

// ---- L18: an entry that looks like a regular expression, without re: ----
void lint_regex_like_entries(const LintContext& ctx, const std::vector<std::string>& entries,
                             const std::vector<std::vector<std::string>>& matches,
                             ModuleMatcher::Role role, bool fixable, std::vector<Finding>& out) {
  const bool ignore = role == ModuleMatcher::Role::kIgnore;
  const char* what = ignore ? "ignore" : "targets";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string& entry = entries[i];
    if (!regex_like_unmatched(entry,
                              i < matches.size() ? matches[i] : std::vector<std::string>{})) {
      continue;
    }
    const std::string as_regex = "re:" + entry;
    std::vector<std::string> would;
    std::string compiles;
    try {
      const ModuleMatcher m({as_regex}, role);
      for (const std::string& module : ctx.modules) {
        if (m.entry_matches(0, module)) would.push_back(module);
      }
    } catch (const Error& e) {
      compiles = e.what();
    }
    Finding f;
    f.id = "L18";
    f.severity = Severity::kError;
    for (const std::string& module : would) {
      if (const TensorDecision* w = ctx.weight_of(module)) f.tensors.push_back(w->name);
    }
    f.message = fmt::format(
        "{} entry '{}' has regular-expression characters but no 're:' prefix, so it is compared "
        "as a literal module name (section 2 of the format spec; compressed-tensors and vLLM "
        "read it so too) and matched 0 modules; {}",
        what, entry,
        !compiles.empty() ? fmt::format("as a pattern it does not compile either ({})", compiles)
        : would.empty()   ? fmt::format("as a pattern ('{}') it matches none either", as_regex)
                          : fmt::format("as a pattern ('{}') it matches {}: {}", as_regex,
                                        plural(would.size(), "module"), join(would, kMaxNearMisses)));
    f.fix = fmt::format("write it as --{} '{}' if it is a pattern, or correct the name", what,
                        as_regex);
    if (compiles.empty() && fixable) {
      f.fix_removes = entry;
      f.fix_removes_target = !ignore;
      (ignore ? f.fix_ignore : f.fix_targets) = {as_regex};
    }
    out.push_back(std::move(f));
  }
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

}  // namespace ctquant::detail
