#include "ctquant/format/matcher.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include <fmt/format.h>

#include "ctquant/util/error.hpp"
#include "ctquant/util/escape.hpp"
#include "util/utf8.hpp"

namespace ctquant {

struct ModuleMatcher::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

namespace {

constexpr std::string_view kRegexPrefix = "re:";

// Python's `\Z` is "end of string", PCRE2's `\z`; PCRE2's `\Z` also matches
// before a final newline. Everything else is passed through unchanged.
std::string to_pcre2_syntax(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size());
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      out += '\\';
      out += pattern[i + 1] == 'Z' ? 'z' : pattern[i + 1];
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

}  // namespace

std::optional<std::string_view> regex_pattern(std::string_view entry) {
  if (entry.substr(0, kRegexPrefix.size()) != kRegexPrefix) return std::nullopt;
  return entry.substr(kRegexPrefix.size());
}

ModuleMatcher::ModuleMatcher(std::vector<std::string> entries, Role role, const char* what)
    : entries_(std::move(entries)), role_(role) {
  if (what == nullptr) what = role_ == Role::kIgnore ? "--ignore" : "--targets";
  std::vector<std::string> problems;
  for (const std::string& entry : entries_) {
    auto compiled = std::unique_ptr<Compiled>();
    const auto pattern = regex_pattern(entry);
    if (entry.empty()) {
      problems.push_back(fmt::format("{} entry is empty", what));
    } else if (const auto bad = detail::first_invalid_utf8(entry); bad != std::string::npos) {
      // config.json is UTF-8 JSON, and Python module names are str.
      problems.push_back(
          fmt::format("{} '{}': not valid UTF-8 (byte {})", what, escape_for_terminal(entry), bad));
    } else if (pattern && pattern->empty()) {
      problems.push_back(
          fmt::format("{} '{}': empty pattern (it would match every module)", what, entry));
    } else if (pattern) {
      const std::string translated = to_pcre2_syntax(*pattern);
      int error_code = 0;
      PCRE2_SIZE error_offset = 0;
      pcre2_code* code =
          pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
      if (code == nullptr) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error_code, message, sizeof message);
        problems.push_back(fmt::format("{} '{}': invalid regular expression at offset {}: {}", what,
                                       entry, error_offset,
                                       reinterpret_cast<const char*>(message)));
      } else {
        compiled = std::make_unique<Compiled>();
        compiled->code = code;
      }
    }
    compiled_.push_back(std::move(compiled));
  }
  if (!problems.empty()) {
    std::string message = problems.front();
    for (std::size_t i = 1; i < problems.size(); ++i) message += "\n" + problems[i];
    throw usage_error(message);
  }
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (compiled_[i] != nullptr) {
      regex_.push_back(i);
    } else if (role_ == Role::kTargets && entries_[i] == "Linear") {
      every_module_.push_back(i);
    } else {
      literal_[std::string_view(entries_[i])].push_back(i);
    }
  }
}

ModuleMatcher::~ModuleMatcher() = default;
ModuleMatcher::ModuleMatcher(ModuleMatcher&&) noexcept = default;
ModuleMatcher& ModuleMatcher::operator=(ModuleMatcher&&) noexcept = default;

bool ModuleMatcher::is_regex(std::size_t i) const { return compiled_[i] != nullptr; }

bool ModuleMatcher::entry_matches(std::size_t i, std::string_view module) const {
  if (compiled_[i] == nullptr) {
    if (role_ == Role::kTargets && entries_[i] == "Linear") return true;
    return entries_[i] == module;
  }
  pcre2_code* code = compiled_[i]->code;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  // PCRE2_ANCHORED: match at the start only, like Python's re.match.
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(module.data()), module.size(), 0,
                             PCRE2_ANCHORED, data, nullptr);
  pcre2_match_data_free(data);
  if (rc >= 0) return true;
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  // Fail closed: a match that could not be decided (match or depth limit on
  // a long name from the checkpoint, bad UTF-8) must not silently count as
  // "does not match", which would quantize a module meant to be ignored.
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(rc, message, sizeof message);
  throw usage_error(
      fmt::format("{} '{}': cannot be matched against module '{}': {}; simplify the "
                  "pattern",
                  role_ == Role::kIgnore ? "--ignore" : "--targets", entries_[i], module,
                  reinterpret_cast<const char*>(message)));
}

std::optional<std::size_t> ModuleMatcher::first_match(std::string_view module) const {
  std::optional<std::size_t> best;
  if (const auto it = literal_.find(module); it != literal_.end()) best = it->second.front();
  if (!every_module_.empty() && (!best || every_module_.front() < *best)) {
    best = every_module_.front();
  }
  for (const std::size_t i : regex_) {
    if (best && i > *best) break;
    if (entry_matches(i, module)) return i;
  }
  return best;
}

std::vector<std::size_t> ModuleMatcher::matching_entries(std::string_view module) const {
  std::vector<std::size_t> out = every_module_;
  if (const auto it = literal_.find(module); it != literal_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  for (const std::size_t i : regex_) {
    if (entry_matches(i, module)) out.push_back(i);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string regex_escape(const std::string& text) {
  static constexpr std::string_view kSpecial = R"(\.^$*+?()[]{}|)";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (kSpecial.find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string last_component_entry(const std::set<std::string>& names, bool any_top_level) {
  std::string alternatives;
  for (const auto& n : names) {
    if (!alternatives.empty()) alternatives += '|';
    alternatives += regex_escape(n);
  }
  if (names.size() > 1) alternatives = "(" + alternatives + ")";
  return any_top_level ? fmt::format("re:(.*\\.)?{}$", alternatives)
                       : fmt::format("re:.*\\.{}$", alternatives);
}

}  // namespace ctquant
