// Ignore-list and targets matching of module names.
//
// Section 2 of the format spec: an entry `re:PATTERN` matches a module name
// when Python's `re.match(PATTERN, name)` would, i.e. anchored at the start
// and not at the end; any other entry matches only the identical name. The
// regex engine is PCRE2 in UTF mode with Unicode properties, which accepts
// Python syntax such as `(?P<name>...)`, `(?P=name)`, `(?i)`, lookbehind and
// `\d`. Python's `\Z` (end of string only) is translated to PCRE2's `\z`.
//
// For targets, the entry `Linear` (the class name vLLM and compressed-tensors
// use) matches every module: a checkpoint carries no class information, and
// the planner already excludes norms and embeddings (section 2, rules 3, 6).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ctquant {

class ModuleMatcher {
 public:
  enum class Role { kIgnore, kTargets };

  // Compiles every entry up front. Throws Error{kUsage} listing every entry
  // whose pattern does not compile (with PCRE2's message and offset), and
  // for an empty entry, an empty `re:` pattern or an entry that is not
  // valid UTF-8 (it could not be written into config.json). Each message
  // starts with `what` (default "--ignore" or "--targets" by role), the
  // option or key the entries came from.
  ModuleMatcher(std::vector<std::string> entries, Role role, const char* what = nullptr);
  ~ModuleMatcher();
  ModuleMatcher(ModuleMatcher&&) noexcept;
  ModuleMatcher& operator=(ModuleMatcher&&) noexcept;

  // Index of the first entry matching module, or nullopt. Throws like
  // entry_matches(). Literal entries are looked up in a hash table built
  // once, so the cost is that of the `re:` entries, not of the list.
  std::optional<std::size_t> first_match(std::string_view module) const;
  // The indices of every entry matching module, in increasing order (as
  // fast as first_match). Throws like entry_matches().
  std::vector<std::size_t> matching_entries(std::string_view module) const;
  // Whether entry i matches module. Throws Error{kUsage} when a pattern
  // cannot be evaluated on module (PCRE2 match or depth limit): the answer
  // is never guessed.
  bool entry_matches(std::size_t i, std::string_view module) const;

  const std::vector<std::string>& entries() const { return entries_; }
  bool is_regex(std::size_t i) const;

 private:
  struct Compiled;
  std::vector<std::string> entries_;
  Role role_;
  std::vector<std::unique_ptr<Compiled>> compiled_;  // one per entry; null for literals
  // Literal entries: text -> their indices, increasing; the `re:` entries
  // and (targets) the "Linear" entries, each in increasing order.
  // (The keys view entries_, whose strings stay put when the matcher moves.)
  std::unordered_map<std::string_view, std::vector<std::size_t>> literal_;
  std::vector<std::size_t> regex_;
  std::vector<std::size_t> every_module_;
};

// The pattern text of an entry ("re:.*x$" -> ".*x$"), or nullopt for a literal.
std::optional<std::string_view> regex_pattern(std::string_view entry);

// `text` with the regular-expression metacharacters escaped, for building
// `re:` entries from module names ("layers.0.fc" -> "layers\.0\.fc").
std::string regex_escape(const std::string& text);

// An ignore entry that takes every module whose last component is one of
// names (non-empty), both under the checkpoint's names and under vLLM's
// prefixed ones: "re:.*\.(k_proj|v_proj)$", or "re:(.*\.)?fc$" when one of
// the modules is top-level (no dot in its name).
std::string last_component_entry(const std::set<std::string>& names, bool any_top_level);

}  // namespace ctquant
