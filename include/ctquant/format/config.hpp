// The compressed-tensors `quantization_config` block and the output
// config.json (section 5 of the format spec; schemes.md 9.2).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ctquant {

// The compressed-tensors release whose config format ctquant writes.
inline constexpr const char* kCompressedTensorsVersion = "0.18.0";

// One entry of config_groups: a QuantizationScheme as compressed-tensors
// serialises it.
struct ConfigGroup {
  std::string name;                  // the config_groups key
  std::vector<std::string> targets;  // written unchanged, in order
  nlohmann::json weights;            // QuantizationArgs (quant_args_json)
  nlohmann::json input_activations;  // null or QuantizationArgs
  std::optional<std::string> format;  // null when the group compressed nothing
};

// The quantization_config block: the groups (serialised with sorted keys, as
// the reference writes them), ignore entries unchanged and in order, the
// top-level format the groups' common one ("mixed-precision" when they
// differ, "dense" when none has one), "quantization_status": "compressed",
// "version": kCompressedTensorsVersion, "transform_config": {}.
nlohmann::json quantization_config(const std::vector<ConfigGroup>& groups,
                                   const std::vector<std::string>& ignore);

// The output config.json: the input's (or an empty object) with
// "quantization_config" replaced by block.
nlohmann::json output_config(const std::optional<nlohmann::json>& input_config,
                             const nlohmann::json& block);

// Serialises JSON as the reference does (sorted keys, 2-space indent, no
// trailing newline; non-ASCII characters escaped as \uXXXX, as Python's
// json.dumps does by default).
//
// Strings must be valid UTF-8, as every string reaching these functions is:
// ignore and targets entries are checked by ModuleMatcher, config.json by the
// JSON parser. Otherwise nlohmann::json::type_error (316) is thrown.
std::string dump_json(const nlohmann::json& value);

}  // namespace ctquant
