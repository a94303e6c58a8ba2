#include "ctquant/model/vllm_match.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "ctquant/util/cancel.hpp"
#include "ctquant/util/text.hpp"

namespace ctquant {

namespace {

std::vector<std::string> mapped(const RoleAnalysis& roles, const std::vector<std::string>& entries) {
  std::vector<std::string> out;
  out.reserve(entries.size());
  for (const std::string& e : entries) out.push_back(vllm_entry(roles.family, e));
  return out;
}

}  // namespace

const char* expectation_state_name(VllmExpectation::State state) {
  switch (state) {
    case VllmExpectation::State::kPacked:
      return "packed";
    case VllmExpectation::State::kUnquantized:
      return "unquantized";
    case VllmExpectation::State::kRefused:
      return "refused";
  }
  return "?";
}

VllmLoadRules::VllmLoadRules(const RoleAnalysis& roles, std::vector<std::string> ignore,
                             std::vector<std::string> targets)
    : written_ignore_(std::move(ignore)),
      ignore_(mapped(roles, written_ignore_)),
      ignore_literal_(ignore_.begin(), ignore_.end()),
      targets_(mapped(roles, targets)),
      ignore_matcher_(ignore_, ModuleMatcher::Role::kIgnore),
      target_matcher_(targets_, ModuleMatcher::Role::kIgnore) {
  // The first literal target that is a case-insensitive substring of
  // "linear": every class vLLM builds these layers with ends in "Linear",
  // so that target takes them (found once, not per layer).
  for (std::size_t i = 0; i < targets_.size() && !linear_class_target_; ++i) {
    const std::string& t = targets_[i];
    if (t.empty() || t.size() > 6 || regex_pattern(t)) continue;
    std::string lower = t;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (std::string("linear").find(lower) != std::string::npos) linear_class_target_ = i;
  }
  // packed_modules_mapping: the fused layers whose shards the role analysis
  // tests under their own names.
  for (const ModuleInfo& m : roles.modules) {
    poll_cancel();  // lint builds these rules for every module (util/cancel.hpp)
    if (m.vllm_layer == m.vllm_name || m.role == ModuleRole::kExpert ||
        m.role == ModuleRole::kStackedExperts) {
      continue;
    }
    auto& shards = packed_[last_component(m.vllm_layer)];
    const std::string shard = last_component(m.vllm_name);
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
  }
  // The row's full shard lists, in its order (a checkpoint may lack a shard).
  const FamilyRow* row = roles.family;
  if (row == nullptr || row->top_level_quant_config) {
    for (const FusedSpec& spec : family_fused_groups(row)) {
      const auto it = packed_.find(spec.fused);
      if (it == packed_.end()) continue;
      it->second.assign(spec.shards.begin(), spec.shards.end());
    }
  }
}

VllmLoadRules::~VllmLoadRules() = default;
VllmLoadRules::VllmLoadRules(VllmLoadRules&&) noexcept = default;

std::optional<std::size_t> VllmLoadRules::ignore_match(const std::string& vllm_name) const {
  return ignore_matcher_.first_match(vllm_name);
}

std::optional<bool> VllmLoadRules::should_ignore_layer(const std::string& layer,
                                                       std::string& error) const {
  const std::string proj = last_component(layer);
  const auto fused = packed_.find(proj);
  if (fused != packed_.end() && !ignore_literal_.contains(layer)) {
    std::optional<bool> decided;
    for (const std::string& shard : fused->second) {
      const bool ignored = ignore_match(replace_all(layer, proj, shard)).has_value();
      if (!decided) {
        decided = ignored;
      } else if (*decided != ignored) {
        std::vector<std::string> quoted;
        for (const auto& s : fused->second) quoted.push_back("'" + s + "'");
        error = fmt::format(
            "Found a different quantization schemes for [{}] in {}. vLLM requires all to use "
            "the same scheme.",
            fmt::join(quoted, ", "), layer);
        return std::nullopt;
      }
    }
    return decided.value_or(false);
  }
  return ignore_match(layer).has_value();
}

std::vector<std::string> VllmLoadRules::moe_probes(const std::string& moe_layer) {
  return {moe_layer + ".0.gate_proj", moe_layer + ".0.up_proj", moe_layer + ".0.down_proj"};
}

std::optional<std::string> VllmLoadRules::matched_target(const std::string& layer,
                                                         bool linear_class) const {
  if (const auto i = target_matcher_.first_match(layer)) return targets_[*i];
  if (linear_class && linear_class_target_) return targets_[*linear_class_target_];
  // _match_fused_layer: every shard must match some target.
  const std::string proj = last_component(layer);
  if (const auto fused = packed_.find(proj); fused != packed_.end()) {
    std::optional<std::string> first;
    for (const std::string& shard : fused->second) {
      const auto i = target_matcher_.first_match(replace_all(layer, proj, shard));
      if (!i) return std::nullopt;
      if (!first) first = targets_[*i];
    }
    return first;
  }
  return std::nullopt;
}

VllmExpectation VllmLoadRules::expect(const ModuleInfo& m) const {
  VllmExpectation e;
  e.layer = m.vllm_layer;
  using State = VllmExpectation::State;
  if (m.build == VllmBuild::kPlain || m.role == ModuleRole::kParameter ||
      m.role == ModuleRole::kNorm) {
    e.state = State::kUnquantized;
    e.why = "vLLM builds it without the quantization config";
    return e;
  }
  if (m.role == ModuleRole::kExpert || m.role == ModuleRole::kStackedExperts) {
    // Every expert of a MoE layer gets the layer's answer: made once.
    if (const auto it = moe_layers_.find(m.vllm_layer); it != moe_layers_.end()) return it->second;
    // get_moe_method: each probe through ignore, then targets ("Linear" is
    // copied to the MoE class key).
    std::vector<std::optional<std::string>> schemes;
    std::string detail;
    for (const std::string& probe : moe_probes(m.vllm_layer)) {
      const auto ignored = ignore_match(probe);
      std::optional<std::string> scheme;
      if (!ignored) scheme = matched_target(probe, /*linear_class=*/true);
      detail += fmt::format("{}'{}' {}", detail.empty() ? "" : ", ", probe,
                            ignored ? fmt::format("ignored by '{}'", written_ignore_[*ignored])
                            : scheme ? fmt::format("matches target '{}'", *scheme)
                                     : std::string("matches nothing"));
      schemes.push_back(scheme.has_value() ? std::optional<std::string>("quantized")
                                           : std::nullopt);
    }
    if (!(schemes[0] == schemes[1] && schemes[1] == schemes[2])) {
      e.state = State::kRefused;
      e.why = fmt::format(
          "All MoE projections need to have same quantization scheme but found multiple "
          "(vLLM probes {})",
          detail);
    } else {
      e.state = schemes[0] ? State::kPacked : State::kUnquantized;
      e.why = fmt::format("MoE layer '{}': {}", m.vllm_layer, detail);
    }
    moe_layers_.emplace(m.vllm_layer, e);
    return e;
  }
  if (m.build == VllmBuild::kIfTargeted) {
    // ParallelLMHead / VocabParallelEmbedding: a scheme only from a target
    // naming the layer (class names hold no "Linear").
    std::string error;
    const auto ignored = should_ignore_layer(m.vllm_layer, error);
    const auto target = matched_target(m.vllm_layer, /*linear_class=*/false);
    if (target && ignored == false) {
      e.state = State::kPacked;
      e.why = fmt::format("target '{}' names '{}'", *target, m.vllm_layer);
    } else {
      e.state = State::kUnquantized;
      e.why = target ? fmt::format("ignored as '{}'", m.vllm_layer)
                     : fmt::format("no target names '{}'", m.vllm_layer);
    }
    return e;
  }
  std::string error;
  const auto ignored = should_ignore_layer(m.vllm_layer, error);
  if (!ignored) {
    e.state = State::kRefused;
    e.why = error;
    return e;
  }
  if (*ignored) {
    e.state = State::kUnquantized;
    const auto i = ignore_match(m.vllm_name);
    e.why = i ? fmt::format("ignored by '{}' as '{}'", written_ignore_[*i], m.vllm_name)
              : fmt::format("ignored as '{}'", m.vllm_layer);
    return e;
  }
  const auto target = matched_target(m.vllm_layer, /*linear_class=*/true);
  if (!target) {
    e.state = State::kUnquantized;
    e.unmatched = true;
    e.why = fmt::format(
        "'{}' is neither ignored nor matched by a target: current vLLM leaves it unquantized, "
        "older releases raise \"Unable to find matching target\"",
        m.vllm_layer);
    return e;
  }
  e.state = State::kPacked;
  e.why = m.vllm_name == m.vllm_layer
              ? fmt::format("'{}' is not ignored and matches target '{}'", m.vllm_layer, *target)
              : fmt::format("'{}' (a shard of '{}') is not ignored and matches target '{}'",
                            m.vllm_name, m.vllm_layer, *target);
  return e;
}

}  // namespace ctquant
