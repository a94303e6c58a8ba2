#include "ctquant/scheme/fused_sets.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "ctquant/format/matcher.hpp"
#include "ctquant/util/error.hpp"

namespace ctquant {

namespace {

// _DEFAULT_FUSED_MAPPINGS_LIST (llm-compressor entrypoints/model_free/microscale.py).
const std::vector<FusedMapping> kMappings = {
    {{R"(re:.*(attn|attention)\.q_proj\.weight$)", R"(re:.*(attn|attention)\.k_proj\.weight$)",
      R"(re:.*(attn|attention)\.v_proj\.weight$)"}},
    {{R"(re:.*(attn|attention)\.wq_a\.weight$)",
      R"(re:.*(attn|attention)\.wkv_a_with_mqa\.weight$)"}},
    {{R"(re:.*mlp\.gate_proj\.weight$)", R"(re:.*mlp\.up_proj\.weight$)"}},
    {{R"(re:.*w1\.weight$)", R"(re:.*w3\.weight$)"}},
};

// One matcher per mapping, compiled once (PCRE2 with Python re.match semantics).
const std::vector<ModuleMatcher>& mapping_matchers() {
  static const std::vector<ModuleMatcher> matchers = [] {
    std::vector<ModuleMatcher> out;
    for (const FusedMapping& m : kMappings)
      out.emplace_back(m.targets, ModuleMatcher::Role::kIgnore);
    return out;
  }();
  return matchers;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The next run of a natural key starting at i: digits or non-digits.
std::string_view next_run(std::string_view s, std::size_t& i) {
  const std::size_t start = i;
  const bool digits = i < s.size() && is_digit(s[i]);
  while (i < s.size() && is_digit(s[i]) == digits) ++i;
  return s.substr(start, i - start);
}

// Two runs of digits compared as the numbers they spell (any length).
int compare_numbers(std::string_view a, std::string_view b) {
  while (a.size() > 1 && a.front() == '0') a.remove_prefix(1);
  while (b.size() > 1 && b.front() == '0') b.remove_prefix(1);
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  const int c = a.compare(b);
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

// natural_key(a) < natural_key(b) of match_names_set_eager: the lists
// re.split(r"(\d+)", s) with digit runs as ints, compared element by
// element (text at even positions, numbers at odd ones; a prefix first).
bool natural_less(std::string_view a, std::string_view b) {
  std::size_t i = 0;
  std::size_t j = 0;
  // Position 0 is text (possibly empty), then digits and text alternate.
  for (bool text = true;; text = !text) {
    if (i >= a.size() && j >= b.size()) return false;
    // re.split ends with a (possibly empty) text element after a number, so
    // a string ending in digits still has one more (empty) element.
    std::string_view ra;
    std::string_view rb;
    if (text) {
      if (!(i < a.size() && is_digit(a[i]))) ra = next_run(a, i);
      if (!(j < b.size() && is_digit(b[j]))) rb = next_run(b, j);
      const int c = ra.compare(rb);
      if (c != 0) return c < 0;
    } else {
      const bool ha = i < a.size();
      const bool hb = j < b.size();
      if (!ha || !hb) return !ha && hb;  // the shorter list is a prefix
      ra = next_run(a, i);
      rb = next_run(b, j);
      const int c = compare_numbers(ra, rb);
      if (c != 0) return c < 0;
    }
  }
}

}  // namespace

const std::vector<FusedMapping>& fused_mappings() { return kMappings; }

FusedSets fused_sets(std::span<const std::string> tensor_names) {
  std::vector<const std::string*> sorted;
  sorted.reserve(tensor_names.size());
  for (const std::string& n : tensor_names) sorted.push_back(&n);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const std::string* a, const std::string* b) { return natural_less(*a, *b); });

