// The compressed-tensors presets ctquant knows but does not write, and why.
//
// model_free_ptq quantizes weights only and cannot calibrate activations:
// `_validate_scheme` (llm-compressor `entrypoints/model_free/validate.py`)
// refuses a preset without weights and any preset whose activations are
// not `"dynamic": true` (schemes.md section 10: FP8's static per-tensor
// inputs). Other presets are written by the library but not loadable by
// vLLM on NVIDIA GPUs (the int-quantized schemes with sub-8-bit weights,
// docs/fp8-int8.md). A name the registry does not list (find_preset returns
// nullptr) is looked up here, so `--scheme FP8` is answered with the reason
// rather than "unknown scheme". A refused preset whose weights a registry
// row writes (NVFP4, whose "local" activations need calibration) is listed
// in that row instead, with Preset::refused: each refusal has one home.
#pragma once

#include <string_view>

namespace ctquant {

// A compressed-tensors preset (`quantization/quant_scheme.py`,
// PRESET_SCHEMES) that ctquant refuses, and why.
struct RefusedPreset {
  std::string_view name;    // as compressed-tensors registers it (upper case)
  std::string_view reason;  // what the library or vLLM does with it, and what to use instead
};

// The refused preset called `name` (compared upper-cased, as
// preset_name_to_scheme does), or nullptr when it is not one of them.
// Static storage; never throws.
const RefusedPreset* refused_preset(std::string_view name);

}  // namespace ctquant
