#include "plan/stacked_experts.hpp"

#include <array>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ctquant/format/config.hpp"
#include "ctquant/format/safetensors.hpp"

namespace ctquant::detail {

using nlohmann::json;

namespace {

constexpr std::array<std::string_view, 2> kStackedKeys = {"gate_up_proj", "down_proj"};

// A config value of the language model: config[key], or text_config[key].
std::optional<std::uint64_t> text_config_number(const std::optional<json>& config,
                                                const char* key) {
  if (!config || !config->is_object()) return std::nullopt;
  for (const json* c :
       {&*config, config->contains("text_config") ? &config->at("text_config") : nullptr}) {
    if (c == nullptr || !c->is_object()) continue;
    const auto it = c->find(key);
    if (it != c->end() && it->is_number_unsigned()) return it->get<std::uint64_t>();
  }
  return std::nullopt;
}

std::string model_type(const std::optional<json>& config) {
  if (!config || !config->is_object()) return {};
  const auto it = config->find("model_type");
  return it != config->end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::optional<std::string_view> stacked_key(const std::string& name, bool& both) {
  std::optional<std::string_view> key;
  both = false;
  for (const std::string_view k : kStackedKeys) {
    if (name.find(k) != std::string::npos) {
      if (key) both = true;
      key = k;
    }
  }
  return key;
}

std::string stacked_layout_problem(const Checkpoint& checkpoint, std::string_view key,
                                   const std::vector<std::uint64_t>& shape) {
  const std::string type = model_type(checkpoint.config);
  if (type == "gpt_oss") {
    return "gpt-oss stores gate and up interleaved along the last dimension ([E, H, 2I]), and "
           "vLLM's gpt-oss loader reads only the stacked tensors: they cannot be split into "
           "per-expert weights (keep them in 16 bits: --ignore a pattern matching them, or "
           "--allow-unloadable)";
  }
  const auto hidden = text_config_number(checkpoint.config, "hidden_size");
  auto inter = text_config_number(checkpoint.config, "moe_intermediate_size");
  if (!inter) inter = text_config_number(checkpoint.config, "intermediate_size");
  if (!hidden) {
    return fmt::format("{} has no hidden_size to prove which dimension of {} is in_features",
                       kConfigFileName, shape_string(shape));
  }
  const bool gate_up = key == "gate_up_proj";
  const std::uint64_t out = shape[1];
  const std::uint64_t in = shape[2];
  // gate_up_proj [E, 2I, H]: in_features H; down_proj [E, H, I]: out_features H.
  const std::uint64_t hidden_dim = gate_up ? in : out;
  if (hidden_dim != *hidden) {
    return fmt::format(
        "its dimension {} of {} is {}, not hidden_size {}: the experts are not stored [E, out, "
        "in] (Llama 4 stores [E, in, out]); ctquant splits only the transformers-v5 layout {}",
        gate_up ? 2 : 1, shape_string(shape), hidden_dim, *hidden,
        gate_up ? "gate_up_proj [E, 2I, H]" : "down_proj [E, H, I]");
  }
  if (gate_up) {
    if (out % 2 != 0) {
      return fmt::format("gate_up_proj expects a second dimension divisible by 2 but got {}", out);
    }
    if (inter && out != 2 * *inter) {
      return fmt::format("its second dimension {} is not 2 x the intermediate size {}", out,
                         *inter);
    }
  } else if (inter && in != *inter) {
    return fmt::format("its last dimension {} is not the intermediate size {}", in, *inter);
  }
  return {};
}

}  // namespace ctquant::detail