  FusedSets out;
  const std::vector<ModuleMatcher>& matchers = mapping_matchers();
  for (std::size_t m = 0; m < kMappings.size(); ++m) {
    const std::vector<std::string>& targets = kMappings[m].targets;
    std::vector<std::optional<std::string>> slots(targets.size());
    for (const std::string* name : sorted) {
      for (std::size_t t = 0; t < targets.size(); ++t) {
        if (!matchers[m].entry_matches(t, *name)) continue;
        if (slots[t]) {
          throw bad_input(fmt::format(
              "Matched a {} twice before completing set ({}, {}): model_free_ptq groups the "
              "weights that share an NVFP4 global scale by walking the names in natural order, "
              "and '{}' comes before the rest of the set of '{}'",
              targets[t], *slots[t], *name, *name, *slots[t]));
        }
        slots[t] = *name;
      }
      if (std::all_of(slots.begin(), slots.end(), [](const auto& s) { return s.has_value(); })) {
        std::vector<std::string> set;
        for (auto& s : slots) set.push_back(std::move(*s));
        out.sets.push_back(std::move(set));
        slots.assign(targets.size(), std::nullopt);
      }
    }
    if (std::any_of(slots.begin(), slots.end(), [](const auto& s) { return s.has_value(); })) {
      std::vector<std::string> rest;
      for (auto& s : slots) rest.push_back(s.value_or(""));
      out.incomplete.push_back(std::move(rest));
    }
  }
  return out;
}

std::vector<std::string> fused_partners(const std::string& tensor_name) {
  // DEFAULT_FUSED_MAPPINGS: `^(?P<prefix>.+?)\.(?P<mid>A|B|...)\.<primary>\.weight$`
  // -> partner templates "{prefix}.{mid}.<partner>.weight". The part after
  // the prefix has a fixed text per alternative and no alternative is a
  // dot-suffix of another, so at most one alternative matches and the lazy
  // prefix is the rest of the name. As in Python, `.` does not match a
  // newline and `$` also matches before a final newline.
  struct Primary {
    std::vector<std::string_view> middles;  // "" for the w1 mapping (no middle component)
    std::string_view primary;
    std::vector<std::string_view> partners;
  };
  static const Primary kPrimaries[] = {
      {{"attn", "attention", "self_attn", "self_attention"}, "q_proj", {"k_proj", "v_proj"}},
      {{"attn", "attention", "self_attn"}, "wq_a", {"wkv_a_with_mqa"}},
      {{"mlp", "feed_forward"}, "gate_proj", {"up_proj"}},
      {{""}, "w1", {"w3"}},
  };
  std::string_view name = tensor_name;
  if (!name.empty() && name.back() == '\n') name.remove_suffix(1);
  std::vector<std::string> out;
  for (const Primary& p : kPrimaries) {
    for (const std::string_view middle : p.middles) {
      const std::string tail = middle.empty() ? fmt::format(".{}.weight", p.primary)
                                              : fmt::format(".{}.{}.weight", middle, p.primary);
      if (name.size() <= tail.size() || !name.ends_with(tail)) continue;
      const std::string_view prefix = name.substr(0, name.size() - tail.size());
      if (prefix.find('\n') != std::string_view::npos) continue;
      for (const std::string_view partner : p.partners) {
        std::string full = middle.empty() ? fmt::format("{}.{}.weight", prefix, partner)
                                          : fmt::format("{}.{}.{}.weight", prefix, middle, partner);
        if (std::find(out.begin(), out.end(), full) == out.end()) out.push_back(std::move(full));
      }
    }
  }
  return out;
}

std::map<std::string, std::vector<std::string>> microscale_job_names(
    std::span<const std::pair<std::string, std::string>> weight_map) {
  std::map<std::string, std::string> shard_of;
  for (const auto& [name, shard] : weight_map) shard_of.emplace(name, shard);
  // Partners are fetched one level deep: no partner is itself a primary of
  // the four mappings, so the recursion of build_inverse_weight_maps stops
  // after one step.
  std::set<std::string> dependencies;
  std::vector<std::vector<std::string>> partners_of(weight_map.size());
  for (std::size_t i = 0; i < weight_map.size(); ++i) {
    partners_of[i] = fused_partners(weight_map[i].first);
    dependencies.insert(partners_of[i].begin(), partners_of[i].end());
  }
  // shard -> (source shard -> names), source shards in first-use order.
  std::map<std::string, std::vector<std::pair<std::string, std::vector<std::string>>>> jobs;
  for (std::size_t i = 0; i < weight_map.size(); ++i) {
    const auto& [name, shard] = weight_map[i];
    if (dependencies.count(name) != 0) continue;
    auto& sources = jobs[shard];
    std::vector<std::string> load = {name};
    load.insert(load.end(), partners_of[i].begin(), partners_of[i].end());
    for (const std::string& n : load) {
      const auto it = shard_of.find(n);
      if (it == shard_of.end()) continue;  // a missing partner (model_free refuses it)
      auto src = std::find_if(sources.begin(), sources.end(),
                              [&](const auto& s) { return s.first == it->second; });
      if (src == sources.end()) {
        sources.emplace_back(it->second, std::vector<std::string>{});
        src = std::prev(sources.end());
      }
      src->second.push_back(n);
    }
  }
  std::map<std::string, std::vector<std::string>> out;
  for (auto& [shard, sources] : jobs) {
    std::vector<std::string>& names = out[shard];
    for (auto& [source, list] : sources) names.insert(names.end(), list.begin(), list.end());
  }
  return out;
}

}  // namespace ctquant
