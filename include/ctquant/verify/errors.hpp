// The weight error of every quantized module of a checkpoint, against the
// INPUT it was made from: `ctquant inspect --errors OUTPUT --source INPUT`.
// The figures quantize reports for the run that wrote OUTPUT, for any
// checkpoint, one ctquant or model_free_ptq wrote.
//
// INPUT is planned again with the scheme groups and ignore list of OUTPUT's
// config.json, as verify --against-source plans it. For every module that
// plan quantizes, the outputs OUTPUT stores are read chunk by chunk beside
// the source rows (an FP8 source dequantized to BF16, as quantize reads it)
// and compared by quant_error_rows (scheme/quant_error.hpp). Nothing is
// recomputed: Q is what OUTPUT stores. Nothing else is checked either:
// whether those outputs are the ones quantize writes is verify's question.
// Memory is a few chunks of rows; files are opened read-only.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ctquant/exec/executor.hpp"
#include "ctquant/plan/plan.hpp"

namespace ctquant {

struct CheckpointErrors {
  std::string output;                // as given
  std::string input;                 // as given
  std::string input_quantization;    // InputQuantization::describe() of INPUT
  QuantizePlan plan;                 // INPUT planned with OUTPUT's quantization_config
  std::vector<ModuleError> modules;  // plan order
  // Modules the plan quantizes that have no figures, one line each naming
  // the module and why: an output tensor OUTPUT lacks or holds with another
  // dtype or shape, or a source value that is not finite.
  std::vector<std::string> skipped;
};

// Throws Error{kIo} when a path does not exist or cannot be read,
// Error{kBadInput} for a broken safetensors header, an OUTPUT config.json
// without a quantization_config, or an INPUT quantize does not convert.
// cancel and before_writing: as VerifyOptions (a transform whose source
// is rewritten again under the temporary directory).
CheckpointErrors checkpoint_errors(const std::filesystem::path& output,
                                   const std::filesystem::path& input,
                                   std::uint64_t chunk_bytes = 4u << 20,
                                   const std::atomic<bool>* cancel = nullptr,
                                   const std::function<void()>& before_writing = {});

// {"mode": "errors", "output", "input", "input_quantization",
// "weight_error" (weight_error_json, report/weight_error.hpp), "skipped"}.
nlohmann::json checkpoint_errors_json(const CheckpointErrors& errors);

// What OUTPUT and INPUT are, a table of every module's figures, the figure
// over all of them, the largest five and the skipped modules.
std::string render_checkpoint_errors_text(const CheckpointErrors& errors);

}  // namespace ctquant
