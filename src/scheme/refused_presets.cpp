#include "ctquant/scheme/refused_presets.hpp"

#include <array>
#include <cctype>
#include <string>

namespace ctquant {

namespace {

// Presets of compressed-tensors 0.18 `quantization/quant_scheme.py` that
// ctquant does not write and no registry row lists. FP8 and UNQUANTIZED
// are refused by model_free_ptq itself (schemes.md 10; NVFP4 too, but its
// refusal is the `refused` text of its preset in the nvfp4 row, nvfp4.cpp,
// since its weights are NVFP4A16's); the int-quantized presets with
// fewer than 8 weight bits are written by model_free_ptq but not loadable
// on NVIDIA GPUs by vLLM (compressed_tensors.py: _is_dynamic_token_w4a8_int
// selects CompressedTensorsW4A8Int, whose kernels are CPU and XPU only;
// on Hopper _is_fp8_w4a8_sm90 routes 4-bit weights to
// CompressedTensorsW4A8Fp8, which expects pack-quantized weights; other
// widths match no vLLM scheme).
constexpr std::string_view kIntQuantizedNarrow =
    "it stores sub-8-bit weights unpacked in an int8 tensor (format int-quantized) with "
    "dynamic per-token activations, which vLLM cannot serve on NVIDIA GPUs (4-bit weights "
    "with 8-bit activations run on CPU and XPU only; other widths have no vLLM scheme); "
    "use W4A16 (weights only, pack-quantized) or W8A8";

constexpr std::array<RefusedPreset, 12> kRefusedPresets = {{
    {"FP8",
     "FP8 quantizes input activations statically per tensor (\"dynamic\": false), which needs "
     "calibration data: model_free_ptq refuses it (Model Free PTQ cannot calibrate "
     "activations); use FP8_DYNAMIC (per-channel weights, dynamic per-token activations) or "
     "FP8_BLOCK (128x128 blocks, dynamic per-group activations)"},
    {"UNQUANTIZED",
     "UNQUANTIZED has no weight quantization: model_free_ptq refuses it (Must provide a "
     "weights quantization scheme to perform weights-only PTQ)"},
    {"W4A8", kIntQuantizedNarrow},
    {"W4AFP8", kIntQuantizedNarrow},
    {"W4A4", kIntQuantizedNarrow},
    {"W2A4", kIntQuantizedNarrow},
    {"W2A8", kIntQuantizedNarrow},
    {"W3A4", kIntQuantizedNarrow},
    {"W3A8", kIntQuantizedNarrow},
    {"W5A8", kIntQuantizedNarrow},
    {"W6A8", kIntQuantizedNarrow},
    {"W7A8", kIntQuantizedNarrow},
}};

}  // namespace

const RefusedPreset* refused_preset(std::string_view name) {
  std::string key(name);
  for (char& c : key) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const RefusedPreset& p : kRefusedPresets) {
    if (p.name == key) return &p;
  }
  return nullptr;
}

}  // namespace ctquant
