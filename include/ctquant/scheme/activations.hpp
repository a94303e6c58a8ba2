// What model_free_ptq refuses about activations, and the compressed-tensors
// presets ctquant knows but does not write.
//
// model_free_ptq quantizes weights only; it cannot calibrate activations, so
// `_validate_scheme` (llm-compressor `entrypoints/model_free/validate.py`)
// refuses any group whose input or output activations are not
// `"dynamic": true` (schemes.md section 10): the FP8 preset (static
// per-tensor inputs), NVFP4 (`"dynamic": "local"`), any custom static
// scheme. ctquant refuses the same, with the library's reason.
//
// A preset name that the registry does not list (find_preset returns
// nullptr) may still be one of compressed-tensors' presets; refused_preset
// says why ctquant does not write it, so `--scheme FP8` is answered with the
// reason rather than "unknown scheme".
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ctquant {

// Why model_free_ptq refuses these activation args, or "" when it accepts
// them: null (no activation quantization) and objects whose "dynamic" is
// true are accepted; any other "dynamic" (false, "local", missing, which
// compressed-tensors defaults to false) is refused. `role` names the field
// in the message ("input_activations" or "output_activations"). Never
// throws.
std::string model_free_activation_refusal(const nlohmann::json& activations,
                                          std::string_view role);

// A compressed-tensors preset (`quantization/quant_scheme.py`,
// PRESET_SCHEMES) that ctquant refuses, and why.
struct RefusedPreset {
  std::string_view name;    // as compressed-tensors registers it (upper case)
  std::string_view reason;  // a sentence: what the library or vLLM does with it
};

// The refused preset called `name` (compared upper-cased, as
// preset_name_to_scheme does), or nullptr when it is not one of them.
// Static storage; never throws.
const RefusedPreset* refused_preset(std::string_view name);

}  // namespace ctquant
