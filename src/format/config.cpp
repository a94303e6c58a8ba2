#include "ctquant/format/config.hpp"

namespace ctquant {

using nlohmann::json;

json quantization_config(const std::vector<ConfigGroup>& groups,
                         const std::vector<std::string>& ignore) {
  json config_groups = json::object();
  std::optional<std::string> common;
  bool mixed = false;
  for (const ConfigGroup& g : groups) {
    config_groups[g.name] = json{
        {"format", g.format ? json(*g.format) : json(nullptr)},
        {"input_activations", g.input_activations},
        {"output_activations", nullptr},
        {"targets", g.targets},
        {"weights", g.weights},
    };
    if (!g.format) continue;
    if (!common) {
      common = g.format;
    } else if (*common != *g.format) {
      mixed = true;
    }
  }
  // llm-compressor entrypoints/model_free/save_utils.py: the groups' common
  // format, "mixed-precision" when they differ, "dense" when none.
  const std::string format = mixed ? "mixed-precision" : common.value_or("dense");
  return json{
      {"config_groups", config_groups},
      {"format", format},
      {"global_compression_ratio", nullptr},
      {"ignore", ignore},
      {"kv_cache_scheme", nullptr},
      {"quant_method", "compressed-tensors"},
      {"quantization_status", "compressed"},
      {"transform_config", json::object()},
      {"version", kCompressedTensorsVersion},
  };
}

json output_config(const std::optional<json>& input_config, const json& block) {
  json config = input_config.value_or(json::object());
  config["quantization_config"] = block;
  return config;
}

std::string dump_json(const json& value) { return value.dump(2, ' ', /*ensure_ascii=*/true); }

}  // namespace ctquant
