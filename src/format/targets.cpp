#include "ctquant/format/targets.hpp"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <unordered_map>

namespace ctquant {

namespace {

std::vector<std::string> flatten(const std::vector<std::vector<std::string>>& targets) {
  std::vector<std::string> out;
  for (const auto& list : targets) out.insert(out.end(), list.begin(), list.end());
  return out;
}

// compressed-tensors' class-name target for every Linear module.
constexpr std::string_view kLinear = "Linear";

// Whether vLLM's class-name step takes a *Linear layer with this target:
// _is_equal_or_regex_match(class_name, target, check_contains=True) on a
// literal, `target.lower() in value.lower()`; every class vLLM builds a
// quantizable linear layer with ends in "Linear".
bool vllm_class_target(std::string_view target) {
  if (target.empty() || target.starts_with("re:")) return false;
  std::string lower(target);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::string("linear").find(lower) != std::string::npos;
}

}  // namespace

GroupTargets::GroupTargets(const std::vector<std::vector<std::string>>& targets,
                           const std::vector<std::string>& names)
    : names_(names), matcher_(flatten(targets), ModuleMatcher::Role::kTargets) {
  for (std::size_t g = 0; g < targets.size(); ++g) {
    for (std::size_t i = 0; i < targets[g].size(); ++i) flat_.push_back(TargetHit{g, i});
  }
  // The groups in config.json's order: by name.
  std::vector<std::size_t> by_name(targets.size());
  std::iota(by_name.begin(), by_name.end(), std::size_t{0});
  std::stable_sort(by_name.begin(), by_name.end(),
                   [&](std::size_t a, std::size_t b) { return names_[a] < names_[b]; });
  // (The keys view the targets, which outlive the constructor's maps.)
  std::unordered_map<std::string_view, std::size_t> reader_group;  // the last group listing it
  std::unordered_map<std::string_view, std::size_t> vllm_rank;     // first-seen position
  for (const std::size_t g : by_name) {
    for (const std::string& t : targets[g]) {
      reader_group[t] = g;
      vllm_rank.try_emplace(t, vllm_rank.size());
    }
  }
  // match_targets: sorted(targets, key=lambda x: ("re:" in x, x)).
  std::vector<std::string_view> ct_order;
  for (const auto& [text, g] : reader_group) ct_order.push_back(text);
  std::sort(ct_order.begin(), ct_order.end(), [](std::string_view a, std::string_view b) {
    const bool ra = a.find("re:") != std::string_view::npos;
    const bool rb = b.find("re:") != std::string_view::npos;
    return ra != rb ? rb : a < b;
  });
  std::unordered_map<std::string_view, std::size_t> ct_rank;
  for (std::size_t r = 0; r < ct_order.size(); ++r) ct_rank[ct_order[r]] = r;
  const std::vector<std::string>& entries = matcher_.entries();
  for (const std::string& text : entries) {
    reader_group_.push_back(reader_group.at(text));
    ct_rank_.push_back(ct_rank.at(text));
    vllm_rank_.push_back(vllm_rank.at(text));
  }
  if (const auto it = reader_group.find(kLinear); it != reader_group.end()) {
    ct_class_group_ = it->second;
  }
  std::optional<std::size_t> first_class_rank;
  for (const auto& [text, rank] : vllm_rank) {
    if (vllm_class_target(text) && (!first_class_rank || rank < *first_class_rank)) {
      first_class_rank = rank;
      vllm_class_group_ = reader_group.at(text);
    }
  }
}

std::vector<TargetHit> GroupTargets::matches(std::string_view module) const {
  std::vector<TargetHit> out;
  for (const std::size_t k : matcher_.matching_entries(module)) out.push_back(flat_[k]);
  return out;
}

std::optional<TargetHit> GroupTargets::first_match(std::string_view module) const {
  const auto k = matcher_.first_match(module);
  if (!k) return std::nullopt;
  return flat_[*k];
}

std::optional<std::size_t> GroupTargets::compressed_tensors_group(
    std::string_view module, const std::vector<std::size_t>& hit) const {
  // The name step: exact names and patterns, in match_targets' sort.
  std::optional<std::size_t> best;
  for (const std::size_t k : hit) {
    const std::string& text = matcher_.entries()[k];
    // "Linear" is matched by class, after every name (a module named
    // "Linear" aside).
    if (text == kLinear && module != kLinear) continue;
    if (!best || ct_rank_[k] < ct_rank_[*best]) best = k;
  }
  if (best) return reader_group_[*best];
  return ct_class_group_;
}

std::optional<std::size_t> GroupTargets::vllm_name_group(
    const std::vector<std::size_t>& hit) const {
  // _find_first_match(layer_name, targets): the first target in
  // target_scheme_map's order equal to the name or matching it.
  std::optional<std::size_t> best;
  for (const std::size_t k : hit) {
    if (matcher_.entries()[k] == kLinear) continue;
    if (!best || vllm_rank_[k] < vllm_rank_[*best]) best = k;
  }
  if (best) return reader_group_[*best];
  return std::nullopt;
}

std::optional<std::size_t> GroupTargets::vllm_group(const std::vector<std::size_t>& hit) const {
  if (const auto by_name = vllm_name_group(hit)) return by_name;
  return vllm_class_group_;
}

std::optional<std::size_t> GroupTargets::vllm_fused_group(
    std::string_view fused_layer, const std::vector<std::string>& shards) const {
  if (const auto by_name = vllm_name_group(matcher_.matching_entries(fused_layer))) return by_name;
  if (vllm_class_group_) return vllm_class_group_;
  std::optional<std::size_t> first;
  for (const std::string& shard : shards) {
    const auto g = vllm_name_group(matcher_.matching_entries(shard));
    if (!g) return std::nullopt;
    if (!first) first = g;
  }
  return first;
}

GroupResolution GroupTargets::resolve(std::string_view module) const {
  const std::vector<std::size_t> hit = matcher_.matching_entries(module);
  GroupResolution r;
  if (!hit.empty()) r.model_free = flat_[hit.front()].group;
  r.compressed_tensors = compressed_tensors_group(module, hit);
  r.vllm = vllm_group(hit);
  // A reader's class step applies to Linear modules only when a "Linear"
  // target says so: without one, a module no target names is no group's.
  if (hit.empty()) {
    r.compressed_tensors.reset();
    r.vllm.reset();
  }
  return r;
}

}  // namespace ctquant
