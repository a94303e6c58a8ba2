// The registry of output scheme families and presets (see scheme.hpp).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ctquant/scheme/scheme.hpp"

namespace ctquant {

// Every family, in compressed-tensors' format priority (schemes.md 1.1).
std::span<const SchemeFamily* const> scheme_families();

// The family compressed-tensors infers for these args, or nullptr when no
// family of ctquant's writes them.
const SchemeFamily* family_for(const QuantArgs& args, bool has_input_activations);

// The family whose format string is `format`, or nullptr.
const SchemeFamily* family_by_format(std::string_view format);

// A preset by name, as compressed-tensors' preset_name_to_scheme looks it up
// (the name upper-cased), or nullptr. A refused preset is returned too (its
// `refused` says why).
const Preset* find_preset(std::string_view name);

// Every preset name ctquant writes, in registry order, comma-separated (for
// --help and error messages); refused presets are left out.
std::string preset_names();

// QuantArgs <-> the `weights` object of a config group, as compressed-tensors
// serialises QuantizationArgs (schemes.md 9.2: scale_dtype as "torch.<name>",
// zp_dtype null whenever symmetric, enums as their values). Reading checks
// types and the combinations compressed-tensors' validation refuses; throws
// Error{kUsage} naming `where` and the field.
nlohmann::json quant_args_json(const QuantArgs& args);
QuantArgs quant_args_from_json(const nlohmann::json& weights, const std::string& where);

}  // namespace ctquant
