#include "ctquant/report/roles_report.hpp"

#include <map>
#include <vector>

#include <fmt/format.h>

#include "ctquant/util/text.hpp"

namespace ctquant {

using nlohmann::json;

namespace {

const char* kind_name(StackedExperts::Kind kind) {
  switch (kind) {
    case StackedExperts::Kind::kGateUp:
      return "gate_up_proj";
    case StackedExperts::Kind::kDown:
      return "down_proj";
    case StackedExperts::Kind::kUnknown:
      return "unknown";
  }
  return "?";
}

}  // namespace

std::string render_roles_text(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  const RoleAnalysis& r = plan.roles;
  std::string text;
  if (r.family != nullptr) {
    text += fmt::format("roles: {}\n", r.family_text());
  } else {
    text += fmt::format("roles: {}\n", r.fallback);
  }
  // Kept modules by role (the default ignore list's reasons say the rest).
  std::map<std::string, std::size_t> kept;
  std::vector<std::string> order;
  for (const ModuleInfo& m : r.modules) {
    if (m.action == DefaultAction::kQuantize) continue;
    // --no-default-ignore drops the keep defaults: the plan's fates say what
    // becomes of these modules.
    const std::string key = fmt::format(
        "{} ({}, {})", role_name(m.role), component_name(m.component),
        m.action != DefaultAction::kKeep ? "refused"
        : plan.options.default_ignore    ? "kept in 16 bits"
                                      : "kept in 16 bits by default; not with --no-default-ignore");
    if (kept[key]++ == 0) order.push_back(key);
  }
  for (const auto& key : order) text += fmt::format("  {}: {}\n", key, kept[key]);
  for (const StackedExperts& s : r.stacked) {
    // How gate and up share the rows: only a gate_up tensor holds both.
    const std::string rows = s.kind != StackedExperts::Kind::kGateUp ? ""
                             : !s.interleave_known                   ? ", interleaving unknown"
                             : s.interleaved                         ? ", gate/up interleaved"
                                                                     : ", gate rows then up rows";
    text += fmt::format(
        "  stacked experts {} ({}): E={}, I={}, H={}, orientation {} ({}){}; vLLM loads {}{}\n",
        s.tensor, kind_name(s.kind), s.experts, s.intermediate, s.hidden,
        orientation_name(s.orientation), proof_name(s.proof), rows,
        s.vllm_loads_stacked ? "the stacked layout only" : "per-expert tensors",
        s.problem.empty() ? "" : "; " + s.problem);
  }
  if (!checkpoint.unlisted_files.empty()) {
    text += fmt::format("not written (not listed in {}):\n", kIndexFileName);
    for (const auto& f : checkpoint.unlisted_files) text += fmt::format("  file {}\n", f);
  }
  if (!checkpoint.unindexed.empty()) {
    text += fmt::format(
        "missing from {}'s weight_map, written and listed in OUTPUT's index (vLLM reads every "
        "tensor of a listed shard):\n",
        kIndexFileName);
    for (const auto& [file, tensor] : checkpoint.unindexed) {
      text += fmt::format("  tensor {} in {}\n", tensor, file);
    }
  }
  return text;
}

std::string render_ignore_text(const QuantizePlan& plan) {
  const auto& o = plan.options;
  std::string text =
      "ignore entries (modules each matched among the 2-D weights ignore can affect):\n";
  if (o.ignore.empty()) text += "  (none)\n";
  for (std::size_t i = 0; i < o.ignore.size(); ++i) {
    const bool default_entry = i < plan.n_default_ignore;
    // A default entry lists the modules it was made for (an embedding is
    // never a module section 2 could quantize, so it matches none there).
    const auto& modules = default_entry && i < plan.ignore_keeps.size() ? plan.ignore_keeps[i]
                                                                        : plan.ignore_matches[i];
    text += fmt::format("  {}: {}{}\n", o.ignore[i], plural(modules.size(), "module"),
                        default_entry ? " (default)" : "");
    if (default_entry && i < plan.ignore_reasons.size()) {
      text += fmt::format("    why: {}\n", plan.ignore_reasons[i]);
    }
    for (const auto& m : modules) text += fmt::format("    {}\n", m);
  }
  return text;
}

json roles_json(const Checkpoint& checkpoint, const QuantizePlan& plan) {
  const RoleAnalysis& r = plan.roles;
  json modules = json::array();
  for (const ModuleInfo& m : r.modules) {
    modules.push_back(json{{"module", m.module},
                           {"tensor", m.tensor},
                           {"role", role_name(m.role)},
                           {"component", component_name(m.component)},
                           {"vllm_build", vllm_build_name(m.build)},
                           {"action", default_action_name(m.action)},
                           {"reason", m.reason},
                           {"vllm_name", m.vllm_name},
                           {"vllm_layer", m.vllm_layer},
                           {"hf_name", m.hf_name}});
  }
  json stacked = json::array();
  for (const StackedExperts& s : r.stacked) {
    stacked.push_back(
        json{{"tensor", s.tensor},
             {"moe_layer", s.moe_layer},
             {"kind", kind_name(s.kind)},
             {"experts", s.experts},
             {"intermediate", s.intermediate},
             {"hidden", s.hidden},
             {"orientation", orientation_name(s.orientation)},
             {"proof", proof_name(s.proof)},
             {"interleaved", s.interleave_known ? json(s.interleaved) : json(nullptr)},
             {"vllm_loads_stacked", s.vllm_loads_stacked},
             {"problem", s.problem}});
  }
  json unindexed = json::array();
  for (const auto& [file, tensor] : checkpoint.unindexed) {
    unindexed.push_back(json{{"file", file}, {"tensor", tensor}});
  }
  return json{{"family", r.family != nullptr ? json(r.family->name) : json(nullptr)},
              {"vllm_source", r.family != nullptr ? json(fmt::format("{}@{}", r.family->vllm_file,
                                                                     r.family->vllm_commit))
                                                  : json(nullptr)},
              {"fallback", r.fallback.empty() ? json(nullptr) : json(r.fallback)},
              {"modules", modules},
              {"stacked_experts", stacked},
              {"not_written", {{"files", checkpoint.unlisted_files}}},
              {"index_omitted", unindexed}};
}

json ignore_json(const QuantizePlan& plan) {
  json out = json::array();
  for (std::size_t i = 0; i < plan.options.ignore.size(); ++i) {
    const bool default_entry = i < plan.n_default_ignore;
    out.push_back(
        json{{"entry", plan.options.ignore[i]},
             {"default", default_entry},
             {"reason", i < plan.ignore_reasons.size() ? plan.ignore_reasons[i] : ""},
             {"keeps", default_entry && i < plan.ignore_keeps.size() ? json(plan.ignore_keeps[i])
                                                                     : json::array()},
             {"modules", plan.ignore_matches[i]}});
  }
  return out;
}

}  // namespace ctquant
