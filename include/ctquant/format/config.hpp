// The compressed-tensors `quantization_config` block and the output
// config.json (section 5 of the format spec).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/scheme/kernel.hpp"

namespace ctquant {

// The compressed-tensors release whose config format ctquant writes.
inline constexpr const char* kCompressedTensorsVersion = "0.18.0";

// The pack-quantized block for scheme, with ignore entries and targets written
// unchanged and in order. Group schemes get "strategy": "group" and their
// group size; channel-wise (group_size 0) "strategy": "channel" and null;
// asymmetric "symmetric": false and "zp_dtype": "torch.int8".
nlohmann::json quantization_config(const QuantScheme& scheme,
                                   const std::vector<std::string>& ignore,
                                   const std::vector<std::string>& targets);

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
