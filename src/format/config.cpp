#include "ctquant/format/config.hpp"

namespace ctquant {

using nlohmann::json;

json quantization_config(const QuantScheme& scheme, const std::vector<std::string>& ignore,
                         const std::vector<std::string>& targets) {
  const bool channel = scheme.group_size == 0;
  json weights = {
      {"actorder", nullptr},
      {"block_structure", nullptr},
      {"dynamic", false},
      {"group_size", channel ? json(nullptr) : json(scheme.group_size)},
      {"num_bits", scheme.num_bits},
      {"observer", "memoryless_minmax"},
      {"observer_kwargs", json::object()},
      {"scale_dtype", nullptr},
      {"strategy", channel ? "channel" : "group"},
      {"symmetric", scheme.symmetric},
      {"type", "int"},
      {"zp_dtype", scheme.symmetric ? json(nullptr) : json("torch.int8")},
  };
  json group = {
      {"format", "pack-quantized"},
      {"input_activations", nullptr},
      {"output_activations", nullptr},
      {"targets", targets},
      {"weights", weights},
  };
  return json{
      {"config_groups", {{"group_0", group}}},
      {"format", "pack-quantized"},
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
